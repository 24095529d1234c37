//! The seam between the UI and whatever does the work.
//!
//! The UI holds a [`Backend`]: it sends [`Command`]s and polls [`Event`]s once
//! per frame, so it never blocks. The other end, a [`WorkerPort`], lives on a
//! worker thread (the engine in the `lcut-viewer` binary, or [`crate::fake`] in
//! tests): it receives commands, sends events (waking the UI), and asks
//! [`WorkerPort::is_cancelled`] between steps.
//!
//! Cancellation does not wait for the worker to read its queue: every run
//! carries a [`JobId`], and [`Backend::cancel`] raises a shared watermark that
//! the worker checks from inside its progress callback.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender, TryRecvError, channel as mpsc_channel};

use lcut_policy::{Policy, PolicySpec, SlimTrace, StepRecord};
use lcut_report::Format;
use lcut_trace::{Report, Sweep};

use crate::failure::JobError;
use crate::slim_data::SlimRunView;

/// Identifies one run (diagnose, generate, export, open); increasing.
pub type JobId = u64;

/// Where the prompts of a diagnostic run come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptSource {
    /// The prompt set bundled with the project.
    Bundled,
    /// A JSONL prompt file (`{"id", "prompt", "system"?}` per line).
    File(PathBuf),
    /// One prompt typed in the UI.
    Typed(String),
}

/// What the UI asks the worker to do.
#[derive(Debug, Clone)]
pub enum Command {
    /// Load a model folder or a `.gguf` file (replacing the current model).
    OpenModel(PathBuf),
    /// Read a saved report (a `report.json`, or a folder holding one).
    OpenReport {
        /// The job.
        job: JobId,
        /// The file or folder.
        path: PathBuf,
    },
    /// Run the diagnostics on the open model.
    RunDiagnose {
        /// The job.
        job: JobId,
        /// The prompts.
        prompts: PromptSource,
        /// Greedy tokens per prompt.
        max_new_tokens: usize,
        /// Wrap prompts in the model's chat template when it has one.
        use_chat_template: bool,
        /// Also run the empirical sweep over every cut, with costs at this
        /// context length.
        sweep_context_len: Option<usize>,
    },
    /// Generate with the full model and SPEED side by side (and a third policy).
    RunGenerate(LiveRequest),
    /// Stop the job (also signalled through the shared watermark).
    Cancel(JobId),
    /// Write the report in `format` to `dir`.
    Export {
        /// The job.
        job: JobId,
        /// The report to write.
        report: Arc<Report>,
        /// The format.
        format: Format,
        /// The folder (created if needed).
        dir: PathBuf,
    },
    /// End the worker thread.
    Shutdown,
}

/// What a model (folder or `.gguf` file) holds, as the UI shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSummary {
    /// The model as the user named it: a folder, a `.gguf` file, or a hub
    /// cache or Ollama name.
    pub path: String,
    /// Architecture name.
    pub arch: String,
    /// Layers.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads.
    pub num_kv_heads: usize,
    /// Head width.
    pub head_dim: usize,
    /// The longest sequence the model takes (`max_position_embeddings`).
    pub max_positions: usize,
    /// Whether a tokenizer was found (text prompts need one).
    pub has_tokenizer: bool,
    /// Whether the tokenizer has a chat template.
    pub has_chat_template: bool,
}

/// Per-policy figures of a live generation, updated each step.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LiveMetrics {
    /// Time to first token, seconds (`None` before the first token).
    pub ttft_s: Option<f64>,
    /// Mean time per output token after the first, seconds.
    pub tpot_s: Option<f64>,
    /// Tokens produced.
    pub tokens: usize,
    /// K/V bytes held now.
    pub kv_bytes: u64,
    /// K/V bytes decode reads now (SlimInfer: sink, active blocks and the
    /// decode phase; the rest could sit offloaded); `kv_bytes` for static
    /// policies.
    pub kv_bytes_resident: u64,
}

