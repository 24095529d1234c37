//! `lcut train`: AdamW on the synthetic tasks with the loss on the answer
//! span only, under a full or SPEED-aware attention mask, then a checkpoint
//! in the Hugging Face layout with its tokenizer, chat template and
//! `training.json`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use candle_nn::{AdamW, Optimizer, ParamsAdamW, VarMap};
use lcut_model::Decoder;
use lcut_policy::{Policy, TokenPhases};
use rand::{Rng, SeedableRng, rngs::StdRng};
use serde::Serialize;
use serde_json::json;

use crate::error::{Result, TrainError, refuse};
use crate::eval::{DEFAULT_EVAL_SEED, evaluate, resolve_policy};
use crate::net::{BatchMasks, ModelShape, TrainModel, init_varmap, load_varmap, save_checkpoint};
use crate::task::{Instance, Stream, TaskKind, TaskSpec};
use crate::vocab::{self, id};

/// What `lcut train` is asked to do: train (or fine-tune) a small Llama on
/// the copy/reverse task family and save it as a Hugging Face model folder.
/// (`training.json` records these as `args`.)
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrainOptions {
    /// Output model folder (created; existing model files are replaced).
    pub out: PathBuf,
    /// Visibility policy of the training mask: `full`, or SPEED such as
    /// `speed:3/4+bos` (anchor-free: `speed:3/4`).
    pub policy: String,
    /// Start from this model folder's weights (fine-tuning) instead of a
    /// fresh initialisation; its config.json fixes the shape.
    pub init: Option<PathBuf>,
    /// Seed of the initial weights and of the training batches.
    pub seed: u64,
    /// Optimiser steps.
    pub steps: usize,
    /// Sequences per step (at most; see `--batch-tokens`).
    pub batch_size: usize,
    /// Peak learning rate (AdamW).
    pub lr: f64,
    /// Standard deviation of the initial weight matrices.
    pub init_std: f32,
    /// Linear warm-up steps; then cosine decay to a tenth of the peak.
    pub warmup: usize,
    /// AdamW weight decay.
    pub weight_decay: f64,
    /// Clip the global gradient norm to this (0: no clipping).
    pub clip: f64,
    /// Decoder layers.
    pub layers: usize,
    /// Residual width.
    pub hidden: usize,
    /// MLP inner width.
    pub intermediate: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// The layer layout (Llama's, SmolLM3's NoPE layers, OLMo's norms after
    /// the blocks and sliding layers).
    pub layout: lcut_model::Layout,
    /// Tasks to train on (comma-separated).
    pub tasks: Vec<TaskKind>,
    /// Shortest prompt in tokens.
    pub min_prompt: usize,
    /// Longest prompt in tokens.
    pub max_prompt: usize,
    /// Shortest span.
    pub min_span: usize,
    /// Longest span.
    pub max_span: usize,
    /// Curriculum: the longest prompt grows linearly from `--start-prompt`
    /// to `--max-prompt` over this many steps (0: no curriculum). Short
    /// prompts are cheap, and the copy circuit found on them carries over.
    pub curriculum_steps: usize,
    /// The longest prompt at step 0 of the curriculum.
    pub start_prompt: usize,
    /// The longest span at step 0 of the curriculum (grows to `--max-span`).
    /// Short spans teach the copy circuit in a few hundred steps; long ones
    /// alone stall on a bag-of-words plateau for thousands.
    pub start_span: usize,
    /// Token budget of a batch: sequences per step shrink to fit
    /// `batch_tokens / longest sequence` (at least 8, at most
    /// `--batch-size`). 0: always `--batch-size` sequences.
    pub batch_tokens: usize,
    /// Steps between progress lines.
    pub log_every: usize,
    /// Steps between teacher-forced validations (0: only at the end).
    pub val_every: usize,
    /// Held-out instances of the final greedy evaluation (0: skip it).
    pub eval_n: usize,
}

