//! The viewer's plain state, and how backend events change it.
//!
//! Nothing here draws, and nothing here imports a panel: the settings live in
//! [`crate::settings`], the live panel's state in [`crate::live_state`]; the
//! `show_*` functions in the other modules read and edit these structs, and
//! [`ViewerState::apply_event`] folds in what the worker reports.

use std::path::PathBuf;
use std::sync::Arc;

use lcut_trace::Report;

use lcut_policy::{Anchors, CutSpec, PolicyKind, PolicySpec};

use crate::backend::{
    Backend, Command, Event, JobId, LiveMetrics, LiveRequest, ModelSummary, PromptSource,
};
use crate::dialog::FileDialogState;
use crate::frames::FrameStats;
use crate::head_picks::HeadPicks;
use crate::live_state::LiveState;
use crate::loaded::LoadedReport;
use crate::settings::CostSettings;
pub use crate::settings::{ExportSettings, PromptChoice, RunInputs, Tab, ViewSettings};

/// What kind of job is running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobKind {
    /// Loading a model (folder or `.gguf` file).
    OpenModel,
    /// Reading a report file.
    OpenReport,
    /// A diagnostic run.
    Diagnose,
    /// A live generation.
    Generate,
    /// Writing an export.
    Export,
}

impl JobKind {
    /// Whether the Cancel button applies.
    pub fn cancellable(self) -> bool {
        matches!(self, JobKind::Diagnose | JobKind::Generate)
    }
}

/// The running job and its progress.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// Its id.
    pub id: JobId,
    /// Its kind.
    pub kind: JobKind,
    /// Units done.
    pub done: usize,
    /// Units in all (0 = unknown).
    pub total: usize,
    /// The latest message.
    pub message: String,
    /// Cancel was pressed; waiting for the worker to stop.
    pub cancelling: bool,
}

impl Job {
    /// Progress in `[0, 1]`.
    pub fn fraction(&self) -> f32 {
        if self.total == 0 {
            0.0
        } else {
            (self.done as f32 / self.total as f32).clamp(0.0, 1.0)
        }
    }
}

/// Everything the viewer shows and edits.
#[derive(Default)]
pub struct ViewerState {
    /// The worker, when one is connected.
    pub backend: Option<Backend>,
    /// Run inputs.
    pub inputs: RunInputs,
    /// The open model.
    pub model: Option<ModelSummary>,
    /// The running job.
    pub job: Option<Job>,
    /// The report on display.
    pub loaded: Option<LoadedReport>,
    /// View settings.
    pub view: ViewSettings,
    /// Cost panel settings.
    pub cost: CostSettings,
    /// Live generation.
    pub live: LiveState,
    /// Export settings.
    pub export: ExportSettings,
    /// The (layer, K/V head) pairs picked in the head view.
    pub heads: HeadPicks,
    /// The eval results of the frontier view.
    pub frontier: crate::frontier_view::FrontierView,
    /// Messages, newest last.
    pub log: Vec<String>,
    /// The latest error, shown until the next job starts.
    pub error: Option<String>,
    /// The open file dialog.
    pub dialog: Option<FileDialogState>,
    /// Frame times.
    pub frames: FrameStats,
}

/// Most messages kept in [`ViewerState::log`].
const LOG_LEN: usize = 200;

impl ViewerState {
    /// A state wired to `backend`.
    pub fn new(backend: Backend) -> Self {
        Self {
            backend: Some(backend),
            ..Self::default()
        }
    }

    /// Adds a message to the log.
    pub fn note(&mut self, msg: impl Into<String>) {
        self.log.push(msg.into());
        if self.log.len() > LOG_LEN {
            let extra = self.log.len() - LOG_LEN;
            self.log.drain(..extra);
        }
    }

    pub(crate) fn fail(&mut self, msg: String) {
        self.note(format!("error: {msg}"));
        self.error = Some(msg);
    }

    /// Whether a job is running (run buttons are disabled meanwhile).
    pub fn busy(&self) -> bool {
        self.job.is_some()
    }

    /// Starts a job with the command `make(job)`; false (and an error) when
    /// no worker is connected or one is busy.
    pub fn start(&mut self, kind: JobKind, make: impl FnOnce(JobId) -> Command) -> bool {
        if self.busy() {
            return false;
        }
        let Some(backend) = self.backend.as_mut() else {
            self.fail("no worker is connected".into());
            return false;
        };
        let id = backend.new_job();
        if !backend.send(make(id)) {
            self.fail("the worker thread has stopped".into());
            return false;
        }
        self.error = None;
        self.job = Some(Job {
            id,
            kind,
            done: 0,
            total: 0,
            message: "starting".into(),
            cancelling: false,
        });
        true
    }

