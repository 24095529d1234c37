//! The layers from the first trained one up, differentiable, with trainable
//! LoRA pairs on chosen projections and the base weights frozen. Below the
//! cut every token of a sequence runs (causal attention); under a SPEED
//! policy only the anchors and the decode-phase tokens exist from the cut
//! up, so there a sequence runs on those rows alone, at their original
//! positions. The residual stream entering the first layer comes from the
//! frozen layers beneath it.

use std::collections::BTreeMap;

use candle_core::{D, DType, Device, Tensor, Var};
use lcut_model::lora::{LoraPair, Site};
use lcut_model::{ModelConfig, WeightSource};

use super::seq::TrainSeq;
use crate::error::{Result, TrainError};

/// Modules an adapter may train here (attention and MLP of Llama).
pub const MODULES: [&str; 7] = [
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
];

/// Frozen weights of one upper layer, [out, in] each, by module.
struct Frozen {
    input_norm: Tensor,
    post_norm: Tensor,
    w: BTreeMap<&'static str, Tensor>,
}

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
}

/// Layers `first..num_layers` with the final norm and the LM head, for a
/// SPEED policy cutting at `cut` (`first <= cut`).
pub struct UpperModel {
    first: usize,
    cut: usize,
    layers: Vec<Frozen>,
    norm: Tensor,
    lm_head: Tensor,
    inv_freq: Tensor,
    cfg: ModelConfig,
}

fn unsupported(reason: &str) -> TrainError {
    TrainError::Shape {
        reason: format!("LoRA training supports Llama-style models only: {reason}"),
    }
}

impl UpperModel {
    /// Load layers `cut..` of a model from its weights, in f32 on the CPU.
    pub fn load(cfg: &ModelConfig, files: &dyn WeightSource, cut: usize) -> Result<Self> {
        Self::load_span(cfg, files, cut, cut)
    }

    /// Load layers `first..` for a policy cutting at `cut`, in f32 on the
    /// CPU; layers `first..cut` run on every token of a sequence.
    pub fn load_span(
        cfg: &ModelConfig,
        files: &dyn WeightSource,
        first: usize,
        cut: usize,
    ) -> Result<Self> {
        if first > cut || cut > cfg.num_layers {
            return Err(unsupported(&format!(
                "the first trained layer {first} must be at or below the cut {cut}, \
                 the cut at most the model's {} layers",
                cfg.num_layers
            )));
        }
        if cfg.qk_norm || cfg.qkv_bias || cfg.fused_qkv || cfg.fused_gate_up || cfg.sandwich_norms {
            return Err(unsupported(
                "no q/k norm, bias, fused projections or sandwich norms",
            ));
        }
        let (d, i) = (cfg.hidden_size, cfg.intermediate_size);
        let (h, kv, hd) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
        let dev = Device::Cpu;
        let load = |name: &str, shape: &[usize]| files.load(name, shape, DType::F32, &dev);
        let shapes = [
            [h * hd, d],
            [kv * hd, d],
            [kv * hd, d],
            [d, h * hd],
            [i, d],
            [i, d],
            [d, i],
        ];
        let mut layers = Vec::new();
        for l in first..cfg.num_layers {
            let p = format!("model.layers.{l}");
            let mut w = BTreeMap::new();
            for (m, s) in MODULES.iter().zip(shapes) {
                w.insert(*m, load(&format!("{p}.{m}.weight"), &s)?);
            }
            layers.push(Frozen {
                input_norm: load(&format!("{p}.input_layernorm.weight"), &[d])?,
                post_norm: load(&format!("{p}.post_attention_layernorm.weight"), &[d])?,
                w,
            });
        }
        let head = match cfg.tie_word_embeddings {
            true => "model.embed_tokens.weight",
            false => "lm_head.weight",
        };
        let inv: Vec<f32> = lcut_model::inverse_frequencies(&cfg.rope)
            .iter()
            .map(|&f| f as f32)
            .collect();
        let n = inv.len();
        Ok(Self {
            first,
            cut,
            layers,
            norm: load("model.norm.weight", &[d])?,
            lm_head: load(head, &[cfg.vocab_size, d])?,
            inv_freq: Tensor::from_vec(inv, (1, n), &dev)?,
            cfg: cfg.clone(),
        })
    }

    /// The first layer run here.
    pub fn first_layer(&self) -> usize {
        self.first
    }