impl TrainOptions {
    /// The task distribution these arguments describe.
    pub fn task_spec(&self) -> TaskSpec {
        TaskSpec {
            tasks: self.tasks.clone(),
            min_prompt: self.min_prompt,
            max_prompt: self.max_prompt,
            min_span: self.min_span,
            max_span: self.max_span,
        }
    }

    /// The model shape these arguments describe.
    pub fn model_shape(&self) -> ModelShape {
        ModelShape {
            vocab_size: vocab::VOCAB_SIZE,
            hidden_size: self.hidden,
            intermediate_size: self.intermediate,
            num_layers: self.layers,
            num_heads: self.heads,
            num_kv_heads: self.kv_heads,
            rope_theta: 10000.0,
            rms_norm_eps: 1e-5,
            max_position_embeddings: 512,
            layout: self.layout,
        }
    }
}

/// One padded training batch.
#[derive(Debug, Clone)]
pub struct Batch {
    /// Token ids [b, t], right-padded with `<pad>`.
    pub ids: Tensor,
    /// Attention masks of the batch under the training policy.
    pub masks: BatchMasks,
    /// Flattened rows (`b_i * t + pos`) whose next token is an answer token.
    pub rows: Vec<u32>,
    /// The answer token each row predicts.
    pub targets: Vec<u32>,
    /// For each sequence, its range in `rows`.
    pub spans: Vec<std::ops::Range<usize>>,
}

impl Batch {
    /// Pad `instances` into one batch for `model` under `policy` with
    /// `anchor_len` anchors (the model's sliding windows apply too).
    pub fn new(
        instances: &[Instance],
        policy: &Policy,
        anchor_len: usize,
        model: &TrainModel,
    ) -> Result<Self> {
        let device = model.device();
        let t = instances
            .iter()
            .map(|i| i.prompt.len() + i.answer.len())
            .max()
            .unwrap_or(1);
        let mut ids = Vec::with_capacity(instances.len() * t);
        let mut phases = Vec::with_capacity(instances.len());
        let (mut rows, mut targets, mut spans) = (vec![], vec![], vec![]);
        for (b, inst) in instances.iter().enumerate() {
            let mut seq = inst.sequence();
            seq.resize(t, id::PAD);
            ids.extend(seq);
            let s = inst.decode_start();
            phases.push(
                TokenPhases::new(inst.prompt.len(), s, anchor_len)
                    .map_err(|e| TrainError::Tokenizer(format!("bad phases: {e}")))?,
            );
            let first = rows.len();
            for (k, &target) in inst.answer.iter().enumerate() {
                rows.push((b * t + s + k) as u32);
                targets.push(target);
            }
            spans.push(first..rows.len());
        }
        Ok(Self {
            ids: Tensor::from_vec(ids, (instances.len(), t), device)?,
            masks: BatchMasks::new(policy, model.windows(), &phases, t),
            rows,
            targets,
            spans,
        })
    }

    /// Mean cross-entropy of the answer tokens and the logits of those rows.
    pub fn loss(&self, model: &TrainModel) -> Result<(Tensor, Tensor)> {
        let hidden = model.hidden(&self.ids, &self.masks)?;
        let logits = model.logits_at(&hidden, &self.rows)?;
        let targets = Tensor::new(self.targets.as_slice(), logits.device())?;
        let loss = candle_nn::loss::cross_entropy(&logits, &targets)?;
        Ok((loss, logits))
    }

    /// Number of sequences whose answer tokens are all the argmax of their
    /// rows of `logits` (teacher-forced exact match).
    pub fn exact(&self, logits: &Tensor) -> Result<usize> {
        let pred = crate::argmax(logits)?;
        Ok(self
            .spans
            .iter()
            .filter(|r| pred[(*r).clone()] == self.targets[(*r).clone()])
            .count())
    }
}