/// One step of a live generation: each policy's token and figures.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LiveStep {
    /// Output index.
    pub index: usize,
    /// The full model's token, while it runs.
    pub full: Option<LiveToken>,
    /// SPEED's token, while it runs.
    pub speed: Option<LiveToken>,
    /// The third policy's token, while it runs (none without one).
    pub extra: Option<LiveToken>,
    /// Full and SPEED produced the same token.
    pub agree: bool,
    /// Full and the third policy produced the same token.
    pub extra_agree: bool,
    /// KL(full ‖ SPEED) while the continuations are identical, nats.
    pub kl: Option<f32>,
    /// The full model's figures so far.
    pub full_metrics: LiveMetrics,
    /// SPEED's figures so far.
    pub speed_metrics: LiveMetrics,
    /// The third policy's figures so far.
    pub extra_metrics: LiveMetrics,
    /// SlimInfer's decode-step records added by this step (third policy).
    pub slim_steps: Vec<StepRecord>,
}

/// One token of one policy in a live generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveToken {
    /// Token id.
    pub id: u32,
    /// Its text.
    pub text: String,
}

/// What the worker tells the UI.
#[derive(Debug, Clone)]
pub enum Event {
    /// A model (folder or `.gguf` file) is loaded.
    ModelOpened(ModelSummary),
    /// Loading a model failed.
    ModelFailed(JobError),
    /// Progress of the running job.
    Progress {
        /// Units done.
        done: usize,
        /// Units in all.
        total: usize,
        /// What is happening.
        message: String,
    },
    /// A report is ready (from a run or a file).
    ReportReady {
        /// The report.
        report: Box<Report>,
        /// Where it came from (a file, or "run on MODEL").
        source: String,
    },
    /// The diagnostics of a run with a sweep are ready while the sweep
    /// goes on: the report without its sweep, shown at once;
    /// [`Event::SweepReady`] ends the run.
    DiagnoseReady {
        /// The report so far (no sweep).
        report: Box<Report>,
        /// Where it came from ("run on MODEL").
        source: String,
    },
    /// The sweep of the run whose diagnostics came in
    /// [`Event::DiagnoseReady`]; the run is done.
    SweepReady(Box<Sweep>),
    /// A diagnostic run (or its sweep) or a report file failed.
    DiagnoseFailed(JobError),
    /// The running job stopped because it was cancelled.
    Cancelled,
    /// A live generation started.
    GenerationStarted {
        /// The reference policy.
        full_policy: Box<Policy>,
        /// The SPEED policy (resolved).
        speed_policy: Box<Policy>,
        /// The third policy (resolved), when there is one.
        extra_policy: Option<Box<Policy>>,
        /// Prompt tokens.
        prompt_len: usize,
    },
    /// The third policy is SlimInfer and its prefill has decided every
    /// cut: kept blocks and scores (decode steps follow in
    /// [`LiveStep::slim_steps`]).
    SlimDecided(Box<SlimRunView>),
    /// One step of a live generation.
    GenerationStep(Box<LiveStep>),
    /// A live generation ended (not cancelled).
    GenerationDone {
        /// The full model's final figures.
        full_metrics: LiveMetrics,
        /// SPEED's final figures.
        speed_metrics: LiveMetrics,
        /// The third policy's final figures.
        extra_metrics: LiveMetrics,
        /// SlimInfer's whole trace, when the third policy is SlimInfer.
        slim: Option<Box<SlimTrace>>,
    },
    /// A live generation failed.
    GenerationFailed(JobError),
    /// An export was written.
    Exported(PathBuf),
    /// An export failed.
    ExportFailed(JobError),
}

/// Called by the worker after each event, to wake the UI (for example
/// `egui::Context::request_repaint`).
pub type Waker = Arc<dyn Fn() + Send + Sync>;

/// The UI's end: send commands, poll events.
pub struct Backend {
    commands: Sender<Command>,
    events: Receiver<Event>,
    cancelled_upto: Arc<AtomicU64>,
    next_job: JobId,
    disconnected: bool,
}

/// The worker's end: receive commands, send events, check cancellation.
pub struct WorkerPort {
    commands: Receiver<Command>,
    events: Sender<Event>,
    cancelled_upto: Arc<AtomicU64>,
    waker: Option<Waker>,
}

