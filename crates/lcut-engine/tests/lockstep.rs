//! The engine's one lockstep run of several policies (what `lcut generate
//! --compare` and the viewer's live run use): each policy's tokens and
//! figures as if it ran alone, agreement and KL against the first policy,
//! prompt progress chunk by chunk, and a cancel from the callback.

use anyhow::{Result, ensure};
use lcut_engine::{
    Comparison, Generation, GenerationConfig, LockstepEvent, PreparedPrompt, StopReason, compare,
};
use lcut_model::{DType, Decoder, Device};
use lcut_policy::{Policy, PolicySpec};
use lcut_testkit::oracle_case;

fn setup() -> Result<(Decoder, PreparedPrompt, Vec<Policy>)> {
    let model = Decoder::load(&oracle_case("llama-gqa"), DType::F32, &Device::Cpu)?;
    let layers = model.config().num_layers;
    let ids: Vec<u32> = (1..40).map(|i| (i * 7 % 90) + 3).collect();
    let prompt = PreparedPrompt::from_ids(ids, Some(30))?;
    let policies = ["full", "speed:1+bos", "full"]
        .iter()
        .map(|p| Ok(p.parse::<PolicySpec>()?.resolve(layers)?))
        .collect::<Result<Vec<_>>>()?;
    Ok((model, prompt, policies))
}

fn config() -> GenerationConfig {
    GenerationConfig {
        max_new_tokens: 8,
        prefill_chunk: 8,
        ..GenerationConfig::default()
    }
}

#[test]
fn each_policy_runs_as_if_alone_and_is_compared_with_the_first() -> Result<()> {
    let (model, prompt, policies) = setup()?;
    let mut prefill = Vec::new();
    let cmp: Comparison = compare(&model, &prompt, &policies, &config(), |e| {
        if let LockstepEvent::Prefill { lane, progress } = e {
            prefill.push((lane, progress.done, progress.total));
        }
        true
    })?;
    ensure!(!cmp.cancelled());
    ensure!(cmp.outputs.len() == 3 && cmp.steps.len() == 8);
    for (policy, out) in policies.iter().zip(&cmp.outputs) {
        let alone = Generation::new(&model, prompt.clone(), *policy, config())?.run(|_| true)?;
        ensure!(
            out.tokens == alone.tokens,
            "{policy}: lockstep changed tokens"
        );
        ensure!(out.kv_bytes_held == alone.kv_bytes_held);
        ensure!(out.policy == policy.to_string());
        ensure!(out.timing.ttft_s > 0.0 && out.timing.tpot_s > 0.0);
    }
    for (k, s) in cmp.steps.iter().enumerate() {
        ensure!(s.index == k);
        let tokens: Vec<Option<u32>> = cmp.outputs.iter().map(|o| Some(o.tokens[k])).collect();
        ensure!(s.tokens == tokens);
        ensure!(s.agree[0] && s.kl[0].is_none());
        ensure!(s.agree[1] == (tokens[0] == tokens[1]));
        // the same policy twice: same tokens, KL zero at every step
        ensure!(s.agree[2] && s.kl[2].is_some_and(|kl| kl.abs() < 1e-6));
    }
    // SPEED's KL is given until its first disagreement, not after
    let first_miss = cmp.steps.iter().position(|s| !s.agree[1]);
    for s in &cmp.steps {
        let before = first_miss.is_none_or(|m| s.index <= m);
        ensure!(
            s.kl[1].is_some() == before,
            "step {}: {:?}",
            s.index,
            s.kl[1]
        );
    }
    // every lane's prompt: announced at 0, then one event per chunk, in order
    let total = prompt.len();
    let per_lane: Vec<(usize, usize, usize)> = [0, 8, 16, 24, 30, 38, 39]
        .iter()
        .map(|&d| (0, d, total))
        .collect();
    ensure!(prefill[..per_lane.len()] == per_lane[..], "{prefill:?}");
    ensure!(prefill.len() == 3 * per_lane.len());
    ensure!(prefill.last() == Some(&(2, total, total)));
    Ok(())
}

#[test]
fn the_callback_cancels_in_the_prompt_or_between_steps() -> Result<()> {
    let (model, prompt, policies) = setup()?;
    let mut events = 0;
    let cmp = compare(&model, &prompt, &policies, &config(), |e| {
        events += 1;
        !matches!(e, LockstepEvent::Prefill { lane: 1, progress } if progress.done > 0)
    })?;
    ensure!(cmp.cancelled() && cmp.steps.is_empty());
    ensure!(cmp.outputs.iter().all(|o| o.tokens.is_empty()));
    ensure!(events == 7 + 2, "{events} events");
    let cmp = compare(
        &model,
        &prompt,
        &policies,
        &config(),
        |e| !matches!(e, LockstepEvent::Step { step, .. } if step.index == 2),
    )?;
    ensure!(cmp.steps.len() == 3);
    for out in &cmp.outputs {
        ensure!(out.tokens.len() == 3 && out.stop == StopReason::Cancelled);
    }
    Ok(())
}