/// The training batch of `step`: sequences of similar length (a bucket of
/// +-12 tokens around a length drawn from `min_prompt..=longest`), so padding
/// wastes little work; `batch` sequences, or fewer when `batch_tokens`
/// (if non-zero) would be exceeded.
pub fn training_instances(
    spec: &TaskSpec,
    seed: u64,
    step: usize,
    longest: usize,
    batch: usize,
    batch_tokens: usize,
) -> Vec<Instance> {
    let mut rng =
        StdRng::seed_from_u64(crate::task::instance_seed(seed, Stream::Train, step as u64));
    let longest = longest.clamp(spec.min_prompt, spec.max_prompt);
    let centre = rng.random_range(spec.min_prompt..=longest);
    let lo = centre.saturating_sub(12).max(spec.min_prompt);
    let hi = (centre + 12).min(longest);
    let n = if batch_tokens > 0 {
        (batch_tokens / (hi + spec.max_answer())).clamp(8.min(batch), batch)
    } else {
        batch
    };
    (0..n)
        .map(|_| {
            let len = rng.random_range(lo..=hi);
            Instance::with_rng(spec, &mut rng, len)
        })
        .collect()
}

/// The task distribution and longest prompt of the batches at `step` under
/// the curriculum: prompt and span limits grow linearly to the spec's.
fn curriculum(args: &TrainOptions, spec: &TaskSpec, step: usize) -> (TaskSpec, usize) {
    if step >= args.curriculum_steps {
        return (spec.clone(), spec.max_prompt);
    }
    let frac = step as f64 / args.curriculum_steps as f64;
    let grow = |start: usize, end: usize| -> usize {
        let start = start.min(end) as f64;
        (start + (end as f64 - start) * frac).round() as usize
    };
    let max_span = grow(args.start_span.max(spec.min_span), spec.max_span);
    (
        TaskSpec {
            max_span,
            ..spec.clone()
        },
        grow(args.start_prompt, spec.max_prompt),
    )
}

fn learning_rate(args: &TrainOptions, step: usize) -> f64 {
    if step < args.warmup {
        return args.lr * (step + 1) as f64 / args.warmup as f64;
    }
    let span = args.steps.saturating_sub(args.warmup).max(1) as f64;
    let progress = ((step - args.warmup) as f64 / span).min(1.0);
    let cosine = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
    args.lr * (0.1 + 0.9 * cosine)
}

/// Scale the gradients so their global norm is at most `max_norm`; returns
/// the norm before clipping.
fn clip_gradients(
    grads: &mut candle_core::backprop::GradStore,
    varmap: &VarMap,
    max_norm: f64,
) -> Result<f64> {
    let vars = varmap.all_vars();
    let mut sum = 0.0f64;
    for v in &vars {
        if let Some(g) = grads.get(v.as_tensor()) {
            sum += g.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
        }
    }
    let norm = sum.sqrt();
    if max_norm > 0.0 && norm > max_norm {
        let scale = max_norm / (norm + 1e-6);
        for v in &vars {
            if let Some(g) = grads.remove(v.as_tensor()) {
                grads.insert(v.as_tensor(), (g * scale)?);
            }
        }
    }
    Ok(norm)
}

/// Teacher-forced exact match and mean loss on a fixed validation set.
fn validate(
    model: &TrainModel,
    val: &[Instance],
    policy: &Policy,
    anchor_len: usize,
    batch: usize,
) -> Result<(f64, f64)> {
    let (mut exact, mut loss_sum, mut chunks) = (0usize, 0.0f64, 0usize);
    for chunk in val.chunks(batch.max(1)) {
        let b = Batch::new(chunk, policy, anchor_len, model)?;
        let (loss, logits) = b.loss(model)?;
        loss_sum += loss.to_scalar::<f32>()? as f64;
        chunks += 1;
        exact += b.exact(&logits)?;
    }
    Ok((
        exact as f64 / val.len().max(1) as f64,
        loss_sum / chunks.max(1) as f64,
    ))
}

/// One row of the training log.
#[derive(Debug, Clone, Serialize)]
struct LogRow {
    step: usize,
    longest_prompt: usize,
    longest_span: usize,
    loss: f64,
    batch_exact: f64,
    lr: f64,
    grad_norm: f64,
    seconds: f64,
}

