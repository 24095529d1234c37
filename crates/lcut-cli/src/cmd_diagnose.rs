//! `lcut diagnose`: full-depth greedy runs over a prompt set with the
//! diagnostic probe; writes `OUT/report.json` and prints the recommendation.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use lcut_engine::Session;
use lcut_engine::diagnose::{
    BUNDLED_PROMPTS, DiagnoseEvent, DiagnoseOptions, PromptSpec, diagnose, read_prompt_set,
};
use lcut_trace::{Report, write_report_json};

use crate::args::{DeviceArg, KvDtypeArg, WeightArg};
use crate::common::open_session;

/// Arguments of `lcut diagnose`.
#[derive(Debug, Args)]
pub struct DiagnoseArgs {
    /// LoRA adapter options (`--lora DIR`, `--lora-mode`).
    #[command(flatten)]
    pub lora: crate::lora_opt::LoraArgs,
    /// Model: a folder, a GGUF file, a Hugging Face cache name
    /// `ORG/NAME[@REV][:FILE]` or an Ollama name `NAME[:TAG]` (`lcut models`
    /// lists them); the bundled model by default.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Prompt set (JSON Lines: {"id", "prompt", "system"?}); the bundled set by default.
    #[arg(long)]
    pub prompts: Option<PathBuf>,
    /// A single prompt instead of a prompt set.
    #[arg(long, conflicts_with = "prompts")]
    pub prompt: Option<String>,
    /// Greedy tokens per prompt.
    #[arg(long, default_value_t = 16)]
    pub max_new_tokens: usize,
    /// Output folder (report.json goes there).
    #[arg(long, default_value = "runs/latest")]
    pub out: PathBuf,
    /// Run shard I of N (0-based), e.g. 0/4; auto/N takes I from
    /// SLURM_ARRAY_TASK_ID or JOB_COMPLETION_INDEX.
    #[arg(long)]
    pub shard: Option<String>,
    /// Most columns of the layer x prompt-position map.
    #[arg(long, default_value_t = 128)]
    pub max_prompt_bins: usize,
    /// Do not apply the chat template.
    #[arg(long)]
    pub raw: bool,
    /// Recommender thresholds as JSON (any subset of tail_mass_max,
    /// entropy_max, mass_min, plateau_eps, agreement_drop_max).
    #[arg(long)]
    pub thresholds: Option<String>,
    /// dtype: f32, bf16, f16, or q (a GGUF's weights kept quantized).
    #[arg(long, default_value = "f32", ignore_case = true)]
    pub dtype: WeightArg,
    /// K/V cache storage: auto (f16 for `--dtype q`, else the weights'
    /// dtype), f32, f16 or bf16.
    #[arg(long, value_enum, default_value = "auto", ignore_case = true)]
    pub kv_dtype: KvDtypeArg,
    /// cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: DeviceArg,
}

/// Parse `I/N`, or `auto/N` with the index from a Slurm job array
/// (`SLURM_ARRAY_TASK_ID`) or a Kubernetes Indexed Job (`JOB_COMPLETION_INDEX`).
pub fn parse_shard(s: &str) -> Result<(usize, usize)> {
    Ok(lcut_engine::shard::parse_shard(s)?)
}

/// A progress bar over prompts, with the current prompt's step.
pub fn progress_bar() -> ProgressBar {
    ProgressBar::new(0).with_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} prompts {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    )
}

/// Feed diagnose events to a progress bar; never cancels.
pub fn on_event(bar: &ProgressBar) -> impl FnMut(&DiagnoseEvent) -> bool + '_ {
    move |e| {
        match e {
            DiagnoseEvent::PromptStarted { total, id, .. } => {
                bar.set_length(*total as u64);
                bar.set_message(id.clone());
            }
            DiagnoseEvent::Prefill { done, total, .. } => {
                bar.set_message(format!("prefill {done}/{total} tokens"));
            }
            DiagnoseEvent::Step {
                step, max_steps, ..
            } => {
                bar.set_message(format!("step {step}/{max_steps}"));
            }
            DiagnoseEvent::PromptDone { .. } => bar.inc(1),
        }
        true
    }
}

/// Load the session and prompts of a diagnose or sweep run.
pub fn load_inputs(args: &DiagnoseArgs) -> Result<(Session, Vec<PromptSpec>, Option<String>)> {
    let mut session = open_session(&args.model, args.dtype, args.kv_dtype, args.device)?;
    args.lora.apply_to_session(&mut session, &[])?;
    let (prompts, file) = match (&args.prompt, &args.prompts) {
        (Some(p), _) => (vec![PromptSpec::text("prompt", p)], None),
        (None, Some(f)) => (read_prompt_set(f)?, Some(f.display().to_string())),
        (None, None) => {
            let f = lcut_engine::bundled(BUNDLED_PROMPTS);
            (read_prompt_set(&f)?, Some(BUNDLED_PROMPTS.to_string()))
        }
    };
    Ok((session, prompts, file))
}

/// The run options from the arguments.
pub fn options(args: &DiagnoseArgs, prompts_file: Option<String>) -> Result<DiagnoseOptions> {
    let thresholds = match &args.thresholds {
        Some(json) => {
            serde_json::from_str(json).context("--thresholds: not a JSON object of thresholds")?
        }
        None => Default::default(),
    };
    Ok(DiagnoseOptions {
        max_new_tokens: args.max_new_tokens,
        thresholds,
        max_prompt_bins: args.max_prompt_bins,
        shard: args.shard.as_deref().map(parse_shard).transpose()?,
        use_chat_template: !args.raw,
        prompts_file,
        policy: None,
    })
}

/// Print the recommendation of a report.
pub fn print_summary(report: &Report) {
    let r = &report.recommendation;
    println!("{}", r.explanation);
    println!("recommended L_cut = {} of {}", r.l_cut, r.num_layers);
    if let Some(sweep) = &report.sweep {
        match sweep.knee {
            Some(k) => println!("sweep knee (quality vs cost) at L_cut = {k}"),
            None => println!("sweep: no cutoff keeps agreement within the threshold"),
        }
    }
}

/// Run `lcut diagnose`.
pub fn run(args: &DiagnoseArgs) -> Result<()> {
    let (session, prompts, file) = load_inputs(args)?;
    let opts = options(args, file)?;
    let bar = progress_bar();
    let report = diagnose(&session, &prompts, &opts, &mut on_event(&bar))?;
    bar.finish_and_clear();
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let path = args.out.join("report.json");
    write_report_json(&path, &report)?;
    print_summary(&report);
    println!("wrote {} ({} prompts)", path.display(), report.traces.len());
    Ok(())
}
