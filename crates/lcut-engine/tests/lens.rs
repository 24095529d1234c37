//! The logit lens through the engine: a diagnostic trace records it at
//! every decode step (the fused step), `forward --lens` teacher-forces it,
//! and the two agree; `forward`'s lens equals transformers' on the
//! reference cases, with NaN where a policy keeps a position out of a
//! layer; `--save-lens-logits` writes each step's logits, which give the
//! trace's numbers; without the lens a trace has none.

mod common;

use anyhow::{Context, Result, ensure};
use lcut_engine::PreparedPrompt;
use lcut_engine::Session;
use lcut_engine::diagnose::{DiagnoseOptions, diagnose_prepared};
use lcut_engine::forward::{ForwardOptions, forward};
use lcut_model::{DType, Device};
use lcut_policy::PolicySpec;
use lcut_testkit::oracle_case;

const LENS_ONLY: ForwardOptions = ForwardOptions {
    residuals: false,
    attention: false,
    lens: true,
    routing: false,
};

use common::{ids, prompts};

/// log softmax(row)[at], in f64.
fn log_softmax_at(row: &[f32], at: usize) -> f32 {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    let sum: f64 = row.iter().map(|&x| f64::from(x - max).exp()).sum();
    (f64::from(row[at] - max) - sum.ln()) as f32
}

fn opts() -> DiagnoseOptions {
    DiagnoseOptions {
        max_new_tokens: 6,
        lens: true,
        ..DiagnoseOptions::default()
    }
}

/// A trace's lens (decoded step by step) is the teacher-forced lens of its
/// prompt and generated tokens, at the positions of its steps; its last
/// site ranks the generated token first.
#[test]
fn the_traced_lens_is_the_teacher_forced_lens() -> Result<()> {
    for case in ["llama-gqa", "gemma2-softcap", "phi3-fused"] {
        let session = Session::load(&oracle_case(case), DType::F32, &Device::Cpu)?;
        let report = diagnose_prepared(&session, &prompts(case)?, &opts(), &mut |_| true)?;
        let sites = session.model.config().num_layers + 1;
        for (lp, t) in prompts(case)?.iter().zip(&report.traces) {
            let lens = t.lens.as_ref().context("the trace has no lens")?;
            ensure!(lens.sites() == sites && lens.steps() == t.num_steps());
            let mut all = lp.prompt.ids.clone();
            all.extend(&t.generated_ids);
            let full = PreparedPrompt::from_ids(all, None)?;
            let forced = forward(&session.model, &full, &PolicySpec::full(), LENS_ONLY)?;
            let forced: Vec<Vec<f32>> = forced.lens_logprob.context("no lens")?.to_vec2()?;
            let n = t.num_steps();
            for k in 0..n {
                let q = t.query_positions[k];
                ensure!(
                    lens.top_ids[(sites - 1) * n + k] == t.generated_ids[k],
                    "{case} step {k}: the last site's top token is not the emitted one"
                );
                ensure!(lens.rank.view()[[sites - 1, k]] == 1.0);
                ensure!(lens.formation(k).is_some_and(|f| f < sites));
                for (i, row) in forced.iter().enumerate() {
                    let (a, b) = (lens.logprob.view()[[i, k]], row[q]);
                    ensure!(
                        (a - b).abs() <= 2e-5,
                        "{case} step {k} site {i}: decoded {a} against teacher-forced {b}"
                    );
                }
            }
        }
        ensure!(report.curves.lens_prob.len() == sites);
        ensure!(report.curves.formation().is_some());
    }
    Ok(())
}