/// One validation of the training log.
#[derive(Debug, Clone, Serialize)]
struct ValRow {
    step: usize,
    teacher_forced_exact: f64,
    loss: f64,
    seconds: f64,
}

fn shape_and_varmap(args: &TrainOptions, device: &Device) -> Result<(ModelShape, VarMap)> {
    match &args.init {
        None => {
            let shape = args.model_shape();
            Ok((
                shape,
                init_varmap(&shape, args.init_std, args.seed, device)?,
            ))
        }
        Some(folder) => {
            let cfg = lcut_model::ModelConfig::from_folder(folder)?;
            let shape = ModelShape::from_config(&cfg);
            if shape.vocab_size != vocab::VOCAB_SIZE {
                return Err(TrainError::Shape {
                    reason: format!(
                        "{}: vocab_size {} is not this task vocabulary's {}",
                        folder.join("config.json").display(),
                        shape.vocab_size,
                        vocab::VOCAB_SIZE
                    ),
                });
            }
            Ok((shape, load_varmap(folder, &shape, device)?))
        }
    }
}

/// Check that the written `tokenizer.json` encodes the rendered chat format
/// of a few instances into exactly the ids the trainer uses.
pub fn check_tokenizer(folder: &Path, spec: &TaskSpec) -> Result<()> {
    let path = folder.join("tokenizer.json");
    let tok = tokenizers::Tokenizer::from_file(&path)
        .map_err(|e| TrainError::Tokenizer(format!("{}: {e}", path.display())))?;
    for i in 0..8 {
        let inst = Instance::generate(spec, 0, Stream::Validation, i);
        let text = vocab::render_prompt(&inst.user_content);
        let enc = tok
            .encode(text.as_str(), false)
            .map_err(|e| TrainError::Tokenizer(e.to_string()))?;
        if enc.get_ids() != inst.prompt.as_slice() {
            return Err(TrainError::Tokenizer(format!(
                "{text:?} encodes as {:?}, the trainer uses {:?}",
                enc.get_ids(),
                inst.prompt
            )));
        }
    }
    Ok(())
}

/// The training policy of `args` for a model of `shape`, with its anchor
/// count; refuses a task longer than the model's positions and SlimInfer
/// (a runtime policy, no training mask).
fn training_policy(
    args: &TrainOptions,
    spec: &TaskSpec,
    shape: &ModelShape,
) -> Result<(Policy, usize)> {
    if spec.max_sequence() > shape.max_position_embeddings {
        refuse!(
            "the longest sequence ({} tokens) exceeds max_position_embeddings {}",
            spec.max_sequence(),
            shape.max_position_embeddings
        );
    }
    let (policy, anchor_len) = resolve_policy(&args.policy, shape.num_layers)?;
    if !policy.trainable() {
        refuse!(
            "--policy {}: training runs under a static mask (full, SPEED, SelfOnly); this policy \
             has none (SlimInfer needs no retraining: evaluate it with `lcut eval --policy ...`)",
            args.policy
        );
    }
    Ok((policy, anchor_len))
}

/// What the training loop works on.
struct Training<'a> {
    args: &'a TrainOptions,
    spec: &'a TaskSpec,
    model: &'a TrainModel,
    varmap: &'a VarMap,
    policy: &'a Policy,
    anchor_len: usize,
}

/// Running sums of the training log between two log rows.
#[derive(Default)]
struct LogSums {
    loss: f64,
    exact: usize,
    steps: usize,
    sequences: usize,
}

