//! Causal prompt knockout through `diagnose`: per band of layers, the
//! curve a run records (one full prefill per prompt, each band's decode
//! tokens in one pass on the prefix restricted to what it keeps) is what
//! the sweep's comparison axis measures for the same `knockout:l` /
//! `band:a..b` policies on an independent path (each prefilled afresh,
//! decoded token by token), also on Qwen3.5's linear layers (the bands
//! themselves are held to transformers in `lcut-model`'s `oracle_parity`);
//! a band the model cannot hold is refused before any work.

mod common;

use anyhow::{Context, Result, ensure};
use lcut_engine::Session;
use lcut_engine::diagnose::{
    AxisPolicy, DiagnoseOptions, SweepOptions, diagnose_prepared, knockout_policies, sweep,
};
use lcut_model::{DType, Device};
use lcut_testkit::{QWEN35_CASE, oracle_case};
use lcut_trace::Thresholds;

const NEW_TOKENS: usize = 6;

use common::{prompts, prompts_from};

#[test]
fn the_knockout_curve_is_what_the_sweep_measures_for_each_band() -> Result<()> {
    // Qwen3.5's bands cross linear and attention layers
    let ids: Vec<u32> = (1..21).collect();
    for case in ["llama-gqa", "gemma2-softcap", QWEN35_CASE] {
        let session = Session::load(&oracle_case(case), DType::F32, &Device::Cpu)?;
        let l = session.model.config().num_layers;
        let prompts = match case {
            QWEN35_CASE => prompts_from(&ids, &[12, 20])?,
            _ => prompts(case)?,
        };
        for band in [1, 2] {
            let opts = DiagnoseOptions {
                max_new_tokens: NEW_TOKENS,
                knockout: Some(band),
                ..DiagnoseOptions::default()
            };
            let report = diagnose_prepared(&session, &prompts, &opts, &mut |_| true)?;
            let starts = l - band + 1;
            for t in &report.traces {
                let k = t.knockout.as_ref().context("the trace has no knockout")?;
                ensure!(k.band == band && k.kl_sum.len() == starts && k.agree.len() == starts);
                // scored on the full model's own continuation: the traced tokens
                ensure!(
                    k.tokens == t.num_steps(),
                    "{} vs {}",
                    k.tokens,
                    t.num_steps()
                );
            }
            let (kl, top1) = (&report.curves.knockout_kl, &report.curves.knockout_top1);
            ensure!(kl.len() == l && top1.len() == l);
            ensure!((0..l).all(|a| kl[a].is_finite() == (a < starts)), "{kl:?}");
            ensure!(
                kl.iter().any(|&x| x > 1e-3),
                "{case}: hiding the prompt moves nothing: {kl:?}"
            );
            let axis = knockout_policies(l, band)?
                .iter()
                .map(|p| {
                    Ok(AxisPolicy {
                        spec: p.to_string().parse()?,
                        paired_with: None,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            let sweep_opts = SweepOptions {
                cuts: Some(vec![l]),
                max_new_tokens: NEW_TOKENS,
                axis,
                ..SweepOptions::default()
            };
            let swept = sweep(
                &session,
                &prompts,
                &sweep_opts,
                &Thresholds::default(),
                &mut |_| true,
            )?;
            ensure!(swept.policies.len() == starts);
            for (a, p) in swept.policies.iter().enumerate() {
                let tokens = p.counts.as_ref().context("no counts")?.tokens as f32;
                ensure!(
                    (kl[a] - p.mean_kl).abs() <= 1e-4 + 1e-3 * p.mean_kl.abs(),
                    "{case} {}: knockout KL {} against the sweep's {}",
                    p.policy,
                    kl[a],
                    p.mean_kl
                );
                // a near tie may tip one token between the two paths, no more
                ensure!(
                    (top1[a] - p.top1_agreement).abs() <= 1.0 / tokens + 1e-6,
                    "{case} {}: top-1 {} against the sweep's {}",
                    p.policy,
                    top1[a],
                    p.top1_agreement
                );
            }
        }
    }
    Ok(())
}

#[test]
fn a_band_the_model_cannot_hold_is_refused_before_any_work() -> Result<()> {
    let case = "llama-gqa";
    let session = Session::load(&oracle_case(case), DType::F32, &Device::Cpu)?;
    let l = session.model.config().num_layers;
    for band in [0, l + 1] {
        let opts = DiagnoseOptions {
            max_new_tokens: NEW_TOKENS,
            knockout: Some(band),
            ..DiagnoseOptions::default()
        };
        let mut events = 0;
        let err = diagnose_prepared(&session, &prompts(case)?, &opts, &mut |_| {
            events += 1;
            true
        })
        .err()
        .with_context(|| format!("a band of {band} layers was accepted"))?;
        let text = err.to_string();
        ensure!(
            text.contains(&format!("a knockout band of {band} layers"))
                && text.contains(&format!("the model has {l} layers")),
            "{text}"
        );
        ensure!(events == 0, "{events} events before the error");
    }
    // the widest band hides the prompt from every layer: one entry
    let all = knockout_policies(l, l)?;
    ensure!(all.len() == 1 && all[0].to_string() == format!("band:0..{}", l - 1));
    Ok(())
}
