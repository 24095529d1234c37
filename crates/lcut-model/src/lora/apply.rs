//! Putting an adapter into a loaded decoder: checked against the model's
//! linear layers, then merged into the weights (W + scale·B·A, quantized
//! matrices dequantized and kept dense) or applied on the fly.

use std::collections::BTreeMap;
use std::path::Path;

use candle_core::{DType, Tensor};

use super::adapter::{LoraAdapter, LoraPair, Site, tensor_name};
use super::config::{Targets, config_path};
use super::error::LoraError;
use super::fingerprint;
use crate::decoder::Decoder;
use crate::error::Result;
use crate::linear::{Linear, LoraLinear, dense_parts, linear_dims};

/// How an adapter is put into the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoraMode {
    /// W + scale·B·A computed once at load; the layer becomes dense.
    Merge,
    /// The base layer kept as is, scale·(x Aᵀ) Bᵀ added at every call.
    OnTheFly,
}

/// `lin` with `pair` put in by `mode`, weights in `dtype`.
fn adapt(
    lin: &Linear,
    pair: &LoraPair,
    scale: f64,
    mode: LoraMode,
    dtype: DType,
) -> Result<Linear> {
    let device = match lin {
        Linear::Dense(l) => l.weight().device().clone(),
        _ => dense_parts(lin)?.0.device().clone(),
    };
    let a = pair.a.to_device(&device)?;
    let b = (pair.b.to_device(&device)? * scale)?;
    Ok(match mode {
        LoraMode::Merge => {
            let (w, bias) = dense_parts(lin)?;
            let merged = (w + b.matmul(&a)?)?.to_dtype(dtype)?;
            Linear::dense(merged, bias)
        }
        LoraMode::OnTheFly => Linear::Adapted(Box::new(LoraLinear::new(
            lin.clone(),
            candle_nn::Linear::new(a.to_dtype(dtype)?, None),
            candle_nn::Linear::new(b.to_dtype(dtype)?, None),
        ))),
    })
}

impl Decoder {
    /// This decoder with the adapter in `folder` (PEFT layout) put in by `mode`.
    pub fn with_lora(mut self, folder: &Path, mode: LoraMode) -> Result<Self> {
        let adapter = LoraAdapter::read(folder)?;
        self.apply_lora(&adapter, mode)?;
        Ok(self)
    }

    /// Check `adapter` against this model (fingerprint, targets, layers,
    /// shapes, completeness), then put it in by `mode`. Nothing changes
    /// when a check fails.
    pub fn apply_lora(&mut self, adapter: &LoraAdapter, mode: LoraMode) -> Result<()> {
        if let Some(expected) = &adapter.config.base_fingerprint {
            fingerprint::check(self, adapter, expected)?;
        }
        let sites = self.checked_sites(adapter)?;
        let (scale, dtype) = (adapter.config.scale(), self.dtype());
        for ((layer, module), pair) in sites {
            let lin = self
                .layer_linears_mut(layer)
                .into_iter()
                .find(|(m, _)| *m == module)
                .map(|(_, lin)| lin);
            if let Some(lin) = lin {
                *lin = adapt(lin, pair, scale, mode, dtype)?;
            }
        }
        Ok(())
    }

    /// The adapter's pairs by site, each checked against the layer it is
    /// for (layers may differ in what they project and how wide: Gemma 4's
    /// shared layers have no keys or values, its full layers no values apart
    /// from the keys); every adapted layer needs a pair for each targeted
    /// projection it has.
    fn checked_sites<'a>(
        &mut self,
        adapter: &'a LoraAdapter,
    ) -> Result<BTreeMap<Site, &'a LoraPair>> {
        let layers = self.config().num_layers;
        let dims: Vec<Vec<(String, (usize, usize))>> = (0..layers)
            .map(|l| {
                self.layer_linears_mut(l)
                    .into_iter()
                    .map(|(m, lin)| Ok((m, linear_dims(lin)?)))
                    .collect::<Result<_>>()
            })
            .collect::<Result<_>>()?;
        // every projection some layer has, in the order the layers name them
        let mut modules: Vec<String> = vec![];
        for (m, _) in dims.iter().flatten() {
            if !modules.contains(m) {
                modules.push(m.clone());
            }
        }
        let targets = resolve_targets(adapter, &modules)?;
        let path = adapter.weights_path();
        for ((layer, module), pair) in &adapter.pairs {
            let name = tensor_name(*layer, module, "A");
            if *layer >= layers {
                let (path, layer) = (path.clone(), *layer);
                return Err(LoraError::LayerOutOfRange {
                    path,
                    name,
                    layer,
                    layers,
                }
                .into());
            }
            let here = dims[*layer].iter().find(|(m, _)| m == module);
            let (true, Some((_, (out, inp)))) = (targets.contains(module), here) else {
                let why = match (modules.contains(module), here) {
                    (false, _) => format!("the model has no linear layer `{module}`"),
                    (true, None) => format!("layer {layer} has no linear layer `{module}`"),
                    (true, Some(_)) => format!("`{module}` is not in target_modules"),
                };
                return Err(LoraError::UnexpectedTensor { path, name, why }.into());
            };
            check_shape(
                &path,
                *layer,
                module,
                "A",
                &pair.a,
                [adapter.config.r, *inp],
            )?;
            check_shape(
                &path,
                *layer,
                module,
                "B",
                &pair.b,
                [*out, adapter.config.r],
            )?;
        }
        let mut sites = BTreeMap::new();
        for l in (0..layers).filter(|&l| adapter.config.adapts_layer(l)) {
            let has = |module: &String| dims[l].iter().any(|(m, _)| m == module);
            for module in targets.iter().filter(|m| has(m)) {
                let site = (l, module.clone());
                let Some(pair) = adapter.pairs.get(&site) else {
                    return Err(LoraError::MissingTensor {
                        path,
                        name: tensor_name(l, module, "A"),
                        why: format!("target_modules names `{module}` and layer {l} is adapted"),
                    }
                    .into());
                };
                sites.insert(site, pair);
            }
        }
        Ok(sites)
    }
}

/// The model's modules (every layer's together) that the config's targets name.
fn resolve_targets(adapter: &LoraAdapter, modules: &[String]) -> Result<Vec<String>> {
    let names = match &adapter.config.targets {
        Targets::AllLinear => return Ok(modules.to_vec()),
        Targets::Modules(names) => names,
    };
    let last = |m: &str| m.rsplit('.').next().unwrap_or(m).to_string();
    for name in names {
        if !modules.iter().any(|m| last(m) == *name || m == name) {
            let known: Vec<String> = modules.iter().map(|m| last(m)).collect();
            return Err(LoraError::UnknownTarget {
                path: config_path(&adapter.folder),
                module: name.clone(),
                known: known.join(", "),
            }
            .into());
        }
    }
    Ok(modules
        .iter()
        .filter(|m| names.iter().any(|n| last(m) == *n || *m == n))
        .cloned()
        .collect())
}

fn check_shape(
    path: &Path,
    layer: usize,
    module: &str,
    which: &str,
    t: &Tensor,
    expected: [usize; 2],
) -> Result<()> {
    if t.dims() == expected {
        return Ok(());
    }
    Err(LoraError::ShapeMismatch {
        path: path.to_path_buf(),
        name: tensor_name(layer, module, which),
        module: format!("layer {layer} {module}"),
        expected: expected.to_vec(),
        found: t.dims().to_vec(),
    }
    .into())
}