impl Training<'_> {
    /// Every optimizer step, with the log rows and the validation rows.
    fn run(&self, opt: &mut AdamW) -> Result<(Vec<LogRow>, Vec<ValRow>)> {
        let args = self.args;
        let val: Vec<Instance> = (0..128)
            .map(|i| Instance::generate(self.spec, args.seed, Stream::Validation, i))
            .collect();
        let start = Instant::now();
        let (mut log, mut vals) = (Vec::<LogRow>::new(), Vec::<ValRow>::new());
        let mut sums = LogSums::default();
        for step in 0..args.steps {
            let lr = learning_rate(args, step);
            opt.set_learning_rate(lr);
            let (step_spec, longest) = curriculum(args, self.spec, step);
            let grad_norm = self.step(opt, step, &step_spec, longest, &mut sums)?;
            let last = step + 1 == args.steps;
            if (step + 1) % args.log_every.max(1) == 0 || last {
                let row = LogRow {
                    step: step + 1,
                    longest_prompt: longest,
                    longest_span: step_spec.max_span,
                    loss: sums.loss / sums.steps as f64,
                    batch_exact: sums.exact as f64 / sums.sequences.max(1) as f64,
                    lr,
                    grad_norm,
                    seconds: start.elapsed().as_secs_f64(),
                };
                print_log_row(&row);
                log.push(row);
                sums = LogSums::default();
            }
            if (args.val_every > 0 && (step + 1) % args.val_every == 0) || last {
                vals.push(self.validation_row(&val, step + 1, &start)?);
            }
        }
        Ok((log, vals))
    }

    /// One optimizer step on a fresh batch; returns the gradient norm.
    fn step(
        &self,
        opt: &mut AdamW,
        step: usize,
        step_spec: &TaskSpec,
        longest: usize,
        sums: &mut LogSums,
    ) -> Result<f64> {
        let args = self.args;
        let instances = training_instances(
            step_spec,
            args.seed,
            step,
            longest,
            args.batch_size,
            args.batch_tokens,
        );
        let batch = Batch::new(&instances, self.policy, self.anchor_len, self.model)?;
        let (loss, logits) = batch.loss(self.model)?;
        let mut grads = loss.backward()?;
        let grad_norm = clip_gradients(&mut grads, self.varmap, args.clip)?;
        opt.step(&grads)?;
        sums.loss += loss.to_scalar::<f32>()? as f64;
        sums.exact += batch.exact(&logits)?;
        sums.sequences += instances.len();
        sums.steps += 1;
        Ok(grad_norm)
    }

    /// Teacher-forced validation after `step` steps, printed.
    fn validation_row(&self, val: &[Instance], step: usize, start: &Instant) -> Result<ValRow> {
        let (exact, vloss) = validate(
            self.model,
            val,
            self.policy,
            self.anchor_len,
            self.args.batch_size,
        )?;
        let row = ValRow {
            step,
            teacher_forced_exact: exact,
            loss: vloss,
            seconds: start.elapsed().as_secs_f64(),
        };
        println!(
            "validation step {} teacher_forced_exact {:.3} loss {:.4}",
            row.step, row.teacher_forced_exact, row.loss
        );
        Ok(row)
    }
}

fn print_log_row(row: &LogRow) {
    println!(
        "step {:>5} loss {:.4} batch_exact {:.3} lr {:.2e} grad_norm {:.3} prompts<={} spans<={} {:.0}s",
        row.step,
        row.loss,
        row.batch_exact,
        row.lr,
        row.grad_norm,
        row.longest_prompt,
        row.longest_span,
        row.seconds
    );
}

/// Greedy exact match of the saved model under the training policy
/// (`None` with `--eval-n 0`).
fn final_eval(
    args: &TrainOptions,
    spec: &TaskSpec,
    device: &Device,
) -> Result<Option<serde_json::Value>> {
    if args.eval_n == 0 {
        return Ok(None);
    }
    let decoder = Decoder::load(&args.out, DType::F32, device)?;
    let (p, correct, per_task) =
        evaluate(&decoder, spec, &args.policy, args.eval_n, DEFAULT_EVAL_SEED)?;
    let em = correct as f64 / args.eval_n as f64;
    println!(
        "final greedy eval under {p}: {correct}/{} exact",
        args.eval_n
    );
    Ok(Some(json!({
        "policy": p,
        "n": args.eval_n,
        "seed": DEFAULT_EVAL_SEED,
        "correct": correct,
        "exact_match": em,
        "per_task": per_task,
    })))
}

