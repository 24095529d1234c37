//! The decoder: one implementation for every supported architecture, run
//! chunk by chunk over a [`Sequence`] whose cache follows a visibility policy.

use std::borrow::Cow;
use std::path::Path;

use candle_core::{D, DType, Device, Tensor};
use lcut_policy::{KvShape, Policy, TokenPhases};

use crate::cache::LayerCache;
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::gguf::{GgufFile, GgufWeights, is_gguf_path};
use crate::layers::{AttentionProj, Loader, Mlp, Qkv, RmsNorm};
use crate::linear::{Embedding, Linear};
use crate::mask::{PartialMask, additive_mask, exact_additive_mask};
use crate::probe::{AttentionView, Probe, ResidualSite};
use crate::rope::Rope;
use crate::slim::SlimRun;
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

/// The keys and values one chunk's queries read at a layer, with the
/// positions of the keys.
struct ChunkKeys<'a> {
    keys: Tensor,
    values: Tensor,
    positions: &'a [usize],
}

impl<'a> ChunkKeys<'a> {
    /// Without the first `n` keys.
    fn skip(self, n: usize) -> Result<Self> {
        let rest = self.positions.len() - n;
        Ok(Self {
            keys: self.keys.narrow(1, n, rest)?,
            values: self.values.narrow(1, n, rest)?,
            positions: &self.positions[n..],
        })
    }
}

/// The residual stream after layer `layer`: `hidden` plus the attention
/// output `attn` (through the output projection), then plus the MLP's.
fn layer_residuals(layer: &Layer, hidden: &Tensor, attn: &Tensor) -> Result<Tensor> {
    let mut attn_out = layer.attn.output(attn)?;
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

/// A loaded model.
#[derive(Debug, Clone)]
pub struct Decoder {
    cfg: ModelConfig,
    dtype: DType,
    mode: WeightMode,
    device: Device,
    embed: Embedding,
    layers: Vec<Layer>,
    final_norm: RmsNorm,
    lm_head: Linear,
    rope: Rope,
    /// Most score elements (heads x queries x keys) one attention block holds.
    attention_block_elems: usize,
}

/// The tensor in which llama.cpp stores per-frequency RoPE divisors.
const ROPE_FACTORS: &str = "rope_freqs.weight";

/// How a model's weights are held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightMode {
    /// Every tensor converted to this float dtype (the exact path).
    Dense(DType),
    /// Matrices kept in their stored ggml type (GGUF), run by candle's
    /// quantized matrix products; activations and the cache in f32.
    Quantized,
}

impl WeightMode {
    /// How reports and tables name the mode: the dtype (`f32`, `bf16`), or `q`.
    pub fn name(&self) -> String {
        match self {
            WeightMode::Dense(dt) => format!("{dt:?}").to_lowercase(),
            WeightMode::Quantized => "q".into(),
        }
    }

    /// The dtype of activations and the K/V cache.
    pub fn activation_dtype(&self) -> DType {
        match self {
            WeightMode::Dense(dt) => *dt,
            WeightMode::Quantized => DType::F32,
        }
    }
}

/// Default bound on one attention block's scores on the CPU (1 GiB in f32).
pub const CPU_ATTENTION_BLOCK_ELEMS: usize = 1 << 28;

/// Default bound on one attention block's scores on a GPU (4 GiB in f32).
/// It must stay below 2^31: candle's CUDA softmax indexes with 32-bit ints.
pub const GPU_ATTENTION_BLOCK_ELEMS: usize = 1 << 30;

/// The bound on one attention block's scores a new decoder on `device` uses.
pub fn default_attention_block_elems(device: &Device) -> usize {
    if device.is_cpu() {
        CPU_ATTENTION_BLOCK_ELEMS
    } else {
        GPU_ATTENTION_BLOCK_ELEMS
    }
}

/// The mask built for the previous layer of the same chunk, reused while
/// the next layer sees the same queries, keys, window and visibility rule.
#[derive(Default)]
struct MaskMemo {
    key: Option<MaskKey>,
    mask: Option<Tensor>,
}

