//! `lcut forward`: run one sequence and write logits, residuals,
//! attention, (`--lens`) the logit lens and a mixture-of-experts model's
//! routing to safetensors in the reference layout.

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use candle_core::Tensor;
use clap::Args;
use lcut_engine::forward::{ForwardOptions, MAX_RECORDED_ATTENTION, forward};
use lcut_engine::{PreparedPrompt, Session};
use lcut_policy::PolicySpec;

use crate::common::parse_ids;

/// Arguments of `lcut forward`.
#[derive(Debug, Args)]
pub struct ForwardArgs {
    /// LoRA adapter options (`--lora DIR`, `--lora-mode`).
    #[command(flatten)]
    pub lora: crate::lora_opt::LoraArgs,
    /// The model and how it loads (`--model`, `--dtype`, `--kv-dtype`,
    /// `--device`).
    #[command(flatten)]
    pub load: crate::common::ModelArgs,
    /// Token ids, comma-separated.
    #[arg(long, conflicts_with = "text")]
    ids: Option<String>,
    /// Text, tokenised raw with the model's tokenizer (BoS prepended).
    #[arg(long)]
    text: Option<String>,
    /// Visibility policy: full, speed:C+bos, speed:C, selfonly:C+bos, swiftkv:C[+bos] (alias pop:C), slim:... (C a count or fraction).
    #[arg(long, default_value = "full")]
    policy: PolicySpec,
    /// First decode-phase position S: ids 0..=S are the prompt, S its last id, and the ids after S its continuation (default: the last id).
    ///
    /// Ids 0..S-1 run as one prefill (SPEED: kept only below the cut, besides the anchors;
    /// SlimInfer: pruned block-wise). Id S and the ids after it then run one at a time at full
    /// depth, as decoding feeds its tokens. S closes the prompt: SlimInfer's query window ends
    /// at S and its prefill decides the blocks there; each id after S is a continuation step
    /// whose decode-time decision may move the active blocks. The file gets `logits` of rows
    /// S..T-1 only (T-S rows; row k is the logits at position S+k, predicting id S+k+1) and
    /// `decode_start` = S. `full` ignores S and writes every row with the residuals and
    /// attention. `lcut generate --ids` reads S differently for SlimInfer: see its
    /// --decode-start.
    #[arg(long)]
    decode_start: Option<usize>,
    /// Skip recording attention (for long sequences).
    #[arg(long)]
    no_attention: bool,
    /// Add the logit lens: `lens_logprob` [layers + 1, T], at each hidden
    /// state (row 0 the embeddings, row l + 1 the output of layer l) the
    /// log-probability, under that state's final norm and LM head, of the
    /// token the last layer ranks first at each position (NaN where the
    /// policy keeps a position out of a layer).
    #[arg(long)]
    lens: bool,
    /// Output safetensors file.
    #[arg(long)]
    out: PathBuf,
}

/// The sequence of the arguments: token ids, or text tokenised raw.
fn prompt_of(args: &ForwardArgs, session: &Session) -> Result<PreparedPrompt> {
    Ok(match (&args.ids, &args.text) {
        (Some(ids), _) => PreparedPrompt::from_ids(parse_ids(ids)?, args.decode_start)?,
        (None, Some(text)) => {
            let p = session.prepare_text(text, None, false)?;
            PreparedPrompt::from_ids(p.ids, args.decode_start)?
        }
        (None, None) => bail!("give the sequence with --ids 1,5,9 or --text \"...\""),
    })
}

/// Run `lcut forward`.
pub fn run(args: &ForwardArgs) -> Result<()> {
    let mut session = args.load.load()?;
    args.lora
        .apply_to_session(&mut session, &[args.policy.to_string()])?;
    let prompt = prompt_of(args, &session)?;
    let cfg = session.model.config();
    let t = prompt.len();
    let full = args.policy.kind == lcut_policy::PolicyKind::Full;
    let record_attention = full && !args.no_attention;
    if record_attention && t > MAX_RECORDED_ATTENTION {
        bail!(
            "{t} tokens: recording attention [H, T, T] would need {} MB per layer; pass --no-attention",
            cfg.num_heads * t * t * 4 / 1_000_000
        );
    }
    // the full model's records, as the reference files hold them
    let opts = ForwardOptions {
        residuals: full,
        attention: record_attention,
        lens: args.lens,
        routing: true,
    };
    let record = forward(&session.model, &prompt, &args.policy, opts)?;
    let policy = session.resolve_policy(&args.policy)?;
    let cpu = candle_core::Device::Cpu;
    let mut tensors: HashMap<String, Tensor> = HashMap::new();
    let ids: Vec<i64> = prompt.ids.iter().map(|&i| i64::from(i)).collect();
    tensors.insert("input_ids".into(), Tensor::new(ids, &cpu)?);
    tensors.insert("logits".into(), record.logits);
    if let Some(lens) = record.lens_logprob {
        tensors.insert("lens_logprob".into(), lens);
    }
    // a mixture's routing of the rows the logits hold, as transformers'
    // reference files name it
    if let Some(r) = &record.routing {
        let n = t - record.first_row;
        for (i, &layer) in r.layers.iter().enumerate() {
            let (probs, experts, weights) = r.layer_rows(i, record.first_row..t);
            let (e, k) = (r.num_experts, r.top_k);
            tensors.insert(
                format!("router.{layer}.probs"),
                Tensor::from_vec(probs, (n, e), &cpu)?,
            );
            let experts = Tensor::from_vec(experts, (n, k), &cpu)?;
            tensors.insert(format!("router.{layer}.experts"), experts);
            let weights = Tensor::from_vec(weights, (n, k), &cpu)?;
            tensors.insert(format!("router.{layer}.weights"), weights);
        }
    }
    if record.full_depth {
        if let Some(embeddings) = record.embeddings {
            tensors.insert("embeddings".into(), embeddings);
        }
        for (l, out) in record.layer_out.into_iter().enumerate() {
            tensors.insert(format!("layer_out.{l}"), out);
        }
        for (l, attn) in record.attention.into_iter().enumerate() {
            tensors.insert(format!("attn.{l}"), attn);
        }
    } else {
        let s = record.decode_start as i64;
        tensors.insert("decode_start".into(), Tensor::new(&[s], &cpu)?);
    }
    let tmp = args.out.with_extension("partial");
    candle_core::safetensors::save(&tensors, &tmp)
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &args.out).with_context(|| format!("writing {}", args.out.display()))?;
    eprintln!(
        "wrote {} ({} tokens, policy {policy}, {} tensors)",
        args.out.display(),
        t,
        tensors.len()
    );
    Ok(())
}
