//! The bundled task models' batched, differentiable forward: the decoder's
//! own layer program (`lcut_model::Decoder::train_batch`) over weights
//! shared with a `VarMap`, with each sequence's attention mask taken from an
//! `lcut_policy::Policy` through the key planner, so SPEED-aware training
//! and SPEED inference share one layer and one definition of visibility.
//!
//! Weights live in a `candle_nn::VarMap` under the Hugging Face names, so
//! saving the map writes a checkpoint that `lcut_model::Decoder` loads.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::{D, DType, Device, Tensor, Var};
use candle_nn::VarMap;
use lcut_model::{BatchSoftmax, Decoder, ModelError, WeightSource};
use lcut_policy::{Policy, TokenPhases, training_matrix};
use rand::{Rng, SeedableRng, rngs::StdRng};
use serde_json::Value;

use crate::error::{Result, TrainError};
use crate::vocab::{self, id};

/// The shape of a bundled task model: lcut-model's one description of a
/// Llama shape (the same serialised form training files have always held).
pub type ModelShape = lcut_model::LlamaShape;

/// The special tokens of the task vocabulary, as a task model's
/// `config.json` names them.
pub const TASK_TOKENS: lcut_model::SpecialTokens = lcut_model::SpecialTokens {
    bos: id::BOS,
    eos: id::EOT,
    pad: Some(id::PAD),
};

/// A fresh `VarMap` of a model of `shape`, initialised from `seed`:
/// vectors at [`ModelShape::vector_start`] (norms at their identity),
/// convolution taps uniform within ±1/sqrt(kernel), matrices uniform with
/// standard deviation `std` (output
/// projections scaled by 1/sqrt(2L), as in GPT-2). About 1/sqrt(hidden)
/// (0.1 for hidden 128) shortens the plateau before the copy circuit forms;
/// the customary 0.02 stalls these small models for hundreds of steps.
pub fn init_varmap(shape: &ModelShape, std: f32, seed: u64, device: &Device) -> Result<VarMap> {
    shape.validate()?;
    let mut rng = StdRng::seed_from_u64(seed);
    let varmap = VarMap::new();
    let residual_std = std / (2.0 * shape.num_layers as f32).sqrt();
    {
        let mut data = varmap.data().lock().map_err(|_| TrainError::Shape {
            reason: "the weight map's lock is poisoned".into(),
        })?;
        for (name, dims) in shape.weight_shapes() {
            let n: usize = dims.iter().product();
            let t = if dims.len() == 1 {
                Tensor::full(shape.vector_start(&name), dims.as_slice(), device)?
            } else {
                let a = if name.ends_with("conv1d.weight") {
                    // a convolution's taps as torch starts them: 1/sqrt(kernel)
                    1.0 / (dims[dims.len() - 1] as f32).sqrt()
                } else if ["o_proj.weight", "down_proj.weight", "out_proj.weight"]
                    .iter()
                    .any(|end| name.ends_with(end))
                {
                    residual_std * 3f32.sqrt()
                } else {
                    std * 3f32.sqrt()
                };
                let vals: Vec<f32> = (0..n).map(|_| rng.random_range(-a..a)).collect();
                Tensor::from_vec(vals, dims.as_slice(), device)?
            };
            data.insert(name, Var::from_tensor(&t)?);
        }
    }
    Ok(varmap)
}

/// The differentiable model: `lcut_model::Decoder`'s layer program over
/// tensors shared with a `VarMap`'s variables, so gradients reach them and
/// an optimizer's updates are seen at the next call.
#[derive(Debug, Clone)]
pub struct TrainModel {
    shape: ModelShape,
    decoder: Decoder,
}

/// A `VarMap`'s variables as the decoder's weights: each weight is the
/// variable's own tensor (never a copy).
struct VarWeights {
    folder: PathBuf,
    vars: HashMap<String, Tensor>,
}

