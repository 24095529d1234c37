//! The training loop: batches of sequences drawn with a seeded generator,
//! cross-entropy of the upper layers' logits on the teacher's tokens plus,
//! where the teacher's distributions are kept, a KL term towards them,
//! AdamW with a linear learning-rate decay, and a checkpoint (adapter,
//! optimizer moments, step, loss curve) every so many steps that a later
//! run resumes from.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{D, Device, Tensor};
use lcut_model::lora::{LoraAdapter, LoraConfig, write_adapter, write_atomic};
use serde::{Deserialize, Serialize};

use super::model::{LoraVars, UpperModel};
use super::optim::{AdamW, SplitMix};
use super::seq::{TeacherTopK, TrainSeq};
use crate::error::{Result, TrainError};

/// Settings of a LoRA training run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LoraTrainOptions {
    /// Optimizer steps.
    pub steps: usize,
    /// Sequences per step.
    pub batch: usize,
    /// Learning rate at the first step.
    pub lr: f64,
    /// Learning rate at the last step (linear decay).
    pub lr_end: f64,
    /// AdamW weight decay.
    pub weight_decay: f64,
    /// Gradient clipping (global norm; 0: none).
    pub clip: f64,
    /// Seed of the batch draws.
    pub seed: u64,
    /// Steps between checkpoints (0: none).
    pub checkpoint_every: usize,
    /// Weight of the KL term towards the teacher's top-k distribution
    /// (0: cross-entropy on the teacher's tokens alone).
    #[serde(default)]
    pub kd_weight: f64,
}

/// What a checkpoint records beside the adapter and the moments.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CheckpointState {
    /// Steps done.
    pub step: usize,
    /// Mean loss of every step done.
    pub losses: Vec<f64>,
    /// Seconds spent training so far (all runs).
    pub train_seconds: f64,
}

const STATE: &str = "state.json";
const MOMENTS: &str = "optimizer.safetensors";

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
    move |source| TrainError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Save the run at `state.step` into `dir`, each file atomically.
fn save(
    dir: &Path,
    config: &LoraConfig,
    lora: &LoraVars,
    adam: &AdamW,
    state: &CheckpointState,
) -> Result<()> {
    write_adapter(dir, config, &lora.pairs()).map_err(lcut_model::ModelError::from)?;
    let tmp = dir.join(format!(".{MOMENTS}.tmp"));
    candle_core::safetensors::save(&adam.state(), &tmp)?;
    std::fs::rename(&tmp, dir.join(MOMENTS)).map_err(io(dir))?;
    let text = serde_json::to_string_pretty(state).map_err(|source| TrainError::Json {
        path: dir.join(STATE),
        reason: source.to_string(),
    })?;
    write_atomic(&dir.join(STATE), text.as_bytes()).map_err(io(dir))
}

/// Restore a checkpoint from `dir` into `lora` and `adam`, if there is one.
fn restore(dir: &Path, lora: &LoraVars, adam: &mut AdamW) -> Result<Option<CheckpointState>> {
    let path = dir.join(STATE);
    if !path.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&path).map_err(io(&path))?;
    let state: CheckpointState =
        serde_json::from_str(&text).map_err(|source| TrainError::Json {
            path: path.clone(),
            reason: source.to_string(),
        })?;
    let adapter = LoraAdapter::read(dir).map_err(lcut_model::ModelError::from)?;
    for (site, (a, b)) in &lora.vars {
        let Some(pair) = adapter.pairs.get(site) else {
            return Err(TrainError::Shape {
                reason: format!(
                    "checkpoint {} has no pair for layer {} {}",
                    dir.display(),
                    site.0,
                    site.1
                ),
            });
        };
        a.set(&pair.a)?;
        b.set(&pair.b)?;
    }
    let moments: HashMap<String, Tensor> =
        candle_core::safetensors::load(dir.join(MOMENTS), &Device::Cpu)?;
    adam.restore(&moments, state.step);
    Ok(Some(state))
}

