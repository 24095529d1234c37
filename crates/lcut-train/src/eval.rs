//! Held-out exact match with greedy decoding by `lcut_model::Decoder`:
//! prefill tokens 0..s-1, then decode from the assistant marker s under the
//! policy, stop at `<|eot|>`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use lcut_model::{DType, Decoder, Device, LogitRows, argmax_rows};
use lcut_policy::{Policy, PolicySpec, TokenPhases};
use serde::{Deserialize, Serialize};

use crate::error::{Result, TrainError};
use crate::task::{Instance, Stream, TaskKind, TaskSpec};
use crate::vocab::id;

/// The held-out seed `lcut eval` uses unless told otherwise; training seeds
/// are small integers, and the eval stream is separated from the training
/// stream anyway.
pub const DEFAULT_EVAL_SEED: u64 = 20_261_122;

/// What `lcut eval` (without a suite) is asked to do: greedy exact match on
/// held-out task instances.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvalOptions {
    /// Model folder (config.json, model.safetensors; training.json, when
    /// present, gives the task distribution the model was trained on).
    pub model: PathBuf,
    /// Visibility policy: `full`, `speed:3+bos`, `speed:3/4`, `selfonly:3+bos`, ...
    pub policy: String,
    /// Number of held-out instances.
    pub n: usize,
    /// Seed of the held-out instances.
    pub seed: u64,
}

/// Exact match of one task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskScore {
    /// The task.
    pub task: TaskKind,
    /// Instances of this task.
    pub n: usize,
    /// Instances answered exactly.
    pub correct: usize,
}

/// What `lcut eval` measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalResult {
    /// The model folder.
    pub model: PathBuf,
    /// The policy resolved against the model's depth (e.g. `speed:3+bos`).
    pub policy: String,
    /// Held-out instances.
    pub n: usize,
    /// Instances whose greedy answer matched exactly (`<|eot|>` included).
    pub correct: usize,
    /// `correct / n`.
    pub exact_match: f64,
    /// Per-task breakdown.
    pub per_task: Vec<TaskScore>,
    /// Seed of the held-out set.
    pub seed: u64,
    /// Wall time of the evaluation in seconds.
    pub seconds: f64,
}

impl EvalResult {
    /// The line `lcut eval` ends with, e.g. `exact_match=0.973`.
    pub fn exact_match_line(&self) -> String {
        format!("exact_match={:.3}", self.exact_match)
    }

    /// Human-readable lines: the setting and the per-task scores.
    pub fn summary_lines(&self) -> Vec<String> {
        let mut lines = vec![format!(
            "model={} policy={} n={} seed={} seconds={:.1}",
            self.model.display(),
            self.policy,
            self.n,
            self.seed,
            self.seconds
        )];
        for t in &self.per_task {
            lines.push(format!(
                "task={} correct={}/{} exact_match={:.3}",
                t.task,
                t.correct,
                t.n,
                t.correct as f64 / t.n.max(1) as f64
            ));
        }
        lines
    }
}

/// The task distribution a model was trained on: `training.json`'s `task`
/// field when the folder has one, the default family otherwise.
pub fn task_spec_of(folder: &Path) -> Result<TaskSpec> {
    let path = folder.join("training.json");
    if !path.is_file() {
        return Ok(TaskSpec::default());
    }
    let text = std::fs::read_to_string(&path).map_err(|source| TrainError::Io {
        path: path.clone(),
        source,
    })?;
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| TrainError::Json {
        path: path.clone(),
        reason: format!("not valid JSON: {e}"),
    })?;
    let task = value.get("task").ok_or_else(|| TrainError::Json {
        path: path.clone(),
        reason: "field `task` is missing (expected the task settings the model was trained on)"
            .into(),
    })?;
    let spec: TaskSpec = serde_json::from_value(task.clone()).map_err(|e| TrainError::Json {
        path: path.clone(),
        reason: format!("field `task`: {e}"),
    })?;
    spec.validate()?;
    Ok(spec)
}

