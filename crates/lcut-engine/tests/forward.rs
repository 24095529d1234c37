//! `lcut_engine::forward`: the logits do not depend on what is recorded
//! (within 1e-5 of the largest logit, on a sliding-window model where
//! recording attention under a policy changes how keys are read: a chunk
//! whose attention rows are recorded takes the tensor path, the others
//! lcut's chunk attention kernel, which sums in another order), and the
//! records under a policy say which tokens exist at which layer.

use anyhow::{Result, ensure};
use lcut_engine::PreparedPrompt;
use lcut_engine::forward::{ForwardOptions, forward};
use lcut_model::{DType, Decoder, Device};
use lcut_policy::PolicySpec;
use lcut_testkit::oracle_case as oracle;

fn ids(name: &str) -> Result<Vec<u32>> {
    let r =
        candle_core::safetensors::load(oracle(name).join("reference.safetensors"), &Device::Cpu)?;
    Ok(r["input_ids"].to_dtype(DType::U32)?.to_vec1()?)
}

const NOTHING: ForwardOptions = ForwardOptions {
    residuals: false,
    attention: false,
    lens: false,
};
const EVERYTHING: ForwardOptions = ForwardOptions {
    residuals: true,
    attention: true,
    lens: true,
};

#[test]
fn logits_are_the_same_whatever_is_recorded() -> Result<()> {
    for case in ["mistral-window", "gemma2-softcap", "llama-gqa"] {
        let model = Decoder::load(&oracle(case), DType::F32, &Device::Cpu)?;
        let prompt = PreparedPrompt::from_ids(ids(case)?, Some(28))?;
        for policy in ["full", "speed:3+bos", "selfonly:2+bos", "speed:1"] {
            let spec: PolicySpec = policy.parse()?;
            let plain = forward(&model, &prompt, &spec, NOTHING)?;
            let all = forward(&model, &prompt, &spec, EVERYTHING)?;
            let a: Vec<Vec<f32>> = plain.logits.to_vec2()?;
            let b: Vec<Vec<f32>> = all.logits.to_vec2()?;
            let largest = a.iter().flatten().fold(0f32, |m, x| m.max(x.abs()));
            let moved = a
                .iter()
                .flatten()
                .zip(b.iter().flatten())
                .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            ensure!(
                a.len() == b.len() && moved <= 1e-5 * largest,
                "{case} {policy}: recording moved the logits by {moved} (largest {largest})"
            );
            ensure!(plain.layer_out.is_empty() && plain.attention.is_empty());
            let layers = model.config().num_layers;
            ensure!(all.layer_out.len() == layers && all.attention.len() == layers);
            let rows = if policy == "full" { 40 } else { 12 };
            ensure!(a.len() == rows, "{case} {policy}: {} rows", a.len());
        }
    }
    Ok(())
}

#[test]
fn records_under_a_policy_leave_absent_tokens_out() -> Result<()> {
    let model = Decoder::load(&oracle("llama-gqa"), DType::F32, &Device::Cpu)?;
    let prompt = PreparedPrompt::from_ids(ids("llama-gqa")?, Some(28))?;
    let spec: PolicySpec = "speed:2+bos".parse()?;
    let r = forward(&model, &prompt, &spec, EVERYTHING)?;
    for (layer, out) in r.layer_out.iter().enumerate() {
        let rows: Vec<Vec<f32>> = out.to_vec2()?;
        for (pos, row) in rows.iter().enumerate() {
            let exists = layer < 2 || pos == 0 || pos >= 28;
            ensure!(
                row.iter().all(|x| x.is_finite() == exists),
                "layer {layer}, position {pos}: exists {exists}"
            );
        }
        let attn: Vec<Vec<Vec<f32>>> = r.attention[layer].to_vec3()?;
        for head in attn {
            for (q, row) in head.iter().enumerate().skip(28) {
                let sum: f32 = row.iter().sum();
                ensure!((sum - 1.0).abs() < 1e-5, "row of query {q} sums to {sum}");
                if layer >= 2 {
                    ensure!(row[1..28].iter().all(|&p| p == 0.0));
                }
            }
        }
    }
    Ok(())
}
