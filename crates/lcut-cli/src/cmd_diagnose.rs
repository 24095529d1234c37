//! `lcut diagnose`: full-depth greedy runs over a prompt set with the
//! diagnostic probe; writes `OUT/report.json` and prints the recommendation.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use indicatif::ProgressBar;
use lcut_engine::diagnose::memory::diagnose_memory;
use lcut_engine::diagnose::{
    BUNDLED_PROMPTS, DiagnoseEvent, DiagnoseOptions, LabelledPrompt, PromptSpec, diagnose_prepared,
    prepare_prompts_with, read_prompt_set,
};
use lcut_engine::serve_shape::{BudgetShape, read_served_prompts};
use lcut_engine::{GenerationConfig, Session};
use lcut_model::default_attention_block_elems;
use lcut_model::memory::{MemoryEstimate, kv_cache_bytes};
use lcut_policy::PolicyKind;
use lcut_trace::{Report, write_report_json};

use crate::memory_check::{check_before_loading, report_peak};

/// Arguments of `lcut diagnose`.
#[derive(Debug, Args)]
pub struct DiagnoseArgs {
    /// LoRA adapter options (`--lora DIR`, `--lora-mode`).
    #[command(flatten)]
    pub lora: crate::lora_opt::LoraArgs,
    /// The model and how it loads (`--model`, `--dtype`, `--kv-dtype`,
    /// `--device`).
    #[command(flatten)]
    pub load: crate::common::ModelArgs,
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
    /// Run even when the memory the run needs (printed before the model is
    /// loaded) is more than the machine has free.
    #[arg(long)]
    pub force: bool,
    /// Also recommend the cut and kept (layer, K/V head) pairs for this
    /// share of the full model's K/V, in (0, 1], checked on the run's
    /// prompts: SPEED+BoS at the largest cut that fits and the plans of the
    /// cuts a fifth of the depth below it, teacher-forced against the full
    /// model, the best agreement kept; writes OUT/heads-kv<BUDGET>.json and
    /// the candidates under OUT/heads-kv<BUDGET>-check/.
    #[arg(long, value_parser = crate::cmd_recommend::parse_budget)]
    pub kv_budget: Option<f64>,
    /// Read the K/V budget at the mean shape of these prompts (a task suite
    /// or a prompt set: the prompts you will serve) instead of the run's
    /// own: anchors and decode-phase tokens weigh more on short prompts, so
    /// a cut holds a different share of full's K/V on other prompts.
    #[arg(long, requires = "kv_budget")]
    pub kv_budget_at: Option<PathBuf>,
    /// With --kv-budget-at: new tokens per served prompt (by default a
    /// suite item's own budget or 24, as `lcut eval` runs it, and
    /// --max-new-tokens for a prompt set).
    #[arg(long, requires = "kv_budget_at")]
    pub kv_budget_new_tokens: Option<usize>,
    /// Record the logit lens: each decode step's hidden states through the
    /// final norm and LM head, where the answer forms (an LM-head product
    /// per layer per step: on SmolLM2 about 6.5 times a decode step's arithmetic).
    #[arg(long)]
    pub lens: bool,
    /// Also write every decode step's lens logits, f32 [layers + 1, vocab]
    /// per step, to OUT/lens-logits.safetensors (diagnose only).
    #[arg(long, requires = "lens")]
    pub save_lens_logits: bool,
    /// After the run, measure causal prompt knockout: per layer (or band of
    /// --knockout-band layers), the prompt hidden from the decode queries
    /// there only, teacher-forced on the full model's continuation: KL and
    /// top-1 agreement against the full model (one pass per band and prompt).
    #[arg(long)]
    pub knockout: bool,
    /// Layers per knockout band (1: one layer at a time).
    #[arg(long, default_value_t = 1, requires = "knockout")]
    pub knockout_band: usize,
    /// On a mixture-of-experts model, after the run, compare the decode
    /// tokens' routing under this policy (e.g. speed:2+bos) with the full
    /// model's, both teacher-forced on the run's tokens: the top-k overlap
    /// per layer, in the report beside the router's entropy and the
    /// experts' load (two more passes per prompt).
    #[arg(long)]
    pub routing_policy: Option<lcut_policy::PolicySpec>,
}

/// The file `--save-lens-logits` writes in the output folder.
pub const LENS_LOGITS_FILE: &str = "lens-logits.safetensors";

/// Parse `I/N`, or `auto/N` with the index from a Slurm job array
/// (`SLURM_ARRAY_TASK_ID`) or a Kubernetes Indexed Job (`JOB_COMPLETION_INDEX`).
pub fn parse_shard(s: &str) -> Result<(usize, usize)> {
    Ok(lcut_engine::shard::parse_shard(s)?)
}

/// A progress bar over prompts, with the current prompt's step.
pub fn progress_bar() -> ProgressBar {
    crate::common::count_bar(0, "prompts")
}

