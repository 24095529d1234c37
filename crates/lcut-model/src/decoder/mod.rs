//! The decoder: one implementation for every supported architecture, run
//! chunk by chunk over a [`Sequence`] whose cache follows a visibility policy.
//!
//! `load` builds a decoder from a model's files, `layer` is one decoder
//! layer top to bottom (the program both executors run), `pass` runs a
//! chunk through the layers as tensors, `step` one new token per sequence
//! through lcut's kernels, `attention` is one layer's attention with its mask,
//! `projected` keeps the K/V a policy projects for tokens that left below,
//! `stages` is the staged prefill of a policy that decides at stage cuts,
//! `prompt_end` the decision of a policy that decides once the prompt has
//! run, `above` a pass that starts above the layers a policy runs as the
//! full model does, from the full run's states.

mod above;
mod attention;
mod batch;
mod chunk_attention;
mod flash;
mod grouped;
mod layer;
mod layer_inputs;
mod lens;
mod load;
mod pass;
mod projected;
mod prompt_end;
mod reads;
mod stages;
mod step;
mod step_model;
mod train;
pub use train::TrainKv;

pub use flash::{
    FUSED_ATTENTION_VAR, FusedAttentionCheck, check_fused_attention, fused_attention_refusal,
    fused_attention_runs,
};
pub(crate) use pass::ChunkRows;
pub use reads::BatchSoftmax;
#[cfg(test)]
pub(crate) use step::read_group_rows;
pub use step::{StepScratch, Unfused};

use candle_core::{D, DType, Device, Tensor};
use lcut_policy::window::first_readable;
use lcut_policy::{
    KvShape, KvSharing, Policy, PressObservation, PressRun, RecurrentLayers, TokenPhases,
};

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::layers::{FeedForward, RmsNorm};
use crate::linear::{Embedding, Linear};
use crate::probe::Probe;
use crate::rope::Rope;
use crate::sequence::{CacheShape, ReferenceMask, Sequence};
use layer::Layer;

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
    /// The sliding layers' RoPE where it is not `rope` (Gemma 3).
    sliding_rope: Option<Rope>,
    /// Most score elements (heads x queries x keys) one attention block holds.
    attention_block_elems: usize,
    /// The storage type of the K/V cache.
    kv_dtype: DType,
    /// What the fused decode step reads, made at its first use.
    step: std::sync::OnceLock<std::result::Result<step_model::StepModel, Unfused>>,
    /// Decode steps stay on the tensor path.
    fused_off: bool,
    /// Which layer's K/V each layer reads (Gemma 4's shared layers).
    sharing: KvSharing,
    /// The per-layer inputs' weights, where the model has them (Gemma 4).
    layer_inputs: Option<layer_inputs::LayerInputs>,
    /// Which layers are recurrent (Qwen3.5's linear attention).
    recurrent: RecurrentLayers,
}

