//! `lcut train-lora`: a SPEED-aware LoRA adapter by self-distillation (see
//! `lcut_train::lora_train`). The arguments are parsed here into an
//! [`AdapterJob`]; progress is shown as bars (or, in a batch job's log, as
//! lines); the library writes the adapter (PEFT layout, with
//! `lcut_policy`), a resumable checkpoint and `training.json`.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Result;
use indicatif::{ProgressBar, ProgressStyle};
use lcut_policy::PolicySpec;
use lcut_train::lora_train::{AdapterJob, DataOptions, LayerSpan, LoraTrainOptions, train_adapter};

/// Arguments of `lcut train-lora`.
#[derive(Debug, clap::Args)]
pub struct TrainLoraArgs {
    /// Base model (Hugging Face folder or .gguf file), loaded dense in f32.
    #[arg(long)]
    model: PathBuf,
    /// The SPEED policy to train for (e.g. speed:22+bos).
    #[arg(long)]
    policy: PolicySpec,
    /// LoRA rank.
    #[arg(long, default_value_t = 8)]
    lora: usize,
    /// LoRA alpha (scale alpha / rank).
    #[arg(long, default_value_t = 16.0)]
    alpha: f64,
    /// Layers to adapt, A..B (end exclusive); the cut to the top by default.
    /// A below the cut trains those layers too, on every token of a
    /// sequence (slower: the whole sequence runs there, not only the rows
    /// that exist above the cut).
    #[arg(long)]
    layers: Option<LayerSpan>,
    /// Projections to adapt, comma-separated (q,k,v,o,gate,up,down; a model
    /// with fused projections names them qkv and gate_up).
    #[arg(long, default_value = "q,k,v,o")]
    modules: String,
    /// Training prompts drawn from lcut's task generators.
    #[arg(long, default_value_t = 140)]
    prompts: usize,
    /// First seed of the task generators (one suite of prompts a seed, the
    /// next seeds used when more are needed; the committed evaluation suite
    /// uses 13).
    #[arg(long, default_value_t = 101)]
    prompt_seed: u64,
    /// Skip prompts longer than this many tokens.
    #[arg(long, default_value_t = 1100)]
    max_prompt_tokens: usize,
    /// Tokens the full model continues each prompt with (the targets).
    #[arg(long, default_value_t = 24)]
    max_new_tokens: usize,
    /// Weight of the logit-distillation term: KL from the full model's
    /// next-token distribution (its top --kd-top-k tokens) to the adapted
    /// model's, added to the cross-entropy on its tokens (0: tokens only).
    #[arg(long, default_value_t = 1.0)]
    kd_weight: f64,
    /// Tokens kept of each of the full model's distributions.
    #[arg(long, default_value_t = 32)]
    kd_top_k: usize,
    /// The full model's continuations and distributions as JSON Lines: read
    /// when the file exists (made with the same settings), else made and
    /// written there, so runs for other cuts share them.
    #[arg(long)]
    teacher: Option<PathBuf>,
    /// Draw every kind of prompt as often as the most frequent one (the
    /// sequences of rarer kinds repeated) instead of as the generators
    /// happened to give them.
    #[arg(long)]
    balance_kinds: bool,
    /// Leave out every prompt of this suite (e.g. the evaluation suite), so
    /// that an evaluation on it is on held-out prompts.
    #[arg(long)]
    exclude_suite: Option<PathBuf>,
    /// Optimizer steps.
    #[arg(long, default_value_t = 1000)]
    steps: usize,
    /// Sequences per step.
    #[arg(long, default_value_t = 4)]
    batch: usize,
    /// Learning rate at the start (decays linearly to --lr-end).
    #[arg(long, default_value_t = 1e-3)]
    lr: f64,
    /// Learning rate at the end.
    #[arg(long, default_value_t = 2e-4)]
    lr_end: f64,
    /// AdamW weight decay.
    #[arg(long, default_value_t = 0.0)]
    weight_decay: f64,
    /// Gradient clipping (global norm).
    #[arg(long, default_value_t = 1.0)]
    clip: f64,
    /// Seed of the adapter's initialisation and of the batch draws.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Steps between checkpoints (a rerun with the same --out resumes).
    #[arg(long, default_value_t = 50)]
    checkpoint_every: usize,
    /// Output folder: the adapter, checkpoint/ and training.json.
    #[arg(long)]
    out: PathBuf,
}

