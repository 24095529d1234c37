//! A whole adapter training job, from its options to its files: the base
//! model loaded (one session, dense in f32, for the teacher, the frozen
//! layers and the trained span), the training data made, the adapter trained
//! with checkpoints, then the adapter (PEFT layout, with `lcut_policy`) and
//! `training.json` written.

use std::time::Instant;

use candle_core::{DType, Device};
use lcut_engine::Session;
use lcut_model::WeightMode;
use lcut_model::lora::{LoraConfig, Targets, write_adapter};
use lcut_policy::Policy;
use serde_json::json;

use super::data::{TrainingData, training_data};
use super::model::{LoraVars, UpperModel};
use super::options::{AdapterJob, adapted_layers, projection_names};
use super::progress::Progress;
use super::run::{CheckpointState, train_lora};
use crate::error::{Context, Result, refuse};

/// What the job decided from its options and the model: the resolved
/// policy, the layers and projections adapted, and the first trained layer.
struct Plan {
    policy: Policy,
    adapt: Vec<usize>,
    modules: Vec<String>,
    first: usize,
}

/// Run `job`: train the adapter and write it, its checkpoint and
/// `training.json` into `job.out`. A rerun with the same output folder
/// resumes from the checkpoint. Returns the training state at the end.
pub fn train_adapter(job: &AdapterJob, progress: &mut dyn Progress) -> Result<CheckpointState> {
    let started = Instant::now();
    let session = Session::load_resolved(&job.model, WeightMode::Dense(DType::F32), &Device::Cpu)
        .with_context(|| format!("loading model {}", job.model))?;
    let plan = plan(job, session.model.config().num_layers)?;
    let cut = plan.policy.l_cut();
    let upper = UpperModel::over(session.model.clone(), plan.first, cut)?;
    let fingerprint = session.model.lora_fingerprint()?;
    let kd = job.train.kd_weight > 0.0;
    let policy = (&plan.policy, plan.first, fingerprint.as_str());
    let data = training_data(&session, policy, &job.data, kd, progress)?;
    let prep_s = started.elapsed().as_secs_f64();
    progress.note(&format!(
        "{} sequences ({} tokens) ready in {prep_s:.0} s",
        data.sequences.len(),
        data.tokens
    ));
    let short: Vec<&str> = plan.modules.iter().map(|m| m.as_str()).collect();
    let lora = upper.init_lora(&plan.adapt, &short, job.rank, job.alpha, job.train.seed)?;
    for (module, layers) in lora.absent(&plan.adapt, &short) {
        progress.note(&format!(
            "{module}: not adapted on layers {layers:?}, which have no {module} of their own \
             (Gemma 4's shared layers read another layer's keys and values, its full layers' \
             values are their keys; Qwen3.5's linear-attention layers project otherwise)"
        ));
    }
    let config = adapter_config(job, &plan, fingerprint);
    let ckpt = job.out.join("checkpoint");
    progress.start("steps", job.train.steps);
    let state = train_lora(
        &upper,
        &lora,
        &data.sequences,
        &job.train,
        (&ckpt, &config),
        |step, loss| progress.set(step, &format!("loss {loss:.3}")),
    )?;
    progress.finish();
    write_outputs(
        job,
        &plan,
        (&config, &lora),
        &data,
        (prep_s, &state, started),
    )?;
    Ok(state)
}

/// The policy resolved for the model's `layers` (a SPEED policy with a cut
/// inside the model), the layers and projections to adapt, and the first
/// layer that is trained.
fn plan(job: &AdapterJob, layers: usize) -> Result<Plan> {
    let spec = job.policy;
    let policy = spec.resolve(layers)?;
    if policy.is_full_depth() || policy.l_cut() == 0 || !policy.trainable() {
        refuse!(
            "--policy {}: LoRA training here is for a SPEED policy with a cut in 1..{layers}",
            job.policy
        );
    }
    let adapt = adapted_layers(job.layers, policy.l_cut(), layers)?;
    let modules = projection_names(&job.modules)?;
    let first = adapt[0].min(policy.l_cut());
    Ok(Plan {
        policy,
        adapt,
        modules,
        first,
    })
}

/// The adapter's `adapter_config.json`: rank, alpha, the adapted
/// projections and layers, and what lcut records (policy, base model).
fn adapter_config(job: &AdapterJob, plan: &Plan, fingerprint: String) -> LoraConfig {
    let mut config = LoraConfig::new(job.rank, job.alpha, &[]);
    config.targets = Targets::Modules(
        plan.modules
            .iter()
            .map(|m| m.rsplit('.').next().unwrap_or(m).to_string())
            .collect(),
    );
    config.layers = Some(plan.adapt.clone());
    config.policy = Some(job.policy.to_string());
    config.base_model = job
        .model
        .path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned());
    config.base_fingerprint = Some(fingerprint);
    config
}

/// Write the adapter and `training.json` (how it was made, the loss curve
/// and the time taken) into `job.out`.
fn write_outputs(
    job: &AdapterJob,
    plan: &Plan,
    (config, lora): (&LoraConfig, &LoraVars),
    data: &TrainingData,
    (prep_s, state, started): (f64, &CheckpointState, Instant),
) -> Result<()> {
    write_adapter(&job.out, config, &lora.pairs()).map_err(lcut_model::ModelError::from)?;
    let record = json!({
        "command": job.command,
        "seed": job.train.seed,
        "prompt_seed": job.data.prompt_seed,
        "kd_top_k": job.data.kd_top_k,
        "balance_kinds": job.data.balance_kinds,
        "exclude_suite": job.data.exclude_suite.as_ref().map(|p| p.display().to_string()),
        "policy": job.policy.to_string(),
        "layers": plan.adapt,
        "modules": plan.modules,
        "rank": job.rank,
        "alpha": job.alpha,
        "options": job.train,
        "sequences": data.sequences.len(),
        "tokens": data.tokens,
        "data_seconds": prep_s,
        "train_seconds": state.train_seconds,
        "wall_seconds_this_run": started.elapsed().as_secs_f64(),
        "loss": state.losses,
    });
    let path = job.out.join("training.json");
    let writing = || format!("writing {}", path.display());
    let text = serde_json::to_string_pretty(&record).with_context(writing)?;
    lcut_model::lora::write_atomic(&path, text.as_bytes()).with_context(writing)
}