/// How a model's weights are held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightMode {
    /// Every tensor converted to this float dtype (the exact path).
    Dense(DType),
    /// Matrices kept in their stored ggml type (GGUF), read in place from
    /// the mapped file by lcut's kernels (or candle's quantized products for
    /// types the kernels do not read); activations in f32.
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

    /// The K/V cache's dtype when the user leaves it to lcut (`--kv-dtype
    /// auto`, the Python package's default): f16 for quantized weights, as
    /// llama.cpp keeps its cache, the weights' own dtype otherwise (f32
    /// stays the exact path).
    pub fn default_kv_dtype(&self) -> DType {
        match self {
            WeightMode::Dense(dt) => *dt,
            WeightMode::Quantized => DType::F16,
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

impl Decoder {
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

    /// How the linear-attention layers (Qwen3.5's Gated DeltaNet) run a
    /// prompt's rows: in transformers' chunked form with chunks of `chunk`
    /// rows (a power of two; 64 is transformers'), or row by row on the
    /// host with `None`. The default is row by row on the CPU and chunks of
    /// 64 on other devices. The two agree within rounding; decode steps and
    /// the probes' prompt/decode split run row by row either way.
    pub fn set_linear_chunk(&mut self, chunk: Option<usize>) {
        for net in self.layers.iter_mut().filter_map(|l| l.linear.as_mut()) {
            net.set_chunk(chunk);
        }
    }

    /// Every projection, router and expert of every layer, then the LM head.
    fn matrices(&self) -> impl Iterator<Item = &Linear> {
        self.layers
            .iter()
            .flat_map(|l| {
                let linear = l.linear.iter().flat_map(|net| net.linears());
                linear.chain(l.attn.linears()).chain(l.mlp.linears())
            })
            .chain(std::iter::once(&self.lm_head))
    }

    /// How many matrices (projections and LM head) are held quantized.
    pub fn quantized_matrices(&self) -> usize {
        self.matrices().filter(|lin| lin.is_quantized()).count()
    }

    /// Bytes of weights one decode step reads: every projection and the LM
    /// head once, and of a mixture of experts the router and the `top_k`
    /// experts a token runs (norms and biases are too small to count).
    pub fn decode_weight_bytes(&self) -> usize {
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                l.attn
                    .linears()
                    .into_iter()
                    .chain(l.linear.iter().flat_map(|net| net.linears()))
                    .map(Linear::bytes)
                    .sum::<usize>()
                    + l.mlp.token_bytes()
            })
            .sum();
        layers + self.lm_head.bytes()
    }

    /// Bytes of every projection, every expert and the LM head as loaded.
    fn matrix_bytes(&self) -> usize {
        self.matrices().map(Linear::bytes).sum()
    }

    /// Bytes the model's weights take as loaded: every matrix (all the
    /// experts, not only those a token runs) and the embedding table where
    /// it is not the LM head's (norms and biases are too small to count). A
    /// GGUF kept quantized counts its blocks' bytes, not parameters times a
    /// dtype.
    pub fn weight_bytes(&self) -> usize {
        let table = if self.cfg.tie_word_embeddings {
            0
        } else {
            self.embed.bytes()
        };
        self.matrix_bytes() + table
    }

    /// How many matrices (projections and LM head) are read in place from a
    /// mapped GGUF file by lcut's kernels (no copy held).
    pub fn mapped_matrices(&self) -> usize {
        self.matrices()
            .filter(|lin| matches!(lin, Linear::Mapped { .. }))
            .count()
    }

    /// How many matrices read in place from a GGUF file are packed into
    /// the kernels' interleaved layout: all of them at load on CPUs with
    /// AVX2, but experts only once a token has read them.
    pub fn packed_matrices(&self) -> usize {
        self.matrices()
            .filter(|lin| matches!(lin, Linear::Mapped { matrix, .. } if matrix.is_packed()))
            .count()
    }

    /// Pack now every matrix left to be packed when a token first reads it
    /// (a mixture's experts); how many this call packed. A benchmark calls
    /// it before timing, as llama.cpp's warm-up reads every expert, so that
    /// no measured step pays for packing. Resident memory then holds every
    /// expert, as it does once enough tokens have run.
    pub fn pack_deferred(&self) -> Result<usize> {
        let mut packed = 0;
        for lin in self.matrices() {
            if let Linear::Mapped { matrix, .. } = lin
                && matrix.pack_if_deferred()?
            {
                packed += 1;
            }
        }
        Ok(packed)
    }

    /// Layer `layer`'s linear layers by module path (`self_attn.q_proj`),
    /// for adapters.
    pub(crate) fn layer_linears_mut(&mut self, layer: usize) -> Vec<(String, &mut Linear)> {
        // the matrices may change: the step model is made again
        self.step = std::sync::OnceLock::new();
        let Some(l) = self.layers.get_mut(layer) else {
            return vec![];
        };
        let attn = l.attn.named_linears_mut().into_iter();
        let attn = attn.map(|(m, lin)| (format!("self_attn.{m}"), lin));
        // a layer of experts offers adapters its attention only
        let mlp = match &mut l.mlp {
            FeedForward::Dense(m) | FeedForward::DenseAndExperts(m, _) => m.named_linears_mut(),
            FeedForward::Experts(_) => vec![],
        };
        attn.chain(mlp.into_iter().map(|(m, lin)| (format!("mlp.{m}"), lin)))
            .collect()
    }

    /// The storage type of the K/V cache of new tokens (the activations'
    /// dtype by default; f16 or bf16 halve the bytes a decode step reads of
    /// the cache).
    pub fn kv_dtype(&self) -> DType {
        self.kv_dtype
    }

    /// Append K/V rows [kv_heads, n, head_dim] of `positions` to `cache`,
    /// stored in the decoder's K/V dtype: every path that fills a cache
    /// (a prefill chunk, projected K/V, a fused decode step) goes through
    /// here, so a cache never mixes dtypes.
    pub(crate) fn store_kv(
        &self,
        cache: &mut crate::cache::LayerCache,
        (k, v): (&Tensor, &Tensor),
        positions: &[usize],
    ) -> Result<()> {
        self.store_kv_by_head(cache, (k, v), positions, |_, _| true)
    }

    /// [`Decoder::store_kv`] into a cache whose K/V heads may hold different
    /// rows: a split cache's head `h` takes the rows for which `keep(h,
    /// position)` holds.
    pub(crate) fn store_kv_by_head(
        &self,
        cache: &mut crate::cache::LayerCache,
        (k, v): (&Tensor, &Tensor),
        positions: &[usize],
        keep: impl Fn(usize, usize) -> bool,
    ) -> Result<()> {
        let (k, v) = (k.to_dtype(self.kv_dtype)?, v.to_dtype(self.kv_dtype)?);
        cache.append_by_head(&k, &v, positions, keep)
    }

    /// Store new tokens' K/V in `dtype` (f32, f16 or bf16; others refused).
    pub fn set_kv_dtype(&mut self, dtype: DType) -> Result<()> {
        if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
            return Err(ModelError::KvDtype { dtype });
        }
        self.kv_dtype = dtype;
        Ok(())
    }

    /// cos and sin tables of `positions` for each RoPE of the model, in the
    /// order [`Layer::rope`] indexes them.
    pub(crate) fn rope_tables(&self, positions: &[usize]) -> Result<Vec<(Tensor, Tensor)>> {
        std::iter::once(&self.rope)
            .chain(&self.sliding_rope)
            .map(|r| r.tables(positions, self.dtype))
            .collect()
    }

    /// The RoPE [`Layer::rope`] index `index` names: 0 the model's, 1 the
    /// sliding layers' own where they have one.
    pub(crate) fn rope_at(&self, index: usize) -> &Rope {
        match (index, &self.sliding_rope) {
            (1, Some(r)) => r,
            _ => &self.rope,
        }
    }

    /// The host cos and sin of one position for each RoPE of the model,
    /// into `tables` (in [`Layer::rope`]'s order), as the fused step reads them.
    pub(crate) fn rope_tables_into(&self, position: usize, tables: &mut Vec<(Vec<f32>, Vec<f32>)>) {
        let ropes = std::iter::once(&self.rope).chain(&self.sliding_rope);
        tables.resize_with(
            1 + usize::from(self.sliding_rope.is_some()),
            Default::default,
        );
        for (rope, (cos, sin)) in ropes.zip(tables.iter_mut()) {
            rope.tables_into(position, cos, sin);
        }
    }

    /// The final norm's scale, then every layer's first norm's (its input
    /// norm, or the norm after its attention where it has none before).
    pub(crate) fn norm_weights(&self) -> Vec<&Tensor> {
        let layers = self.layers.iter().filter_map(|l| {
            l.input_norm
                .as_ref()
                .or(l.attn_out_norm.as_ref())
                .map(|n| n.weight())
        });
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

    /// Shape of one token's K/V (in the cache's dtype), for the cost model.
    pub fn kv_shape(&self) -> KvShape {
        self.cfg.kv_shape(self.kv_dtype)
    }

    /// What a sequence's caches need to know of this model.
    fn cache_shape(&self) -> CacheShape {
        CacheShape {
            kv_heads: self.layers.iter().map(|l| l.attn.num_kv_heads()).collect(),
            windows: self.layers.iter().map(|l| l.window).collect(),
            sharing: self.sharing.clone(),
        }
    }

    /// Which layers are recurrent (Qwen3.5's linear attention) and what
    /// their states hold.
    pub fn recurrent_layers(&self) -> &RecurrentLayers {
        &self.recurrent
    }

    /// Which layer's K/V each layer reads: every layer its own, except
    /// Gemma 4's shared layers.
    pub fn kv_sharing(&self) -> &KvSharing {
        &self.sharing
    }

    /// Bytes of K/V `policy` keeps for a sequence of `cost`'s phases on this
    /// model: the uniform formula ([`lcut_policy::KvCost::bytes`]), or,
    /// for a model whose layers differ in K/V shape or share K/V, the
    /// layer-by-layer count ([`Decoder::layered_kv_bytes`]).
    pub fn kv_bytes_for(&self, policy: &Policy, cost: &lcut_policy::KvCost) -> u64 {
        let phases = TokenPhases::from_counts(cost.anchors, cost.prefill);
        let len = cost.anchors + cost.prefill + cost.decode;
        let rule = policy.visibility(phases);
        self.layered_kv_bytes(rule.as_ref(), len)
            .unwrap_or_else(|| cost.bytes(policy, &self.kv_shape(), &self.cfg.sliding_window))
    }

    /// Bytes of K/V a sequence under `rule` holds once `len` tokens have
    /// run, counted layer by layer ([`KvSharing::held_bytes`]), for a model
    /// whose layers differ in K/V shape or share K/V (Gemma 4); `None` for
    /// the others, whose K/V the uniform formula ([`Decoder::kv_shape`])
    /// counts.
    pub fn layered_kv_bytes(&self, rule: &dyn lcut_policy::Visibility, len: usize) -> Option<u64> {
        let shapes: Vec<lcut_policy::LayerKvShape> = self
            .layers
            .iter()
            .map(|l| lcut_policy::LayerKvShape {
                kv_heads: l.attn.num_kv_heads(),
                head_dim: l.attn.head_dim(),
            })
            .collect();
        let uniform = shapes.windows(2).all(|w| w[0] == w[1]);
        if uniform && !self.sharing.any() {
            return None;
        }
        let windows: Vec<Option<usize>> = self.layers.iter().map(|l| l.window).collect();
        let bytes = self.kv_dtype.size_in_bytes();
        Some(self.sharing.held_bytes(rule, len, &shapes, &windows, bytes))
    }

    /// Bytes of the K/V buffers a sequence under `rule` makes room for to
    /// run `len` tokens ([`Sequence::reserve`]'s rows): what its caches
    /// allocate, which a sliding layer's make twice its window
    /// ([`crate::memory::window_cache_rows`]) where the policy's count
    /// ([`Decoder::kv_bytes_for`]) holds one window.
    pub fn kv_bytes_reserved(&self, rule: &dyn lcut_policy::Visibility, len: usize) -> u64 {
        self.kv_bytes_by_layer(|l, window| {
            crate::memory::window_cache_rows(window, rule.accounting().kv_rows(l, 0, len))
        })
    }

    /// Bytes of the K/V buffers a sequence under `rule` allocates itself to
    /// run `len` tokens when it branches from a run of its first
    /// `prompt_len` tokens and reads the prompt rows it keeps in the layers
    /// below `shared_below` from that run's buffers
    /// ([`crate::memory::branch_cache_rows`]); from `shared_below` up it
    /// holds all of its rows itself.
    pub fn kv_bytes_branch_reserved(
        &self,
        rule: &dyn lcut_policy::Visibility,
        (prompt_len, len): (usize, usize),
        shared_below: usize,
    ) -> u64 {
        self.kv_bytes_by_layer(|l, window| {
            let rows = |n| rule.accounting().kv_rows(l, 0, n);
            match l < shared_below {
                true => crate::memory::branch_cache_rows(window, rows(prompt_len), rows(len)),
                false => crate::memory::window_cache_rows(window, rows(len)),
            }
        })
    }

    /// Bytes of the K/V buffers of `rows(layer, window)` rows in each
    /// layer that stores K/V.
    fn kv_bytes_by_layer(&self, rows: impl Fn(usize, Option<usize>) -> usize) -> u64 {
        let bytes = self.kv_dtype.size_in_bytes() as u64;
        self.layers
            .iter()
            .enumerate()
            .filter(|(l, _)| self.sharing.stores(*l))
            .map(|(l, layer)| {
                let row = 2 * (layer.attn.num_kv_heads() * layer.attn.head_dim()) as u64 * bytes;
                rows(l, layer.window) as u64 * row
            })
            .sum()
    }

    /// A new, empty sequence under `policy` with the given token phases.
    pub fn new_sequence(&self, policy: Policy, phases: TokenPhases) -> Result<Sequence> {
        if policy.num_layers() != self.cfg.num_layers {
            return Err(depth_mismatch(&policy, self.cfg.num_layers));
        }
        let kv_heads_at = |l: usize| self.layers.get(l).map_or(0, |x| x.attn.num_kv_heads());
        if let Some(heads) = policy.heads()
            && let Some(&(layer, kv_head)) =
                heads.set.pairs().iter().find(|p| p.1 >= kv_heads_at(p.0))
        {
            let kv_heads = kv_heads_at(layer);
            return Err(ModelError::Policy(
                lcut_policy::PolicyError::HeadOutOfRange {
                    path: policy.to_string(),
                    layer,
                    kv_head,
                    reason: format!("K/V head {kv_head} is past the model's {kv_heads} K/V heads"),
                },
            ));
        }
        self.check_layout(&policy)?;
        policy.check_phases(&phases)?;
        let seq = Sequence::with_rule(policy, policy.visibility(phases), self.cache_shape());
        self.check_prompt_end(&seq)?;
        Ok(seq)
    }

    /// Refuse `policy` where this model's layout gives it no meaning:
    /// layers that read another layer's K/V (Gemma 4) or hold a recurrent
    /// state instead of K/V (Qwen3.5) take the full model, SPEED, SelfOnly
    /// and knockout bands, and refuse the rest by
    /// name ([`KvSharing::check`], [`lcut_policy::RecurrentLayers::check`]).
    pub fn check_layout(&self, policy: &Policy) -> Result<()> {
        self.sharing.check(policy)?;
        self.recurrent.check(policy)?;
        Ok(())
    }

    /// Refuse kept K/V heads (a K/V budget's plans, `what` naming the
    /// request) where the layout gives them no meaning, before any work:
    /// layers that share K/V or hold a recurrent state.
    pub fn check_kept_heads(&self, what: &str) -> Result<()> {
        self.sharing.check_kept_heads(what)?;
        self.recurrent.check_kept_heads(what)?;
        Ok(())
    }

    /// A new sequence whose prompt run serves every press of `presses`
    /// (kvpress's presses, which decide at the prompt's end): it runs as the
    /// first of them but observes what all of them read of the prompt's
    /// queries, and once the prompt has run [`Sequence::retargeted`] gives
    /// each press its own state without running the prompt again. Refused
    /// where a policy is not a press, or where one run cannot observe for
    /// them all (Expected Attention's statistics over other spans).
    pub fn new_press_prefix(&self, presses: &[Policy], phases: TokenPhases) -> Result<Sequence> {
        let not_press = |p: &Policy| ModelError::NotRestrictable {
            policy: p.to_string(),
        };
        let first = presses.first().ok_or_else(|| ModelError::NotRestrictable {
            policy: "(no press given)".into(),
        })?;
        let params = presses
            .iter()
            .map(|p| p.press().copied().ok_or_else(|| not_press(p)))
            .collect::<Result<Vec<_>>>()?;
        let mut observe = PressObservation::default();
        for p in &params {
            observe = observe.union(PressObservation::of(p)).ok_or_else(|| {
                lcut_policy::PolicyError::PressShare {
                    observer: first.to_string(),
                    policy: p.to_string(),
                    reason: "they read query statistics over other spans or settings".into(),
                }
            })?;
        }
        let mut seq = self.new_sequence(*first, phases)?;
        seq.rule = Box::new(PressRun::observing(
            params[0],
            observe,
            phases,
            self.cfg.num_layers,
        )?);
        Ok(seq)
    }

    /// A new full-depth sequence.
    pub fn new_full_sequence(&self) -> Sequence {
        let policy = Policy::full(self.cfg.num_layers);
        Sequence::with_rule(
            policy,
            policy.visibility(TokenPhases::all_decode()),
            self.cache_shape(),
        )
    }

    /// Refuse `tokens` as `seq`'s next tokens when there are none, when
    /// they would run past the model's positions, or when one is outside
    /// the vocabulary.
    fn check_next(&self, seq: &Sequence, tokens: &[u32]) -> Result<()> {
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
        Ok(())
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
        self.check_next(seq, tokens)?;
        let (n, start) = (tokens.len(), seq.next_pos);
        if seq.awaits_prompt_end() && start + n > seq.phases().decode_start() {
            return self.forward_across_prompt_end(seq, tokens, rows, probe);
        }
        if n == 1
            && let Some(out) = self.fused_step(seq, tokens[0], rows, &mut probe)?
        {
            self.drop_unread(seq)?;
            return Ok(out);
        }
        let chunk = self.embed_rows(tokens, start, &mut probe)?;
        let last = start + n - 1;
        if seq.prefills_in_stages() {
            let out = self.staged_prefill(seq, chunk, last, rows, &mut probe);
            seq.next_pos = start + n;
            self.drop_unread(seq)?;
            return out;
        }
        let layers = 0..self.layers.len();
        let out = self.run_layers(seq, layers, chunk, Some(start), &mut probe)?;
        seq.next_pos = start + n;
        self.drop_unread(seq)?;
        self.logits(&out.hidden, &out.present, last, rows)
    }

    /// Drop the cache rows no later query of `seq` reads: rows older than a
    /// layer's sliding window, and, once the decode phase has started (no
    /// prompt query is left to run), the rows the policy does not keep for
    /// decoding (a layer's K/V the prompt's own queries read while it ran;
    /// per K/V head where the heads keep different rows). Pending chunks of
    /// a staged prefill still read their layers' rows: nothing goes while
    /// one waits; nor does a policy's row that decides at the prompt's end
    /// before it has.
    pub(crate) fn drop_unread(&self, seq: &mut Sequence) -> Result<()> {
        if !seq.pending.is_empty() {
            return Ok(());
        }
        let next = seq.next_pos;
        let decoding = next >= seq.rule.phases().decode_start() && !seq.awaits_prompt_end();
        for (l, (cache, layer)) in seq.caches.iter_mut().zip(&self.layers).enumerate() {
            if let Some(w) = layer.window {
                cache.drop_below(first_readable(w, next));
            }
            if decoding {
                self.retain_kept(seq.rule.as_ref(), l, cache)?;
            }
        }
        Ok(())
    }

    /// Keep in layer `l`'s `cache` only the rows `rule` keeps for decoding
    /// at a layer that reads it (per K/V head where the heads keep
    /// different rows).
    pub(crate) fn retain_kept(
        &self,
        rule: &dyn lcut_policy::Visibility,
        l: usize,
        cache: &mut crate::cache::LayerCache,
    ) -> Result<()> {
        let share = &self.sharing;
        let per_head = share.heads_differ(rule, l);
        let kv_heads = self.layers[l].attn.num_kv_heads();
        cache.retain_checked(kv_heads, per_head, |h, p| match per_head {
            true => share.head_retains(rule, l, h, p),
            false => share.retains(rule, l, p),
        })
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
        let policy = Policy::full(self.cfg.num_layers);
        let rule = ReferenceMask::new(visible, self.cfg.num_layers);
        let mut seq = Sequence::with_rule(policy, Box::new(rule), self.cache_shape());
        let out = self.forward(&mut seq, tokens, LogitRows::All, None)?;
        out.logits.ok_or(ModelError::MissingLogits)
    }

    /// The incremental path on `seq`: `tokens` before `start` as one chunk,
    /// then each token from `start` on alone, as decoding feeds them; the
    /// logits of those tokens [T - start, vocab].
    pub fn incremental_logits(
        &self,
        seq: &mut Sequence,
        tokens: &[u32],
        start: usize,
        mut probe: Option<&mut (dyn Probe + '_)>,
    ) -> Result<Tensor> {
        let prompt = tokens.get(..start).ok_or(ModelError::EmptyInput)?;
        if !prompt.is_empty() {
            self.forward(seq, prompt, LogitRows::None, probe.as_deref_mut())?;
        }
        let rows = tokens[start..]
            .iter()
            .map(|id| {
                let out = self.forward(
                    seq,
                    std::slice::from_ref(id),
                    LogitRows::Last,
                    probe.as_deref_mut(),
                )?;
                out.logits.ok_or(ModelError::MissingLogits)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Tensor::cat(&rows, 0)?)
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

pub(crate) fn depth_mismatch(policy: &Policy, model_layers: usize) -> ModelError {
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
