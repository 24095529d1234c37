//! The eframe application: the UI state, the worker that serves it, what to
//! open at start, and an optional scripted pan for frame-time measurements.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use lcut_model::StoreRoots;
use lcut_model::store;
use lcut_viewer_ui::backend::Command;
use lcut_viewer_ui::live::LiveStatus;
use lcut_viewer_ui::{Tab, ViewerState, channel, show_viewer};

use crate::paths;
use crate::worker::{WorkerConfig, spawn};

/// What to open and show when the window appears.
#[derive(Debug, Clone, Default)]
pub struct StartOptions {
    /// A model to load: a folder, a GGUF file or a store name (the bundled
    /// one when `None` and it exists).
    pub model: Option<PathBuf>,
    /// Do not load any model at start.
    pub no_model: bool,
    /// A report (or run folder) to open.
    pub report: Option<PathBuf>,
    /// Open the large synthetic report (32 × 32 × 128 steps × 128K positions).
    pub demo_large: bool,
    /// The tab to show first.
    pub tab: Option<Tab>,
    /// A JSONL prompt file to use instead of the bundled prompt set.
    pub prompts: Option<PathBuf>,
    /// Run diagnostics once the model is loaded.
    pub run: bool,
    /// The live view's prompt.
    pub live_prompt: Option<String>,
    /// The live view's most new tokens.
    pub live_max_new_tokens: Option<usize>,
    /// The live view's third policy as written (empty: none).
    pub live_policy: Option<String>,
    /// Generate in the live view once the model is loaded (after the
    /// diagnostic run of `run`, if any).
    pub generate: bool,
    /// The live view's SPEED L_cut, which `generate` runs at and the live
    /// control keeps showing (default: the report's chosen cut, the
    /// recommendation of the run, or 3/4 of the depth).
    pub l_cut: Option<usize>,
    /// Once a report is open, fill the head view's picks from the plan for
    /// this K/V budget (and choose its cut); print a line when done.
    pub kv_budget: Option<f64>,
    /// Once `kv_budget` has filled the picks, run them beside the full
    /// model (`speed:C+bos+heads:FILE`); print a line when done.
    pub run_heads: bool,
    /// Record this many idle frames, then drag-pan the prompt-position
    /// heatmap for as many more, print both frame-time summaries and quit.
    pub bench_pan_frames: Option<usize>,
    /// `lcut eval --json` results (or a leaderboard run) to draw in the
    /// frontier view, which is shown first.
    pub eval: Vec<PathBuf>,
}

/// Checks a model given on the command line before the window opens: an
/// existing folder or GGUF file (the worker reports what a folder lacks or
/// a damaged file), or a hub cache or Ollama name that is on disk.
pub fn check_model(reference: &Path, roots: &StoreRoots) -> Result<(), String> {
    store::resolve(reference, roots)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Parses a tab name (case-insensitive label).
pub fn parse_tab(name: &str) -> Option<Tab> {
    Tab::ALL
        .into_iter()
        .find(|t| t.label().eq_ignore_ascii_case(name))
}

/// A job started from the command line, whose end is announced on stdout
/// (so that scripts, such as `app/screenshots.sh`, know when to look).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Watched {
    Run,
    Generate,
}

/// The scripted pan.
struct PanBench {
    frames: usize,
    done: usize,
    pressed: bool,
    idle: String,
}

/// The viewer application.
pub struct ViewerApp {
    /// The UI state.
    pub state: ViewerState,
    worker: Option<JoinHandle<()>>,
    pending_run: bool,
    pending_generate: bool,
    pending_budget: Option<f64>,
    pending_heads_run: bool,
    watched: Option<Watched>,
    bench: Option<PanBench>,
}