/// Feed diagnose events to a progress bar; never cancels.
pub fn on_event(bar: &ProgressBar) -> impl FnMut(&DiagnoseEvent) -> bool + '_ {
    move |e| {
        match e {
            DiagnoseEvent::PromptStarted { total, id, index } => {
                bar.set_length(*total as u64);
                bar.set_position(*index as u64);
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

/// What a diagnose or sweep run works on: the loaded model, the prompts of
/// this shard tokenized, and the prompts file's name.
pub struct Inputs {
    /// The model, tokenizer and adapter.
    pub session: Session,
    /// The prompts of the run's shard, tokenized.
    pub prepared: Vec<LabelledPrompt>,
    /// The prompts file, for the report.
    pub file: Option<String>,
    /// What the run was estimated to need.
    pub need: MemoryEstimate,
}

/// The prompt set of the arguments and its file's name.
fn read_prompts(args: &DiagnoseArgs) -> Result<(Vec<PromptSpec>, Option<String>)> {
    Ok(match (&args.prompt, &args.prompts) {
        (Some(p), _) => (vec![PromptSpec::text("prompt", p)], None),
        (None, Some(f)) => (read_prompt_set(f)?, Some(f.display().to_string())),
        (None, None) => {
            let f = lcut_engine::bundled(BUNDLED_PROMPTS);
            (read_prompt_set(&f)?, Some(BUNDLED_PROMPTS.to_string()))
        }
    })
}

/// Load the model and prompts of a diagnose or sweep run: the prompts are
/// tokenized and the run's memory estimated (weights, K/V of the longest
/// prompt, traces and probe buffers) before the weights are loaded, and a
/// run that does not fit is refused unless `--force`. For a sweep the
/// estimate is a floor: it also holds a cache per cutoff. `other` are the
/// kinds of the policies the run prefills beside its own (a sweep's axis).
pub fn load_inputs(args: &DiagnoseArgs, other: &[PolicyKind]) -> Result<Inputs> {
    let pending = args.load.open()?;
    let (prompts, file) = read_prompts(args)?;
    let opts = options(args, file.clone())?;
    if let Some(band) = opts.knockout {
        // a band the model cannot hold is refused before the weights load
        lcut_engine::diagnose::knockout_policies(pending.config().num_layers, band)?;
    }
    let prompter = pending.prompter()?;
    let prepared = prepare_prompts_with(&prompts, &opts, &|user, system, template| {
        prompter.prepare_text(user, system, template)
    })?;
    let lens: Vec<usize> = prepared.iter().map(|p| p.prompt.len()).collect();
    let chunk = GenerationConfig::default().prefill_chunk;
    let block = default_attention_block_elems(&pending.device);
    let longest = lens.iter().copied().max().unwrap_or(0);
    // the K/V of the longest prompt and its new tokens, in the cache's
    // dtype (f16 for a quantized run), not the activations'
    let total = longest + opts.max_new_tokens;
    let kv = kv_cache_bytes(pending.config(), pending.kv_dtype, total);
    let mut kinds = vec![opts.policy.map_or(PolicyKind::Full, |p| p.kind)];
    kinds.extend_from_slice(other);
    let decode_phase = prepared
        .iter()
        .map(|p| p.prompt.len() - p.prompt.decode_start)
        .max()
        .unwrap_or(0);
    let need = diagnose_memory(
        pending.config(),
        (pending.dtype(), pending.weight_bytes()),
        (&lens, decode_phase),
        &opts,
        (chunk, block),
    )
    .with_kv(kv)
    .for_prefill_path(
        (&pending.device, &kinds),
        pending.config(),
        pending.dtype(),
        (total, chunk),
    );
    let plural = if lens.len() == 1 { "" } else { "s" };
    let what = format!("{} prompt{plural} of at most {longest} tokens", lens.len());
    let need = check_before_loading(&what, &need, (&pending.device, pending.mode), args.force)?;
    let mut session = pending.load()?;
    crate::memory_check::say_attention_path(&session.model);
    args.lora.apply_to_session(&mut session, &[])?;
    Ok(Inputs {
        session,
        prepared,
        file,
        need,
    })
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
        lens: args.lens,
        lens_logits: args
            .save_lens_logits
            .then(|| args.out.join(LENS_LOGITS_FILE)),
        knockout: args.knockout.then_some(args.knockout_band),
        routing_policy: args.routing_policy,
    })
}

/// Print the recommendation of a report.
pub fn print_summary(report: &Report) {
    let r = &report.recommendation;
    println!("{}", r.explanation);
    if let Some(line) = lcut_report::report_formation_sentence(report) {
        println!("{line}");
    }
    if let Some(line) = lcut_report::knockout_sentence(report) {
        println!("{line}");
    }
    if let Some(line) = lcut_report::routing_sentence(report) {
        println!("{line}");
    }
    print_candidate_votes(report);
    println!("recommended L_cut = {} of {}", r.l_cut, r.num_layers);
    if let Some(sweep) = &report.sweep {
        match sweep.knee {
            Some(k) => println!("sweep knee (quality vs cost) at L_cut = {k}"),
            None => println!("sweep: no cutoff keeps agreement within the threshold"),
        }
    }
}

/// The cuts the logit lens's formation layer and the knockout curve would
/// vote, printed beside the recommendation but not among its votes: on
/// SmolLM2's suite neither moved the recommendation nearer the accuracy
/// knee (docs/suite-and-calibration.md).
fn print_candidate_votes(report: &Report) {
    let formation = report.curves.formation().map(|f| f.median);
    let knockout = lcut_diag::knockout_band(&report.traces).and_then(|band| {
        lcut_diag::vote_knockout(&report.curves, band, lcut_diag::KNOCKOUT_KL_MIN)
    });
    if formation.is_none() && knockout.is_none() {
        return;
    }
    let show = |v: Option<usize>| v.map_or_else(|| "-".to_string(), |c| c.to_string());
    println!(
        "not among the votes: formation layer {}, knockout {} (1 + the highest band whose \
         knockout moves the answer more than {} nats)",
        show(formation),
        show(knockout),
        lcut_diag::KNOCKOUT_KL_MIN
    );
}

/// Run `lcut diagnose`.
pub fn run(args: &DiagnoseArgs) -> Result<()> {
    // the served prompts are read before the model loads: a bad file stops here
    let served = args
        .kv_budget_at
        .as_deref()
        .map(read_served_prompts)
        .transpose()?;
    let inputs = load_inputs(args, &[])?;
    if args.kv_budget.is_some() {
        // a budget's plans keep K/V heads: refused here on a layout that
        // gives them no meaning, before the diagnosis runs
        inputs
            .session
            .model
            .check_kept_heads("kept K/V heads (--kv-budget)")?;
    }
    let opts = options(args, inputs.file.clone())?;
    let served_shape = served
        .map(|s| {
            let default_new = match s.is_suite() {
                true => crate::cmd_eval::DEFAULT_NEW_TOKENS,
                false => args.max_new_tokens,
            };
            s.shape(
                &inputs.session,
                args.kv_budget_new_tokens,
                default_new,
                !args.raw,
            )
        })
        .transpose()?;
    if let Some(path) = &opts.lens_logits {
        std::fs::create_dir_all(&args.out)
            .with_context(|| format!("creating {}", args.out.display()))?;
        let cfg = inputs.session.model.config();
        let per_step = 4 * (cfg.num_layers + 1) * cfg.vocab_size;
        let most = per_step * opts.max_new_tokens * inputs.prepared.len();
        eprintln!(
            "lens logits: {:.1} MB per step, at most {:.2} GB in {}",
            per_step as f64 / 1e6,
            most as f64 / 1e9,
            path.display()
        );
    }
    let bar = progress_bar();
    let report = diagnose_prepared(
        &inputs.session,
        &inputs.prepared,
        &opts,
        &mut on_event(&bar),
    )?;
    bar.finish_and_clear();
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let path = args.out.join("report.json");
    write_report_json(&path, &report)?;
    print_summary(&report);
    println!("wrote {} ({} prompts)", path.display(), report.traces.len());
    if let Some(lens) = &opts.lens_logits {
        println!("wrote {}", lens.display());
    }
    let ranking = lcut_engine::heads::write_ranking(&args.out, &report)?;
    println!(
        "wrote {} (the (layer, K/V head) pairs by decode-to-prefill mass)",
        ranking.display()
    );
    if let Some(budget) = args.kv_budget {
        let at = served_shape.unwrap_or_else(|| BudgetShape::of_report(&report));
        check_budget(args, &inputs, &report, (budget, &at))?;
    }
    report_peak(&inputs.need, inputs.session.model.device());
    Ok(())
}

/// `--kv-budget`: check the budget's candidate plans on the run's prompts,
/// write the chosen head file and print every candidate's figures.
fn check_budget(
    args: &DiagnoseArgs,
    inputs: &Inputs,
    report: &Report,
    (budget, at): (f64, &BudgetShape),
) -> Result<()> {
    let out = crate::cmd_recommend::head_file_path(&args.out, budget);
    let dir = args.out.join(format!("heads-kv{budget}-check"));
    let bar = progress_bar();
    bar.println(format!(
        "checking the plans of K/V budget {budget} (read at {}: {}) on {} prompts",
        at.read_at,
        at.shape(),
        inputs.prepared.len()
    ));
    let checked = lcut_engine::head_check::check_budget(
        &inputs.session,
        report,
        &inputs.prepared,
        (budget, at),
        args.max_new_tokens,
        &dir,
        &mut on_event(&bar),
    )?;
    bar.finish_and_clear();
    lcut_engine::heads::write_head_file(&out, &checked.advice, &report.model)
        .with_context(|| format!("writing the head file {}", out.display()))?;
    print!("{}", checked.table());
    println!("{}", checked.advice.summary(&out));
    println!(
        "wrote {} (chosen, * above) and {}",
        out.display(),
        dir.join("candidates.json").display()
    );
    Ok(())
}