impl WeightSource for VarWeights {
    fn folder(&self) -> &Path {
        &self.folder
    }

    fn contains(&self, name: &str) -> bool {
        self.vars.contains_key(name)
    }

    fn load(
        &self,
        name: &str,
        expected: &[usize],
        dtype: DType,
        device: &Device,
    ) -> lcut_model::Result<Tensor> {
        let t = self
            .vars
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor {
                name: name.into(),
                folder: self.folder.clone(),
            })?;
        if t.dims() != expected {
            return Err(ModelError::TensorShape {
                folder: self.folder.clone(),
                config: "the model's shape",
                name: name.into(),
                expected: expected.to_vec(),
                found: t.dims().to_vec(),
            });
        }
        // the variable itself where it is already in `dtype` on `device`
        Ok(t.to_dtype(dtype)?.to_device(device)?)
    }
}

impl TrainModel {
    /// Bind the model to the variables of `varmap` (created by
    /// [`init_varmap`] or loaded from a checkpoint).
    pub fn new(shape: ModelShape, varmap: &VarMap, device: &Device) -> Result<Self> {
        shape.validate()?;
        let data = varmap.data().lock().map_err(|_| TrainError::Shape {
            reason: "the weight map's lock is poisoned".into(),
        })?;
        let mut vars: HashMap<String, Tensor> = HashMap::new();
        for (name, dims) in shape.weight_shapes() {
            let var = data.get(&name).ok_or_else(|| TrainError::Shape {
                reason: format!("weight {name} is missing"),
            })?;
            if var.dims() != dims.as_slice() {
                return Err(TrainError::Shape {
                    reason: format!(
                        "weight {name} has shape {:?}, expected {dims:?}",
                        var.dims()
                    ),
                });
            }
            vars.insert(name, var.as_tensor().clone());
        }
        let weights = VarWeights {
            folder: PathBuf::from("(training variables)"),
            vars,
        };
        let cfg = shape.model_config(TASK_TOKENS)?;
        let decoder = Decoder::from_weights(cfg, &weights, DType::F32, device)?;
        Ok(Self { shape, decoder })
    }

    /// The sliding window of each layer (OLMo 3's layout), none elsewhere.
    pub fn windows(&self) -> &[Option<usize>] {
        &self.decoder.config().sliding_window
    }

    /// The device its variables live on.
    pub fn device(&self) -> &Device {
        self.decoder.device()
    }

    /// The model's shape.
    pub fn shape(&self) -> &ModelShape {
        &self.shape
    }

    /// Final hidden states [b, t, hidden] (before the final norm) of the
    /// token batch `ids` [b, t] under `masks`: the decoder's layers, each
    /// query reading what its sequence's policy shows it.
    pub fn hidden(&self, ids: &Tensor, masks: &BatchMasks) -> Result<Tensor> {
        let (b, t) = ids.dims2()?;
        let layers = 0..self.shape.num_layers;
        let x = self.decoder.train_batch(layers, ids, masks)?;
        Ok(x.reshape((b, t, self.shape.hidden_size))?)
    }

    /// Logits [rows, vocab] of the given rows of flattened hidden states
    /// [b * t, hidden] (row `b_i * t + pos`).
    pub fn logits_at(&self, hidden: &Tensor, rows: &[u32]) -> Result<Tensor> {
        let (b, t, d) = hidden.dims3()?;
        let flat = hidden.reshape((b * t, d))?;
        let idx = Tensor::new(rows, hidden.device())?;
        Ok(self.decoder.head_logits(&flat.index_select(&idx, 0)?)?)
    }
}

/// Which keys each query of a batch reads at each layer: one mask per rule
/// the policy applies (below and at/above the cutoff for SPEED) and window
/// the layer has, shared by the layers under the same rule and window.
#[derive(Debug, Clone)]
pub struct BatchMasks {
    /// Index into `masks` of each layer's mask.
    mask_of_layer: Vec<usize>,
    masks: Vec<MaskedSoftmax>,
}