    /// Asks the worker to load the model at `path` (a model folder or a
    /// `.gguf` file).
    pub fn open_model(&mut self, path: PathBuf) -> bool {
        self.inputs.model_path = path.display().to_string();
        self.start(JobKind::OpenModel, |_| Command::OpenModel(path))
    }

    /// Asks the worker to read a report file (or a run folder).
    pub fn open_report(&mut self, path: PathBuf) -> bool {
        self.start(JobKind::OpenReport, |job| Command::OpenReport { job, path })
    }

    /// Starts a diagnostic run with the current inputs.
    pub fn run_diagnose(&mut self) -> bool {
        let prompts = match self.inputs.prompts {
            PromptChoice::Bundled => PromptSource::Bundled,
            PromptChoice::File => PromptSource::File(PathBuf::from(&self.inputs.prompts_file)),
            PromptChoice::Typed => PromptSource::Typed(self.inputs.typed_prompt.clone()),
        };
        let (max_new_tokens, use_chat_template) =
            (self.inputs.max_new_tokens, self.inputs.use_chat_template);
        let sweep_context_len = self.inputs.with_sweep.then_some(self.cost.context_len);
        self.start(JobKind::Diagnose, |job| Command::RunDiagnose {
            job,
            prompts,
            max_new_tokens,
            use_chat_template,
            sweep_context_len,
        })
    }

    /// Starts a live generation at the chosen cutoff, with the third
    /// policy when one is typed (a malformed one is an error, no job).
    pub fn run_generate(&mut self) -> bool {
        let layers = self.model.as_ref().map(|m| m.num_layers);
        let chosen = self.live_cut();
        let l_cut = layers.map_or(chosen, |n| chosen.clamp(1, n.max(1)));
        let extra = match self.live.extra_spec(layers) {
            Ok(e) => e.map(Box::new),
            Err(e) => {
                self.fail(format!("third policy: {e}"));
                return false;
            }
        };
        let policy = Box::new(speed_spec(l_cut, self.live.keep_bos));
        let (prompt, max_new_tokens) = (self.live.prompt.clone(), self.live.max_new_tokens);
        let use_chat_template = self.inputs.use_chat_template;
        let ok = self.start(JobKind::Generate, |job| {
            Command::RunGenerate(LiveRequest {
                job,
                prompt,
                policy,
                max_new_tokens,
                use_chat_template,
                extra,
            })
        });
        if ok {
            self.live.begin(l_cut);
        }
        ok
    }

    /// The SPEED cut the live panel shows and its next run uses: the cut
    /// of the run on screen (or one the user or `--l-cut` chose there),
    /// else the report's chosen cut.
    pub fn live_cut(&self) -> usize {
        self.live.chosen_cut.unwrap_or(self.view.l_cut)
    }

    /// Exports the report on display.
    pub fn export(&mut self) -> bool {
        let Some(report) = self.loaded.as_ref().map(|l| Arc::clone(&l.report)) else {
            self.fail("nothing to export: open or run a report first".into());
            return false;
        };
        let (format, dir) = (self.export.format, PathBuf::from(&self.export.dir));
        self.start(JobKind::Export, |job| Command::Export {
            job,
            report,
            format,
            dir,
        })
    }

    /// Cancels the running job.
    pub fn cancel(&mut self) {
        if let (Some(job), Some(backend)) = (self.job.as_mut(), self.backend.as_mut())
            && job.kind.cancellable()
            && !job.cancelling
        {
            job.cancelling = true;
            job.message = "cancelling…".into();
            backend.cancel(job.id);
        }
    }

    /// Shows `report` (from `source`), with the chosen cut at its recommendation.
    pub fn set_report(&mut self, report: Report, source: String) {
        self.note(format!(
            "report: {} prompts, {} layers × {} heads, from {source}",
            report.traces.len(),
            report.model.num_layers,
            report.model.num_heads
        ));
        self.view.l_cut = report.recommendation.l_cut;
        self.heads = HeadPicks::for_report(&source, &self.export.dir);
        self.loaded = Some(LoadedReport::new(Arc::new(report), source));
    }

    /// Polls the backend and applies every event; returns how many arrived.
    pub fn poll(&mut self) -> usize {
        let events = match self.backend.as_mut() {
            Some(b) => b.poll(),
            None => return 0,
        };
        let n = events.len();
        for e in events {
            self.apply_event(e);
        }
        if self.backend.as_ref().is_some_and(Backend::is_disconnected) && self.job.is_some() {
            self.job = None;
            self.fail("the worker thread has stopped".into());
        }
        n
    }