impl ViewerApp {
    /// Starts the worker (waking `ctx` on each event) and applies `opts`.
    pub fn new(ctx: &egui::Context, opts: &StartOptions) -> std::io::Result<Self> {
        let ctx2 = ctx.clone();
        let (backend, port) = channel(Some(Arc::new(move || ctx2.request_repaint())));
        let worker = spawn(port, WorkerConfig::default())?;
        let mut state = ViewerState::new(backend);
        state.inputs.bundled_model = paths::resolve(paths::BUNDLED_MODEL);
        state.inputs.model_path = state.inputs.bundled_model.display().to_string();
        let mut app = Self {
            state,
            worker: Some(worker),
            pending_run: opts.run,
            pending_generate: opts.generate,
            pending_budget: opts.kv_budget,
            pending_heads_run: opts.run_heads,
            watched: None,
            bench: opts.bench_pan_frames.map(|frames| PanBench {
                frames,
                done: 0,
                pressed: false,
                idle: String::new(),
            }),
        };
        app.apply(opts);
        Ok(app)
    }

    fn apply(&mut self, opts: &StartOptions) {
        let s = &mut self.state;
        if opts.demo_large {
            open_demo_large(s);
        }
        let model = opts.model.clone().or_else(|| {
            (!opts.no_model && s.inputs.bundled_model.exists())
                .then(|| s.inputs.bundled_model.clone())
        });
        if let Some(m) = model {
            s.open_model(m);
        }
        if let Some(r) = &opts.report {
            if s.busy() {
                // One job at a time: queue the report behind the model.
                if let Some(b) = s.backend.as_mut() {
                    let job = b.new_job();
                    b.send(Command::OpenReport {
                        job,
                        path: r.clone(),
                    });
                }
            } else {
                s.open_report(r.clone());
            }
        }
        for path in &opts.eval {
            lcut_viewer_ui::files::open_eval_result(s, path.clone());
        }
        if let Some(t) = opts.tab {
            s.view.tab = t;
        }
        if let Some(p) = &opts.live_prompt {
            s.live.prompt.clone_from(p);
        }
        if let Some(c) = opts.l_cut {
            s.live.chosen_cut = Some(c);
        }
        if let Some(n) = opts.live_max_new_tokens {
            s.live.max_new_tokens = n;
        }
        if let Some(p) = &opts.live_policy {
            s.live.extra_text.clone_from(p);
        }
        if let Some(p) = &opts.prompts {
            s.inputs.prompts_file = p.display().to_string();
            s.inputs.prompts = lcut_viewer_ui::state::PromptChoice::File;
        }
    }

    /// Fills the head view's picks from `--kv-budget` once a report is
    /// open and no job runs; prints the plan (or why there is none).
    fn fill_pending_budget(&mut self) {
        let s = &mut self.state;
        let Some(budget) = self.pending_budget else {
            return;
        };
        if s.busy() || s.loaded.is_none() {
            return;
        }
        self.pending_budget = None;
        s.heads.budget = budget;
        match s.fill_heads_from_budget() {
            Ok(p) => println!(
                "heads done: K/V budget {budget}: L_cut {} + {} pairs hold {:.4} of full's K/V, \
                 keep {:.3} of the mass (SPEED+BoS within the budget: L_cut {}, {:.3})",
                p.cut,
                p.heads.len(),
                p.kv_share,
                p.mass_kept,
                p.speed_cut,
                p.speed_mass_kept
            ),
            Err(e) => {
                println!("failed: {e}");
                return;
            }
        }
        if std::mem::take(&mut self.pending_heads_run) && s.run_heads() {
            self.watched = Some(Watched::Generate);
        }
    }

    /// Starts what the command line asked for once the model is there: the
    /// diagnostic run, then the live generation; announces their ends.
    fn start_pending(&mut self) {
        self.fill_pending_budget();
        let s = &mut self.state;
        if let Some(w) = self.watched {
            if s.busy() {
                return;
            }
            self.watched = None;
            match (w, &s.error) {
                (_, Some(e)) => println!("failed: {e}"),
                (Watched::Run, None) => match &s.loaded {
                    Some(l) => println!(
                        "run done: {} prompts, recommended L_cut {} of {}",
                        l.report.traces.len(),
                        l.report.recommendation.l_cut,
                        l.report.model.num_layers
                    ),
                    None => println!("run stopped"),
                },
                (Watched::Generate, None) if s.live.status != LiveStatus::Done => {
                    println!("generation stopped");
                }
                (Watched::Generate, None) => println!(
                    "generation done: {} tokens, agreement {:.0}%{}",
                    s.live.full.len(),
                    100.0 * s.live.agreement(),
                    match &s.live.extra_policy {
                        Some(p) => format!(", {p} {:.0}%", 100.0 * s.live.extra_agreement()),
                        None => String::new(),
                    }
                ),
            }
        }
        if !(self.pending_run || self.pending_generate) || s.busy() {
            return;
        }
        if s.model.is_none() {
            // The model failed to load (or none was asked for): say so once.
            println!(
                "failed: {}",
                s.error.as_deref().unwrap_or("no model is open")
            );
            self.pending_run = false;
            self.pending_generate = false;
            return;
        }
        if self.pending_run {
            self.pending_run = false;
            if s.run_diagnose() {
                self.watched = Some(Watched::Run);
            }
        } else {
            self.pending_generate = false;
            if s.run_generate() {
                self.watched = Some(Watched::Generate);
            }
        }
    }

