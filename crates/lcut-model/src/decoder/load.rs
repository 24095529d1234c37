//! Building a decoder from a model's files: a Hugging Face folder or a GGUF
//! file, dense in a dtype or with a GGUF's matrices kept quantized.

use std::path::Path;

use candle_core::{DType, Device};

use super::layer::{LayerInputBranch, LayerScalar};
use super::layer_inputs::LayerInputs;
use super::{Decoder, Layer, WeightMode, default_attention_block_elems};
use crate::config::{ModelConfig, NormPlacement};
use crate::error::{ModelError, Result};
use crate::files::ModelFiles;
use crate::gguf::GgufWeights;
use crate::layers::{AttentionProj, Experts, FeedForward, Loader, Mlp};
use crate::linear_attention::GatedDeltaNet;
use crate::rope::Rope;
use crate::store::ModelFormat;
use crate::weights::WeightSource;
use lcut_policy::{KvSharing, RecurrentLayers};

/// The tensor in which llama.cpp stores per-frequency RoPE divisors.
const ROPE_FACTORS: &str = "rope_freqs.weight";

impl Decoder {
    /// Load a Hugging Face model folder or a `.gguf` file with weights
    /// converted to `dtype`.
    pub fn load(path: &Path, dtype: DType, device: &Device) -> Result<Self> {
        Self::load_as(path, WeightMode::Dense(dtype), device)
    }

    /// Load a Hugging Face model folder or a `.gguf` file, dense in a dtype
    /// or with a GGUF's matrices kept quantized.
    pub fn load_as(path: &Path, mode: WeightMode, device: &Device) -> Result<Self> {
        Self::from_files(ModelFiles::open(path)?, mode, device)
    }

    /// Load a model whose format is known (a resolved model reference,
    /// [`crate::store::resolve`]): a GGUF file whatever its name, or a
    /// Hugging Face model folder.
    pub fn load_format(
        path: &Path,
        format: ModelFormat,
        mode: WeightMode,
        device: &Device,
    ) -> Result<Self> {
        Self::from_files(ModelFiles::open_format(path, format)?, mode, device)
    }

    /// Build the decoder from a model's opened files (for callers that also
    /// read its tokenizer, so the files are opened and parsed once).
    pub fn from_files(files: ModelFiles, mode: WeightMode, device: &Device) -> Result<Self> {
        match files {
            ModelFiles::Gguf(file) => {
                let cfg = file.config().clone();
                Self::build(cfg, &GgufWeights::new(file), mode, device)
            }
            ModelFiles::Folder(folder) => Self::build(folder.config, &folder.weights, mode, device),
        }
    }

    /// Build the decoder from a parsed config and a source of weights.
    pub fn from_weights(
        cfg: ModelConfig,
        files: &dyn WeightSource,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        Self::build(cfg, files, WeightMode::Dense(dtype), device)
    }

