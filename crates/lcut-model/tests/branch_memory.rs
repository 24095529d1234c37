//! A branch of a prompt run (the full model's generation, SPEED, a kept
//! prompt prefix) reads the prompt rows it keeps from the run's buffers and
//! allocates only the rows it computes itself, as many as
//! `Decoder::kv_bytes_branch_reserved` counts for the memory line: on full
//! layers and sliding ones, on every reference case. The run it branched
//! from goes on unchanged, and the branch holds what its policy keeps.

mod common;

use anyhow::{Result, ensure};
use common::{OracleModel, oracle_models};
use lcut_model::{Decoder, LogitRows};
use lcut_policy::{Policy, PolicySpec, TokenPhases};

fn resolve(model: &Decoder, text: &str, ids: usize, s: usize) -> Result<(Policy, TokenPhases)> {
    let policy = text
        .parse::<PolicySpec>()?
        .resolve(model.config().num_layers)?;
    let anchors = policy.anchor_len(None, s)?;
    Ok((policy, TokenPhases::new(ids, s, anchors)?))
}

#[test]
fn a_branch_allocates_the_rows_the_memory_line_counts() -> Result<()> {
    for OracleModel {
        name,
        model,
        ids,
        decode_start: s,
    } in oracle_models()?
    {
        let t = ids.len();
        let layers = model.config().num_layers;
        let (full, phases) = resolve(&model, "full", t, s)?;
        let mut run = model.new_sequence(full, phases)?;
        run.reserve(t);
        model.forward(&mut run, &ids[..s], LogitRows::None, None)?;
        let (run_held, run_allocated) = (run.kv_bytes_held(), run.kv_bytes_allocated());
        for text in ["full", "speed:2+bos", "speed:1"] {
            let (policy, phases) = resolve(&model, text, t, s)?;
            let mut branch = run.restricted(policy, phases)?;
            ensure!(
                branch.kv_bytes_allocated() == 0,
                "{name} {text}: a branch copied {} bytes of the prompt",
                branch.kv_bytes_allocated()
            );
            branch.reserve(t);
            for i in s..t {
                model.forward(&mut branch, &ids[i..i + 1], LogitRows::Last, None)?;
            }
            let rule = policy.visibility(phases);
            let counted = model.kv_bytes_branch_reserved(rule.as_ref(), (s, t), layers);
            ensure!(
                branch.kv_bytes_allocated() == counted,
                "{name} {text}: the branch allocated {} bytes, the memory line counts {counted}",
                branch.kv_bytes_allocated()
            );
            // what the policy holds is what it would hold alone
            let alone = model.kv_bytes_for(
                &policy,
                &lcut_policy::KvCost {
                    anchors: phases.anchor_len(),
                    prefill: phases.prefill_len(),
                    decode: t - s,
                },
            );
            let windowed = model.config().sliding_window.iter().any(Option::is_some);
            ensure!(
                windowed || branch.kv_bytes_held() == alone,
                "{name} {text}: holds {} bytes, the policy keeps {alone}",
                branch.kv_bytes_held()
            );
        }
        ensure!(
            (run.kv_bytes_held(), run.kv_bytes_allocated()) == (run_held, run_allocated),
            "{name}: the run changed under its branches"
        );
    }
    Ok(())
}
