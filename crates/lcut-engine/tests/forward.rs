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
    routing: false,
};
const EVERYTHING: ForwardOptions = ForwardOptions {
    residuals: true,
    attention: true,
    lens: true,
    routing: true,
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

/// The policy of a case.json entry, as lcut reads policies.
fn policy_of(entry: &serde_json::Value) -> Result<(String, usize, String)> {
    let kind = match entry["self_only"].as_bool() {
        Some(true) => "selfonly",
        _ => "speed",
    };
    let anchors = match entry["anchors"].as_array().map(Vec::len) {
        Some(0) => "",
        _ => "+bos",
    };
    let cut = entry["l_cut"].as_u64().unwrap_or(0);
    let s = entry["decode_start"].as_u64().unwrap_or(0) as usize;
    let key = entry["key"]
        .as_str()
        .unwrap_or("")
        .trim_start_matches("logits.");
    Ok((format!("{kind}:{cut}{anchors}"), s, key.to_string()))
}

/// A mixture's routing as `forward` records it (what `lcut forward` writes
/// and `Session.forward` returns), against transformers' on every routed
/// reference case: every token's router probabilities (within 1e-5), its
/// experts and their weights at full depth, and under every listed
/// SPEED/SelfOnly policy the decode tokens' routing, the prompt tokens
/// kept out of a layer having none there.
#[test]
fn every_tokens_routing_matches_transformers() -> Result<()> {
    for case in lcut_testkit::ROUTED_CASES {
        let dir = oracle(case);
        let model = Decoder::load(&dir, DType::F32, &Device::Cpu)?;
        let reference =
            candle_core::safetensors::load(dir.join("reference.safetensors"), &Device::Cpu)?;
        let spec: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("case.json"))?)?;
        let ids = ids(case)?;
        let t = ids.len();
        let check = |r: &lcut_model::probes::RoutingRecord, prefix: &str, from: usize| {
            for (i, &layer) in r.layers.iter().enumerate() {
                let (probs, experts, weights) = r.layer_rows(i, from..t);
                let want_probs: Vec<f32> = reference[&format!("{prefix}{layer}.probs")]
                    .flatten_all()?
                    .to_vec1()?;
                let want_experts: Vec<i64> = reference[&format!("{prefix}{layer}.experts")]
                    .flatten_all()?
                    .to_vec1()?;
                let worst = probs
                    .iter()
                    .zip(&want_probs)
                    .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
                ensure!(
                    probs.len() == want_probs.len() && worst <= 1e-5,
                    "{case} {prefix}{layer}: probabilities differ by {worst:e}"
                );
                ensure!(
                    experts == want_experts,
                    "{case} {prefix}{layer}: experts differ"
                );
                if let Some(w) = reference.get(&format!("{prefix}{layer}.weights")) {
                    let want: Vec<f32> = w.flatten_all()?.to_vec1()?;
                    let worst = weights
                        .iter()
                        .zip(&want)
                        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
                    ensure!(
                        worst <= 1e-5,
                        "{case} {prefix}{layer}: weights differ by {worst:e}"
                    );
                }
            }
            Ok::<_, anyhow::Error>(())
        };
        let full = PreparedPrompt::from_ids(ids.clone(), Some(t - 1))?;
        let r = forward(&model, &full, &PolicySpec::full(), ROUTING)?;
        let routing = r
            .routing
            .ok_or_else(|| anyhow::anyhow!("{case}: no routing"))?;
        ensure!(!routing.layers.is_empty() && routing.tokens == t);
        check(&routing, "router.", 0)?;
        for entry in spec["policies"].as_array().into_iter().flatten() {
            let (policy, s, key) = policy_of(entry)?;
            let prompt = PreparedPrompt::from_ids(ids.clone(), Some(s))?;
            let r = forward(&model, &prompt, &policy.parse()?, ROUTING)?;
            let routing = r
                .routing
                .ok_or_else(|| anyhow::anyhow!("{case}: no routing"))?;
            check(&routing, &format!("router.{key}."), s)?;
            // the prompt's tokens between BoS and the decode start reach
            // only the layers below the cut
            let cut = entry["l_cut"].as_u64().unwrap_or(0) as usize;
            for (i, &layer) in routing.layers.iter().enumerate() {
                let (_, experts, _) = routing.layer_rows(i, 1..s);
                let absent = experts.iter().filter(|&&x| x < 0).count();
                let want = if layer < cut { 0 } else { experts.len() };
                ensure!(
                    absent == want,
                    "{case} {policy} layer {layer}: {absent} of the prompt's rows absent"
                );
            }
        }
    }
    // a dense model has none
    let model = Decoder::load(&oracle("llama-gqa"), DType::F32, &Device::Cpu)?;
    let prompt = PreparedPrompt::from_ids(ids("llama-gqa")?, None)?;
    ensure!(
        forward(&model, &prompt, &PolicySpec::full(), ROUTING)?
            .routing
            .is_none()
    );
    Ok(())
}

const ROUTING: ForwardOptions = ForwardOptions {
    residuals: false,
    attention: false,
    lens: false,
    routing: true,
};
