//! A live generation on the worker: the full model, SPEED and an optional
//! third policy (SlimInfer, typically) stepped in lockstep, each timed on
//! its own, streamed to the UI as events; Cancel is checked between prompt
//! chunks and between steps.

use std::time::Instant;

use lcut_engine::{
    EngineError, Generation, GenerationConfig, PreparedPrompt, Sampling, Session, Step,
    TextTokenizer, kl_divergence,
};
use lcut_policy::{Anchors, Policy, PolicyKind};
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

/// Per-policy step timing of a live generation.
#[derive(Default)]
struct Clock {
    first: Option<f64>,
    rest: f64,
    tokens: usize,
}

impl Clock {
    fn add(&mut self, seconds: f64) {
        match self.first {
            None => self.first = Some(seconds),
            Some(_) => self.rest += seconds,
        }
        self.tokens += 1;
    }
}

/// One policy's generation with its timing and detokenizer.
struct Lane<'m> {
    name: &'static str,
    generation: Generation<'m>,
    detok: Detokenizer<'m>,
    clock: Clock,
    /// Prefill seconds, added to the first token's time.
    prefill_s: f64,
    /// SlimInfer decode-step records already sent.
    slim_sent: usize,
    /// Bytes of one token's K/V at one layer.
    bytes_per_token_layer: u64,
}

impl<'m> Lane<'m> {
    fn new(
        session: &'m Session,
        name: &'static str,
        prompt: &PreparedPrompt,
        policy: Policy,
        config: &GenerationConfig,
    ) -> Result<Self, EngineError> {
        Ok(Self {
            name,
            generation: Generation::new(&session.model, prompt.clone(), policy, config.clone())?,
            detok: Detokenizer::new(session.tokenizer.as_ref()),
            clock: Clock::default(),
            prefill_s: 0.0,
            slim_sent: 0,
            bytes_per_token_layer: session.model.kv_shape().bytes_per_token_layer() as u64,
        })
    }

    /// Runs the prompt chunk by chunk with progress; false when cancelled.
    fn prefill(&mut self, port: &WorkerPort, job: JobId) -> Result<bool, EngineError> {
        let t = Instant::now();
        let name = self.name;
        let done = !port.is_cancelled(job)
            && self.generation.prefill_with(None, |p| {
                port.progress(
                    p.done,
                    p.total,
                    format!("{name} prefill: {}/{} prompt tokens", p.done, p.total),
                );
                !port.is_cancelled(job)
            })?;
        self.prefill_s = t.elapsed().as_secs_f64();
        Ok(done)
    }

    /// The next token, timed (the prefill counts toward the first).
    fn step(&mut self) -> Result<Option<Step>, EngineError> {
        let t = Instant::now();
        let s = self.generation.step(None)?;
        if s.is_some() {
            self.clock
                .add(t.elapsed().as_secs_f64() + std::mem::take(&mut self.prefill_s));
        }
        Ok(s)
    }

    /// K/V bytes decode reads now: for SlimInfer the sink, the active
    /// blocks and the decode phase; all that is held otherwise.
    fn resident_bytes(&self) -> u64 {
        let seq = self.generation.sequence();
        match seq.slim() {
            Some(run) => {
                let decode = self.generation.kv_cost().decode;
                self.bytes_per_token_layer * run.selection().resident_token_layers(decode) as u64
            }
            None => seq.kv_bytes_held(),
        }
    }

    fn metrics(&self) -> LiveMetrics {
        let c = &self.clock;
        LiveMetrics {
            ttft_s: c.first,
            tpot_s: (c.tokens > 1).then(|| c.rest / (c.tokens - 1) as f64),
            tokens: c.tokens,
            kv_bytes: self.generation.sequence().kv_bytes_held(),
            kv_bytes_resident: self.resident_bytes(),
        }
    }

    /// SlimInfer's decode-step records not sent yet.
    fn new_slim_steps(&mut self) -> Vec<lcut_policy::StepRecord> {
        let Some(run) = self.generation.sequence().slim() else {
            return Vec::new();
        };
        let new = run.steps()[self.slim_sent.min(run.steps().len())..].to_vec();
        self.slim_sent = run.steps().len();
        new
    }
}

