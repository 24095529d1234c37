//! `lcut generate`: stream a generation under a policy, optionally side by
//! side with a reference policy (per-step agreement and KL).

use std::io::Write;
use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use lcut_engine::{
    Generation, GenerationConfig, GenerationOutput, LockstepEvent, PreparedPrompt, Sampling,
    Session, compare_models,
};
use lcut_policy::{Policy, PolicyKind, PolicySpec};

use lcut_model::Decoder;
use lcut_model::default_attention_block_elems;
use lcut_model::memory::{MemoryEstimate, estimate, kv_cache_bytes};

use crate::common::{PendingModel, parse_ids, write_atomic};
use crate::memory_check::{check_before_loading, report_peak};

/// Arguments of `lcut generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// The user prompt (through the chat template when the model has one).
    prompt: Option<String>,
    /// Generate every prompt of this prompt set instead (JSON Lines of
    /// `{"id": ..., "prompt": ..., "system"?: ...}`), up to eight at a time
    /// decoded side by side; each result is printed as it ends, `--json`
    /// writes them all.
    #[arg(long, conflicts_with_all = ["prompt", "ids", "compare", "system"])]
    prompts: Option<PathBuf>,
    /// LoRA adapter options (`--lora DIR`, `--lora-mode`).
    #[command(flatten)]
    pub lora: crate::lora_opt::LoraArgs,
    /// The model and how it loads (`--model`, `--dtype`, `--kv-dtype`,
    /// `--device`).
    #[command(flatten)]
    pub load: crate::common::ModelArgs,
    /// Policy to generate under.
    #[arg(long, default_value = "speed:3/4+bos")]
    policy: PolicySpec,
    /// Also run this policy in lockstep and compare (e.g. full). With
    /// `--lora`, it runs on the base model (without the adapter), so that
    /// the adapted policy is set beside the model it was made from.
    #[arg(long)]
    compare: Option<PolicySpec>,
    /// System message (for `+system` anchors).
    #[arg(long)]
    system: Option<String>,
    /// Do not apply the chat template; the last prompt token starts decoding.
    #[arg(long)]
    raw: bool,
    /// Prompt as token ids instead of text, all of them prompt: generation continues after the last id.
    ///
    /// The ids are used as given (no chat template, no BoS added); --decode-start says where
    /// the prompt's decode-phase part begins.
    #[arg(long, conflicts_with = "prompt")]
    ids: Option<String>,
    /// First decode-phase prompt id S for --ids (default: the last id).
    ///
    /// Ids 0..S-1 are the prefill (SPEED: kept only below the cut, besides the anchors;
    /// SlimInfer: pruned block-wise). Ids S..P-1 are the prompt's decode-phase part, at full
    /// depth like a chat template's generation prompt, but still prompt: they run together as
    /// the prefill's last chunk (512 ids), so SlimInfer's query window ends at the last id
    /// (at S+511 for a longer tail), not at S, and the first generated token follows the last
    /// id. `lcut forward --decode-start S` reads the ids after S as a continuation instead,
    /// fed one at a time after a window that ends at S. SPEED reads S the same way in both;
    /// for SlimInfer the two agree only when S is the last id.
    #[arg(long, requires = "ids")]
    decode_start: Option<usize>,
    /// Most new tokens.
    #[arg(long, default_value_t = 64)]
    max_new_tokens: usize,
    /// Sampling temperature; greedy when absent.
    #[arg(long)]
    temperature: Option<f64>,
    /// Top-k sampling.
    #[arg(long)]
    top_k: Option<usize>,
    /// Top-p sampling.
    #[arg(long)]
    top_p: Option<f64>,
    /// Sampling seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Write the result as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Run even when the memory the run needs (printed before the model is
    /// loaded) is more than the machine has free.
    #[arg(long)]
    force: bool,
}

fn sampling(args: &GenerateArgs) -> Sampling {
    match args.temperature {
        Some(t) if t > 0.0 => Sampling::Sample {
            temperature: t,
            top_k: args.top_k,
            top_p: args.top_p,
            seed: args.seed,
        },
        _ => Sampling::Greedy,
    }
}