    /// New pairs of rank `r` on `modules` of `layers`: A small random
    /// (seeded), B zero, so training starts from the base model.
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
        for &l in layers {
            let frozen = l.checked_sub(self.first).and_then(|i| self.layers.get(i));
            let Some(frozen) = frozen else {
                return Err(unsupported(&format!(
                    "layer {l} is below the first trained layer {}",
                    self.first
                )));
            };
            for m in modules {
                let Some(w) = MODULES
                    .iter()
                    .position(|x| x.ends_with(m))
                    .and_then(|k| frozen.w.get(MODULES[k]))
                else {
                    return Err(unsupported(&format!("unknown module {m}")));
                };
                let (out, inp) = w.dims2()?;
                let bound = 1.0 / (inp as f64).sqrt();
                let a: Vec<f32> = (0..r * inp)
                    .map(|_| ((rng.next_f64() * 2.0 - 1.0) * bound) as f32)
                    .collect();
                let a = Var::from_tensor(&Tensor::from_vec(a, (r, inp), &dev)?)?;
                let b = Var::from_tensor(&Tensor::zeros((out, r), DType::F32, &dev)?)?;
                let full = MODULES
                    .iter()
                    .find(|x| x.ends_with(m))
                    .copied()
                    .unwrap_or(m);
                vars.insert((l, full.to_string()), (a, b));
            }
        }
        Ok(LoraVars {
            vars,
            scale: alpha / r as f64,
        })
    }

    /// Logits [loss rows, vocab] of a sequence: the trained layers below
    /// the cut on all its rows, then the rows kept at the cut through the
    /// rest, each reading the rows its mask shows.
    pub fn logits(&self, s: &TrainSeq, lora: &LoraVars) -> Result<Tensor> {
        let mut x = s.x.clone();
        let mut layers = self.layers.iter().enumerate();
        match (&s.below, self.first < self.cut) {
            (Some(below), true) => {
                let mask = mask(&below.visible, below.positions.len())?;
                let rope = self.rope(&below.positions)?;
                for (i, w) in layers.by_ref().take(self.cut - self.first) {
                    x = self.layer(&x, self.first + i, w, &mask, (&rope.0, &rope.1), lora)?;
                }
                x = x.index_select(&Tensor::new(below.kept.as_slice(), &Device::Cpu)?, 0)?;
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
        let mask = mask(&s.visible, s.positions.len())?;
        let (cos, sin) = self.rope(&s.positions)?;
        for (i, w) in layers {
            x = self.layer(&x, self.first + i, w, &mask, (&cos, &sin), lora)?;
        }
        let idx = Tensor::new(s.loss_rows.as_slice(), &Device::Cpu)?;
        let picked = rms(&x.index_select(&idx, 0)?, &self.norm, self.cfg.rms_norm_eps)?;
        Ok(picked.matmul(&self.lm_head.t()?)?)
    }

    fn rope(&self, positions: &[usize]) -> Result<(Tensor, Tensor)> {
        let pos: Vec<f32> = positions.iter().map(|&p| p as f32).collect();
        let pos = Tensor::from_vec(pos, (positions.len(), 1), &Device::Cpu)?;
        let freqs = pos.broadcast_mul(&self.inv_freq)?;
        Ok((freqs.cos()?, freqs.sin()?))
    }

    fn layer(
        &self,
        x: &Tensor,
        l: usize,
        w: &Frozen,
        mask: &Tensor,
        (cos, sin): (&Tensor, &Tensor),
        lora: &LoraVars,
    ) -> Result<Tensor> {
        let c = &self.cfg;
        let n = x.dim(0)?;
        let (h, kv, hd) = (c.num_heads, c.num_kv_heads, c.head_dim);
        let proj = |m: &'static str, inp: &Tensor| -> Result<Tensor> {
            let mut y = inp.matmul(&w.w[m].t()?)?;
            if let Some((a, b)) = lora.vars.get(&(l, m.to_string())) {
                let low = inp.matmul(&a.as_tensor().t()?)?;
                y = (y + (low.matmul(&b.as_tensor().t()?)? * lora.scale)?)?;
            }
            Ok(y)
        };
        let heads = |t: Tensor, count: usize| -> Result<Tensor> {
            Ok(t.reshape((n, count, hd))?.transpose(0, 1)?.contiguous()?)
        };
        let normed = rms(x, &w.input_norm, c.rms_norm_eps)?;
        let q = rope(&heads(proj("self_attn.q_proj", &normed)?, h)?, cos, sin)?;
        let k = rope(&heads(proj("self_attn.k_proj", &normed)?, kv)?, cos, sin)?;
        let v = heads(proj("self_attn.v_proj", &normed)?, kv)?;
        let group = h / kv;
        let expand = |t: Tensor| -> Result<Tensor> {
            Ok(t.unsqueeze(1)?
                .expand((kv, group, n, hd))?
                .reshape((h, n, hd))?)
        };
        let (k, v) = (expand(k)?, expand(v)?);
        let scores = (q.matmul(&k.t()?)? / (hd as f64).sqrt())?.broadcast_add(mask)?;
        let probs = candle_nn::ops::softmax(&scores, D::Minus1)?;
        let attn = probs.matmul(&v)?.transpose(0, 1)?.reshape((n, h * hd))?;
        let x = (x + proj("self_attn.o_proj", &attn)?)?;
        let normed = rms(&x, &w.post_norm, c.rms_norm_eps)?;
        let gate = candle_nn::ops::silu(&proj("mlp.gate_proj", &normed)?)?;
        let up = proj("mlp.up_proj", &normed)?;
        Ok((&x + proj("mlp.down_proj", &(gate * up)?)?)?)
    }
}

/// An additive attention mask [1, n, n] from row q reads row k where
/// `visible[q * n + k]`.
fn mask(visible: &[bool], n: usize) -> Result<Tensor> {
    if visible.len() != n * n {
        return Err(TrainError::Shape {
            reason: format!("a mask of {} entries for {n} rows", visible.len()),
        });
    }
    let mask: Vec<f32> = visible
        .iter()
        .map(|&v| if v { 0.0 } else { -1e9 })
        .collect();
    Ok(Tensor::from_vec(mask, (1, n, n), &Device::Cpu)?)
}

/// RMSNorm from differentiable ops.
fn rms(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    let var = x.sqr()?.mean_keepdim(D::Minus1)?;
    let normed = x.broadcast_div(&(var + eps)?.sqrt()?)?;
    Ok(normed.broadcast_mul(w)?)
}

/// Half-split RoPE (Hugging Face layout) on [heads, n, hd].
fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let half = x.dim(D::Minus1)? / 2;
    let x1 = x.narrow(D::Minus1, 0, half)?;
    let x2 = x.narrow(D::Minus1, half, half)?;
    let a = (x1.broadcast_mul(cos)? - x2.broadcast_mul(sin)?)?;
    let b = (x2.broadcast_mul(cos)? + x1.broadcast_mul(sin)?)?;
    Ok(Tensor::cat(&[a, b], D::Minus1)?)
}
