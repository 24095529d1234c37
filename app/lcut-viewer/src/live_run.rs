//! A live generation on the worker: the full model, the request's policy
//! (SPEED, typically) and an optional third policy (SlimInfer, typically)
//! run by the engine's [`Lockstep`], streamed to the UI as events; Cancel is
//! checked between prompt chunks and between steps.

use lcut_engine::{EngineError, Generation, Lockstep, LockstepEvent, Session, TextTokenizer};
use lcut_policy::{Policy, StepRecord};
use lcut_viewer_ui::backend::{
    Event, JobId, LiveMetrics, LiveRequest, LiveStep, LiveToken, WorkerPort,
};
use lcut_viewer_ui::slim_data::SlimRunView;

/// Text of each new token as it extends the decoded output (so spaces and
/// multi-token characters come out right), or `[id]` when it adds nothing.
struct Detokenizer<'a> {
    tokenizer: Option<&'a TextTokenizer>,
    ids: Vec<u32>,
    text: String,
}

impl<'a> Detokenizer<'a> {
    fn new(tokenizer: Option<&'a TextTokenizer>) -> Self {
        Self {
            tokenizer,
            ids: Vec::new(),
            text: String::new(),
        }
    }

    fn push(&mut self, id: u32) -> LiveToken {
        let piece = match self.tokenizer {
            None => String::new(),
            Some(t) => {
                self.ids.push(id);
                let text = t.decode(&self.ids);
                let piece = match text.strip_prefix(self.text.as_str()) {
                    Some(rest) => rest.to_string(),
                    None => t.decode(&[id]),
                };
                self.text = text;
                piece
            }
        };
        LiveToken {
            id,
            text: if piece.is_empty() {
                format!("[{id}]")
            } else {
                piece
            },
        }
    }
}

/// The names of the lanes in progress messages.
const LANE_NAMES: [&str; 3] = ["full", "SPEED", "third policy"];

/// The UI's figures of one lane so far (its timing counts its own steps).
fn metrics(generation: &Generation<'_>) -> LiveMetrics {
    let out = generation.output();
    let tokens = out.tokens.len();
    LiveMetrics {
        ttft_s: (tokens > 0).then_some(out.timing.ttft_s),
        tpot_s: (tokens > 1).then_some(out.timing.tpot_s),
        tokens,
        kv_bytes: out.kv_bytes_held,
        kv_bytes_resident: out.kv_bytes_resident,
    }
}

/// Each lane's figures, three of them (default for a missing third lane).
fn all_metrics(lanes: &[Generation<'_>]) -> [LiveMetrics; 3] {
    std::array::from_fn(|k| lanes.get(k).map(metrics).unwrap_or_default())
}

/// The SlimInfer run of `generation` once its prefill has decided every
/// cut (`None` when its policy is not SlimInfer).
fn slim_view(session: &Session, generation: &Generation<'_>) -> Option<SlimRunView> {
    let policy = *generation.sequence().policy();
    let params = policy.slim()?;
    let trace = generation.output().slim?;
    let ids = &generation.prompt().ids;
    Some(SlimRunView {
        policy: policy.to_string(),
        num_layers: policy.num_layers(),
        prompt_len: ids.len(),
        gamma: params.options.gamma(),
        prompt_tokens: session
            .tokenizer
            .as_ref()
            .map(|t| t.token_strings(ids))
            .unwrap_or_default(),
        trace,
    })
}

/// What the live run keeps between the engine's events: each lane's
/// detokenizer and the SlimInfer decode-step records already sent.
struct Stream<'a> {
    port: &'a WorkerPort,
    job: JobId,
    session: &'a Session,
    detok: Vec<Detokenizer<'a>>,
    slim_sent: usize,
}

