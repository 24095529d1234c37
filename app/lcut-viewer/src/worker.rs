//! The worker thread that owns the engine: it loads models (folders or GGUF
//! files), runs the diagnostics and live generations, and answers with
//! events. Reports and exports need no model and go through
//! `lcut_viewer_ui::jobs`.

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::Instant;

use lcut_engine::diagnose::{
    BUNDLED_PROMPTS, DiagnoseEvent, DiagnoseOptions, PromptSpec, SweepOptions, diagnose_prepared,
    prepare_prompts, read_prompt_set, sweep,
};
use lcut_engine::{
    EngineError, Generation, GenerationConfig, Sampling, Session, TextTokenizer, kl_divergence,
};
use lcut_model::gguf::is_gguf_path;
use lcut_model::{DType, Device};
use lcut_policy::{Anchors, Policy, PolicyKind};
use lcut_viewer_ui::backend::{
    Command, Event, JobId, LiveMetrics, LiveToken, ModelSummary, PromptSource, WorkerPort,
};
use lcut_viewer_ui::jobs::{serve_export, serve_open_report};

use crate::paths;

/// What the worker needs besides its commands.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The bundled prompt set (`PromptSource::Bundled`).
    pub bundled_prompts: PathBuf,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            bundled_prompts: paths::resolve(BUNDLED_PROMPTS),
        }
    }
}

/// A progress callback for the engine: forwards events as progress and
/// returns false once `job` is cancelled. `phase` names the stage.
fn progress_callback<'a>(
    port: &'a WorkerPort,
    job: JobId,
    phase: &'a str,
    steps_hint: usize,
) -> impl FnMut(&DiagnoseEvent) -> bool + 'a {
    let mut current = String::new();
    let mut total_prompts = 1;
    move |e: &DiagnoseEvent| {
        match e {
            DiagnoseEvent::PromptStarted { index, total, id } => {
                current.clone_from(id);
                total_prompts = *total;
                port.progress(
                    index * steps_hint,
                    total * steps_hint,
                    format!("{phase}: prompt {id} ({}/{total})", index + 1),
                );
            }
            DiagnoseEvent::Prefill { index, done, total } => {
                port.progress(
                    index * steps_hint,
                    total_prompts * steps_hint,
                    format!("{phase}: prompt {current}, prefill {done}/{total} tokens"),
                );
            }
            DiagnoseEvent::Step {
                index,
                step,
                max_steps,
            } => {
                port.progress(
                    index * max_steps + step,
                    total_prompts * max_steps,
                    format!("{phase}: prompt {current}, step {step}/{max_steps}"),
                );
            }
            DiagnoseEvent::PromptDone { index, total } => {
                port.progress(
                    (index + 1) * steps_hint,
                    total * steps_hint,
                    format!("{phase}: prompt {}/{total} done", index + 1),
                );
            }
        }
        !port.is_cancelled(job)
    }
}

/// What `path` names as a model, for messages: a GGUF file or a model folder.
pub fn model_kind(path: &Path) -> &'static str {
    if is_gguf_path(path) {
        "GGUF file"
    } else {
        "model folder"
    }
}

/// The engine worker's state: the open session, if any.
pub struct EngineWorker {
    port: WorkerPort,
    config: WorkerConfig,
    session: Option<Session>,
}

/// The summary the UI shows for a loaded session.
pub fn summarise(session: &Session) -> ModelSummary {
    let c = session.model.config();
    ModelSummary {
        path: session.folder().display().to_string(),
        arch: format!("{:?}", c.arch).to_lowercase(),
        num_layers: c.num_layers,
        num_heads: c.num_heads,
        num_kv_heads: c.num_kv_heads,
        head_dim: c.head_dim,
        has_tokenizer: session.tokenizer.is_some(),
        has_chat_template: session.has_chat_template(),
    }
}

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
    fn metrics(&self, kv_bytes: u64) -> LiveMetrics {
        LiveMetrics {
            ttft_s: self.first,
            tpot_s: (self.tokens > 1).then(|| self.rest / (self.tokens - 1) as f64),
            tokens: self.tokens,
            kv_bytes,
        }
    }
}

impl EngineWorker {
    /// A worker with no model open.
    pub fn new(port: WorkerPort, config: WorkerConfig) -> Self {
        Self {
            port,
            config,
            session: None,
        }
    }