impl BatchMasks {
    /// Visibility for `phases.len()` sequences padded to `t` tokens under
    /// `policy` in layers with `windows` (one per layer; `None` reads every
    /// earlier key), each sequence's rows as the key planner gives them
    /// ([`training_matrix`]: the keys the policy shows a query within the
    /// layer's window, a query whose token does not exist at the layer
    /// reading only itself).
    pub fn new(
        policy: &Policy,
        windows: &[Option<usize>],
        phases: &[TokenPhases],
        t: usize,
    ) -> Self {
        let rules: Vec<_> = phases.iter().map(|ph| policy.visibility(*ph)).collect();
        let positions: Vec<usize> = (0..t).collect();
        let window = |layer: usize| windows.get(layer).copied().flatten();
        let build = |layer: usize| -> MaskedSoftmax {
            let mut m = Vec::with_capacity(phases.len() * t * t);
            for rule in &rules {
                m.extend(training_matrix(
                    rule.as_ref(),
                    layer,
                    window(layer),
                    &positions,
                ));
            }
            MaskedSoftmax {
                visible: Arc::new(m),
                batch: phases.len(),
                t,
            }
        };
        let (mut classes, mut masks, mut mask_of_layer) = (Vec::new(), Vec::new(), Vec::new());
        for layer in 0..policy.num_layers() {
            let class: (Vec<usize>, Option<usize>) = (
                rules.iter().map(|r| r.rule_class(layer)).collect(),
                window(layer),
            );
            let index = match classes.iter().position(|c| *c == class) {
                Some(i) => i,
                None => {
                    classes.push(class);
                    masks.push(build(layer));
                    masks.len() - 1
                }
            };
            mask_of_layer.push(index);
        }
        Self {
            mask_of_layer,
            masks,
        }
    }

    /// The visibility of layer `l`.
    fn for_layer(&self, l: usize) -> &MaskedSoftmax {
        &self.masks[self.mask_of_layer[l]]
    }

    /// The additive mask [b, 1, 1, t, t] of layer `l` (0 visible, -1e9 hidden).
    pub fn additive(&self, l: usize, device: &Device) -> Result<Tensor> {
        let m = self.for_layer(l);
        let v: Vec<f32> = m
            .visible
            .iter()
            .map(|&v| if v { 0.0 } else { HIDDEN })
            .collect();
        Ok(Tensor::from_vec(v, (m.batch, 1, 1, m.t, m.t), device)?)
    }
}

impl BatchSoftmax for BatchMasks {
    /// Attention probabilities at layer `l` from scores [b, kv, group, t,
    /// t]: softmax over the visible keys, zero elsewhere (one op with its
    /// own backward on the CPU; composed candle ops elsewhere).
    fn softmax(&self, l: usize, scores: &Tensor) -> lcut_model::Result<Tensor> {
        Ok(self.for_layer(l).apply(scores)?)
    }

    fn visibility(&self, l: usize) -> &[bool] {
        &self.for_layer(l).visible
    }
}

/// The value of a hidden key in the additive mask of the non-CPU path.
/// Finite, so a masked score never turns into NaN in the backward pass.
const HIDDEN: f32 = -1e9;

/// Softmax over the last dimension restricted to the visible keys, fused
/// into one op with its own backward (the composed candle ops allocate a
/// dozen score-sized tensors per layer, which dominated a training step).
#[derive(Debug, Clone)]
struct MaskedSoftmax {
    /// [batch, t (query), t (key)]: whether the key is read.
    visible: Arc<Vec<bool>>,
    batch: usize,
    t: usize,
}