/// Progress of one phase: a bar on a terminal; elsewhere (a batch job's
/// log) a line at every twentieth of the work, so a log shows it too.
struct Progress {
    bar: ProgressBar,
    what: &'static str,
    len: usize,
    lines: bool,
    started: Instant,
}

impl Progress {
    fn new(len: usize, what: &'static str) -> Self {
        let bar = ProgressBar::new(len as u64);
        let style = format!("{what} {{bar:30}} {{pos}}/{{len}} {{msg}} [{{elapsed}} < {{eta}}]");
        if let Ok(s) = ProgressStyle::with_template(&style) {
            bar.set_style(s);
        }
        Self {
            bar,
            what,
            len,
            lines: !std::io::stderr().is_terminal(),
            started: Instant::now(),
        }
    }

    /// `done` of the work is done; `msg` says how it goes.
    fn set(&self, done: usize, msg: &str) {
        self.bar.set_position(done as u64);
        self.bar.set_message(msg.to_string());
        let every = (self.len / 20).max(1);
        if self.lines && (done.is_multiple_of(every) || done == self.len) {
            let secs = self.started.elapsed().as_secs_f64();
            eprintln!("{} {done}/{} {msg} ({secs:.0} s)", self.what, self.len);
        }
    }

    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

impl TrainLoraArgs {
    /// The job these arguments describe; `command` is the command line
    /// recorded in `training.json`.
    fn job(&self, command: String) -> Result<AdapterJob> {
        Ok(AdapterJob {
            model: crate::common::resolve_model(&self.model)?,
            policy: self.policy,
            rank: self.lora,
            alpha: self.alpha,
            layers: self.layers,
            modules: self.modules.split(',').map(str::to_string).collect(),
            data: DataOptions {
                prompts: self.prompts,
                prompt_seed: self.prompt_seed,
                max_prompt_tokens: self.max_prompt_tokens,
                max_new_tokens: self.max_new_tokens,
                kd_top_k: self.kd_top_k,
                teacher: self.teacher.clone(),
                balance_kinds: self.balance_kinds,
                exclude_suite: self.exclude_suite.clone(),
            },
            train: LoraTrainOptions {
                steps: self.steps,
                batch: self.batch,
                lr: self.lr,
                lr_end: self.lr_end,
                weight_decay: self.weight_decay,
                clip: self.clip,
                seed: self.seed,
                checkpoint_every: self.checkpoint_every,
                kd_weight: self.kd_weight,
            },
            out: self.out.clone(),
            command,
        })
    }
}

/// The phases of a job, each shown by a [`Progress`] bar; notes go to stderr.
#[derive(Default)]
struct Bars(Option<Progress>);

impl lcut_train::lora_train::Progress for Bars {
    fn start(&mut self, phase: &'static str, len: usize) {
        self.0 = Some(Progress::new(len, phase));
    }

    fn set(&mut self, done: usize, message: &str) {
        if let Some(p) = &self.0 {
            p.set(done, message);
        }
    }

    fn finish(&mut self) {
        if let Some(p) = self.0.take() {
            p.finish();
        }
    }

    fn note(&mut self, line: &str) {
        eprintln!("{line}");
    }
}

/// Run `lcut train-lora`.
pub fn run(args: &TrainLoraArgs) -> Result<()> {
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let state = train_adapter(&args.job(command)?, &mut Bars::default())?;
    let last =
        state.losses.iter().rev().take(50).sum::<f64>() / state.losses.len().clamp(1, 50) as f64;
    println!(
        "wrote adapter {} ({} steps, last-50 mean loss {last:.4}, training {:.0} s)",
        args.out.display(),
        state.step,
        state.train_seconds
    );
    Ok(())
}