/// What a layer's mask depends on.
struct MaskKey {
    /// The visibility rule in force: [`Sequence::rule_at`].
    rule: usize,
    window: Option<usize>,
    queries: Vec<usize>,
    keys: Vec<usize>,
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
/// Not `Clone`: [`Sequence::fork`] copies the caches so that the copies
/// never append into a shared buffer.
#[derive(Debug)]
pub struct Sequence {
    policy: Policy,
    phases: TokenPhases,
    caches: Vec<LayerCache>,
    next_pos: usize,
    /// SlimInfer's selection and decisions (SlimInfer policies only).
    pub(crate) slim: Option<SlimRun>,
    /// A caller's visibility rule for a full-depth reference run.
    mask_rule: Option<MaskRule>,
}

/// A visibility rule `(layer, query, key) -> visible` given by a caller.
#[derive(Clone)]
struct MaskRule(std::sync::Arc<dyn Fn(usize, usize, usize) -> bool + Send + Sync>);

impl std::fmt::Debug for MaskRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MaskRule")
    }
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

    /// SlimInfer's state: kept blocks, decisions, traffic (SlimInfer only).
    pub fn slim(&self) -> Option<&SlimRun> {
        self.slim.as_ref()
    }

    /// Whether the token at `pos` has a hidden state (and K/V) at `layer`:
    /// the policy's rule, and for SlimInfer the blocks the run kept.
    pub fn token_exists(&self, layer: usize, pos: usize) -> bool {
        match &self.slim {
            Some(run) => run.selection().exists(layer, pos),
            None => self.policy.token_exists(layer, pos, &self.phases),
        }
    }

    /// Whether the cache at `layer` keeps the K/V of the token at `pos`.
    pub fn retains_kv(&self, layer: usize, pos: usize) -> bool {
        match &self.slim {
            Some(run) => run.selection().exists(layer, pos),
            None => self.policy.retains_kv(layer, pos, &self.phases),
        }
    }

    /// Whether a query at `q` reads the key at `k` (k <= q) at `layer`,
    /// before the model's own window: for SlimInfer, keys present there and
    /// in the cut's active blocks.
    pub fn key_visible(&self, layer: usize, q: usize, k: usize) -> bool {
        if let Some(rule) = &self.mask_rule {
            return k == q || (rule.0)(layer, q, k);
        }
        match &self.slim {
            Some(run) => run.selection().decode_reads(layer, k),
            None => self.policy.key_visible(layer, q, k, &self.phases),
        }
    }

    /// An id of the visibility rule at `layer`: layers with the same id see
    /// the same keys the same way (0 where everything is visible).
    fn rule_at(&self, layer: usize) -> usize {
        if self.mask_rule.is_some() {
            return layer + 1;
        }
        match &self.slim {
            Some(run) => run.selection().segment(layer),
            None => usize::from(self.policy.is_upper(layer)),
        }
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
        if policy.slim().is_some() {
            return Err(ModelError::SlimNotRestrictable {
                policy: policy.to_string(),
            });
        }
        if !self.policy.is_full_depth() || self.slim.is_some() {
            return Err(ModelError::NotFullDepthPrefix {
                policy: self.policy.to_string(),
            });
        }
        if self.next_pos > phases.decode_start() {
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
            slim: None,
            mask_rule: None,
        })
    }

    /// An independent copy of this state (the caches' tokens copied), to
    /// continue it in two ways.
    pub fn fork(&self) -> Result<Sequence> {
        Ok(Sequence {
            policy: self.policy,
            phases: self.phases,
            caches: self
                .caches
                .iter()
                .map(LayerCache::fork)
                .collect::<Result<Vec<_>>>()?,
            next_pos: self.next_pos,
            slim: self.slim.clone(),
            mask_rule: self.mask_rule.clone(),
        })
    }

    /// Reserve cache room for `total_len` tokens in all, each layer only for
    /// the tokens the policy keeps there.
    /// SlimInfer layers above the first cut reserve for the blocks the
    /// budgets predict, never for the whole prompt.
    pub fn reserve(&mut self, total_len: usize) {
        let predicted = self.policy.slim().map(|params| {
            let s = self.phases.decode_start();
            params.predicted_kept_tokens(self.phases.prefill_len(), s)
        });
        for (layer, cache) in self.caches.iter_mut().enumerate() {
            let mut kept = (self.next_pos..total_len)
                .filter(|&p| self.policy.retains_kv(layer, p, &self.phases))
                .count();
            if let (Some(kept_at), Some(params)) = (&predicted, self.policy.slim()) {
                let seg = params.segment(layer);
                if seg > 0 && self.next_pos < self.phases.decode_start() {
                    kept += kept_at[seg - 1];
                }
            }
            cache.reserve(kept);
        }
    }
}