impl MaskedSoftmax {
    fn apply(&self, scores: &Tensor) -> candle_core::Result<Tensor> {
        if scores.device().is_cpu() {
            return scores.apply_op1(self.clone());
        }
        // Devices without the fused kernel: compose basic ops.
        let v: Vec<f32> = self
            .visible
            .iter()
            .map(|&v| if v { 0.0 } else { HIDDEN })
            .collect();
        let mask = Tensor::from_vec(v, (self.batch, 1, 1, self.t, self.t), scores.device())?;
        candle_nn::ops::softmax(&scores.broadcast_add(&mask)?, D::Minus1)
    }

    /// The visibility row of flattened score row `r` (rows are ordered
    /// batch, heads..., query).
    fn row(&self, r: usize, rows: usize) -> &[bool] {
        let per_seq = rows / self.batch;
        let (b, q) = (r / per_seq, r % self.t);
        &self.visible[(b * self.t + q) * self.t..(b * self.t + q + 1) * self.t]
    }
}

impl candle_core::CustomOp1 for MaskedSoftmax {
    fn name(&self) -> &'static str {
        "lcut-masked-softmax"
    }

    fn cpu_fwd(
        &self,
        storage: &candle_core::CpuStorage,
        layout: &candle_core::Layout,
    ) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
        let candle_core::CpuStorage::F32(data) = storage else {
            candle_core::bail!("{}: expected f32 scores", self.name());
        };
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("{}: expected contiguous scores", self.name());
        };
        let x = &data[start..end];
        let t = self.t;
        if t == 0 || !x.len().is_multiple_of(t * t * self.batch) {
            candle_core::bail!(
                "{}: {} scores do not fit batch {} of length {t}",
                self.name(),
                x.len(),
                self.batch
            );
        }
        let rows = x.len() / t;
        let mut out = vec![0f32; x.len()];
        for (r, (xr, or)) in x.chunks_exact(t).zip(out.chunks_exact_mut(t)).enumerate() {
            let vis = self.row(r, rows);
            let max = xr
                .iter()
                .zip(vis)
                .filter(|(_, v)| **v)
                .map(|(x, _)| *x)
                .fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0f32;
            for ((o, &x), &v) in or.iter_mut().zip(xr).zip(vis) {
                if v {
                    *o = (x - max).exp();
                    sum += *o;
                }
            }
            if sum > 0.0 {
                let inv = 1.0 / sum;
                or.iter_mut().for_each(|o| *o *= inv);
            }
        }
        Ok((candle_core::CpuStorage::F32(out), layout.shape().clone()))
    }

    fn bwd(
        &self,
        _arg: &Tensor,
        res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        // d score_j = p_j (g_j - sum_k g_k p_k); hidden keys have p = 0.
        let p = res.flatten_all()?.to_vec1::<f32>()?;
        let g = grad_res.flatten_all()?.to_vec1::<f32>()?;
        let t = self.t;
        let mut d = vec![0f32; p.len()];
        for ((pr, gr), dr) in p
            .chunks_exact(t)
            .zip(g.chunks_exact(t))
            .zip(d.chunks_exact_mut(t))
        {
            let dot: f32 = pr.iter().zip(gr).map(|(p, g)| p * g).sum();
            for ((d, &p), &g) in dr.iter_mut().zip(pr).zip(gr) {
                *d = p * (g - dot);
            }
        }
        Ok(Some(Tensor::from_vec(d, res.shape(), res.device())?))
    }
}

