//! `lcut forward`: run one sequence and write logits, residuals and
//! attention to safetensors in the reference layout.

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use candle_core::Tensor;
use clap::Args;
use lcut_engine::PreparedPrompt;
use lcut_model::LogitRows;
use lcut_model::probes::RecordingProbe;
use lcut_policy::PolicySpec;

use crate::args::{DeviceArg, KvDtypeArg, WeightArg};
use crate::common::{open_session, parse_ids};

/// Longest sequence for which attention [H, T, T] is recorded by default.
const MAX_RECORDED_ATTENTION: usize = 2048;

/// Arguments of `lcut forward`.
#[derive(Debug, Args)]
pub struct ForwardArgs {
    /// LoRA adapter options (`--lora DIR`, `--lora-mode`).
    #[command(flatten)]
    pub lora: crate::lora_opt::LoraArgs,
    /// Model folder (Hugging Face layout) or `.gguf` file; the bundled model by default.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Token ids, comma-separated.
    #[arg(long, conflicts_with = "text")]
    ids: Option<String>,
    /// Text, tokenised raw with the model's tokenizer (BoS prepended).
    #[arg(long)]
    text: Option<String>,
    /// Visibility policy: full, speed:C+bos, speed:C, selfonly:C+bos (C a count or fraction).
    #[arg(long, default_value = "full")]
    policy: PolicySpec,
    /// First decode-phase position S (policies other than full); default: last token.
    #[arg(long)]
    decode_start: Option<usize>,
    /// Weights and cache dtype: f32, bf16, f16, or q (a GGUF's weights kept quantized).
    #[arg(long, default_value = "f32", ignore_case = true)]
    dtype: WeightArg,
    /// K/V cache storage: auto (f16 for `--dtype q`, else the weights'
    /// dtype), f32, f16 or bf16.
    #[arg(long, value_enum, default_value = "auto", ignore_case = true)]
    kv_dtype: KvDtypeArg,
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

/// Run `lcut forward`.
pub fn run(args: &ForwardArgs) -> Result<()> {
    let mut session = open_session(&args.model, args.dtype, args.kv_dtype, args.device)?;
    args.lora
        .apply_to_session(&mut session, &[args.policy.to_string()])?;
    let prompt = match (&args.ids, &args.text) {
        (Some(ids), _) => PreparedPrompt::from_ids(parse_ids(ids)?, args.decode_start)?,
        (None, Some(text)) => {
            let p = session.prepare_text(text, None, false)?;
            PreparedPrompt::from_ids(p.ids, args.decode_start)?
        }
        (None, None) => bail!("give the sequence with --ids 1,5,9 or --text \"...\""),
    };
    let spec = args.policy;
    let model = &session.model;
    let cfg = model.config();
    let policy = spec.resolve(cfg.num_layers)?;
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
        let record_attention = !args.no_attention;
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
    } else {
        // The real incremental path: prefill 0..S-1, then S..T-1 one by one.
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
