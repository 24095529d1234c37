//! The worker thread that owns the engine: it loads models (folders, GGUF
//! files, hub cache and Ollama names), runs the diagnostics and live
//! generations, and answers with events. Reports and exports need no model
//! and go through `lcut_viewer_ui::jobs`.

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use lcut_engine::diagnose::{
    BUNDLED_PROMPTS, DiagnoseEvent, DiagnoseOptions, PromptSpec, SweepOptions, diagnose_prepared,
    prepare_prompts, read_prompt_set, sweep,
};
use lcut_engine::{EngineError, Session};
use lcut_model::store;
use lcut_model::{DType, Device, ModelFormat, StoreRoots, WeightMode};
use lcut_viewer_ui::backend::{Command, Event, JobId, ModelSummary, PromptSource, WorkerPort};
use lcut_viewer_ui::jobs::{serve_export, serve_open_report};
use lcut_viewer_ui::{FailureKind, JobError};

use crate::live_run::run_live;
use crate::paths;
use lcut_viewer_ui::backend::LiveRequest;

/// What the worker needs besides its commands.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The bundled prompt set (`PromptSource::Bundled`).
    pub bundled_prompts: PathBuf,
    /// Where model names (`ORG/NAME`, `NAME:TAG`) are looked up: the hub
    /// cache and Ollama's store.
    pub store_roots: StoreRoots,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            bundled_prompts: paths::resolve(BUNDLED_PROMPTS),
            store_roots: StoreRoots::from_env(),
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

/// What a model is, for messages: a GGUF file or a model folder.
pub fn model_kind(format: ModelFormat) -> &'static str {
    match format {
        ModelFormat::Gguf => "GGUF file",
        ModelFormat::Folder => "model folder",
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
        path: session.name().to_string(),
        arch: format!("{:?}", c.arch).to_lowercase(),
        num_layers: c.num_layers,
        num_heads: c.num_heads,
        num_kv_heads: c.num_kv_heads,
        head_dim: c.head_dim,
        max_positions: c.max_position_embeddings,
        has_tokenizer: session.tokenizer.is_some(),
        has_chat_template: session.has_chat_template(),
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
                        // the curves show where the answer forms
                        lens: true,
                        ..DiagnoseOptions::default()
                    };
                    self.diagnose(job, &prompts, opts, sweep_context_len);
                }
                Command::RunGenerate(request) => self.generate(&request),
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

    /// Resolve `reference` (a path or a store name), then load it.
    fn open_model(&mut self, reference: &Path) {
        self.port
            .progress(0, 1, format!("loading {}", reference.display()));
        // Free the old model before loading the next one.
        self.session = None;
        let loaded = match store::resolve(reference, &self.config.store_roots) {
            Ok(model) => {
                Session::load_resolved(&model, WeightMode::Dense(DType::F32), &Device::Cpu)
                    .map_err(|e| format!("loading the {} {model}: {e}", model_kind(model.format)))
            }
            Err(e) => Err(format!("loading model {}: {e}", reference.display())),
        };
        match loaded {
            Ok(s) => {
                self.port.send(Event::ModelOpened(summarise(&s)));
                self.session = Some(s);
            }
            Err(message) => {
                self.port.send(Event::ModelFailed(JobError::new(
                    FailureKind::LoadModel,
                    message,
                )));
            }
        }
    }

    fn generate(&self, req: &LiveRequest) {
        let Some(session) = &self.session else {
            self.port
                .send(Event::GenerationFailed(JobError::no_model()));
            return;
        };
        if let Err(e) = run_live(&self.port, session, req) {
            self.port.send(Event::GenerationFailed(JobError::new(
                FailureKind::Generate,
                e.to_string(),
            )));
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
            port.send(Event::DiagnoseFailed(JobError::no_model()));
            return;
        };
        let (prompts, prompts_file) = match self.prompts(source) {
            Ok(p) => p,
            Err(e) => {
                port.send(Event::DiagnoseFailed(JobError::new(
                    FailureKind::Prompts,
                    e,
                )));
                return;
            }
        };
        opts.prompts_file = prompts_file;
        let source = format!("run on {}", session.folder().display());
        // With a sweep, the diagnostics are shown as soon as they exist; the
        // sweep (every cut, minutes on a real model) follows.
        let result = (|| {
            let prepared = prepare_prompts(session, &prompts, &opts)?;
            let report = {
                let mut cb = progress_callback(port, job, "diagnose", opts.max_new_tokens);
                diagnose_prepared(session, &prepared, &opts, &mut cb)?
            };
            let Some(context_len) = sweep_context_len else {
                port.send(Event::ReportReady {
                    report: Box::new(report),
                    source,
                });
                return Ok(());
            };
            port.send(Event::DiagnoseReady {
                report: Box::new(report),
                source,
            });
            let sweep_opts = SweepOptions {
                cuts: None,
                anchor_free: true,
                context_len,
                max_new_tokens: opts.max_new_tokens,
                ..SweepOptions::default()
            };
            let mut cb = progress_callback(port, job, "sweep", 1);
            let measured = sweep(session, &prepared, &sweep_opts, &opts.thresholds, &mut cb)?;
            port.send(Event::SweepReady(Box::new(measured)));
            Ok::<_, EngineError>(())
        })();
        match result {
            Ok(()) => {}
            Err(EngineError::Cancelled) => {
                port.send(Event::Cancelled);
            }
            Err(e) => {
                port.send(Event::DiagnoseFailed(JobError::new(
                    FailureKind::Diagnose,
                    e.to_string(),
                )));
            }
        }
    }
}

/// Starts the engine worker on its own thread.
pub fn spawn(port: WorkerPort, config: WorkerConfig) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("lcut-engine".into())
        .spawn(move || EngineWorker::new(port, config).run())
}
