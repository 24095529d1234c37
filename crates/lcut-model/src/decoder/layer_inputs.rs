//! Gemma 4's per-layer inputs: each token's input to every layer, made once
//! from its embedding and a per-layer token table, carried with the rows
//! through the layers, and applied by each layer's branch after its MLP
//! ([`super::layer::LayerInputBranch`]).

use candle_core::Tensor;

use super::Decoder;
use crate::config::PerLayerInput;
use crate::error::Result;
use crate::layers::{Loader, RmsNorm};
use crate::linear::{Embedding, Linear};

/// The model-level weights of the per-layer inputs.
#[derive(Debug, Clone)]
pub(super) struct LayerInputs {
    /// The per-layer token table [vocab, layers * width]
    /// (`model.embed_tokens_per_layer`).
    table: Embedding,
    /// The embedding into every layer's input [layers * width, hidden]
    /// (`model.per_layer_model_projection`).
    projection: Linear,
    /// The norm on each layer's projected input
    /// (`model.per_layer_projection_norm`).
    norm: RmsNorm,
    /// Values per layer.
    width: usize,
    /// Layers.
    layers: usize,
}

impl LayerInputs {
    /// The weights of `input` for a model of `layers` layers.
    pub(super) fn load(ld: &Loader<'_>, input: PerLayerInput, layers: usize) -> Result<Self> {
        let all = layers * input.width;
        Ok(Self {
            table: ld.embedding("model.embed_tokens_per_layer.weight", input.vocab, all)?,
            projection: ld.linear(
                "model.per_layer_model_projection",
                all,
                ld.cfg.hidden_size,
                false,
            )?,
            norm: ld.norm("model.per_layer_projection_norm", input.width)?,
            width: input.width,
            layers,
        })
    }

    /// Values per layer.
    pub(super) fn width(&self) -> usize {
        self.width
    }

    /// The embedding into every layer's input (the fused step reads it).
    pub(super) fn projection(&self) -> &Linear {
        &self.projection
    }

    /// The norm on each layer's projected input.
    pub(super) fn norm(&self) -> &RmsNorm {
        &self.norm
    }

    /// The table rows of `ids` times sqrt(width): [n, layers * width].
    fn table_rows(&self, ids: &Tensor) -> Result<Tensor> {
        Ok((self.table.lookup(ids)? * (self.width as f64).sqrt())?)
    }

    /// The table rows of `tokens` times sqrt(width), in f32 on the host,
    /// one row of `layers * width` values per token after another (the
    /// fused step adds them to its own projected rows).
    pub(super) fn host_table_rows(&self, tokens: &[u32], out: &mut Vec<f32>) -> Result<()> {
        let ids = Tensor::new(tokens, &candle_core::Device::Cpu)?;
        let rows = self.table_rows(&ids)?.to_dtype(candle_core::DType::F32)?;
        out.clear();
        out.extend(rows.flatten_all()?.to_vec1::<f32>()?);
        Ok(())
    }
}

impl Decoder {
    /// Every layer's input [n, layers * width] for `tokens` whose scaled
    /// embeddings are `embedded` [n, hidden], as transformers' Gemma 4
    /// makes them: (RMSNorm of the projected embedding / sqrt(hidden), per
    /// layer, + the token's table row * sqrt(width)) / sqrt(2); `None` for
    /// a model without per-layer inputs.
    pub(super) fn layer_inputs(&self, tokens: &[u32], embedded: &Tensor) -> Result<Option<Tensor>> {
        let Some(li) = &self.layer_inputs else {
            return Ok(None);
        };
        let n = tokens.len();
        let ids = Tensor::new(tokens, &self.device)?;
        let table = li.table_rows(&ids)?;
        let projected =
            (li.projection.forward(embedded)? * (self.cfg.hidden_size as f64).powf(-0.5))?;
        let projected = li
            .norm
            .forward(&projected.reshape((n, li.layers, li.width))?)?
            .reshape((n, li.layers * li.width))?;
        Ok(Some(
            ((projected + table)? * std::f64::consts::FRAC_1_SQRT_2)?,
        ))
    }
}