    /// A model loaded: note it, and without a report of its depth to
    /// recommend a cut, start SPEED at 3/4 of the depth.
    fn model_opened(&mut self, summary: ModelSummary) {
        self.note(format!(
            "model: {} ({}, {} layers, {} heads, {} KV heads)",
            summary.path, summary.arch, summary.num_layers, summary.num_heads, summary.num_kv_heads
        ));
        self.inputs.model_path.clone_from(&summary.path);
        let matches_report = self
            .loaded
            .as_ref()
            .is_some_and(|l| l.num_layers() == summary.num_layers);
        if !matches_report {
            self.view.l_cut = (summary.num_layers * 3).div_ceil(4).max(1);
        }
        self.cost.start_from_model(summary.max_positions);
        self.model = Some(summary);
        self.job = None;
    }

    /// The running job's progress (its message kept while cancelling).
    fn progress(&mut self, done: usize, total: usize, message: String) {
        if let Some(job) = self.job.as_mut() {
            job.done = done;
            job.total = total;
            if !job.cancelling {
                job.message = message;
            }
        }
    }

    /// The running job stopped on Cancel.
    fn cancelled(&mut self) {
        if self
            .job
            .as_ref()
            .is_some_and(|j| j.kind == JobKind::Generate)
        {
            self.live.cancelled();
        }
        self.sweep_stopped();
        self.job = None;
        self.note("cancelled");
    }

    /// The run stopped before its sweep came: the report on display will
    /// not get one.
    fn sweep_stopped(&mut self) {
        if let Some(l) = self.loaded.as_mut() {
            l.sweep_pending = false;
        }
    }

    /// Ends the running job if it is one of `kinds` (a report queued
    /// behind another job must not end that job).
    fn end_job(&mut self, kinds: &[JobKind]) {
        if self.job.as_ref().is_some_and(|j| kinds.contains(&j.kind)) {
            self.job = None;
        }
    }

    /// The diagnostics of a run came; its sweep goes on (the job too).
    fn diagnose_ready(&mut self, report: Report, source: String) {
        self.set_report(report, source);
        if let Some(l) = self.loaded.as_mut() {
            l.sweep_pending = true;
        }
        self.note("diagnostics ready; the sweep is running");
    }

    /// The sweep of the run on display came: the run is done.
    fn sweep_ready(&mut self, sweep: lcut_trace::Sweep) {
        self.end_job(&[JobKind::Diagnose]);
        let points = sweep.points.len();
        match self.loaded.as_mut() {
            Some(l) if l.sweep_pending => {
                l.attach_sweep(sweep);
                self.note(format!("sweep: {points} points"));
            }
            _ => self.note("a sweep came for a report no longer on display; dropped"),
        }
    }

    /// A live generation finished: its last figures, the SlimInfer trace,
    /// and a line with the agreement.
    fn generation_done(
        &mut self,
        metrics: [LiveMetrics; 3],
        slim: Option<Box<lcut_policy::SlimTrace>>,
    ) {
        self.job = None;
        self.live.done(metrics, slim);
        let extra = match &self.live.extra_policy {
            Some(p) => format!(", {p} {:.0}%", 100.0 * self.live.extra_agreement()),
            None => String::new(),
        };
        self.note(format!(
            "generation done: {} tokens, agreement {:.0}%{extra}",
            self.live.full.len(),
            100.0 * self.live.agreement()
        ));
    }