    /// Serves commands until `Shutdown` or until the UI has gone.
    pub fn run(mut self) {
        while let Some(cmd) = self.port.recv() {
            match cmd {
                Command::OpenModel(path) => self.open_model(&path),
                Command::OpenReport { path, .. } => serve_open_report(&self.port, &path),
                Command::RunDiagnose {
                    job,
                    prompts,
                    max_new_tokens,
                    use_chat_template,
                    sweep_context_len,
                } => {
                    let opts = DiagnoseOptions {
                        max_new_tokens,
                        use_chat_template,
                        ..DiagnoseOptions::default()
                    };
                    self.diagnose(job, &prompts, opts, sweep_context_len);
                }
                Command::RunGenerate {
                    job,
                    prompt,
                    l_cut,
                    keep_bos,
                    max_new_tokens,
                    use_chat_template,
                } => {
                    let r = self.generate(
                        job,
                        &prompt,
                        l_cut,
                        keep_bos,
                        max_new_tokens,
                        use_chat_template,
                    );
                    if let Err(e) = r {
                        self.port.send(Event::GenerationFailed(e.to_string()));
                    }
                }
                Command::Export {
                    report,
                    format,
                    dir,
                    ..
                } => serve_export(&self.port, &report, format, &dir),
                Command::Cancel(_) => {}
                Command::Shutdown => break,
            }
        }
    }

    fn open_model(&mut self, path: &Path) {
        self.port
            .progress(0, 1, format!("loading {}", path.display()));
        // Free the old model before loading the next one.
        self.session = None;
        match Session::load(path, DType::F32, &Device::Cpu) {
            Ok(s) => {
                self.port.send(Event::ModelOpened(summarise(&s)));
                self.session = Some(s);
            }
            Err(e) => {
                self.port.send(Event::ModelFailed(format!(
                    "loading the {} {}: {e}",
                    model_kind(path),
                    path.display()
                )));
            }
        }
    }

    fn prompts(&self, source: &PromptSource) -> Result<(Vec<PromptSpec>, Option<String>), String> {
        let read = |p: &Path| {
            read_prompt_set(p)
                .map(|v| (v, Some(p.display().to_string())))
                .map_err(|e| e.to_string())
        };
        match source {
            PromptSource::Bundled => read(&self.config.bundled_prompts),
            PromptSource::File(p) => read(p),
            PromptSource::Typed(text) if text.trim().is_empty() => {
                Err("the typed prompt is empty".to_string())
            }
            PromptSource::Typed(text) => Ok((
                vec![PromptSpec {
                    id: "typed".into(),
                    user: text.clone(),
                    system: None,
                }],
                None,
            )),
        }
    }

    fn diagnose(
        &self,
        job: JobId,
        source: &PromptSource,
        mut opts: DiagnoseOptions,
        sweep_context_len: Option<usize>,
    ) {
        let port = &self.port;
        let Some(session) = &self.session else {
            port.send(Event::DiagnoseFailed("open a model first".into()));
            return;
        };
        let (prompts, prompts_file) = match self.prompts(source) {
            Ok(p) => p,
            Err(e) => {
                port.send(Event::DiagnoseFailed(e));
                return;
            }
        };
        opts.prompts_file = prompts_file;
        let result = (|| {
            let prepared = prepare_prompts(session, &prompts, &opts)?;
            let mut report = {
                let mut cb = progress_callback(port, job, "diagnose", opts.max_new_tokens);
                diagnose_prepared(session, &prepared, &opts, &mut cb)?
            };
            if let Some(context_len) = sweep_context_len {
                let sweep_opts = SweepOptions {
                    cuts: None,
                    anchor_free: true,
                    context_len,
                    max_new_tokens: opts.max_new_tokens,
                    ..SweepOptions::default()
                };
                let mut cb = progress_callback(port, job, "sweep", 1);
                report.sweep = Some(sweep(
                    session,
                    &prepared,
                    &sweep_opts,
                    &opts.thresholds,
                    &mut cb,
                )?);
            }
            Ok::<_, EngineError>(report)
        })();
        match result {
            Ok(report) => {
                port.send(Event::ReportReady {
                    report: Box::new(report),
                    source: format!("run on {}", session.folder().display()),
                });
            }
            Err(EngineError::Cancelled) => {
                port.send(Event::Cancelled);
            }
            Err(e) => {
                port.send(Event::DiagnoseFailed(e.to_string()));
            }
        }
    }

