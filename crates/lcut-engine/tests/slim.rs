//! SlimInfer in the engine: generation costs equal the cost model, the
//! sweep's comparison axis measures quality, K/V and attention recall
//! honestly (full keeps everything, anchor-free SPEED nothing above its
//! cutoff), and pairs at equal held K/V hold what SPEED holds to within a
//! block per layer.

use anyhow::{Result, ensure};
use lcut_engine::diagnose::{AxisPolicy, LabelledPrompt, SweepOptions, equal_kv_pairs, sweep};
use lcut_engine::{Generation, GenerationConfig, GenerationOutput, PreparedPrompt, Session};
use lcut_model::{DType, Device};
use lcut_policy::{PolicySpec, SlimOptions};
use lcut_testkit::oracle_case;
use lcut_trace::Thresholds;

fn session() -> Result<Session> {
    Ok(Session::load(
        &oracle_case("llama-gqa"),
        DType::F32,
        &Device::Cpu,
    )?)
}

/// Raw prompts cut from the reference ids at several lengths.
fn prompts(session: &Session) -> Result<Vec<LabelledPrompt>> {
    let r = candle_core::safetensors::load(
        oracle_case("llama-gqa").join("reference.safetensors"),
        &Device::Cpu,
    )?;
    let ids: Vec<u32> = r["input_ids"].to_dtype(DType::U32)?.to_vec1()?;
    let vocab = session.model.config().vocab_size as u32;
    [40usize, 33, 27]
        .iter()
        .enumerate()
        .map(|(index, &len)| {
            let ids: Vec<u32> = ids[..len].iter().map(|&t| t % vocab).collect();
            Ok(LabelledPrompt {
                index,
                id: format!("p{len}"),
                prompt: PreparedPrompt::from_ids(ids, None)?,
            })
        })
        .collect()
}

fn generate(session: &Session, prompt: &PreparedPrompt, policy: &str) -> Result<GenerationOutput> {
    let layers = session.model.config().num_layers;
    let policy = policy.parse::<PolicySpec>()?.resolve(layers)?;
    let config = GenerationConfig {
        max_new_tokens: 6,
        prefill_chunk: 7,
        ..GenerationConfig::default()
    };
    Ok(Generation::new(&session.model, prompt.clone(), policy, config)?.run(|_| true)?)
}

#[test]
fn a_slim_generation_holds_what_the_cost_model_says_and_reports_its_decisions() -> Result<()> {
    let session = session()?;
    for p in prompts(&session)? {
        let out = generate(
            &session,
            &p.prompt,
            "slim:2@50%,4@25%+block:4+unit:2+swap:1",
        )?;
        ensure!(
            out.kv_bytes_held == out.kv_bytes_formula,
            "{}: held vs formula",
            p.id
        );
        ensure!(out.kv_bytes_resident <= out.kv_bytes_held);
        ensure!(out.kv_bytes_held < out.kv_bytes_full);
        let trace = out.slim.as_ref().expect("a SlimInfer trace");
        ensure!(trace.cuts.len() == 2 && trace.cuts[1].kept_tokens <= trace.cuts[0].kept_tokens);
        ensure!(
            trace.steps.len() == out.tokens.len() - 1,
            "one record per decode step"
        );
        // the JSON a user saves reads back whole
        let back: GenerationOutput = serde_json::from_str(&serde_json::to_string(&out)?)?;
        ensure!(back == out);
        let speed = generate(&session, &p.prompt, "speed:2+bos")?;
        ensure!(speed.slim.is_none() && speed.kv_bytes_resident == speed.kv_bytes_held);
    }
    Ok(())
}

#[test]
fn pairs_at_equal_held_kv_hold_the_same_to_within_a_block_per_layer() -> Result<()> {
    let session = session()?;
    let layers = session.model.config().num_layers;
    let b = session.model.kv_shape().bytes_per_token_layer() as i64;
    let block = 4;
    let options = SlimOptions {
        block,
        unit: 2,
        ..SlimOptions::default()
    };
    let first_cut = 2;
    let pairs = equal_kv_pairs(layers, &[3, 4, 5], first_cut, options)?;
    ensure!(pairs.len() == 6);
    for p in prompts(&session)? {
        for pair in pairs.chunks(2) {
            let speed = generate(&session, &p.prompt, &pair[0].spec.to_string())?;
            let slim = generate(&session, &p.prompt, &pair[1].spec.to_string())?;
            let bound = b * ((layers - first_cut) * block + layers) as i64;
            let gap = slim.kv_bytes_held as i64 - speed.kv_bytes_held as i64;
            ensure!(
                gap.abs() <= bound,
                "{}: {} holds {} bytes, {} {} (bound {bound})",
                p.id,
                pair[1].spec,
                slim.kv_bytes_held,
                pair[0].spec,
                speed.kv_bytes_held
            );
        }
    }
    Ok(())
}

#[test]
fn the_sweeps_policy_axis_measures_quality_costs_and_attention_recall() -> Result<()> {
    let session = session()?;
    let prompts = prompts(&session)?;
    let axis: Vec<AxisPolicy> = ["full", "speed:2", "slim:2@50%+block:4+unit:2"]
        .iter()
        .map(|t| {
            Ok(AxisPolicy {
                spec: t.parse()?,
                paired_with: None,
            })
        })
        .collect::<Result<_>>()?;
    let opts = SweepOptions {
        cuts: Some(vec![2, 6]),
        context_len: 1024,
        max_new_tokens: 5,
        axis,
        ..SweepOptions::default()
    };
    let result = sweep(
        &session,
        &prompts,
        &opts,
        &Thresholds::default(),
        &mut |_| true,
    )?;
    let [full, speed, slim] = &result.policies[..] else {
        anyhow::bail!("{} axis points", result.policies.len());
    };
    ensure!(
        full.top1_agreement == 1.0 && full.mean_kl < 1e-6,
        "{full:?}"
    );
    ensure!(full.kv_ratio == 1.0 && full.resident_ratio == 1.0 && full.prefill_ratio == 1.0);
    ensure!(full.attention_recall.iter().all(|&r| r == 1.0), "{full:?}");
    let layers = session.model.config().num_layers;
    ensure!(speed.attention_recall.len() == layers);
    for (l, &r) in speed.attention_recall.iter().enumerate() {
        let expected = if l < 2 { 1.0 } else { 0.0 };
        ensure!(r == expected, "anchor-free SPEED recall {r} at layer {l}");
    }
    ensure!(
        slim.kv_ratio < 1.0 && slim.resident_ratio <= slim.kv_ratio,
        "{slim:?}"
    );
    ensure!(slim.attention_recall[..2].iter().all(|&r| r == 1.0));
    ensure!(
        slim.attention_recall[2..]
            .iter()
            .all(|&r| (0.0..1.0).contains(&r)),
        "{slim:?}"
    );
    // the SPEED points of the sweep itself are unchanged by the axis
    ensure!(result.points.len() == 2 && result.points[1].top1_agreement == 1.0);
    Ok(())
}