impl Decoder {
    /// Load a Hugging Face model folder or a `.gguf` file with weights
    /// converted to `dtype`.
    pub fn load(path: &Path, dtype: DType, device: &Device) -> Result<Self> {
        Self::load_as(path, WeightMode::Dense(dtype), device)
    }

    /// Load a Hugging Face model folder or a `.gguf` file, dense in a dtype
    /// or with a GGUF's matrices kept quantized.
    pub fn load_as(path: &Path, mode: WeightMode, device: &Device) -> Result<Self> {
        if is_gguf_path(path) {
            return Self::from_gguf(GgufFile::open(path)?, mode, device);
        }
        if path.is_file() {
            return Err(ModelError::MissingFile {
                path: path.to_path_buf(),
                what: "a model is a Hugging Face folder (config.json, model.safetensors) or a file ending in .gguf".into(),
            });
        }
        let cfg = ModelConfig::from_folder(path)?;
        let files = WeightFiles::open(path)?;
        Self::build(cfg, &files, mode, device)
    }

    /// Build the decoder from an opened GGUF file (for callers that also
    /// read its tokenizer, so the file is parsed once).
    pub fn from_gguf(file: GgufFile, mode: WeightMode, device: &Device) -> Result<Self> {
        let cfg = file.config().clone();
        Self::build(cfg, &GgufWeights::new(file), mode, device)
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
        let attention_block_elems = default_attention_block_elems(device);
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
            attention_block_elems,
        })
    }

    /// Bound the scores of one attention block to `elems` elements (heads x
    /// queries x keys): a chunk whose scores would be larger is attended in
    /// blocks of query rows, so a long prompt's prefill never materialises
    /// [chunk x context] scores for all heads at once. Results do not depend
    /// on it; at least one query row is attended per block.
    pub fn set_attention_block_elems(&mut self, elems: usize) {
        self.attention_block_elems = elems.clamp(1, GPU_ATTENTION_BLOCK_ELEMS);
    }

    /// The bound on one attention block's scores (elements).
    pub fn attention_block_elems(&self) -> usize {
        self.attention_block_elems
    }

    /// How many matrices (projections and LM head) are held quantized.
    pub fn quantized_matrices(&self) -> usize {
        let layers = self
            .layers
            .iter()
            .flat_map(|l| l.attn.linears().into_iter().chain(l.mlp.linears()));
        layers
            .chain(std::iter::once(&self.lm_head))
            .filter(|lin| lin.is_quantized())
            .count()
    }

    /// How many matrices (projections and LM head) are read in place from a
    /// mapped GGUF file by lcut's kernels (no copy held).
    pub fn mapped_matrices(&self) -> usize {
        let layers = self
            .layers
            .iter()
            .flat_map(|l| l.attn.linears().into_iter().chain(l.mlp.linears()));
        layers
            .chain(std::iter::once(&self.lm_head))
            .filter(|lin| matches!(lin, Linear::Mapped { .. }))
            .count()
    }

    /// Layer `layer`'s linear layers by module path (`self_attn.q_proj`),
    /// for adapters.
    pub(crate) fn layer_linears_mut(&mut self, layer: usize) -> Vec<(String, &mut Linear)> {
        let Some(l) = self.layers.get_mut(layer) else {
            return vec![];
        };
        let attn = l.attn.named_linears_mut().into_iter();
        let attn = attn.map(|(m, lin)| (format!("self_attn.{m}"), lin));
        let mlp = l.mlp.named_linears_mut().into_iter();
        attn.chain(mlp.map(|(m, lin)| (format!("mlp.{m}"), lin)))
            .collect()
    }

    /// The final norm's scale, then every layer's input norm's.
    pub(crate) fn norm_weights(&self) -> Vec<&Tensor> {
        let layers = self.layers.iter().map(|l| l.input_norm.weight());
        std::iter::once(self.final_norm.weight())
            .chain(layers)
            .collect()
    }

    /// How the weights are held (dense in a dtype, or quantized).
    pub fn weight_mode(&self) -> WeightMode {
        self.mode
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
        self.cfg.kv_shape(self.dtype)
    }

    /// A new, empty sequence under `policy` with the given token phases.
    pub fn new_sequence(&self, policy: Policy, phases: TokenPhases) -> Result<Sequence> {
        if policy.num_layers() != self.cfg.num_layers {
            return Err(depth_mismatch(&policy, self.cfg.num_layers));
        }
        let slim = policy
            .slim()
            .map(|params| SlimRun::new(*params, phases, self.cfg.num_layers));
        Ok(Sequence {
            policy,
            phases,
            caches: (0..self.cfg.num_layers)
                .map(|_| LayerCache::new())
                .collect(),
            next_pos: 0,
            slim,
            mask_rule: None,
        })
    }

    /// A new full-depth sequence.
    pub fn new_full_sequence(&self) -> Sequence {
        Sequence {
            policy: Policy::full(self.cfg.num_layers),
            phases: TokenPhases::all_decode(),
            caches: (0..self.cfg.num_layers)
                .map(|_| LayerCache::new())
                .collect(),
            next_pos: 0,
            slim: None,
            mask_rule: None,
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
        let (hidden, present) = self.embed(tokens, start, &mut probe)?;
        let last = start + n - 1;
        if seq.slim.as_ref().is_some_and(|run| !run.is_decided()) {
            let out = self.slim_prefill(seq, hidden, present, last, rows, &mut probe);
            seq.next_pos = start + n;
            return out;
        }
        let decode_step = seq.slim.is_some();
        let layers = 0..self.layers.len();
        let (hidden, present) =
            self.run_layers(seq, layers, hidden, present, decode_step, &mut probe)?;
        seq.next_pos = start + n;
        self.logits(&hidden, &present, last, rows)
    }

    /// The (scaled) embeddings of a chunk starting at `start`, and its positions.
    fn embed(
        &self,
        tokens: &[u32],
        start: usize,
        probe: &mut Option<&mut (dyn Probe + '_)>,
    ) -> Result<(Tensor, Vec<usize>)> {
        let ids = Tensor::new(tokens, &self.device)?;
        let mut hidden = self.embed.lookup(&ids)?;
        if let Some(scale) = self.cfg.embedding_scale {
            hidden = (hidden * scale)?;
        }
        let present: Vec<usize> = (start..start + tokens.len()).collect();
        if let Some(p) = probe.as_deref_mut()
            && p.wants_residual(ResidualSite::Embeddings)
        {
            p.on_residual(ResidualSite::Embeddings, &present, &hidden)?;
        }
        Ok((hidden, present))
    }

    /// Run hidden states at `present` through `layers`, dropping the tokens
    /// that do not exist at a layer; returns what is left after the last.
    /// `decode_step`: a SlimInfer decode step, whose decision layers update
    /// the active blocks.
    pub(crate) fn run_layers(
        &self,
        seq: &mut Sequence,
        layers: std::ops::Range<usize>,
        mut hidden: Tensor,
        mut present: Vec<usize>,
        decode_step: bool,
        probe: &mut Option<&mut (dyn Probe + '_)>,
    ) -> Result<(Tensor, Vec<usize>)> {
        let mut tables = self.rope.tables(&present, self.dtype)?;
        let mut masks = MaskMemo::default();
        for l in layers {
            let layer = &self.layers[l];
            let keep: Vec<u32> = (0..present.len() as u32)
                .filter(|&i| seq.token_exists(l, present[i as usize]))
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
            hidden =
                self.layer_forward(l, layer, &hidden, &present, &tables, seq, &mut masks, probe)?;
            if let Some(p) = probe.as_deref_mut()
                && p.wants_residual(ResidualSite::Layer(l))
            {
                p.on_residual(ResidualSite::Layer(l), &present, &hidden)?;
            }
            if decode_step {
                self.slim_decode_decision(seq, l)?;
            }
        }
        Ok((hidden, present))
    }

    /// Logits of the requested rows of hidden states at `present`.
    pub(crate) fn logits(
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
                let z = self
                    .lm_head
                    .forward(&self.final_norm.forward(&h)?)?
                    .to_dtype(DType::F32)?;
                Some(match self.cfg.final_softcap {
                    Some(c) => ((z / c)?.tanh()? * c)?,
                    None => z,
                })
            }
        };
        Ok(ChunkOutput { logits, positions })
    }

    /// One decoder layer over a chunk: projections, the chunk's K/V into
    /// the cache (what the policy keeps), attention, then the MLP.
    #[allow(clippy::too_many_arguments)]
    fn layer_forward(
        &self,
        l: usize,
        layer: &Layer,
        hidden: &Tensor,
        present: &[usize],
        (cos, sin): &(Tensor, Tensor),
        seq: &mut Sequence,
        masks: &mut MaskMemo,
        probe: &mut Option<&mut (dyn Probe + '_)>,
    ) -> Result<Tensor> {
        let x = layer.input_norm.forward(hidden)?;
        let qkv = layer.attn.qkv(&x, &self.rope, cos, sin)?;
        if let Some(run) = seq.slim.as_mut() {
            run.observe_queries(l, &qkv.q)?;
        }
        let retained: Vec<u32> = (0..present.len() as u32)
            .filter(|&i| seq.retains_kv(l, present[i as usize]))
            .collect();
        let (keys, values, key_positions) = if retained.len() == present.len() {
            seq.caches[l].append(&qkv.k, &qkv.v, present)?;
            let cache = &seq.caches[l];
            let (k, v) = cache.kv()?.ok_or(ModelError::EmptyCache { layer: l })?;
            (k, v, Cow::Borrowed(cache.positions()))
        } else {
            let (k, v, positions) =
                self.keys_kept_in_part(&mut seq.caches[l], &qkv, present, &retained)?;
            (k, v, Cow::Owned(positions))
        };
        let keys = ChunkKeys {
            keys,
            values,
            positions: &key_positions,
        };
        let attn = self.attend_layer(l, layer.window, &qkv.q, keys, present, seq, masks, probe)?;
        layer_residuals(layer, hidden, &attn)
    }

    /// The keys and values a chunk reads when the cache keeps only the
    /// `retained` rows of it (SelfOnly): the cache's and the whole chunk's,
    /// with their positions; the retained rows are appended to the cache.
    fn keys_kept_in_part(
        &self,
        cache: &mut LayerCache,
        qkv: &Qkv,
        present: &[usize],
        retained: &[u32],
    ) -> Result<(Tensor, Tensor, Vec<usize>)> {
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
            let idx = Tensor::new(retained, &self.device)?;
            let pos: Vec<usize> = retained.iter().map(|&i| present[i as usize]).collect();
            cache.append(
                &qkv.k.index_select(&idx, 1)?,
                &qkv.v.index_select(&idx, 1)?,
                &pos,
            )?;
        }
        Ok((k, v, key_positions))
    }

    /// Layer `l`'s attention of the chunk's queries `q` over `keys`: keys
    /// outside a sliding window dropped, the policy's mask, and the probe
    /// told of the attention rows it asks for.
    #[allow(clippy::too_many_arguments)]
    fn attend_layer(
        &self,
        l: usize,
        window: Option<usize>,
        q: &Tensor,
        keys: ChunkKeys<'_>,
        present: &[usize],
        seq: &Sequence,
        masks: &mut MaskMemo,
        probe: &mut Option<&mut (dyn Probe + '_)>,
    ) -> Result<Tensor> {
        let probs_from = probe
            .as_deref()
            .and_then(|p| p.attention_from(l))
            .map(|from| present.partition_point(|&q| q < from))
            .filter(|&first| first < present.len());
        // Keys older than the window of the chunk's first query are read by
        // none of its queries: a windowed layer reads `window` keys, not the
        // whole context (kept when a probe wants the attention rows whole).
        let skip = match (window, probs_from) {
            (Some(w), None) => keys.positions.partition_point(|&k| k + w <= present[0]),
            _ => 0,
        };
        let ChunkKeys {
            keys,
            values,
            positions: key_positions,
        } = if skip > 0 { keys.skip(skip)? } else { keys };
        let mask = self.layer_mask(l, window, seq, present, key_positions, masks)?;
        let (attn, probs) = self.attend(q, &keys, &values, mask.as_ref(), probs_from)?;
        if let (Some(p), Some(first), Some(probs)) = (probe.as_deref_mut(), probs_from, probs) {
            p.on_attention(AttentionView {
                layer: l,
                query_positions: &present[first..],
                key_positions,
                probs: &probs,
            })?;
        }
        Ok(attn)
    }

    /// The additive mask of layer `l` for these queries and keys, or `None`
    /// when every key is visible to every query. A decode step over a
    /// cache the policy hides nothing of costs O(1) here, whatever the
    /// context length; a prefill chunk's mask is built once and reused by
    /// the following layers that see the same keys under the same rule.
    fn layer_mask(
        &self,
        l: usize,
        window: Option<usize>,
        seq: &Sequence,
        queries: &[usize],
        keys: &[usize],
        memo: &mut MaskMemo,
    ) -> Result<Option<Tensor>> {
        // `Sequence::key_visible` depends on the layer only through `rule_at`.
        let rule = seq.rule_at(l);
        if rule == 0 && window.is_none() && keys.last() <= queries.first() {
            return Ok(None);
        }
        if let Some(key) = &memo.key
            && key.rule == rule
            && key.window == window
            && key.queries == queries
            && key.keys == keys
        {
            return Ok(memo.mask.clone());
        }
        let visible = |q, k| seq.key_visible(l, q, k);
        let mask = match seq.mask_rule {
            Some(_) => Some(exact_additive_mask(queries, keys, window, visible)),
            None => additive_mask(queries, keys, window, visible),
        }
        .map(|m| self.mask_tensor(m, queries.len(), keys.len()))
        .transpose()?;
        memo.key = Some(MaskKey {
            rule,
            window,
            queries: queries.to_vec(),
            keys: keys.to_vec(),
        });
        memo.mask = mask.clone();
        Ok(mask)
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
    /// share a KV head are stacked into one matrix per KV head. Query rows
    /// are taken in blocks whose scores stay within the block bound.
    /// Returns the output [heads, n, head_dim] and, when `probs_from` is
    /// given, the probabilities of rows `probs_from..n` [heads, rows, keys] (f32).
    fn attend(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: Option<&Tensor>,
        probs_from: Option<usize>,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let (heads, n, _) = q.dims3()?;
        let keys = k.dim(1)?;
        let rows_per_block = (self.attention_block_elems / (heads * keys).max(1)).max(1);
        if rows_per_block >= n {
            let (out, probs) = self.attend_block(q, k, v, mask)?;
            let probs = probs_from
                .map(|first| probs.narrow(1, first, n - first))
                .transpose()?;
            return Ok((out, probs));
        }
        let (mut outs, mut kept) = (Vec::new(), Vec::new());
        for start in (0..n).step_by(rows_per_block) {
            let rows = rows_per_block.min(n - start);
            let q_block = q.narrow(1, start, rows)?.contiguous()?;
            let mask_block = mask.map(|m| m.narrow(0, start, rows)).transpose()?;
            let (out, probs) = self.attend_block(&q_block, k, v, mask_block.as_ref())?;
            outs.push(out);
            if let Some(first) = probs_from
                && start + rows > first
            {
                let skip = first.saturating_sub(start);
                kept.push(probs.narrow(1, skip, rows - skip)?);
            }
        }
        let probs = if kept.is_empty() {
            None
        } else {
            Some(Tensor::cat(&kept, 1)?)
        };
        Ok((Tensor::cat(&outs, 1)?, probs))
    }

    /// [`Self::attend`] for one block of query rows, all at once.
    fn attend_block(
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

    /// Teacher forcing at full depth with a caller's visibility rule: every
    /// token exists at every layer, and a query at `q` reads the key at
    /// `k <= q` at `layer` when `visible(layer, q, k)` (and always itself,
    /// so that no row is empty). The reference against which pruned runs
    /// are checked: hiding a token's key from every later query must give
    /// what removing the token gives. Logits for every position [T, vocab].
    pub fn teacher_forced_masked(
        &self,
        tokens: &[u32],
        visible: impl Fn(usize, usize, usize) -> bool + Send + Sync + 'static,
    ) -> Result<Tensor> {
        let mut seq = self.new_full_sequence();
        seq.mask_rule = Some(MaskRule(std::sync::Arc::new(visible)));
        let out = self.forward(&mut seq, tokens, LogitRows::All, None)?;
        out.logits.ok_or(ModelError::MissingLogits)
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
        out.logits.ok_or(ModelError::MissingLogits)
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
