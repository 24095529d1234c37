//! `lcut forward`: run one sequence and write logits, residuals and
//! attention to safetensors in the reference layout.

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use candle_core::Tensor;
use clap::Args;
use lcut_engine::{PreparedPrompt, Session};
use lcut_model::probes::RecordingProbe;
use lcut_model::{Decoder, LogitRows};
use lcut_policy::{Policy, PolicySpec};

use crate::args::{DeviceArg, WeightArg};
use crate::common::{open_session, parse_ids};

/// Longest sequence for which attention [H, T, T] is recorded by default.
const MAX_RECORDED_ATTENTION: usize = 2048;

/// Arguments of `lcut forward`.
#[derive(Debug, Args)]
pub struct ForwardArgs {
    /// LoRA adapter options (`--lora DIR`, `--lora-mode`).
    #[command(flatten)]
    pub lora: crate::lora_opt::LoraArgs,
    /// Model: a folder (Hugging Face layout), a GGUF file, a Hugging Face
    /// cache name `ORG/NAME[@REV][:FILE]` or an Ollama name `NAME[:TAG]`
    /// (`lcut models` lists them); the bundled model by default.
    #[arg(long)]
    model: Option<PathBuf>,
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
    /// Weights and cache dtype: f32, bf16, f16, or q (a GGUF's weights kept quantized).
    #[arg(long, default_value = "f32", ignore_case = true)]
    dtype: WeightArg,
    /// cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    device: DeviceArg,
    /// Skip recording attention (for long sequences).
    #[arg(long)]
    no_attention: bool,
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
    let mut session = open_session(&args.model, args.dtype, args.device)?;
    args.lora
        .apply_to_session(&mut session, &[args.policy.to_string()])?;
    let prompt = prompt_of(args, &session)?;
    let spec = args.policy;
    let model = &session.model;
    let policy = spec.resolve(model.config().num_layers)?;
    let ids = &prompt.ids;
    let t = ids.len();
    let mut tensors: HashMap<String, Tensor> = HashMap::new();
    tensors.insert(
        "input_ids".into(),
        Tensor::new(
            ids.iter().map(|&i| i as i64).collect::<Vec<_>>(),
            &candle_core::Device::Cpu,
        )?,
    );
    if policy.is_full_depth() && spec.kind == lcut_policy::PolicyKind::Full {
        full_depth(model, ids, !args.no_attention, &mut tensors)?;
    } else {
        incremental(model, &prompt, policy, &mut tensors)?;
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

/// The full model teacher-forced on `ids` in one pass: logits, embeddings,
/// every layer's output and, with `record_attention`, every layer's
/// attention [H, T, T].
fn full_depth(
    model: &Decoder,
    ids: &[u32],
    record_attention: bool,
    tensors: &mut HashMap<String, Tensor>,
) -> Result<()> {
    let cfg = model.config();
    let t = ids.len();
    if record_attention && t > MAX_RECORDED_ATTENTION {
        bail!(
            "{t} tokens: recording attention [H, T, T] would need {} MB per layer; pass --no-attention",
            cfg.num_heads * t * t * 4 / 1_000_000
        );
    }
    let heads = if record_attention { cfg.num_heads } else { 0 };
    let mut probe = RecordingProbe::new(cfg.num_layers, heads, cfg.hidden_size, t);
    let logits = model.teacher_forced_logits(ids, Some(&mut probe))?;
    tensors.insert(
        "logits".into(),
        logits.to_device(&candle_core::Device::Cpu)?,
    );
    let cpu = candle_core::Device::Cpu;
    tensors.insert(
        "embeddings".into(),
        Tensor::from_vec(probe.embeddings, (t, cfg.hidden_size), &cpu)?,
    );
    for (l, out) in probe.layer_out.into_iter().enumerate() {
        tensors.insert(
            format!("layer_out.{l}"),
            Tensor::from_vec(out, (t, cfg.hidden_size), &cpu)?,
        );
    }
    if record_attention {
        for (l, attn) in probe.attention.into_iter().enumerate() {
            tensors.insert(
                format!("attn.{l}"),
                Tensor::from_vec(attn, (cfg.num_heads, t, t), &cpu)?,
            );
        }
    }
    Ok(())
}

/// The real incremental path under `policy`: prefill 0..S-1, then S..T-1
/// one by one; the decode-phase logits and S.
fn incremental(
    model: &Decoder,
    prompt: &PreparedPrompt,
    policy: Policy,
    tensors: &mut HashMap<String, Tensor>,
) -> Result<()> {
    let (ids, t) = (&prompt.ids, prompt.ids.len());
    let phases = prompt.phases(&policy)?;
    let s = phases.decode_start();
    let mut seq = model.new_sequence(policy, phases)?;
    if s > 0 {
        model.forward(&mut seq, &ids[..s], LogitRows::None, None)?;
    }
    let mut rows = Vec::with_capacity(t - s);
    for i in s..t {
        let out = model.forward(&mut seq, &ids[i..=i], LogitRows::Last, None)?;
        rows.push(out.logits.context("decode-phase token without logits")?);
    }
    tensors.insert(
        "logits".into(),
        Tensor::cat(&rows, 0)?.to_device(&candle_core::Device::Cpu)?,
    );
    tensors.insert(
        "decode_start".into(),
        Tensor::new(&[s as i64], &candle_core::Device::Cpu)?,
    );
    Ok(())
}