/// Loss of one sequence: mean cross-entropy on the teacher's tokens plus
/// `kd_weight` times the mean KL(teacher top-k || model) over the loss rows.
fn seq_loss(model: &UpperModel, lora: &LoraVars, s: &TrainSeq, kd_weight: f64) -> Result<Tensor> {
    let logits = model.logits(s, lora)?;
    let log_probs = candle_nn::ops::log_softmax(&logits, D::Minus1)?;
    let targets = Tensor::new(s.targets.as_slice(), &Device::Cpu)?;
    let ce = candle_nn::loss::nll(&log_probs, &targets)?;
    match &s.teacher {
        Some(t) if kd_weight > 0.0 => Ok((ce + (topk_kl(&log_probs, t)? * kd_weight)?)?),
        _ => Ok(ce),
    }
}

/// Mean over rows of KL(p || q) on the teacher's top k, with p the
/// teacher's renormalised top-k probabilities and q the model's.
pub fn topk_kl(log_probs: &Tensor, teacher: &TeacherTopK) -> Result<Tensor> {
    let rows = teacher.ids.dim(0)?;
    if log_probs.dim(0)? != rows {
        return Err(TrainError::Shape {
            reason: format!(
                "teacher distribution has {rows} rows, the sequence {} loss rows",
                log_probs.dim(0)?
            ),
        });
    }
    let model_lp = log_probs.gather(&teacher.ids, 1)?;
    let p = &teacher.probs;
    let teacher_lp = p.clamp(1e-30, 1.0)?.log()?;
    let kl = (p * (teacher_lp - model_lp)?)?.sum_all()?;
    Ok((kl / (rows.max(1) as f64))?)
}

/// Train `lora` on `data`, resuming from (and checkpointing to) `ckpt`;
/// `on_step(step, loss)` after every step. Returns the final state.
pub fn train_lora(
    model: &UpperModel,
    lora: &LoraVars,
    data: &[TrainSeq],
    opts: &LoraTrainOptions,
    (ckpt, config): (&Path, &LoraConfig),
    mut on_step: impl FnMut(usize, f64),
) -> Result<CheckpointState> {
    if data.is_empty() {
        return Err(TrainError::Shape {
            reason: "no training sequences".into(),
        });
    }
    let mut adam = AdamW::new(lora.all(), opts.weight_decay)?;
    let mut state = restore(ckpt, lora, &mut adam)?.unwrap_or_default();
    let mut clock = std::time::Instant::now();
    while state.step < opts.steps {
        let step = state.step;
        let frac = step as f64 / opts.steps.max(1) as f64;
        let lr = opts.lr + (opts.lr_end - opts.lr) * frac;
        // one generator per step: a resumed run draws the same batches
        let mut rng = SplitMix(opts.seed ^ (step as u64).wrapping_mul(0x2545_F491_4F6C_DD1D));
        let mut total: Option<Tensor> = None;
        for _ in 0..opts.batch.max(1) {
            let l = seq_loss(model, lora, &data[rng.below(data.len())], opts.kd_weight)?;
            total = Some(match total {
                Some(t) => (t + l)?,
                None => l,
            });
        }
        let loss = (total.ok_or_else(|| TrainError::Shape {
            reason: "empty batch".into(),
        })? / opts.batch.max(1) as f64)?;
        let grads = loss.backward()?;
        adam.step(&grads, lr, opts.clip)?;
        let value = f64::from(loss.to_scalar::<f32>()?);
        state.losses.push(value);
        state.step += 1;
        on_step(state.step, value);
        let last = state.step == opts.steps;
        if opts.checkpoint_every > 0 && (state.step % opts.checkpoint_every == 0 || last) {
            state.train_seconds += clock.elapsed().as_secs_f64();
            clock = std::time::Instant::now();
            save(ckpt, config, lora, &adam, &state)?;
        }
    }
    Ok(state)
}
