//! The training passes: the layer program on the tensor executor with no
//! cache, every row computed at once. `train_rows` runs one sequence's rows
//! (given with their positions and which rows each reads, each layer's
//! sliding window applied) for the LoRA trainer, with trainable LoRA pairs
//! in its linear layers; `train_batch` runs a batch of sequences for the
//! bundled task models' trainer. Gradients reach whatever carries them
//! through candle's autograd. A linear-attention layer's recurrence runs
//! row by row over each sequence in tensor ops.

use std::collections::BTreeMap;
use std::ops::Range;

use candle_core::Tensor;

use super::Decoder;
use super::pass::{ChunkRows, Keys};
use super::projected::Projected;
use super::reads::BatchSoftmax;
use crate::error::{ModelError, Result};
use crate::linear::{Linear, LoraLinear, linear_dims};
use crate::lora::Site;

/// A refusal of the training pass's input.
fn refuse(detail: String) -> ModelError {
    ModelError::TrainInput { detail }
}

/// Keys and values [kv_heads, rows, head_dim] of a training call's rows,
/// by layer: given, those of layers below the call that a layer of it
/// reads (Gemma 4's shared K/V); returned, every layer's the call ran.
pub type TrainKv = BTreeMap<usize, (Tensor, Tensor)>;

impl Decoder {
    /// The module paths (`self_attn.q_proj`, `mlp.down_proj`, ...) of a
    /// layer's linear layers and their (out, in), as adapters name them.
    pub fn linear_modules(&self) -> Result<Vec<(String, (usize, usize))>> {
        self.layer_linear_modules(0)
    }

    /// [`Decoder::linear_modules`] of layer `layer`: layers differ where a
    /// model's do (Gemma 4's shared layers have no keys or values of their
    /// own, its full layers no values apart from the keys, and wider heads).
    pub fn layer_linear_modules(&self, layer: usize) -> Result<Vec<(String, (usize, usize))>> {
        let mut copy = self.clone();
        copy.layer_linears_mut(layer)
            .into_iter()
            .map(|(m, lin)| Ok((m, linear_dims(lin)?)))
            .collect()
    }

    /// A copy of this decoder whose linear layers at `pairs`' sites add
    /// `scale`·(x Aᵀ) Bᵀ, A [r, in] and B [out, r] as given (an optimizer's
    /// variables: their updates are seen at the next call, and gradients
    /// reach them). A site the model does not have, or a pair of another
    /// shape, is refused by name.
    pub fn with_trainable_lora(
        &self,
        pairs: &BTreeMap<Site, (Tensor, Tensor)>,
        scale: f64,
    ) -> Result<Decoder> {
        let mut adapted = self.clone();
        let layers = self.cfg.num_layers;
        for ((layer, module), (a, b)) in pairs {
            if *layer >= layers {
                return Err(refuse(format!(
                    "a pair at layer {layer}, past the model's {layers} layers"
                )));
            }
            let mut linears = adapted.layer_linears_mut(*layer);
            let known: Vec<String> = linears.iter().map(|(m, _)| m.clone()).collect();
            let Some((_, lin)) = linears.iter_mut().find(|(m, _)| m == module) else {
                return Err(refuse(format!(
                    "layer {layer} has no linear layer `{module}` (it has: {})",
                    known.join(", ")
                )));
            };
            let (out, inp) = linear_dims(lin)?;
            let (ra, ia) = a.dims2()?;
            let (ob, rb) = b.dims2()?;
            if ia != inp || ob != out || ra != rb {
                return Err(refuse(format!(
                    "layer {layer} {module} is [{out}, {inp}]: A [{ra}, {ia}] and B [{ob}, {rb}] \
                     do not make a pair for it"
                )));
            }
            let base = lin.clone();
            **lin = Linear::Adapted(Box::new(LoraLinear::trainable(
                base,
                a.clone(),
                b.clone(),
                scale,
            )));
        }
        Ok(adapted)
    }

    /// The residual stream `hidden` [n, hidden] of rows at `positions`
    /// (increasing) through `layers`, row q reading row k where
    /// `visible[q * n + k]` and, at a sliding layer, where k lies within
    /// the layer's window of q (`visible` as [`lcut_policy::training_matrix`]
    /// gives it). Every row must read itself and no later row. A model with
    /// per-layer inputs (Gemma 4) needs the rows' `layer_inputs`
    /// ([`Decoder::train_layer_inputs`]); a layer that reads another's K/V
    /// reads what that layer computed in the same call. Differentiable with
    /// respect to the pairs of [`Decoder::with_trainable_lora`].
    pub fn train_rows(
        &self,
        layers: Range<usize>,
        hidden: Tensor,
        layer_inputs: Option<&Tensor>,
        positions: &[usize],
        visible: &[bool],
    ) -> Result<Tensor> {
        let mut kv = TrainKv::new();
        self.train_rows_with_kv(layers, hidden, layer_inputs, positions, visible, &mut kv)
    }