/// `lcut train`: train, save the checkpoint in `args.out`, evaluate it with
/// lcut-model's greedy decoding under the training policy and record
/// everything in `training.json`.
pub fn run_train(args: &TrainOptions) -> Result<()> {
    let device = Device::Cpu;
    let spec = args.task_spec();
    spec.validate()?;
    let (shape, varmap) = shape_and_varmap(args, &device)?;
    let (policy, anchor_len) = training_policy(args, &spec, &shape)?;
    let model = TrainModel::new(shape, &varmap, &device)?;
    let params = ParamsAdamW {
        lr: args.lr,
        beta1: 0.9,
        beta2: 0.98,
        eps: 1e-8,
        weight_decay: args.weight_decay,
    };
    let mut opt = AdamW::new(varmap.all_vars(), params)?;
    let n_params: usize = varmap.all_vars().iter().map(|v| v.elem_count()).sum();
    println!(
        "training {} ({} parameters, {} layers) under {policy} for {} steps, batch {}, seed {}",
        args.out.display(),
        n_params,
        shape.num_layers,
        args.steps,
        args.batch_size,
        args.seed
    );
    let start = Instant::now();
    let training = Training {
        args,
        spec: &spec,
        model: &model,
        varmap: &varmap,
        policy: &policy,
        anchor_len,
    };
    let (log, vals) = training.run(&mut opt)?;
    let train_seconds = start.elapsed().as_secs_f64();
    save_checkpoint(&args.out, &shape, &varmap)?;
    check_tokenizer(&args.out, &spec)?;
    let eval_start = Instant::now();
    let final_eval = final_eval(args, &spec, &device)?;
    let environment: Vec<String> = ["CANDLE_NUM_THREADS", "RAYON_NUM_THREADS", "GLIBC_TUNABLES"]
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| format!("{k}={v}")))
        .collect();
    let record = json!({
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "environment": environment,
        "args": args,
        "policy": policy.to_string(),
        "anchor_len": anchor_len,
        "shape": shape,
        "parameters": n_params,
        "task": spec,
        "seed": args.seed,
        "steps": args.steps,
        "train_wall_seconds": train_seconds,
        "eval_wall_seconds": eval_start.elapsed().as_secs_f64(),
        "cpu_threads": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "final_eval": final_eval,
        "validation": vals,
        "log": log,
        "lcut_train_version": env!("CARGO_PKG_VERSION"),
    });
    let path = args.out.join("training.json");
    let text = serde_json::to_string_pretty(&record).map_err(|e| TrainError::Json {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    lcut_model::lora::write_atomic(&path, format!("{text}\n").as_bytes())
        .map_err(|source| TrainError::Io { path, source })?;
    println!(
        "saved {} after {:.0}s of training",
        args.out.display(),
        train_seconds
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The gradients that reach every weight agree with finite differences
    /// of the loss, under the full mask and under a SPEED mask, on Llama's
    /// layout, on Mixtral's (the router learns through the weights of the
    /// experts it chose), on Qwen3.5's (a linear layer below a full one:
    /// the convolution, decay rates and state reach every weight; with
    /// experts, the shared expert and its gate too) and on
    /// Gemma 4's (a sliding layer below a full one whose keys are its
    /// values, per-layer inputs, layer scalars, tied embeddings).
    #[test]
    fn gradients_match_finite_differences() -> Result<()> {
        for (layout, heads) in [
            (lcut_model::Layout::Llama, (4, 2)),
            (
                lcut_model::Layout::Mixtral {
                    experts: 3,
                    top_k: 2,
                },
                (4, 2),
            ),
            // heads 8 wide: RoPE turns a quarter of each
            (
                lcut_model::Layout::Qwen35 {
                    full_interval: 2,
                    experts: None,
                },
                (2, 1),
            ),
            (
                lcut_model::Layout::Qwen35 {
                    full_interval: 2,
                    experts: Some((3, 2)),
                },
                (2, 1),
            ),
            (
                lcut_model::Layout::Gemma4 {
                    window: 8,
                    shared: 0,
                    experts: None,
                },
                (2, 1),
            ),
            (
                lcut_model::Layout::Gemma4 {
                    window: 8,
                    shared: 0,
                    experts: Some((3, 2)),
                },
                (2, 1),
            ),
        ] {
            gradients_of(layout, heads)?;
        }
        Ok(())
    }

    fn gradients_of(
        layout: lcut_model::Layout,
        (num_heads, num_kv_heads): (usize, usize),
    ) -> Result<()> {
        let dev = Device::Cpu;
        let shape = ModelShape {
            vocab_size: vocab::VOCAB_SIZE,
            hidden_size: 16,
            intermediate_size: 24,
            num_layers: 2,
            num_heads,
            num_kv_heads,
            rope_theta: 10000.0,
            rms_norm_eps: 1e-5,
            max_position_embeddings: 512,
            layout,
        };
        let spec = TaskSpec {
            min_prompt: 18,
            max_prompt: 24,
            ..TaskSpec::default()
        };
        let instances: Vec<Instance> = (0..3)
            .map(|i| Instance::generate(&spec, 1, Stream::Train, i))
            .collect();
        for policy_text in ["full", "speed:1+bos"] {
            let varmap = init_varmap(&shape, 0.08, 3, &dev)?;
            let model = TrainModel::new(shape, &varmap, &dev)?;
            let (policy, anchors) = resolve_policy(policy_text, shape.num_layers)?;
            let batch = Batch::new(&instances, &policy, anchors, &model)?;
            let loss_of =
                || -> Result<f64> { Ok(batch.loss(&model)?.0.to_scalar::<f32>()? as f64) };
            let grads = batch.loss(&model)?.0.backward()?;
            let data = varmap.data().lock().map_err(|_| TrainError::Shape {
                reason: "poisoned".into(),
            })?;
            let mut names: Vec<&String> = data.keys().collect();
            names.sort();
            let mut checked = 0;
            let mut failures = Vec::new();
            for name in names {
                let var = &data[name];
                let grad = grads
                    .get(var.as_tensor())
                    .ok_or_else(|| TrainError::Shape {
                        reason: format!("no gradient reaches {name}"),
                    })?
                    .flatten_all()?
                    .to_vec1::<f32>()?;
                let base = var.as_tensor().flatten_all()?.to_vec1::<f32>()?;
                // The entry with the largest gradient, and one more.
                let big = grad
                    .iter()
                    .enumerate()
                    .max_by(|a, b| a.1.abs().total_cmp(&b.1.abs()))
                    .map(|(i, _)| i)
                    .unwrap_or(0);
                for i in [big, base.len() / 2] {
                    // a router's bump of 1e-2 can change which experts a
                    // token chooses (the loss jumps there), and Gemma 4's
                    // embeddings scaled by sqrt(hidden) and soft-capped logits
                    // curve within it (30% off under SPEED); 1e-3 does neither
                    let eps = 1e-3f32;
                    let bump = |delta: f32| -> Result<f64> {
                        let mut v = base.clone();
                        v[i] += delta;
                        var.set(&Tensor::from_vec(v, var.dims(), &dev)?)?;
                        loss_of()
                    };
                    let numeric = (bump(eps)? - bump(-eps)?) / (2.0 * eps as f64);
                    var.set(&Tensor::from_vec(base.clone(), var.dims(), &dev)?)?;
                    let analytic = grad[i] as f64;
                    let tol = 2e-3 + 0.05 * numeric.abs().max(analytic.abs());
                    if (numeric - analytic).abs() > tol {
                        failures.push(format!(
                            "{layout}, {policy_text}: {name}[{i}]: analytic {analytic} vs \
                             numeric {numeric}"
                        ));
                    }
                    checked += 1;
                }
            }
            assert!(failures.is_empty(), "{}", failures.join("\n"));
            assert!(checked >= 2 * shape.weight_shapes().len());
            assert!(shape.weight_shapes().len() >= 3 + 9 * shape.num_layers);
        }
        Ok(())
    }
}