impl Stream<'_> {
    /// Forwards one engine event to the UI; false once the job is cancelled.
    fn on_event(&mut self, event: LockstepEvent<'_, '_>) -> bool {
        match event {
            LockstepEvent::Prefill { lane, progress } => {
                self.port.progress(
                    progress.done,
                    progress.total,
                    format!(
                        "{} prefill: {}/{} prompt tokens",
                        LANE_NAMES[lane.min(2)],
                        progress.done,
                        progress.total
                    ),
                );
            }
            LockstepEvent::Prefilled { lanes } => {
                if let Some(v) = lanes.get(2).and_then(|g| slim_view(self.session, g)) {
                    self.port.send(Event::SlimDecided(Box::new(v)));
                }
            }
            LockstepEvent::Step { step, lanes } => {
                let live = self.live_step(step, lanes);
                self.port.send(Event::GenerationStep(Box::new(live)));
            }
        }
        !self.port.is_cancelled(self.job)
    }

    /// The UI's view of one engine step.
    fn live_step(&mut self, step: &lcut_engine::CompareStep, lanes: &[Generation<'_>]) -> LiveStep {
        let mut tokens: Vec<Option<LiveToken>> = self
            .detok
            .iter_mut()
            .zip(&step.tokens)
            .map(|(d, t)| t.map(|t| d.push(t)))
            .collect();
        tokens.resize(3, None);
        let [full_metrics, speed_metrics, extra_metrics] = all_metrics(lanes);
        LiveStep {
            index: step.index,
            extra: tokens.pop().flatten(),
            speed: tokens.pop().flatten(),
            full: tokens.pop().flatten(),
            agree: step.agree[1],
            extra_agree: step.agree.get(2).copied().unwrap_or(false),
            kl: step.kl[1],
            full_metrics,
            speed_metrics,
            extra_metrics,
            slim_steps: lanes
                .get(2)
                .map(|g| self.new_slim_steps(g))
                .unwrap_or_default(),
        }
    }

    /// SlimInfer's decode-step records of `generation` not sent yet.
    fn new_slim_steps(&mut self, generation: &Generation<'_>) -> Vec<StepRecord> {
        let Some(run) = generation.sequence().slim() else {
            return Vec::new();
        };
        let new = run.steps()[self.slim_sent.min(run.steps().len())..].to_vec();
        self.slim_sent = run.steps().len();
        new
    }
}

/// The full model, the request's policy and its third policy, resolved
/// for the session's model (a head file made for another model, or naming
/// a K/V head it lacks, is refused).
fn policies(session: &Session, req: &LiveRequest) -> Result<Vec<Policy>, EngineError> {
    let layers = session.model.config().num_layers;
    let mut out = vec![Policy::full(layers), session.resolve_policy(&req.policy)?];
    if let Some(extra) = &req.extra {
        out.push(session.resolve_policy(extra)?);
    }
    Ok(out)
}

/// Runs a live generation of `req` on `session`, sending its events; an
/// error is the caller's to report.
pub fn run_live(
    port: &WorkerPort,
    session: &Session,
    req: &LiveRequest,
) -> Result<(), EngineError> {
    let prompt = session.prepare_text(&req.prompt, None, req.use_chat_template)?;
    let policies = policies(session, req)?;
    let config = session.greedy_config(req.max_new_tokens);
    let mut run = Lockstep::new(&session.model, &prompt, &policies, &config)?;
    port.send(Event::GenerationStarted {
        full_policy: Box::new(policies[0]),
        speed_policy: Box::new(policies[1]),
        extra_policy: policies.get(2).copied().map(Box::new),
        prompt_len: prompt.len(),
    });
    let mut stream = Stream {
        port,
        job: req.job,
        session,
        detok: (0..policies.len())
            .map(|_| Detokenizer::new(session.tokenizer.as_ref()))
            .collect(),
        slim_sent: 0,
    };
    let finished = !port.is_cancelled(req.job) && run.drive(|e| stream.on_event(e))?;
    if !finished {
        port.send(Event::Cancelled);
        return Ok(());
    }
    let [full_metrics, speed_metrics, extra_metrics] = all_metrics(run.lanes());
    port.send(Event::GenerationDone {
        full_metrics,
        speed_metrics,
        extra_metrics,
        slim: run
            .lanes()
            .get(2)
            .and_then(|g| g.output().slim)
            .map(Box::new),
    });
    Ok(())
}