/// A connected pair. `waker` is called after every event the worker sends.
pub fn channel(waker: Option<Waker>) -> (Backend, WorkerPort) {
    let (ctx, crx) = mpsc_channel();
    let (etx, erx) = mpsc_channel();
    let cancelled = Arc::new(AtomicU64::new(0));
    (
        Backend {
            commands: ctx,
            events: erx,
            cancelled_upto: Arc::clone(&cancelled),
            next_job: 1,
            disconnected: false,
        },
        WorkerPort {
            commands: crx,
            events: etx,
            cancelled_upto: cancelled,
            waker,
        },
    )
}

impl Backend {
    /// A fresh job id for the next run.
    pub fn new_job(&mut self) -> JobId {
        let id = self.next_job;
        self.next_job += 1;
        id
    }

    /// Sends a command; false when the worker has gone.
    pub fn send(&mut self, command: Command) -> bool {
        if let Command::Cancel(job) = command {
            self.cancelled_upto.fetch_max(job, Ordering::SeqCst);
        }
        let ok = self.commands.send(command).is_ok();
        self.disconnected |= !ok;
        ok
    }

    /// Cancels `job` (and every earlier one) at once, and tells the worker.
    pub fn cancel(&mut self, job: JobId) {
        self.send(Command::Cancel(job));
    }

    /// The events that have arrived, without blocking.
    pub fn poll(&mut self) -> Vec<Event> {
        let mut out = Vec::new();
        loop {
            match self.events.try_recv() {
                Ok(e) => out.push(e),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    self.disconnected = true;
                    break;
                }
            }
        }
        out
    }

    /// True once the worker's end is gone.
    pub fn is_disconnected(&self) -> bool {
        self.disconnected
    }
}

impl WorkerPort {
    /// The next command, blocking; `None` when the UI's end is gone.
    pub fn recv(&self) -> Option<Command> {
        self.commands.recv().ok()
    }

    /// Sends an event and wakes the UI; false when the UI has gone.
    pub fn send(&self, event: Event) -> bool {
        let ok = self.events.send(event).is_ok();
        if let Some(w) = &self.waker {
            w();
        }
        ok
    }

    /// True when `job` has been cancelled.
    pub fn is_cancelled(&self, job: JobId) -> bool {
        self.cancelled_upto.load(Ordering::SeqCst) >= job
    }

    /// Sends a progress event.
    pub fn progress(&self, done: usize, total: usize, message: impl Into<String>) -> bool {
        self.send(Event::Progress {
            done,
            total,
            message: message.into(),
        })
    }
}

/// What a live generation is asked for: the viewer's command, and what the
/// worker runs.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveRequest {
    /// The job.
    pub job: JobId,
    /// The prompt text.
    pub prompt: String,
    /// The policy run beside the full model (SPEED at the chosen cutoff,
    /// with or without the BoS anchor, or any other), resolved against the
    /// model's depth by the worker.
    pub policy: Box<PolicySpec>,
    /// Most new tokens.
    pub max_new_tokens: usize,
    /// Wrap the prompt in the model's chat template when it has one.
    pub use_chat_template: bool,
    /// A third policy run in lockstep beside the two (a SlimInfer
    /// policy such as `slim:1/3@50%,2/3@25%+block:16+unit:4`), resolved
    /// against the model's depth by the worker.
    pub extra: Option<Box<PolicySpec>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cancel_marks_the_job_and_earlier_ones() {
        let (mut ui, worker) = channel(None);
        let a = ui.new_job();
        let b = ui.new_job();
        assert!(!worker.is_cancelled(a));
        ui.cancel(a);
        assert!(worker.is_cancelled(a));
        assert!(!worker.is_cancelled(b));
        assert!(matches!(worker.recv(), Some(Command::Cancel(j)) if j == a));
        worker.progress(1, 2, "x");
        assert_eq!(ui.poll().len(), 1);
        drop(worker);
        assert!(ui.poll().is_empty());
        assert!(ui.is_disconnected());
    }
}
