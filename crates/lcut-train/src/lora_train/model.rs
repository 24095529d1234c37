//! The layers from the first trained one up, differentiable, with trainable
//! LoRA pairs on chosen projections and the base weights frozen: the
//! model's own tensor path ([`Decoder::train_rows`]), so that every
//! architecture lcut reads (q/k norms, biases, fused projections, sandwich
//! norms, soft-caps, sliding windows, Gemma 3's two RoPE bases, Gemma 4's
//! per-layer inputs and shared K/V) trains as it runs. Below the cut every
//! token of a sequence runs (causal attention); under a SPEED policy only
//! the anchors and the decode-phase tokens exist
//! from the cut up, so there a sequence runs on those rows alone, at their
//! original positions. The residual stream entering the first layer comes
//! from the frozen layers beneath it.

use std::collections::BTreeMap;

use candle_core::{DType, Device, Tensor, Var};
use lcut_model::lora::{LoraPair, Site};
use lcut_model::{Decoder, ModelConfig, TrainKv, WeightSource};

use super::seq::TrainSeq;
use crate::error::{Result, TrainError};

/// Modules an adapter may train, as a layer names them (a model has the
/// separate or the fused projections, not both).
pub const MODULES: [&str; 9] = [
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.qkv_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.gate_up_proj",
    "mlp.down_proj",
];

/// The trainable pairs: A [r, in] and B [out, r] per site, scale alpha/r.
pub struct LoraVars {
    /// The pairs by site.
    pub vars: BTreeMap<Site, (Var, Var)>,
    /// alpha / r.
    pub scale: f64,
}

impl LoraVars {
    /// Every variable, A then B per site, in site order.
    pub fn all(&self) -> Vec<Var> {
        self.vars
            .values()
            .flat_map(|(a, b)| [a.clone(), b.clone()])
            .collect()
    }

    /// Which of `modules` (as [`UpperModel::init_lora`] took them) have no
    /// pair on some of `layers`, with those layers: the projections those
    /// layers do not have.
    pub fn absent(&self, layers: &[usize], modules: &[&str]) -> Vec<(String, Vec<usize>)> {
        let has = |l: usize, m: &str| {
            self.vars
                .keys()
                .any(|(at, path)| *at == l && (short(path) == m || path == m))
        };
        modules
            .iter()
            .filter_map(|m| {
                let missing: Vec<usize> = layers.iter().copied().filter(|&l| !has(l, m)).collect();
                (!missing.is_empty()).then(|| (m.to_string(), missing))
            })
            .collect()
    }

    /// The pairs as plain tensors (for writing the adapter).
    pub fn pairs(&self) -> BTreeMap<Site, LoraPair> {
        let pair = |(a, b): &(Var, Var)| LoraPair {
            a: a.as_tensor().clone(),
            b: b.as_tensor().clone(),
        };
        self.vars
            .iter()
            .map(|(s, v)| (s.clone(), pair(v)))
            .collect()
    }

    /// The pairs as the tensors the optimizer updates in place.
    fn tensors(&self) -> BTreeMap<Site, (Tensor, Tensor)> {
        self.vars
            .iter()
            .map(|(s, (a, b))| (s.clone(), (a.as_tensor().clone(), b.as_tensor().clone())))
            .collect()
    }
}

/// Layers `first..num_layers` with the final norm and the LM head, for a
/// SPEED policy cutting at `cut` (`first <= cut`), in f32 on the CPU.
pub struct UpperModel {
    first: usize,
    cut: usize,
    decoder: Decoder,
}

fn span_error(reason: String) -> TrainError {
    TrainError::Shape { reason }
}

impl UpperModel {
    /// Load the model from its weights, in f32 on the CPU, to train layers
    /// `cut..`.
    pub fn load(cfg: &ModelConfig, files: &dyn WeightSource, cut: usize) -> Result<Self> {
        Self::load_span(cfg, files, cut, cut)
    }

    /// Load the model from its weights, in f32 on the CPU, to train layers
    /// `first..` for a policy cutting at `cut`; layers `first..cut` run on
    /// every token of a sequence.
    pub fn load_span(
        cfg: &ModelConfig,
        files: &dyn WeightSource,
        first: usize,
        cut: usize,
    ) -> Result<Self> {
        let decoder = Decoder::from_weights(cfg.clone(), files, DType::F32, &Device::Cpu)?;
        Self::over(decoder, first, cut)
    }

    /// Train layers `first..` of `decoder` (dense f32 on the CPU, as a
    /// session for training loads it) for a policy cutting at `cut`.
    pub fn over(decoder: Decoder, first: usize, cut: usize) -> Result<Self> {
        let layers = decoder.config().num_layers;
        if first > cut || cut > layers {
            return Err(span_error(format!(
                "the first trained layer {first} must be at or below the cut {cut}, \
                 the cut at most the model's {layers} layers"
            )));
        }
        if decoder.dtype() != DType::F32 || !decoder.device().is_cpu() {
            return Err(span_error(format!(
                "training runs on dense f32 weights on the CPU, not {:?} on {:?}",
                decoder.dtype(),
                decoder.device()
            )));
        }
        Ok(Self {
            first,
            cut,
            decoder,
        })
    }

    /// The first layer run here.
    pub fn first_layer(&self) -> usize {
        self.first
    }

