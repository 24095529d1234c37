//! The logit lens of the real model, SmolLM2-135M-Instruct (fetched by
//! `scripts/fetch-model.sh`), against transformers' on the same GGUF
//! dequantized to f32 (`fixtures/real/smollm2/lens.safetensors`, made by
//! `fixtures/oracle/lens_reference.py smollm2`): the lens a diagnostic
//! trace records at each decode step (one token per fused step) against
//! transformers' teacher-forced lens of the same tokens, and `forward`'s
//! teacher-forced lens over a whole chat case. In CI a missing model fails.

use std::collections::HashMap;

use anyhow::{Context, Result, ensure};
use lcut_engine::diagnose::{DiagnoseOptions, LabelledPrompt, trace_prompt};
use lcut_engine::forward::{ForwardOptions, forward};
use lcut_engine::{PreparedPrompt, Session};
use lcut_model::{DType, Device, Tensor};
use lcut_policy::PolicySpec;
use lcut_testkit::{real_model, real_reference};
use serde_json::Value;

/// Largest |difference| in a log-probability or KL against transformers:
/// both dequantize the same Q4_1 weights to f32, and the logits agree to
/// about 1e-4 over 30 layers.
const TOL: f32 = 1e-3;

struct Case {
    name: String,
    ids: Vec<u32>,
    prompt_len: usize,
    decode_start: usize,
}

fn cases() -> Result<(Vec<Case>, HashMap<String, Tensor>)> {
    let dir = real_reference();
    let meta: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("case.json"))?)?;
    let lens = candle_core::safetensors::load(dir.join("lens.safetensors"), &Device::Cpu)?;
    let refs = candle_core::safetensors::load(dir.join("reference.safetensors"), &Device::Cpu)?;
    let mut out = Vec::new();
    for c in meta["cases"].as_array().context("cases")? {
        let name = c["name"].as_str().context("name")?.to_string();
        out.push(Case {
            ids: refs[&format!("{name}.input_ids")]
                .to_dtype(DType::U32)?
                .to_vec1()?,
            prompt_len: c["prompt_len"].as_u64().context("prompt_len")? as usize,
            decode_start: c["decode_start"].as_u64().context("decode_start")? as usize,
            name,
        });
    }
    Ok((out, lens))
}

fn f32_rows(t: &HashMap<String, Tensor>, key: &str) -> Result<Vec<Vec<f32>>> {
    Ok(t.get(key).context(key.to_string())?.to_vec2()?)
}

fn i64_rows(t: &HashMap<String, Tensor>, key: &str) -> Result<Vec<Vec<i64>>> {
    Ok(t.get(key)
        .context(key.to_string())?
        .to_dtype(DType::I64)?
        .to_vec2()?)
}

/// Greedy decoding with the diagnostic probe records, at every step and
/// hidden state, transformers' lens of the same token: log-probability and
/// KL within `TOL`, the rank within transformers' near-tie interval, the
/// top token where its margin is clear. Steps stop at the model's EoS, as
/// diagnose does; the reference's greedy tokens are the emitted ones.
#[test]
fn the_traced_lens_equals_transformers() -> Result<()> {
    let Some(path) = real_model() else {
        return Ok(());
    };
    let session = Session::load(&path, DType::F32, &Device::Cpu)?;
    let (cases, lens) = cases()?;
    let opts = DiagnoseOptions {
        max_new_tokens: 16,
        lens: true,
        ..DiagnoseOptions::default()
    };
    let stops = session.stop_tokens();
    let (mut worst_lp, mut worst_kl, mut steps) = (0f32, 0f32, 0);
    for c in &cases {
        let lp = LabelledPrompt {
            index: 0,
            id: c.name.clone(),
            prompt: PreparedPrompt::from_ids(c.ids[..c.prompt_len].to_vec(), Some(c.decode_start))?,
        };
        let strings = |ids: &[u32]| ids.iter().map(u32::to_string).collect();
        let trace = trace_prompt(&session.model, &lp, &opts, &stops, &strings, &mut |_| true)?;
        let ours = trace.lens.as_ref().context("no lens")?;
        let key = |k: &str| format!("{}.lens.{k}", c.name);
        let (logprob, kl, margin) = (
            f32_rows(&lens, &key("logprob"))?,
            f32_rows(&lens, &key("kl"))?,
            f32_rows(&lens, &key("margin"))?,
        );
        let (lo, hi, top1) = (
            i64_rows(&lens, &key("rank_lo"))?,
            i64_rows(&lens, &key("rank_hi"))?,
            i64_rows(&lens, &key("top1"))?,
        );
        let n = trace.num_steps();
        ensure!(n >= 9, "{}: {n} steps", c.name);
        ensure!(
            trace.generated_ids == c.ids[c.prompt_len..c.prompt_len + n],
            "{}: the greedy tokens differ from transformers'",
            c.name
        );
        for k in 0..n {
            let t = c.prompt_len - 1 + k;
            for i in 0..ours.sites() {
                worst_lp = worst_lp.max((ours.logprob.view()[[i, k]] - logprob[i][t]).abs());
                worst_kl = worst_kl.max((ours.kl.view()[[i, k]] - kl[i][t]).abs());
                let rank = ours.rank.view()[[i, k]] as i64;
                ensure!(
                    lo[i][t] <= rank && rank <= hi[i][t],
                    "{} step {k} site {i}: rank {rank} outside [{}, {}]",
                    c.name,
                    lo[i][t],
                    hi[i][t]
                );
                if margin[i][t] > 4e-3 {
                    ensure!(
                        i64::from(ours.top_ids[i * n + k]) == top1[i][t],
                        "{} step {k} site {i}: top token",
                        c.name
                    );
                }
            }
            steps += 1;
        }
    }
    eprintln!(
        "{steps} steps: |log-probability difference| <= {worst_lp:e}, |KL difference| <= {worst_kl:e}"
    );
    ensure!(worst_lp <= TOL && worst_kl <= TOL);
    Ok(())
}

/// `forward --lens` over the `copy` case's prompt and answer: every
/// position's lens log-probability against transformers'.
#[test]
fn forward_lens_equals_transformers() -> Result<()> {
    let Some(path) = real_model() else {
        return Ok(());
    };
    let session = Session::load(&path, DType::F32, &Device::Cpu)?;
    let (cases, lens) = cases()?;
    let c = cases
        .iter()
        .find(|c| c.name == "copy")
        .context("copy case")?;
    let opts = ForwardOptions {
        residuals: false,
        attention: false,
        lens: true,
        routing: false,
    };
    let prompt = PreparedPrompt::from_ids(c.ids.clone(), None)?;
    let got = forward(&session.model, &prompt, &PolicySpec::full(), opts)?;
    let got: Vec<Vec<f32>> = got.lens_logprob.context("no lens")?.to_vec2()?;
    let want = f32_rows(&lens, "copy.lens.logprob")?;
    let mut worst = 0f32;
    for (g, w) in got.iter().zip(&want) {
        for (a, b) in g.iter().zip(w) {
            worst = worst.max((a - b).abs());
        }
    }
    eprintln!("copy: |lens log-probability difference| <= {worst:e}");
    ensure!(worst <= TOL, "{worst}");
    Ok(())
}