    /// Build the decoder from a parsed config and a source of weights in a mode.
    pub fn build(
        cfg: ModelConfig,
        files: &dyn WeightSource,
        mode: WeightMode,
        device: &Device,
    ) -> Result<Self> {
        let dtype = mode.activation_dtype();
        let ld = Loader {
            files,
            cfg: &cfg,
            dtype,
            device,
            quantized: mode == WeightMode::Quantized,
        };
        let (v, d) = (cfg.vocab_size, cfg.hidden_size);
        let embed = ld.embedding("model.embed_tokens.weight", v, d)?;
        let layers = (0..cfg.num_layers)
            .map(|l| {
                let p = format!("model.layers.{l}");
                let norm = |name: &str| ld.norm(&format!("{p}.{name}"), d);
                let (before, after) = (cfg.norms.before(), cfg.norms.after());
                // experts beside the dense MLP (Gemma 4) rather than in its place
                let beside = cfg.experts.is_some_and(|e| e.beside_mlp);
                // a linear-attention layer (Qwen3.5): its Gated DeltaNet, and
                // its output projection as the attention's
                let linear = match &cfg.linear_attention {
                    Some(la) if la.is_linear(l) => {
                        Some(GatedDeltaNet::load(&ld, &format!("{p}.linear_attn"), la)?)
                    }
                    _ => None,
                };
                let attn = match &linear {
                    Some(net) => AttentionProj::output_only(
                        &ld,
                        &format!("{p}.linear_attn"),
                        net.output_heads(),
                    )?,
                    None => AttentionProj::load(&ld, &format!("{p}.self_attn"), l)?,
                };
                Ok(Layer {
                    input_norm: before.then(|| norm("input_layernorm")).transpose()?,
                    attn,
                    linear,
                    // the norm after the attention where the layer has one;
                    // the same name is Llama's norm before the MLP
                    attn_out_norm: after
                        .then(|| norm("post_attention_layernorm"))
                        .transpose()?,
                    mlp_in_norm: match cfg.norms {
                        NormPlacement::Pre => Some(norm("post_attention_layernorm")?),
                        NormPlacement::Sandwich => Some(norm("pre_feedforward_layernorm")?),
                        NormPlacement::Post => None,
                    },
                    mlp: match (cfg.sparse_layers.get(l), beside) {
                        (Some(true), false) => FeedForward::Experts(Experts::load(&ld, &p)?),
                        (Some(true), true) => FeedForward::DenseAndExperts(
                            Mlp::load(&ld, &format!("{p}.mlp"), cfg.mlp_width(l))?,
                            Experts::load(&ld, &p)?,
                        ),
                        _ => FeedForward::Dense(Mlp::load(
                            &ld,
                            &format!("{p}.mlp"),
                            cfg.mlp_width(l),
                        )?),
                    },
                    mlp_out_norm: after
                        .then(|| norm("post_feedforward_layernorm"))
                        .transpose()?,
                    dense_out_norm: match beside && cfg.sparse_layers.get(l) == Some(&true) {
                        true => Some(norm("post_feedforward_layernorm_1")?),
                        false => None,
                    },
                    window: cfg.sliding_window[l],
                    rope: cfg.rotates[l].then_some(usize::from(
                        cfg.sliding_window[l].is_some() && cfg.sliding_rope.is_some(),
                    )),
                    kv_source: cfg.layer_attention[l].kv_source,
                    layer_input: cfg
                        .per_layer_input
                        .map(|input| -> Result<LayerInputBranch> {
                            Ok(LayerInputBranch {
                                gate: ld.linear(
                                    &format!("{p}.per_layer_input_gate"),
                                    input.width,
                                    d,
                                    false,
                                )?,
                                projection: ld.linear(
                                    &format!("{p}.per_layer_projection"),
                                    d,
                                    input.width,
                                    false,
                                )?,
                                norm: norm("post_per_layer_input_norm")?,
                                activation: cfg.activation,
                            })
                        })
                        .transpose()?,
                    scalar: match cfg.layer_scalars {
                        true => Some(layer_scalar(&ld, &p)?),
                        false => None,
                    },
                })
            })
            .collect::<Result<Vec<_>>>()?;
        if !files.contains("model.norm.weight") {
            return Err(ModelError::MissingFinalNorm {
                folder: files.folder().to_path_buf(),
            });
        }
        let final_norm = ld.norm("model.norm", d)?;
        let lm_head = if cfg.tie_word_embeddings {
            embed.tied_head()?
        } else if files.contains("lm_head.weight") {
            ld.linear("lm_head", v, d, false)?
        } else {
            return Err(ModelError::MissingLmHead {
                folder: files.folder().to_path_buf(),
            });
        };
        let rope = match files.contains(ROPE_FACTORS) {
            // llama.cpp stores Llama 3.1's frequency scaling as per-frequency divisors
            true => Rope::with_factors(
                &cfg.rope,
                &files
                    .load(
                        ROPE_FACTORS,
                        &[cfg.rope.rotary_dim / 2],
                        DType::F32,
                        &Device::Cpu,
                    )?
                    .to_vec1::<f32>()?,
                device,
            )?,
            false => Rope::new(&cfg.rope, device)?,
        };
        let sliding_rope = cfg
            .sliding_rope
            .as_ref()
            .map(|r| Rope::new(r, device))
            .transpose()?;
        let attention_block_elems = default_attention_block_elems(device);
        let sharing = KvSharing::new(cfg.layer_attention.iter().map(|a| a.kv_source).collect())?;
        let recurrent = RecurrentLayers::new(
            (0..cfg.num_layers)
                .map(|l| match &cfg.linear_attention {
                    Some(la) if la.is_linear(l) => la.state_values(),
                    _ => 0,
                })
                .collect(),
        );
        let layer_inputs = cfg
            .per_layer_input
            .map(|input| LayerInputs::load(&ld, input, cfg.num_layers))
            .transpose()?;
        Ok(Self {
            cfg,
            dtype,
            mode,
            device: device.clone(),
            embed,
            layers,
            final_norm,
            lm_head,
            rope,
            sliding_rope,
            attention_block_elems,
            kv_dtype: dtype,
            step: std::sync::OnceLock::new(),
            fused_off: false,
            sharing,
            layer_inputs,
            recurrent,
        })
    }
}

/// Layer `prefix`'s learned output scale (`layer_scalar`, one value).
fn layer_scalar(ld: &Loader<'_>, prefix: &str) -> Result<LayerScalar> {
    let weight = ld.tensor(&format!("{prefix}.layer_scalar"), &[1])?;
    let value = f64::from(weight.to_dtype(DType::F32)?.to_vec1::<f32>()?[0]);
    Ok(LayerScalar { value, weight })
}