    /// [`Decoder::train_rows`] where a layer of `layers` may read the K/V
    /// of a layer below them: `kv` gives those layers' keys and values of
    /// the same rows ([`TrainKv`]), and holds every layer's the call ran
    /// when it returns, for a later call over rows kept from these (the
    /// layers above a cut, run apart from those below it).
    pub fn train_rows_with_kv(
        &self,
        layers: Range<usize>,
        hidden: Tensor,
        layer_inputs: Option<&Tensor>,
        positions: &[usize],
        visible: &[bool],
        kv: &mut TrainKv,
    ) -> Result<Tensor> {
        let n = positions.len();
        for (layer, (k, v)) in kv.iter() {
            if k.dim(1)? != n || v.dim(1)? != n {
                return Err(refuse(format!(
                    "layer {layer}'s given keys {:?} and values {:?} are not of the {n} rows",
                    k.dims(),
                    v.dims()
                )));
            }
        }
        if hidden.dims() != [n, self.cfg.hidden_size] {
            return Err(refuse(format!(
                "hidden states {:?} for {n} positions of width {}",
                hidden.dims(),
                self.cfg.hidden_size
            )));
        }
        if visible.len() != n * n {
            return Err(refuse(format!(
                "a mask of {} entries for {n} rows",
                visible.len()
            )));
        }
        if let Some(q) = (0..n).find(|&q| !visible[q * n + q]) {
            return Err(refuse(format!("row {q} does not read itself")));
        }
        if positions.windows(2).any(|w| w[0] >= w[1]) {
            return Err(refuse("positions must increase".into()));
        }
        if let Some(i) = (0..n * n).find(|&i| visible[i] && i % n > i / n) {
            return Err(refuse(format!(
                "row {} reads the later row {}: attention is causal",
                i / n,
                i % n
            )));
        }
        self.check_layers(&layers)?;
        let layer_inputs = match (&self.layer_inputs, layer_inputs) {
            (Some(li), Some(given)) => {
                let width = li.width() * self.cfg.num_layers;
                if given.dims() != [n, width] {
                    return Err(refuse(format!(
                        "per-layer inputs {:?} for {n} rows of {width}",
                        given.dims()
                    )));
                }
                Some(given.clone())
            }
            (Some(_), None) => {
                return Err(refuse(
                    "a model with per-layer inputs (Gemma 4) trains with them: \
                     Decoder::train_layer_inputs gives them"
                        .into(),
                ));
            }
            (None, Some(_)) => {
                return Err(refuse("per-layer inputs for a model without them".into()));
            }
            (None, None) => None,
        };
        let rows = ChunkRows {
            hidden,
            present: positions.to_vec(),
            layer_inputs,
        };
        self.run_layers_uncached(layers, rows, Keys::mask(visible), kv)
    }

    /// Keys and values [kv_heads, n, head_dim] that layer `layer` computes
    /// for rows at `positions` entering it with `hidden` [n, hidden]: its
    /// input norm, K/V projections, k-norm and RoPE, as `forward_above`
    /// projects a source layer's K/V from a recorded state (a row's keys
    /// and values depend on its own state and position alone). Refused for
    /// a layer that stores none.
    pub fn train_kv(
        &self,
        layer: usize,
        hidden: Tensor,
        positions: &[usize],
    ) -> Result<(Tensor, Tensor)> {
        let at = self.layers.get(layer).ok_or_else(|| {
            refuse(format!(
                "layer {layer} of a model of {}",
                self.cfg.num_layers
            ))
        })?;
        let rows = Projected::at(self, hidden, positions.to_vec())?;
        self.projected_kv(at, &rows)
    }

    /// The per-layer inputs [n, layers * width] of `tokens` whose scaled
    /// embeddings are `embedded` [n, hidden], for [`Decoder::train_rows`]:
    /// `None` for a model without them (all but Gemma 4).
    pub fn train_layer_inputs(&self, tokens: &[u32], embedded: &Tensor) -> Result<Option<Tensor>> {
        self.layer_inputs(tokens, embedded)
    }

    /// The residual stream after `layers` of a batch of token sequences
    /// `ids` [b, t] (each at positions 0..t): [b * t, hidden], row `i * t +
    /// p` for sequence i's token at p. Each query reads its own sequence's
    /// keys, with the probabilities `softmax` gives at each layer (the
    /// bundled task models' trainer, whose masks hold every sequence's
    /// policy). Differentiable with respect to every weight that carries
    /// gradients.
    pub fn train_batch(
        &self,
        layers: Range<usize>,
        ids: &Tensor,
        softmax: &dyn BatchSoftmax,
    ) -> Result<Tensor> {
        let (b, t) = ids.dims2()?;
        if b == 0 || t == 0 {
            return Err(refuse(format!("a batch of {b} sequences of {t} tokens")));
        }
        self.check_layers(&layers)?;
        let tokens = ids.flatten_all()?.to_vec1::<u32>()?;
        let mut rows = self.embed_rows(&tokens, 0, &mut None)?;
        rows.present = (0..b).flat_map(|_| 0..t).collect();
        let keys = Keys::Batch { t, softmax };
        self.run_layers_uncached(layers, rows, keys, &mut TrainKv::new())
    }

    /// Refuse a range of layers past the model's depth. A linear-attention
    /// layer (Qwen3.5) runs its recurrence over each sequence's rows, a row
    /// entering the state where a later row reads it.
    fn check_layers(&self, layers: &Range<usize>) -> Result<()> {
        match layers.end > self.cfg.num_layers {
            true => Err(refuse(format!(
                "layers {layers:?} of a model of {}",
                self.cfg.num_layers
            ))),
            false => Ok(()),
        }
    }
}