/// `cells` left-aligned in columns of 16.
fn columns(cells: &[String]) -> String {
    cells
        .iter()
        .map(|c| format!("{c:<16}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn summary(label: &str, out: &GenerationOutput) -> String {
    let full = out.kv_bytes_full.max(1) as f64;
    let mut line = format!(
        "{label:<20} TTFT {:>8.1} ms  TPOT {:>7.2} ms  {:>7.1} tok/s  KV {:>10} B ({:.3} of full)",
        out.timing.ttft_s * 1e3,
        out.timing.tpot_s * 1e3,
        out.timing.tokens_per_s,
        out.kv_bytes_held,
        out.kv_bytes_held as f64 / full
    );
    if let Some(slim) = &out.slim {
        let kept: Vec<String> = slim
            .cuts
            .iter()
            .map(|c| format!("{}:{}/{}", c.layer, c.kept_tokens, slim.prefill_tokens))
            .collect();
        let swaps = slim
            .steps
            .iter()
            .flat_map(|s| &s.cuts)
            .filter(|t| t.swapped)
            .count();
        line += &format!(
            "\n{:<20} resident {} B ({:.3} of full); kept prompt tokens at cuts {}; {swaps} swaps; SPEED at equal K/V: L_cut {:.1}",
            "",
            out.kv_bytes_resident,
            out.kv_bytes_resident as f64 / full,
            kept.join(", "),
            slim.equal_kv_cutoff
        );
    }
    line
}

/// The prompt of the arguments: token ids, or text through the model's
/// tokenizer (and chat template unless `--raw`), read before its weights.
fn prompt_of(args: &GenerateArgs, model: &PendingModel) -> Result<PreparedPrompt> {
    Ok(match (&args.ids, &args.prompt) {
        (Some(ids), _) => PreparedPrompt::from_ids(parse_ids(ids)?, args.decode_start)?,
        (None, Some(text)) => {
            model
                .prompter()?
                .prepare_text(text, args.system.as_deref(), !args.raw)?
        }
        (None, None) => anyhow::bail!("give a prompt: lcut generate \"...\" (or --ids 1,5,9)"),
    })
}

/// What a generation of `total_len` tokens (prompt and new) under policies
/// of `kinds` needs: the weights as they will be loaded, the full model's
/// K/V for every token in the cache's dtype, a prefill chunk's attention
/// (no score matrix where the blocked kernel runs every chunk) and
/// activations.
pub(crate) fn generation_memory(
    model: &PendingModel,
    total_len: usize,
    kinds: &[PolicyKind],
) -> MemoryEstimate {
    let (cfg, dtype) = (model.config(), model.dtype());
    let kv = kv_cache_bytes(cfg, model.kv_dtype, total_len);
    let chunk = GenerationConfig::default().prefill_chunk;
    let block = default_attention_block_elems(&model.device);
    estimate(cfg, dtype, kv, total_len, chunk, block)
        .with_weights(model.weight_bytes())
        .for_prefill_path((&model.device, kinds), cfg, dtype, (total_len, chunk))
}

/// Token ids as text (the ids themselves without a tokenizer).
fn text(session: &Session, ids: &[u32]) -> String {
    match &session.tokenizer {
        Some(t) => t.decode(ids),
        None => format!("{ids:?}"),
    }
}

/// One token as its tokenizer piece (its id without a tokenizer).
fn piece(session: &Session, id: u32) -> String {
    match &session.tokenizer {
        Some(t) => t.token_strings(&[id]).remove(0),
        None => id.to_string(),
    }
}

/// Run `lcut generate`.
pub fn run(args: &GenerateArgs) -> Result<()> {
    let pending = args.load.open()?;
    if let Some(path) = &args.prompts {
        let run = crate::generate_file::FileRun {
            path,
            lora: &args.lora,
            policy: &args.policy,
            config: GenerationConfig {
                max_new_tokens: args.max_new_tokens,
                sampling: sampling(args),
                ..GenerationConfig::default()
            },
            use_template: !args.raw,
            force: args.force,
            json: args.json.as_deref(),
        };
        return crate::generate_file::run(pending, &run);
    }
    let prompt = prompt_of(args, &pending)?;
    let total = prompt.len() + args.max_new_tokens;
    let kinds: Vec<PolicyKind> = std::iter::once(&args.policy)
        .chain(&args.compare)
        .map(|p| p.kind)
        .collect();
    let need = generation_memory(&pending, total, &kinds);
    let what = format!("{total} tokens");
    let need = check_before_loading(&what, &need, (&pending.device, pending.mode), args.force)?;
    let mut session = pending.load()?;
    crate::memory_check::say_attention_path(&session.model);
    let run_policies: Vec<String> = std::iter::once(&args.policy)
        .chain(&args.compare)
        .map(ToString::to_string)
        .collect();
    args.lora.apply_to_session(&mut session, &run_policies)?;
    let policy = session.resolve_policy(&args.policy)?;
    let reference = args
        .compare
        .as_ref()
        .map(|r| session.resolve_policy(r))
        .transpose()?;
    if let Some(note) =
        crate::common::press_layers_note(&session.model, std::iter::once(&policy).chain(&reference))
    {
        eprintln!("{note}");
    }
    let config = GenerationConfig {
        sampling: sampling(args),
        ..session.greedy_config(args.max_new_tokens)
    };
    eprintln!(
        "prompt: {} tokens, decode start {} ({})",
        prompt.len(),
        prompt.decode_start,
        if prompt.chat_template_used {
            "chat template"
        } else {
            "raw"
        }
    );
    let json = match reference {
        Some(reference) => {
            let policies = [reference, policy];
            // an adapter is compared with the model it was made from
            let base = match &args.lora.lora {
                Some(_) => Some(args.load.load()?),
                None => None,
            };
            let reference_model = base.as_ref().map_or(&session.model, |b| &b.model);
            let models = [reference_model, &session.model];
            side_by_side(&session, (&models, &prompt), &policies, &config)?
        }
        None => streamed(&session, prompt, policy, config)?,
    };
    if let Some(path) = &args.json {
        write_atomic(path, serde_json::to_string_pretty(&json)?.as_bytes())?;
    }
    report_peak(&need, session.model.device());
    Ok(())
}

/// `policies` (the reference, then the policy) in lockstep: a table of the
/// tokens step by step with their agreement and KL, then each output and
/// its costs. Returns the comparison as JSON.
fn side_by_side(
    session: &Session,
    (models, prompt): (&[&Decoder; 2], &PreparedPrompt),
    policies: &[Policy; 2],
    config: &GenerationConfig,
) -> Result<serde_json::Value> {
    let names: Vec<String> = policies.iter().map(ToString::to_string).collect();
    println!(
        "{:>4}  {}  {:>5} {:>9}",
        "step",
        columns(&names),
        "same",
        "KL"
    );
    let cmp = compare_models(models, prompt, policies, config, |e| {
        if let LockstepEvent::Step { step, .. } = e {
            let shown: Vec<String> = step
                .tokens
                .iter()
                .map(|t| t.map(|id| piece(session, id)).unwrap_or_else(|| "-".into()))
                .collect();
            println!(
                "{:>4}  {}  {:>5} {:>9}",
                step.index,
                columns(&shown),
                if step.agree[1] { "yes" } else { "NO" },
                step.kl[1].map(|k| format!("{k:.2e}")).unwrap_or_default()
            );
        }
        true
    })?;
    println!();
    for (name, out) in names.iter().zip(&cmp.outputs) {
        println!("[{name}] {}", text(session, &out.tokens));
    }
    let agree = cmp.steps.iter().filter(|s| s.agree[1]).count();
    println!("agreement {agree}/{} steps", cmp.steps.len());
    for (name, out) in names.iter().zip(&cmp.outputs) {
        println!("{}", summary(name, out));
    }
    Ok(serde_json::to_value(&cmp)?)
}

/// A generation under `policy`, its text printed as it comes, then its
/// costs. Returns the output as JSON.
fn streamed(
    session: &Session,
    prompt: PreparedPrompt,
    policy: Policy,
    config: GenerationConfig,
) -> Result<serde_json::Value> {
    let generation = Generation::new(&session.model, prompt, policy, config)?;
    let mut produced = Vec::new();
    let mut printed = 0;
    let mut stdout = std::io::stdout();
    let out = generation.run(|step| {
        produced.push(step.token);
        let t = text(session, &produced);
        if t.len() > printed && t.is_char_boundary(printed) {
            let _ = write!(stdout, "{}", &t[printed..]);
            let _ = stdout.flush();
            printed = t.len();
        }
        true
    })?;
    println!();
    println!("{}", summary(&policy.to_string(), &out));
    Ok(serde_json::to_value(&out)?)
}