    fn bench_input(&mut self, raw: &mut egui::RawInput) {
        let Some(b) = self.bench.as_mut() else {
            return;
        };
        let Some(rect) = self
            .state
            .loaded
            .as_ref()
            .and_then(|l| l.caches.by_position.last_rect)
        else {
            return;
        };
        b.done += 1;
        // First `frames` idle frames (the renderer's baseline), then `frames`
        // frames dragging back and forth over the heatmap, 8 px per frame.
        if b.done <= b.frames {
            if b.done == 1 {
                self.state.frames.reset();
            }
            return;
        }
        let k = b.done - b.frames;
        let span = rect.width() * 0.6;
        let phase = (k as f32 * 8.0) % (2.0 * span);
        let dx = if phase < span {
            phase
        } else {
            2.0 * span - phase
        };
        let pos = egui::pos2(rect.left() + rect.width() * 0.8 - dx, rect.center().y);
        raw.events.push(egui::Event::PointerMoved(pos));
        if !b.pressed {
            raw.events.push(egui::Event::PointerButton {
                pos,
                button: egui::PointerButton::Primary,
                pressed: true,
                modifiers: egui::Modifiers::NONE,
            });
            b.pressed = true;
            b.idle = summary_line(&self.state);
            self.state.frames.reset();
        }
    }

    fn bench_finish(&mut self, ctx: &egui::Context) {
        let Some(b) = &self.bench else {
            return;
        };
        if b.done < 2 * b.frames {
            ctx.request_repaint();
            return;
        }
        println!("idle: {}", b.idle);
        println!("pan:  {}", summary_line(&self.state));
        ctx.send_viewport_cmd(egui::ViewportCommand::Close);
        self.bench = None;
    }
}

/// Frame-time summary of the frames recorded so far, for the bench output.
fn summary_line(state: &ViewerState) -> String {
    let f = &state.frames;
    let (Some(build), Some(interval)) = (f.build(), f.interval()) else {
        return "no frames".into();
    };
    let tex = state.loaded.as_ref().map(|l| {
        (
            l.caches.by_position.texture_size(),
            l.caches.by_position.rebuilds,
        )
    });
    format!(
        "{} frames; UI build mean {:.2} ms, p95 {:.2} ms, max {:.2} ms; \
         frame interval mean {:.2} ms, p95 {:.2} ms, max {:.2} ms; \
         position texture (size, builds so far) {:?}",
        interval.frames,
        build.mean_ms,
        build.p95_ms,
        build.max_ms,
        interval.mean_ms,
        interval.p95_ms,
        interval.max_ms,
        tex
    )
}

impl eframe::App for ViewerApp {
    fn raw_input_hook(&mut self, _ctx: &egui::Context, raw: &mut egui::RawInput) {
        self.bench_input(raw);
    }

    fn ui(&mut self, ui: &mut egui::Ui, _frame: &mut eframe::Frame) {
        show_viewer(ui, &mut self.state);
        self.start_pending();
        self.bench_finish(ui.ctx());
    }

    fn on_exit(&mut self, _gl: Option<&eframe::glow::Context>) {
        if let Some(b) = self.state.backend.as_mut() {
            let running = self.state.job.as_ref().map(|j| j.id);
            if let Some(job) = running {
                b.cancel(job);
            }
            b.send(Command::Shutdown);
        }
        // The worker stops at its next step; do not wait on a long prefill.
        drop(self.worker.take());
    }
}