    /// New pairs of rank `r` on `modules` (`q_proj`, `gate_up_proj`, ...)
    /// of `layers`: A small random (seeded), B zero, so training starts
    /// from the base model. As PEFT targets modules, a projection is adapted
    /// on each of `layers` that has it (Gemma 4's shared layers have no keys
    /// or values, its full layers no values: [`LoraVars::absent`] names what
    /// was left out); a layer below the first trained one, or projections
    /// none of `layers` has, are refused by name.
    pub fn init_lora(
        &self,
        layers: &[usize],
        modules: &[&str],
        r: usize,
        alpha: f64,
        seed: u64,
    ) -> Result<LoraVars> {
        let dev = Device::Cpu;
        let mut rng = crate::lora_train::optim::SplitMix(seed);
        let mut vars = BTreeMap::new();
        let mut known: Vec<String> = vec![];
        for &l in layers {
            if l < self.first || l >= self.decoder.config().num_layers {
                return Err(span_error(format!(
                    "layer {l} is outside the trained layers {}..{}",
                    self.first,
                    self.decoder.config().num_layers
                )));
            }
            // layers differ in what they project and how wide (Gemma 4)
            let linears = self.decoder.layer_linear_modules(l)?;
            for (path, _) in &linears {
                if !known.contains(&short(path)) {
                    known.push(short(path));
                }
            }
            for m in modules {
                let site = linears
                    .iter()
                    .find(|(path, _)| short(path) == *m || path == m);
                let Some((path, (out, inp))) = site.cloned() else {
                    continue;
                };
                let bound = 1.0 / (inp as f64).sqrt();
                let a: Vec<f32> = (0..r * inp)
                    .map(|_| ((rng.next_f64() * 2.0 - 1.0) * bound) as f32)
                    .collect();
                let a = Var::from_tensor(&Tensor::from_vec(a, (r, inp), &dev)?)?;
                let b = Var::from_tensor(&Tensor::zeros((out, r), DType::F32, &dev)?)?;
                vars.insert((l, path), (a, b));
            }
        }
        if vars.is_empty() {
            return Err(span_error(format!(
                "no projection {} to adapt in layers {layers:?} (they have: {})",
                modules.join(", "),
                known.join(", ")
            )));
        }
        Ok(LoraVars {
            vars,
            scale: alpha / r as f64,
        })
    }

    /// Logits [loss rows, vocab] of a sequence: the trained layers below
    /// the cut on all its rows, then the rows kept at the cut through the
    /// rest, each reading the rows its mask shows (and, at a sliding layer,
    /// only those within its window).
    pub fn logits(&self, s: &TrainSeq, lora: &LoraVars) -> Result<Tensor> {
        let model = self
            .decoder
            .with_trainable_lora(&lora.tensors(), lora.scale)?;
        let layers = model.config().num_layers;
        let mut x = s.x.clone();
        // the rows of `x`: every token below the cut, else those at the cut
        let x_rows: Vec<u32> = match &s.below {
            Some(below) => below.positions.iter().map(|&p| p as u32).collect(),
            None => s.positions.iter().map(|&p| p as u32).collect(),
        };
        let mut inputs = select_rows(s.layer_inputs.as_ref(), &x_rows)?;
        let mut kv = select_kv(&s.source_kv, &x_rows)?;
        match (&s.below, self.first < self.cut) {
            (Some(below), true) => {
                x = model.train_rows_with_kv(
                    self.first..self.cut,
                    x,
                    inputs.as_ref(),
                    &below.positions,
                    &below.visible,
                    &mut kv,
                )?;
                // the rows that go on past the cut, and their K/V below it
                x = x.index_select(&Tensor::new(below.kept.as_slice(), &Device::Cpu)?, 0)?;
                inputs = select_rows(inputs.as_ref(), &below.kept)?;
                kv = select_kv(&kv, &below.kept)?;
            }
            (None, false) => {}
            (below, _) => {
                return Err(TrainError::Shape {
                    reason: format!(
                        "the model starts at layer {} for the cut {}, the sequence was \
                         prepared {} the cut",
                        self.first,
                        self.cut,
                        if below.is_some() { "below" } else { "at" }
                    ),
                });
            }
        }
        x = model.train_rows_with_kv(
            self.cut..layers,
            x,
            inputs.as_ref(),
            &s.positions,
            &s.visible,
            &mut kv,
        )?;
        let idx = Tensor::new(s.loss_rows.as_slice(), &Device::Cpu)?;
        Ok(model.head_logits(&x.index_select(&idx, 0)?)?)
    }
}

/// A module's last name (`q_proj` of `self_attn.q_proj`), as modules are asked for.
fn short(path: &str) -> String {
    path.rsplit('.').next().unwrap_or(path).to_string()
}

/// The layers below `first` whose K/V a layer from `first` on reads (a
/// training sequence carries their keys and values: [`TrainSeq::source_kv`]).
pub(crate) fn frozen_sources(decoder: &Decoder, first: usize) -> Vec<usize> {
    let sharing = decoder.kv_sharing();
    let sources: std::collections::BTreeSet<usize> = (first..sharing.num_layers())
        .map(|l| sharing.source(l))
        .filter(|&s| s < first)
        .collect();
    sources.into_iter().collect()
}

/// Rows `rows` (dimension 0) of `t`, where there is one.
fn select_rows(t: Option<&Tensor>, rows: &[u32]) -> Result<Option<Tensor>> {
    let idx = Tensor::new(rows, &Device::Cpu)?;
    Ok(match t {
        Some(t) => Some(t.index_select(&idx, 0)?),
        None => None,
    })
}

/// Rows `rows` of each layer's keys and values [kv_heads, rows, head_dim].
fn select_kv(kv: &TrainKv, rows: &[u32]) -> Result<TrainKv> {
    let idx = Tensor::new(rows, &Device::Cpu)?;
    kv.iter()
        .map(|(&l, (k, v))| {
            let rows = |t: &Tensor| t.contiguous()?.index_select(&idx, 1);
            Ok((l, (rows(k)?, rows(v)?)))
        })
        .collect()
}