/// `forward`'s lens equals transformers' log-probabilities on every
/// reference case, teacher-forced at full depth.
#[test]
fn forward_lens_equals_transformers() -> Result<()> {
    for case in lcut_testkit::ORACLE_CASES {
        let session = Session::load(&oracle_case(case), DType::F32, &Device::Cpu)?;
        let r = candle_core::safetensors::load(
            oracle_case(case).join("lens.safetensors"),
            &Device::Cpu,
        )?;
        let want: Vec<Vec<f32>> = r["logprob"].to_vec2()?;
        let prompt = PreparedPrompt::from_ids(ids(case)?, None)?;
        let got = forward(&session.model, &prompt, &PolicySpec::full(), LENS_ONLY)?;
        let got: Vec<Vec<f32>> = got.lens_logprob.context("no lens")?.to_vec2()?;
        ensure!(got.len() == want.len(), "{case}: {} sites", got.len());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            for (t, (a, b)) in g.iter().zip(w).enumerate() {
                ensure!(
                    (a - b).abs() <= 1e-4,
                    "{case} site {i} position {t}: {a} against transformers' {b}"
                );
            }
        }
    }
    Ok(())
}

/// Under SPEED the prompt's tokens leave above the cut: they have no lens
/// at all (they never reach the last layer); BoS and the decode phase have
/// one at every site.
#[test]
fn a_policy_leaves_the_prompt_without_a_lens() -> Result<()> {
    let session = Session::load(&oracle_case("llama-gqa"), DType::F32, &Device::Cpu)?;
    let s = 28;
    let prompt = PreparedPrompt::from_ids(ids("llama-gqa")?, Some(s))?;
    let spec: PolicySpec = "speed:3+bos".parse()?;
    let rec = forward(&session.model, &prompt, &spec, LENS_ONLY)?;
    let lens: Vec<Vec<f32>> = rec.lens_logprob.context("no lens")?.to_vec2()?;
    for row in &lens {
        ensure!(row[0].is_finite(), "BoS");
        ensure!(
            row[1..s].iter().all(|x| x.is_nan()),
            "the prompt above the cut"
        );
        ensure!(row[s..].iter().all(|x| x.is_finite()), "the decode phase");
    }
    Ok(())
}

/// `--save-lens-logits`: one tensor of [steps, sites, vocab] per prompt
/// whose log-softmax at each step's token is the trace's log-probability;
/// without `--lens` (the default) a run records none.
#[test]
fn saved_lens_logits_give_the_traced_lens() -> Result<()> {
    let session = Session::load(&oracle_case("qwen2-bias"), DType::F32, &Device::Cpu)?;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("lens-logits.safetensors");
    let opts = DiagnoseOptions {
        lens_logits: Some(path.clone()),
        ..opts()
    };
    let report = diagnose_prepared(&session, &prompts("qwen2-bias")?, &opts, &mut |_| true)?;
    let saved = candle_core::safetensors::load(&path, &Device::Cpu)?;
    let cfg = session.model.config();
    for t in &report.traces {
        let lens = t.lens.as_ref().context("lens")?;
        let z = &saved[&format!("prompt.{}.logits", t.index)];
        ensure!(z.dims() == [t.num_steps(), cfg.num_layers + 1, cfg.vocab_size]);
        let tokens: Vec<i64> = saved[&format!("prompt.{}.tokens", t.index)].to_vec1()?;
        let positions: Vec<i64> = saved[&format!("prompt.{}.positions", t.index)].to_vec1()?;
        ensure!(
            tokens
                .iter()
                .zip(&t.generated_ids)
                .all(|(a, &b)| *a == i64::from(b))
        );
        ensure!(
            positions
                .iter()
                .zip(&t.query_positions)
                .all(|(a, &b)| *a as usize == b)
        );
        let z: Vec<Vec<Vec<f32>>> = z.to_vec3()?;
        for (k, step) in z.iter().enumerate() {
            for (i, row) in step.iter().enumerate() {
                let want = lens.logprob.view()[[i, k]];
                let got = log_softmax_at(row, t.generated_ids[k] as usize);
                ensure!(
                    (got - want).abs() <= 1e-5,
                    "step {k} site {i}: {got} vs {want}"
                );
            }
        }
    }
    let without = DiagnoseOptions {
        max_new_tokens: 6,
        ..DiagnoseOptions::default()
    };
    let report = diagnose_prepared(&session, &prompts("qwen2-bias")?, &without, &mut |_| true)?;
    ensure!(report.traces.iter().all(|t| t.lens.is_none()));
    ensure!(report.curves.lens_prob.is_empty());
    Ok(())
}