/// Parse `text` and resolve it against a model of `num_layers` layers;
/// returns the policy and its number of anchor tokens.
pub fn resolve_policy(text: &str, num_layers: usize) -> Result<(Policy, usize)> {
    let spec: PolicySpec = text.parse().map_err(|source| TrainError::Policy {
        text: text.to_string(),
        source,
    })?;
    let policy = spec
        .resolve(num_layers)
        .map_err(|source| TrainError::Policy {
            text: text.to_string(),
            source,
        })?;
    let anchors = policy
        .anchors()
        .len(None)
        .map_err(|source| TrainError::Policy {
            text: text.to_string(),
            source,
        })?;
    Ok((policy, anchors))
}

/// Greedy decoding of one instance under `policy`; returns the generated
/// ids (`<|eot|>` included when produced), at most `max_new` of them.
pub fn greedy_answer(
    decoder: &Decoder,
    inst: &Instance,
    policy: Policy,
    anchor_len: usize,
    max_new: usize,
) -> Result<Vec<u32>> {
    let s = inst.decode_start();
    // anchors as the policy counts them for this prompt (SlimInfer's sink is
    // clamped to its decode start)
    let anchor_len = policy.anchor_len(None, s).unwrap_or(anchor_len);
    let phases = TokenPhases::new(inst.prompt.len(), s, anchor_len)
        .map_err(|e| TrainError::Tokenizer(format!("bad phases for a task prompt: {e}")))?;
    let mut seq = decoder.new_sequence(policy, phases)?;
    seq.reserve(inst.prompt.len() + max_new);
    if s > 0 {
        decoder.forward(&mut seq, &inst.prompt[..s], LogitRows::None, None)?;
    }
    let mut out = decoder.forward(&mut seq, &inst.prompt[s..], LogitRows::Last, None)?;
    let mut answer = Vec::with_capacity(max_new);
    while answer.len() < max_new {
        let logits = out
            .logits
            .ok_or(TrainError::Model(lcut_model::ModelError::EmptyInput))?;
        let next = argmax_rows(&logits)?[0];
        answer.push(next);
        if next == id::EOT || answer.len() == max_new {
            break;
        }
        out = decoder.forward(&mut seq, &[next], LogitRows::Last, None)?;
    }
    Ok(answer)
}

/// Exact match of `decoder` on `n` held-out instances of `spec` (seed
/// `seed`) under the policy written as `policy`.
pub fn evaluate(
    decoder: &Decoder,
    spec: &TaskSpec,
    policy: &str,
    n: usize,
    seed: u64,
) -> Result<(String, usize, Vec<TaskScore>)> {
    let (policy, anchor_len) = resolve_policy(policy, decoder.config().num_layers)?;
    let mut per_task: Vec<TaskScore> = Vec::new();
    let mut correct = 0;
    for i in 0..n {
        let inst = Instance::generate(spec, seed, Stream::Eval, i as u64);
        let got = greedy_answer(decoder, &inst, policy, anchor_len, spec.max_answer() + 2)?;
        let ok = got == inst.answer;
        correct += usize::from(ok);
        match per_task.iter_mut().find(|t| t.task == inst.kind) {
            Some(t) => {
                t.n += 1;
                t.correct += usize::from(ok);
            }
            None => per_task.push(TaskScore {
                task: inst.kind,
                n: 1,
                correct: usize::from(ok),
            }),
        }
    }
    per_task.sort_by_key(|t| t.task);
    Ok((policy.to_string(), correct, per_task))
}

/// `lcut eval`: load the model with lcut-model (f32, CPU) and measure greedy
/// exact match on held-out instances of its task family.
pub fn run_eval(args: &EvalOptions) -> Result<EvalResult> {
    let start = Instant::now();
    let spec = task_spec_of(&args.model)?;
    let decoder = Decoder::load(&args.model, DType::F32, &Device::Cpu)?;
    let (policy, correct, per_task) = evaluate(&decoder, &spec, &args.policy, args.n, args.seed)?;
    Ok(EvalResult {
        model: args.model.clone(),
        policy,
        n: args.n,
        correct,
        exact_match: correct as f64 / args.n.max(1) as f64,
        per_task,
        seed: args.seed,
        seconds: start.elapsed().as_secs_f64(),
    })
}