/// Shows the large synthetic report (`--demo-large`).
#[cfg(feature = "demo")]
fn open_demo_large(s: &mut ViewerState) {
    use lcut_viewer_ui::large::{LargeSpec, large_report};
    match large_report(LargeSpec::default()) {
        Ok(r) => s.set_report(r, "synthetic large trace".into()),
        Err(e) => s.note(format!("error: {e}")),
    }
}

/// Without the `demo` feature there is no large synthetic report to show.
#[cfg(not(feature = "demo"))]
fn open_demo_large(s: &mut ViewerState) {
    s.note("error: --demo-large needs the viewer built with the `demo` feature");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_l_cut_flag_is_the_live_controls_cut() {
        let opts = StartOptions {
            no_model: true,
            l_cut: Some(22),
            ..StartOptions::default()
        };
        let mut app = ViewerApp::new(&egui::Context::default(), &opts).unwrap();
        assert_eq!(app.state.live_cut(), 22);
        // the report's chosen cut is another thing
        app.state.view.l_cut = 28;
        assert_eq!(app.state.live_cut(), 22);
        if let Some(b) = app.state.backend.as_mut() {
            b.send(Command::Shutdown);
        }
        if let Some(w) = app.worker.take() {
            w.join().unwrap();
        }
    }

    #[test]
    fn the_kv_budget_flag_fills_the_picks_once_a_report_is_open() {
        let opts = StartOptions {
            no_model: true,
            kv_budget: Some(0.6),
            ..StartOptions::default()
        };
        let mut app = ViewerApp::new(&egui::Context::default(), &opts).unwrap();
        app.fill_pending_budget();
        assert!(app.state.heads.picked.is_empty() && app.pending_budget.is_some());
        let report = lcut_diag::synthetic::synthetic_report(6, 16, 8, false).unwrap();
        app.state.set_report(report.clone(), "synthetic".into());
        app.fill_pending_budget();
        assert!(app.pending_budget.is_none());
        let plan = app.state.heads.plan.clone().unwrap();
        assert!(!plan.heads.is_empty() && plan.kv_share <= 0.6, "{plan:?}");
        assert_eq!(app.state.heads.pairs(), plan.heads);
        assert_eq!(app.state.view.l_cut, plan.cut);
        // the head file `lcut recommend --kv-budget 0.6` writes
        let cli = lcut_engine::heads::HeadAdvice::from_report(&report, 0.6).unwrap();
        assert_eq!(
            app.state.heads.head_file(&report.model, plan.cut),
            cli.head_file(&report.model)
        );
        if let Some(b) = app.state.backend.as_mut() {
            b.send(Command::Shutdown);
        }
        if let Some(w) = app.worker.take() {
            w.join().unwrap();
        }
    }

    #[test]
    fn models_on_the_command_line() {
        let dir = tempfile::tempdir().unwrap();
        let roots = StoreRoots::at(dir.path().join("hub"), dir.path().join("ollama"));
        assert!(check_model(dir.path(), &roots).is_ok());
        let gguf = dir.path().join("m.Q4_1.gguf");
        std::fs::write(&gguf, b"GGUF").unwrap();
        assert!(check_model(&gguf, &roots).is_ok());
        let txt = dir.path().join("m.txt");
        std::fs::write(&txt, b"").unwrap();
        let e = check_model(&txt, &roots).unwrap_err();
        assert!(e.contains("m.txt") && e.contains("a GGUF file"), "{e}");
        let e = check_model(&dir.path().join("gone.gguf"), &roots).unwrap_err();
        assert!(e.contains("gone.gguf") && e.contains("no such"), "{e}");
        // a hub cache name on disk passes; one that is not names the cache
        let snapshot = dir.path().join("hub/models--org--m/snapshots/abc123");
        std::fs::create_dir_all(&snapshot).unwrap();
        std::fs::write(
            dir.path()
                .join("hub/models--org--m/snapshots/abc123/m.gguf"),
            b"GGUF",
        )
        .unwrap();
        assert!(check_model(Path::new("org/m"), &roots).is_ok());
        let e = check_model(Path::new("org/other"), &roots).unwrap_err();
        assert!(e.contains("models--org--other") && e.contains("hub"), "{e}");
    }
}