    fn generate(
        &self,
        job: JobId,
        text: &str,
        l_cut: usize,
        keep_bos: bool,
        max_new_tokens: usize,
        use_chat_template: bool,
    ) -> Result<(), EngineError> {
        let port = &self.port;
        let Some(session) = &self.session else {
            port.send(Event::GenerationFailed("open a model first".into()));
            return Ok(());
        };
        let model = &session.model;
        let layers = model.config().num_layers;
        let prompt = session.prepare_text(text, None, use_chat_template)?;
        let anchors = if keep_bos {
            Anchors::Bos
        } else {
            Anchors::None
        };
        let full = Policy::full(layers);
        let speed = Policy::new(PolicyKind::Speed, l_cut.clamp(1, layers), layers, anchors)?;
        let config = GenerationConfig {
            max_new_tokens,
            sampling: Sampling::Greedy,
            stop_tokens: session.stop_tokens(),
            ..GenerationConfig::default()
        };
        let mut a = Generation::new(model, prompt.clone(), full, config.clone())?;
        let mut b = Generation::new(model, prompt.clone(), speed, config)?;
        port.send(Event::GenerationStarted {
            full_policy: full.to_string(),
            speed_policy: speed.to_string(),
            prompt_len: prompt.len(),
        });
        let (mut da, mut db) = (
            Detokenizer::new(session.tokenizer.as_ref()),
            Detokenizer::new(session.tokenizer.as_ref()),
        );
        let (mut ca, mut cb) = (Clock::default(), Clock::default());
        // Both prompts chunk by chunk first, so that Cancel takes within a
        // long prompt; the time counts toward each policy's first token.
        let mut prefill_s = [0.0f64; 2];
        for (k, (g, name)) in [(&mut a, "full"), (&mut b, "SPEED")]
            .into_iter()
            .enumerate()
        {
            let t = Instant::now();
            let done = !port.is_cancelled(job)
                && g.prefill_with(None, |p| {
                    port.progress(
                        p.done,
                        p.total,
                        format!("{name} prefill: {}/{} prompt tokens", p.done, p.total),
                    );
                    !port.is_cancelled(job)
                })?;
            prefill_s[k] = t.elapsed().as_secs_f64();
            if !done {
                port.send(Event::Cancelled);
                return Ok(());
            }
        }
        let mut same_prefix = true;
        let mut index = 0;
        loop {
            if port.is_cancelled(job) {
                port.send(Event::Cancelled);
                return Ok(());
            }
            // Each policy is timed on its own, so TTFT/TPOT are per policy.
            let t = Instant::now();
            let sa = a.step(None)?;
            if sa.is_some() {
                ca.add(t.elapsed().as_secs_f64() + std::mem::take(&mut prefill_s[0]));
            }
            let t = Instant::now();
            let sb = b.step(None)?;
            if sb.is_some() {
                cb.add(t.elapsed().as_secs_f64() + std::mem::take(&mut prefill_s[1]));
            }
            if sa.is_none() && sb.is_none() {
                break;
            }
            let kl = match (&sa, &sb) {
                (Some(x), Some(y)) if same_prefix => Some(kl_divergence(&x.logits, &y.logits)?),
                _ => None,
            };
            let agree = matches!((&sa, &sb), (Some(x), Some(y)) if x.token == y.token);
            same_prefix &= agree;
            port.send(Event::GenerationStep {
                index,
                full: sa.map(|s| da.push(s.token)),
                speed: sb.map(|s| db.push(s.token)),
                agree,
                kl,
                full_metrics: ca.metrics(a.sequence().kv_bytes_held()),
                speed_metrics: cb.metrics(b.sequence().kv_bytes_held()),
            });
            index += 1;
        }
        port.send(Event::GenerationDone {
            full_metrics: ca.metrics(a.sequence().kv_bytes_held()),
            speed_metrics: cb.metrics(b.sequence().kv_bytes_held()),
        });
        Ok(())
    }
}

/// Starts the engine worker on its own thread.
pub fn spawn(port: WorkerPort, config: WorkerConfig) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("lcut-engine".into())
        .spawn(move || EngineWorker::new(port, config).run())
}