/// Write `config.json`, `model.safetensors`, `tokenizer.json` and
/// `tokenizer_config.json` of a model into `folder` (each atomically).
pub fn save_checkpoint(folder: &Path, shape: &ModelShape, varmap: &VarMap) -> Result<()> {
    std::fs::create_dir_all(folder).map_err(|source| TrainError::Io {
        path: folder.to_path_buf(),
        source,
    })?;
    let write_json = |name: &str, value: &Value| -> Result<()> {
        let text = serde_json::to_string_pretty(value).map_err(|e| TrainError::Json {
            path: folder.join(name),
            reason: e.to_string(),
        })?;
        let path = folder.join(name);
        lcut_model::lora::write_atomic(&path, format!("{text}\n").as_bytes())
            .map_err(|source| TrainError::Io { path, source })?;
        Ok(())
    };
    write_json("config.json", &shape.config_json(TASK_TOKENS))?;
    write_json("tokenizer.json", &vocab::tokenizer_json())?;
    write_json("tokenizer_config.json", &vocab::tokenizer_config_json())?;
    let tmp = folder.join("model.safetensors.partial");
    varmap.save(&tmp)?;
    let dst = folder.join("model.safetensors");
    std::fs::rename(&tmp, &dst).map_err(|source| TrainError::Io { path: dst, source })
}

/// Load the weights of a saved checkpoint into a `VarMap` of `shape`.
pub fn load_varmap(folder: &Path, shape: &ModelShape, device: &Device) -> Result<VarMap> {
    let mut varmap = init_varmap(shape, 0.02, 0, device)?;
    let path = folder.join("model.safetensors");
    if !path.is_file() {
        return Err(TrainError::Io {
            path,
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no model.safetensors"),
        });
    }
    varmap.load(&path)?;
    Ok(varmap)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lcut_kernels::testdata::Rng;
    use lcut_testkit::grads::{grad_diff, max_abs_diff as max_diff, normal, probe_grads as grads};

    /// The bundled models' `config.json` is, byte for byte, what
    /// `save_checkpoint` writes for the shape read back from it.
    #[test]
    fn the_bundled_configs_are_what_their_shapes_write() -> Result<()> {
        let models = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models");
        for name in ["copy-full", "copy-speed3-bos", "copy-speed3-noanchor"] {
            let folder = models.join(name);
            let shape = ModelShape::from_config(&lcut_model::ModelConfig::from_folder(&folder)?);
            shape.validate()?;
            let written =
                serde_json::to_string_pretty(&shape.config_json(TASK_TOKENS)).map_err(|e| {
                    TrainError::Json {
                        path: folder.clone(),
                        reason: e.to_string(),
                    }
                })?;
            let path = folder.join("config.json");
            let on_disk =
                std::fs::read_to_string(&path).map_err(|source| TrainError::Io { path, source })?;
            assert_eq!(format!("{written}\n"), on_disk, "{name}");
        }
        Ok(())
    }

    /// The masked softmax op against composed candle ops (RMSNorm's and
    /// RoPE's ops are lcut-model's, tested there).
    #[test]
    fn masked_softmax_matches_composed_ops_and_its_gradient() -> candle_core::Result<()> {
        let dev = Device::Cpu;
        let mut rng = Rng::new(0x5eed);
        // Masked softmax: a causal mask over two sequences, scores [2, 1, 2, 4, 4].
        let visible: Vec<bool> = (0..2 * 16).map(|i| (i % 16) % 4 <= (i % 16) / 4).collect();
        let sm = MaskedSoftmax {
            visible: Arc::new(visible.clone()),
            batch: 2,
            t: 4,
        };
        let s = Var::from_tensor(&normal(&mut rng, 0.0, 3.0, &[2, 1, 2, 4, 4])?)?;
        let add: Vec<f32> = visible
            .iter()
            .map(|&v| if v { 0.0 } else { HIDDEN })
            .collect();
        let add = Tensor::from_vec(add, (2, 1, 1, 4, 4), &dev)?;
        let probe = normal(&mut rng, 0.0, 1.0, &[2, 1, 2, 4, 4])?;
        let fused = sm.apply(&s)?;
        let slow = candle_nn::ops::softmax(&s.broadcast_add(&add)?, D::Minus1)?;
        assert!(max_diff(&fused, &slow) < 1e-6);
        let (gf, gs) = (grads(&fused, &probe)?, grads(&slow, &probe)?);
        assert!(grad_diff(&gf, &gs, &s) < 1e-5);
        Ok(())
    }
}
