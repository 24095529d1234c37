//! The decoder: one implementation for every supported architecture, run
//! chunk by chunk over a [`Sequence`] whose cache follows a visibility policy.

use std::path::Path;

use candle_core::{D, DType, Device, Tensor};
use candle_nn::Linear;
use lcut_policy::{KvShape, Policy, TokenPhases};

use crate::cache::LayerCache;
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::layers::{AttentionProj, Loader, Mlp, RmsNorm};
use crate::mask::{PartialMask, additive_mask};
use crate::probe::{AttentionView, Probe, ResidualSite};
use crate::rope::Rope;
use crate::weights::{WeightFiles, WeightSource};

/// One decoder layer.
#[derive(Debug, Clone)]
struct Layer {
    input_norm: RmsNorm,
    attn: AttentionProj,
    /// Gemma-2's norm on the attention output before the residual add.
    attn_out_norm: Option<RmsNorm>,
    mlp_in_norm: RmsNorm,
    mlp: Mlp,
    /// Gemma-2's norm on the MLP output before the residual add.
    mlp_out_norm: Option<RmsNorm>,
    window: Option<usize>,
}

/// A loaded model.
#[derive(Debug, Clone)]
pub struct Decoder {
    cfg: ModelConfig,
    dtype: DType,
    device: Device,
    embed: Tensor,
    layers: Vec<Layer>,
    final_norm: RmsNorm,
    lm_head: Linear,
    rope: Rope,
}

/// Which rows of a chunk get logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitRows {
    /// None (prefill of a prompt whose last token is not decoded from).
    None,
    /// The chunk's last token, if it reaches the top layer.
    Last,
    /// Every token of the chunk that reaches the top layer.
    All,
}

/// What one forward call returns.
#[derive(Debug, Clone)]
pub struct ChunkOutput {
    /// Logits [rows, vocab] in f32, when rows were asked for and exist.
    pub logits: Option<Tensor>,
    /// Positions of the logit rows.
    pub positions: Vec<usize>,
}

/// The state of one sequence: its policy, token phases and layer caches.
#[derive(Debug, Clone)]
pub struct Sequence {
    policy: Policy,
    phases: TokenPhases,
    caches: Vec<LayerCache>,
    next_pos: usize,
}

impl Sequence {
    /// Number of tokens processed so far (the next token's position).
    pub fn len(&self) -> usize {
        self.next_pos
    }

    /// True before the first token.
    pub fn is_empty(&self) -> bool {
        self.next_pos == 0
    }

    /// The visibility policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The token phases.
    pub fn phases(&self) -> &TokenPhases {
        &self.phases
    }

    /// The per-layer caches.
    pub fn caches(&self) -> &[LayerCache] {
        &self.caches
    }

    /// Bytes of K/V held over all layers.
    pub fn kv_bytes_held(&self) -> u64 {
        self.caches.iter().map(|c| c.bytes_held() as u64).sum()
    }

    /// Bytes of K/V buffers allocated over all layers.
    pub fn kv_bytes_allocated(&self) -> u64 {
        self.caches.iter().map(|c| c.bytes_allocated() as u64).sum()
    }

    /// The state this prompt prefix would have under another policy, without
    /// recomputing it: lower layers are shared, upper layers keep only the
    /// tokens the new policy keeps there.
    ///
    /// Valid while every processed token is before the decode start of
    /// `phases` and the sequence ran at full depth: anchors are a prefix, so
    /// in both runs an anchor reads only anchors, and a layer's keys below
    /// the cutoff are the full model's. Used by sweeps over cutoffs to reuse
    /// one prefill.
    pub fn restricted(&self, policy: Policy, phases: TokenPhases) -> Result<Sequence> {
        if !self.policy.is_full_depth() || self.next_pos > phases.decode_start() {
            return Err(ModelError::Phase(
                lcut_policy::PhaseError::DecodeStartOutsidePrompt {
                    decode_start: phases.decode_start(),
                    prompt_len: self.next_pos,
                },
            ));
        }
        if policy.num_layers() != self.caches.len() {
            return Err(depth_mismatch(&policy, self.caches.len()));
        }
        let caches = self
            .caches
            .iter()
            .enumerate()
            .map(|(l, c)| c.filtered(|p| policy.retains_kv(l, p, &phases)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Sequence {
            policy,
            phases,
            caches,
            next_pos: self.next_pos,
        })
    }

    /// Reserve cache room for `total_len` tokens in all, each layer only for
    /// the tokens the policy keeps there.
    pub fn reserve(&mut self, total_len: usize) {
        for (layer, cache) in self.caches.iter_mut().enumerate() {
            let kept = (self.next_pos..total_len)
                .filter(|&p| self.policy.retains_kv(layer, p, &self.phases))
                .count();
            cache.reserve(kept);
        }
    }
}

impl Decoder {
    /// Load a Hugging Face model folder with weights converted to `dtype`.
    pub fn load(folder: &Path, dtype: DType, device: &Device) -> Result<Self> {
        let cfg = ModelConfig::from_folder(folder)?;
        let files = WeightFiles::open(folder)?;
        Self::from_weights(cfg, &files, dtype, device)
    }