    /// Folds one event into the state.
    pub fn apply_event(&mut self, event: Event) {
        match event {
            Event::ModelOpened(summary) => self.model_opened(summary),
            Event::ModelFailed(e) => {
                // the worker let the old model go before trying the new one
                self.model = None;
                self.job = None;
                self.fail(e.to_string());
            }
            Event::DiagnoseFailed(e) | Event::ExportFailed(e) => {
                self.job = None;
                self.sweep_stopped();
                self.fail(e.to_string());
            }
            Event::Progress {
                done,
                total,
                message,
            } => self.progress(done, total, message),
            Event::ReportReady { report, source } => {
                self.end_job(&[JobKind::Diagnose, JobKind::OpenReport]);
                self.set_report(*report, source);
            }
            Event::DiagnoseReady { report, source } => self.diagnose_ready(*report, source),
            Event::SweepReady(sweep) => self.sweep_ready(*sweep),
            Event::Cancelled => self.cancelled(),
            Event::GenerationStarted {
                full_policy,
                speed_policy,
                extra_policy,
                prompt_len,
            } => self.live.started(
                full_policy.to_string(),
                speed_policy.to_string(),
                extra_policy.map(|p| p.to_string()),
                prompt_len,
            ),
            Event::SlimDecided(v) => self.live.slim = Some(*v),
            Event::GenerationStep(step) => self.live.step(*step),
            Event::GenerationDone {
                full_metrics,
                speed_metrics,
                extra_metrics,
                slim,
            } => self.generation_done([full_metrics, speed_metrics, extra_metrics], slim),
            Event::GenerationFailed(e) => {
                self.job = None;
                self.fail(e.to_string());
                self.live.failed(e);
            }
            Event::Exported(path) => {
                self.job = None;
                self.note(format!("exported {}", path.display()));
                self.export.last = Some(path);
            }
        }
    }
}

/// SPEED at `l_cut` layers, with the BoS anchor when `keep_bos`.
fn speed_spec(l_cut: usize, keep_bos: bool) -> PolicySpec {
    let anchors = if keep_bos {
        Anchors::Bos
    } else {
        Anchors::None
    };
    PolicySpec::at_cut(PolicyKind::Speed, CutSpec::Layers(l_cut), anchors)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::channel;
    use crate::failure::{FailureKind, JobError};
    use crate::live_state::LiveStatus;

    /// A model of `layers` layers that takes `max_positions` tokens.
    fn model(layers: usize, max_positions: usize) -> ModelSummary {
        ModelSummary {
            path: "m".into(),
            arch: "llama".into(),
            num_layers: layers,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 16,
            max_positions,
            has_tokenizer: true,
            has_chat_template: true,
        }
    }

    #[test]
    fn the_live_cut_stays_with_its_run_when_a_report_arrives() {
        let (backend, port) = channel(None);
        let mut s = ViewerState::new(backend);
        s.apply_event(Event::ModelOpened(model(30, 8192)));
        // `lcut-viewer --l-cut 22 --generate`
        s.live.chosen_cut = Some(22);
        assert!(s.run_generate());
        match port.recv() {
            Some(Command::RunGenerate(r)) => assert_eq!(r.policy.to_string(), "speed:22+bos"),
            other => panic!("{other:?}"),
        }
        // a report queued behind the model arrives while the run streams
        let report = lcut_diag::synthetic::synthetic_report(2, 30, 4, false).unwrap();
        let rec = report.recommendation.l_cut;
        assert_ne!(rec, 22);
        s.apply_event(Event::ReportReady {
            report: Box::new(report),
            source: "file".into(),
        });
        assert_eq!(s.view.l_cut, rec);
        assert_eq!(s.live_cut(), 22);
        assert_eq!(s.live.l_cut, Some(22));
        assert!(
            s.job.as_ref().is_some_and(|j| j.kind == JobKind::Generate),
            "the report ended the generation's job"
        );
    }

    #[test]
    fn opening_a_model_costs_its_own_context_length() {
        let (backend, port) = channel(None);
        let mut s = ViewerState::new(backend);
        assert_eq!(s.cost.context_len, 131_072);
        s.apply_event(Event::ModelOpened(model(30, 8192)));
        assert_eq!(s.cost.context_len, 8192);
        // the sweep is costed at it too
        assert!(s.run_diagnose());
        match port.recv() {
            Some(Command::RunDiagnose {
                sweep_context_len, ..
            }) => assert_eq!(sweep_context_len, Some(8192)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn failure_events_show_their_message_and_keep_their_kind() {
        let (backend, _port) = channel(None);
        let mut s = ViewerState::new(backend);
        let e = JobError::new(FailureKind::Generate, "the prompt has no tokens");
        s.apply_event(Event::GenerationFailed(e.clone()));
        assert_eq!(s.error.as_deref(), Some("the prompt has no tokens"));
        assert_eq!(s.live.status, LiveStatus::Failed(e));
        assert!(
            s.log
                .last()
                .is_some_and(|l| l.ends_with("error: the prompt has no tokens")),
            "{:?}",
            s.log
        );

        s.apply_event(Event::ExportFailed(JobError::new(
            FailureKind::Export,
            "exporting html to /x: denied",
        )));
        assert_eq!(s.error.as_deref(), Some("exporting html to /x: denied"));
        s.apply_event(Event::ModelFailed(JobError::no_model()));
        assert_eq!(s.error.as_deref(), Some("open a model first"));
    }
}
