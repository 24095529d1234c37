//! A worker without an engine, for tests and the demo mode: it answers every
//! [`Command`] the way the real worker does, with progress, cancellation and
//! synthetic reports from `lcut_diag::synthetic`.

use std::thread::JoinHandle;
use std::time::Duration;

use lcut_diag::synthetic::synthetic_report;

use crate::backend::{
    Command, Event, JobId, LiveMetrics, LiveToken, ModelSummary, PromptSource, WorkerPort,
};
use crate::jobs::{serve_export, serve_open_report};

/// How the fake worker behaves.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FakeOptions {
    /// Progress steps of a diagnostic run.
    pub diagnose_steps: usize,
    /// Pause between steps (diagnose and generate).
    pub step_delay: Duration,
    /// Layers of the synthetic model.
    pub layers: usize,
    /// Heads of the synthetic model.
    pub heads: usize,
}

impl Default for FakeOptions {
    fn default() -> Self {
        Self {
            diagnose_steps: 8,
            step_delay: Duration::from_millis(5),
            layers: 16,
            heads: 8,
        }
    }
}

/// The summary the fake worker reports for any model path (folder or `.gguf`).
pub fn fake_model(path: &str, o: &FakeOptions) -> ModelSummary {
    ModelSummary {
        path: path.to_string(),
        arch: "llama".into(),
        num_layers: o.layers,
        num_heads: o.heads,
        num_kv_heads: o.heads.div_ceil(2),
        head_dim: 16,
        has_tokenizer: true,
        has_chat_template: true,
    }
}

fn diagnose(port: &WorkerPort, job: JobId, prompts: &PromptSource, sweep: bool, o: &FakeOptions) {
    let n_prompts = match prompts {
        PromptSource::Typed(_) => 1,
        _ => 6,
    };
    for i in 0..o.diagnose_steps {
        if port.is_cancelled(job) {
            port.send(Event::Cancelled);
            return;
        }
        port.progress(i, o.diagnose_steps, format!("prompt {}", i % n_prompts));
        std::thread::sleep(o.step_delay);
    }
    match synthetic_report(n_prompts, o.layers, o.heads, sweep) {
        Ok(report) => port.send(Event::ReportReady {
            report: Box::new(report),
            source: "run on the fake backend".into(),
        }),
        Err(e) => port.send(Event::DiagnoseFailed(e.to_string())),
    };
}

fn generate(port: &WorkerPort, job: JobId, l_cut: usize, max_new_tokens: usize, o: &FakeOptions) {
    port.send(Event::GenerationStarted {
        full_policy: "full".into(),
        speed_policy: format!("speed:{l_cut}+bos"),
        prompt_len: 12,
    });
    let bytes_per_token = 2 * o.heads.div_ceil(2) as u64 * 16 * 4;
    let mut full_m = LiveMetrics::default();
    let mut speed_m = LiveMetrics::default();
    for k in 0..max_new_tokens {
        if port.is_cancelled(job) {
            port.send(Event::Cancelled);
            return;
        }
        std::thread::sleep(o.step_delay);
        let t = (k + 1) as f64 * 0.001;
        let agree = k % 5 != 3;
        let tok = |id: u32| LiveToken {
            id,
            text: format!(" w{id}"),
        };
        for (m, cut) in [(&mut full_m, o.layers), (&mut speed_m, l_cut)] {
            m.tokens = k + 1;
            m.ttft_s = Some(m.ttft_s.unwrap_or(t));
            m.tpot_s = (k > 0).then_some(0.001);
            m.kv_bytes = bytes_per_token * (cut as u64 * 11 + o.layers as u64 * (2 + k as u64));
        }
        port.send(Event::GenerationStep {
            index: k,
            full: Some(tok(k as u32)),
            speed: Some(tok(if agree { k as u32 } else { 1000 + k as u32 })),
            agree,
            kl: (k < 3).then_some(0.01 * k as f32),
            full_metrics: full_m,
            speed_metrics: speed_m,
        });
    }
    port.send(Event::GenerationDone {
        full_metrics: full_m,
        speed_metrics: speed_m,
    });
}

/// Serves commands until `Shutdown` or until the UI's end is gone.
pub fn serve(port: WorkerPort, o: FakeOptions) {
    while let Some(cmd) = port.recv() {
        match cmd {
            Command::OpenModel(path) => {
                let p = path.display().to_string();
                if p.trim().is_empty() {
                    port.send(Event::ModelFailed(
                        "no model folder or .gguf file given".into(),
                    ));
                } else {
                    port.send(Event::ModelOpened(fake_model(&p, &o)));
                }
            }
            Command::OpenReport { path, .. } => serve_open_report(&port, &path),
            Command::RunDiagnose {
                job,
                prompts,
                sweep_context_len,
                ..
            } => diagnose(&port, job, &prompts, sweep_context_len.is_some(), &o),
            Command::RunGenerate {
                job,
                l_cut,
                max_new_tokens,
                ..
            } => generate(&port, job, l_cut, max_new_tokens, &o),
            Command::Export {
                report,
                format,
                dir,
                ..
            } => serve_export(&port, &report, format, &dir),
            Command::Cancel(_) => {}
            Command::Shutdown => break,
        }
    }
}

/// Starts the fake worker on its own thread.
pub fn spawn(port: WorkerPort, o: FakeOptions) -> JoinHandle<()> {
    std::thread::spawn(move || serve(port, o))
}