    /// Build the decoder from a parsed config and a source of weights.
    pub fn from_weights(
        cfg: ModelConfig,
        files: &dyn WeightSource,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let ld = Loader {
            files,
            cfg: &cfg,
            dtype,
            device,
        };
        let (v, d) = (cfg.vocab_size, cfg.hidden_size);
        let embed = ld.tensor("model.embed_tokens.weight", &[v, d])?;
        let layers = (0..cfg.num_layers)
            .map(|l| {
                let p = format!("model.layers.{l}");
                let gemma = cfg.sandwich_norms;
                Ok(Layer {
                    input_norm: ld.norm(&format!("{p}.input_layernorm"), d)?,
                    attn: AttentionProj::load(&ld, &format!("{p}.self_attn"))?,
                    attn_out_norm: if gemma {
                        Some(ld.norm(&format!("{p}.post_attention_layernorm"), d)?)
                    } else {
                        None
                    },
                    mlp_in_norm: if gemma {
                        ld.norm(&format!("{p}.pre_feedforward_layernorm"), d)?
                    } else {
                        ld.norm(&format!("{p}.post_attention_layernorm"), d)?
                    },
                    mlp: Mlp::load(&ld, &format!("{p}.mlp"))?,
                    mlp_out_norm: if gemma {
                        Some(ld.norm(&format!("{p}.post_feedforward_layernorm"), d)?)
                    } else {
                        None
                    },
                    window: cfg.sliding_window[l],
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let final_norm = ld.norm("model.norm", d)?;
        let lm_head = if cfg.tie_word_embeddings {
            Linear::new(embed.clone(), None)
        } else if files.contains("lm_head.weight") {
            Linear::new(ld.tensor("lm_head.weight", &[v, d])?, None)
        } else {
            return Err(ModelError::MissingLmHead {
                folder: files.folder().to_path_buf(),
            });
        };
        let rope = Rope::new(&cfg.rope, device)?;
        Ok(Self {
            cfg,
            dtype,
            device: device.clone(),
            embed,
            layers,
            final_norm,
            lm_head,
            rope,
        })
    }

    /// The model's config.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// The dtype of weights and cache.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The device the model runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Shape of one token's K/V, for the cost model.
    pub fn kv_shape(&self) -> KvShape {
        KvShape {
            num_layers: self.cfg.num_layers,
            num_kv_heads: self.cfg.num_kv_heads,
            head_dim: self.cfg.head_dim,
            dtype_bytes: self.dtype.size_in_bytes(),
        }
    }

    /// A new, empty sequence under `policy` with the given token phases.
    pub fn new_sequence(&self, policy: Policy, phases: TokenPhases) -> Result<Sequence> {
        if policy.num_layers() != self.cfg.num_layers {
            return Err(depth_mismatch(&policy, self.cfg.num_layers));
        }
        Ok(Sequence {
            policy,
            phases,
            caches: vec![LayerCache::new(); self.cfg.num_layers],
            next_pos: 0,
        })
    }

    /// A new full-depth sequence.
    pub fn new_full_sequence(&self) -> Sequence {
        Sequence {
            policy: Policy::full(self.cfg.num_layers),
            phases: TokenPhases::all_decode(),
            caches: vec![LayerCache::new(); self.cfg.num_layers],
            next_pos: 0,
        }
    }

    /// Run `tokens` (the sequence's next tokens) through the model, updating
    /// the sequence's caches, and return logits for the requested rows.
    pub fn forward(
        &self,
        seq: &mut Sequence,
        tokens: &[u32],
        rows: LogitRows,
        mut probe: Option<&mut (dyn Probe + '_)>,
    ) -> Result<ChunkOutput> {
        let n = tokens.len();
        if n == 0 {
            return Err(ModelError::EmptyInput);
        }
        let start = seq.next_pos;
        if start + n > self.cfg.max_position_embeddings {
            return Err(ModelError::SequenceTooLong {
                len: start + n,
                max: self.cfg.max_position_embeddings,
            });
        }
        if let Some((i, &id)) = tokens
            .iter()
            .enumerate()
            .find(|(_, id)| **id as usize >= self.cfg.vocab_size)
        {
            return Err(ModelError::TokenOutOfVocab {
                id,
                position: start + i,
                vocab_size: self.cfg.vocab_size,
            });
        }
        let ids = Tensor::new(tokens, &self.device)?;
        let mut hidden = self.embed.index_select(&ids, 0)?;
        if let Some(scale) = self.cfg.embedding_scale {
            hidden = (hidden * scale)?;
        }
        let mut present: Vec<usize> = (start..start + n).collect();
        if let Some(p) = probe.as_deref_mut()
            && p.wants_residual(ResidualSite::Embeddings)
        {
            p.on_residual(ResidualSite::Embeddings, &present, &hidden)?;
        }
        let mut tables = self.rope.tables(&present, self.dtype)?;
        for (l, layer) in self.layers.iter().enumerate() {
            let keep: Vec<u32> = (0..present.len() as u32)
                .filter(|&i| seq.policy.token_exists(l, present[i as usize], &seq.phases))
                .collect();
            if keep.len() != present.len() {
                if keep.is_empty() {
                    present.clear();
                    break;
                }
                let idx = Tensor::new(keep.as_slice(), &self.device)?;
                hidden = hidden.index_select(&idx, 0)?;
                present = keep.iter().map(|&i| present[i as usize]).collect();
                tables = self.rope.tables(&present, self.dtype)?;
            }
            hidden = self.layer_forward(l, layer, &hidden, &present, &tables, seq, &mut probe)?;
            if let Some(p) = probe.as_deref_mut()
                && p.wants_residual(ResidualSite::Layer(l))
            {
                p.on_residual(ResidualSite::Layer(l), &present, &hidden)?;
            }
        }
        seq.next_pos = start + n;
        self.logits(&hidden, &present, start + n - 1, rows)
    }

    fn logits(
        &self,
        hidden: &Tensor,
        present: &[usize],
        last: usize,
        rows: LogitRows,
    ) -> Result<ChunkOutput> {
        let (h, positions) = match rows {
            LogitRows::None => (None, vec![]),
            _ if present.is_empty() => (None, vec![]),
            LogitRows::Last if present.last() == Some(&last) => {
                (Some(hidden.narrow(0, present.len() - 1, 1)?), vec![last])
            }
            LogitRows::Last => (None, vec![]),
            LogitRows::All => (Some(hidden.clone()), present.to_vec()),
        };
        let logits = match h {
            None => None,
            Some(h) => {
                let z = candle_nn::Module::forward(&self.lm_head, &self.final_norm.forward(&h)?)?
                    .to_dtype(DType::F32)?;
                Some(match self.cfg.final_softcap {
                    Some(c) => ((z / c)?.tanh()? * c)?,
                    None => z,
                })
            }
        };
        Ok(ChunkOutput { logits, positions })
    }

    #[allow(clippy::too_many_arguments)]
    fn layer_forward(
        &self,
        l: usize,
        layer: &Layer,
        hidden: &Tensor,
        present: &[usize],
        (cos, sin): &(Tensor, Tensor),
        seq: &mut Sequence,
        probe: &mut Option<&mut (dyn Probe + '_)>,
    ) -> Result<Tensor> {
        let x = layer.input_norm.forward(hidden)?;
        let qkv = layer.attn.qkv(&x, &self.rope, cos, sin)?;
        let (policy, phases) = (seq.policy, seq.phases);
        let cache = &mut seq.caches[l];
        let retained: Vec<u32> = (0..present.len() as u32)
            .filter(|&i| policy.retains_kv(l, present[i as usize], &phases))
            .collect();
        let (keys, values, key_positions) = if retained.len() == present.len() {
            cache.append(&qkv.k, &qkv.v, present)?;
            let (k, v) = cache.kv()?.ok_or(ModelError::EmptyInput)?;
            (k, v, cache.positions().to_vec())
        } else {
            // Keys this chunk reads but the cache will not keep (SelfOnly).
            let (k, v) = match cache.kv()? {
                Some((ck, cv)) => (
                    Tensor::cat(&[&ck, &qkv.k], 1)?,
                    Tensor::cat(&[&cv, &qkv.v], 1)?,
                ),
                None => (qkv.k.clone(), qkv.v.clone()),
            };
            let mut key_positions = cache.positions().to_vec();
            key_positions.extend_from_slice(present);
            if !retained.is_empty() {
                let idx = Tensor::new(retained.as_slice(), &self.device)?;
                let pos: Vec<usize> = retained.iter().map(|&i| present[i as usize]).collect();
                cache.append(
                    &qkv.k.index_select(&idx, 1)?,
                    &qkv.v.index_select(&idx, 1)?,
                    &pos,
                )?;
            }
            (k, v, key_positions)
        };
        let mask = additive_mask(present, &key_positions, layer.window, |q, k| {
            policy.key_visible(l, q, k, &phases)
        })
        .map(|m| self.mask_tensor(m, present.len(), key_positions.len()))
        .transpose()?;
        let (attn, probs) = self.attend(&qkv.q, &keys, &values, mask.as_ref())?;
        if let Some(p) = probe.as_deref_mut()
            && let Some(from) = p.attention_from(l)
        {
            let first = present.partition_point(|&q| q < from);
            if first < present.len() {
                let probs = probs.narrow(1, first, present.len() - first)?;
                p.on_attention(AttentionView {
                    layer: l,
                    query_positions: &present[first..],
                    key_positions: &key_positions,
                    probs: &probs,
                })?;
            }
        }
        let mut attn_out = layer.attn.output(&attn)?;
        if let Some(norm) = &layer.attn_out_norm {
            attn_out = norm.forward(&attn_out)?;
        }
        let hidden = (hidden + attn_out)?;
        let mut mlp_out = layer.mlp.forward(&layer.mlp_in_norm.forward(&hidden)?)?;
        if let Some(norm) = &layer.mlp_out_norm {
            mlp_out = norm.forward(&mlp_out)?;
        }
        Ok((hidden + mlp_out)?)
    }

    /// The full [queries x keys] mask on the device: zeros for the visible
    /// prefix are made there, only the rest crosses from the host.
    fn mask_tensor(&self, mask: PartialMask, queries: usize, keys: usize) -> Result<Tensor> {
        let rest = Tensor::from_vec(
            mask.rest,
            (queries, keys - mask.visible_prefix),
            &self.device,
        )?;
        if mask.visible_prefix == 0 {
            return Ok(rest);
        }
        let prefix = Tensor::zeros((queries, mask.visible_prefix), DType::F32, &self.device)?;
        Ok(Tensor::cat(&[&prefix, &rest], 1)?)
    }

    /// Grouped-query attention without repeating K/V: the query heads that
    /// share a KV head are stacked into one matrix per KV head.
    /// Returns the output [heads, n, head_dim] and probabilities [heads, n, keys] (f32).
    fn attend(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: Option<&Tensor>,
    ) -> Result<(Tensor, Tensor)> {
        let (heads, n, head_dim) = q.dims3()?;
        let (kv_heads, keys, _) = k.dims3()?;
        let group = heads / kv_heads;
        let q = (q * self.cfg.attn_scale)?.reshape((kv_heads, group * n, head_dim))?;
        let mut scores = q.matmul(&k.t()?)?.to_dtype(DType::F32)?;
        if let Some(c) = self.cfg.attn_softcap {
            scores = ((scores / c)?.tanh()? * c)?;
        }
        if let Some(mask) = mask {
            scores = scores
                .reshape((kv_heads, group, n, keys))?
                .broadcast_add(mask)?
                .reshape((kv_heads, group * n, keys))?;
        }
        let probs = candle_nn::ops::softmax_last_dim(&scores)?;
        let out = probs.to_dtype(self.dtype)?.matmul(v)?;
        Ok((
            out.reshape((heads, n, head_dim))?,
            probs.reshape((heads, n, keys))?,
        ))
    }

    /// Teacher forcing: run `tokens` as one chunk on a fresh full-depth
    /// sequence and return logits for every position [T, vocab].
    pub fn teacher_forced_logits(
        &self,
        tokens: &[u32],
        probe: Option<&mut (dyn Probe + '_)>,
    ) -> Result<Tensor> {
        let mut seq = self.new_full_sequence();
        let out = self.forward(&mut seq, tokens, LogitRows::All, probe)?;
        out.logits.ok_or(ModelError::EmptyInput)
    }
}

fn depth_mismatch(policy: &Policy, model_layers: usize) -> ModelError {
    ModelError::PolicyDepth {
        policy: policy.to_string(),
        policy_layers: policy.num_layers(),
        model_layers,
    }
}

/// Index of the largest logit in each row of [rows, vocab].
pub fn argmax_rows(logits: &Tensor) -> Result<Vec<u32>> {
    Ok(logits.argmax(D::Minus1)?.to_vec1::<u32>()?)
}