/// The SlimInfer run of `lane` once its prefill has decided every cut
/// (`None` when `policy` is not SlimInfer).
fn slim_view(session: &Session, lane: &Lane<'_>, policy: &Policy) -> Option<SlimRunView> {
    let params = policy.slim()?;
    let trace = lane.generation.output().slim?;
    let ids = &lane.generation.prompt().ids;
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

fn same_token(a: &Option<Step>, b: &Option<Step>) -> bool {
    matches!((a, b), (Some(x), Some(y)) if x.token == y.token)
}

/// Steps every lane until all have ended, one event per step; the first
/// lane (full) is the reference of the agreement and the KL.
fn step_loop(port: &WorkerPort, job: JobId, lanes: &mut [Lane<'_>]) -> Result<bool, EngineError> {
    let mut same_prefix = true;
    for index in 0.. {
        if port.is_cancelled(job) {
            return Ok(false);
        }
        let steps = lanes
            .iter_mut()
            .map(Lane::step)
            .collect::<Result<Vec<_>, _>>()?;
        if steps.iter().all(Option::is_none) {
            break;
        }
        let kl = match (&steps[0], &steps[1]) {
            (Some(x), Some(y)) if same_prefix => Some(kl_divergence(&x.logits, &y.logits)?),
            _ => None,
        };
        let agree = same_token(&steps[0], &steps[1]);
        same_prefix &= agree;
        let mut tokens: Vec<Option<LiveToken>> = lanes
            .iter_mut()
            .zip(&steps)
            .map(|(l, s)| s.as_ref().map(|s| l.detok.push(s.token)))
            .collect();
        tokens.resize(3, None);
        let step = LiveStep {
            index,
            extra: tokens.pop().flatten(),
            speed: tokens.pop().flatten(),
            full: tokens.pop().flatten(),
            agree,
            extra_agree: steps.get(2).is_some_and(|c| same_token(&steps[0], c)),
            kl,
            full_metrics: lanes[0].metrics(),
            speed_metrics: lanes[1].metrics(),
            extra_metrics: lanes.get(2).map(Lane::metrics).unwrap_or_default(),
            slim_steps: lanes
                .get_mut(2)
                .map(Lane::new_slim_steps)
                .unwrap_or_default(),
        };
        port.send(Event::GenerationStep(Box::new(step)));
    }
    Ok(true)
}

/// Runs a live generation of `req` on `session`, sending its events; an
/// error is the caller's to report.
pub fn run_live(
    port: &WorkerPort,
    session: &Session,
    req: &LiveRequest,
) -> Result<(), EngineError> {
    let layers = session.model.config().num_layers;
    let prompt = session.prepare_text(&req.prompt, None, req.use_chat_template)?;
    let anchors = if req.keep_bos {
        Anchors::Bos
    } else {
        Anchors::None
    };
    let full = Policy::full(layers);
    let speed = Policy::new(
        PolicyKind::Speed,
        req.l_cut.clamp(1, layers),
        layers,
        anchors,
    )?;
    let extra = req.extra.as_ref().map(|s| s.resolve(layers)).transpose()?;
    let config = GenerationConfig {
        max_new_tokens: req.max_new_tokens,
        sampling: Sampling::Greedy,
        stop_tokens: session.stop_tokens(),
        ..GenerationConfig::default()
    };
    let mut lanes = vec![
        Lane::new(session, "full", &prompt, full, &config)?,
        Lane::new(session, "SPEED", &prompt, speed, &config)?,
    ];
    if let Some(p) = extra {
        lanes.push(Lane::new(session, "third policy", &prompt, p, &config)?);
    }
    port.send(Event::GenerationStarted {
        full_policy: full.to_string(),
        speed_policy: speed.to_string(),
        extra_policy: extra.map(|p| p.to_string()),
        prompt_len: prompt.len(),
    });
    // Every prompt chunk by chunk first, so that Cancel takes within a long
    // prompt; the time counts toward each policy's first token.
    for lane in &mut lanes {
        if !lane.prefill(port, req.job)? {
            port.send(Event::Cancelled);
            return Ok(());
        }
    }
    if let (Some(lane), Some(p)) = (lanes.get(2), &extra)
        && let Some(v) = slim_view(session, lane, p)
    {
        port.send(Event::SlimDecided(Box::new(v)));
    }
    if !step_loop(port, req.job, &mut lanes)? {
        port.send(Event::Cancelled);
        return Ok(());
    }
    port.send(Event::GenerationDone {
        full_metrics: lanes[0].metrics(),
        speed_metrics: lanes[1].metrics(),
        extra_metrics: lanes.get(2).map(Lane::metrics).unwrap_or_default(),
        slim: lanes
            .get(2)
            .and_then(|l| l.generation.output().slim)
            .map(Box::new),
    });
    Ok(())
}
