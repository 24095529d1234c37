//! A policy's pass started above the layers it runs as the full model does
//! (`Decoder::forward_above`, what the sweep's and the knockouts'
//! teacher-forced runs of every cutoff do): from the states the full
//! model's pass over the same tokens recorded entering that layer, the
//! logits must be the bits of the policy's own whole pass, on every
//! reference case (dense, mixture-of-experts, Qwen3.5's linear layers,
//! sliding windows, Gemma 4's per-layer inputs and layers that read a lower
//! layer's K/V), in f32, with the quantized products of Q8_0 files and on
//! the real SmolLM2 file; and a start the policy does not allow, or one
//! the full run did not record the states for, is refused, not run.

mod common;

use anyhow::{Context, Result, ensure};
use common::{OracleModel, models_of};
use lcut_model::probes::PromptRecord;
use lcut_model::{Decoder, Device, LogitRows, ModelError, Sequence, Tensor, WeightMode};
use lcut_policy::{Policy, PolicySpec, TokenPhases};
use lcut_testkit::{
    GEMMA4_CASE, GEMMA4MOE_CASE, GEMMA4WIDE_CASE, MOE_CASES, ORACLE_CASES, QWEN35_CASE,
    oracle_case, oracle_ids, real_model,
};

/// The full model's state after `ids[..s]` (the prompt up to its decode
/// start), its logits over `ids[s..]` and the states that pass recorded
/// entering every layer.
fn full_run(model: &Decoder, ids: &[u32], s: usize) -> Result<(Sequence, Tensor, PromptRecord)> {
    let layers = model.config().num_layers;
    let phases = TokenPhases::new(ids.len(), s, 0)?;
    let mut prefix = model.new_sequence(Policy::full(layers), phases)?;
    model.forward(&mut prefix, &ids[..s], LogitRows::None, None)?;
    let mut record = PromptRecord::entering(0..=layers);
    let mut full = prefix.fork()?;
    let out = model.forward(&mut full, &ids[s..], LogitRows::All, Some(&mut record))?;
    Ok((prefix, out.logits.context("rows asked for")?, record))
}

/// Every policy that reuses the full prefill a sweep or a knockout runs on
/// `model`: SPEED at every cut with and without BoS, SelfOnly, and
/// knockout bands.
fn policies(model: &Decoder) -> Vec<String> {
    let layers = model.config().num_layers;
    let mut specs = Vec::new();
    for c in 1..=layers {
        specs.push(format!("speed:{c}+bos"));
        specs.push(format!("speed:{c}"));
    }
    specs.push(format!("selfonly:{}", layers / 2));
    specs.push("knockout:0".into());
    specs.push(format!("band:1..{}", layers - 1));
    specs
}

/// `spec`'s logits over `ids[s..]` both ways: its whole pass from the
/// restricted prefix, and the pass started above its shared layers.
fn both_ways(
    model: &Decoder,
    (prefix, record): (&Sequence, &PromptRecord),
    ids: &[u32],
    s: usize,
    spec: &str,
) -> Result<(Tensor, Tensor)> {
    let policy = spec
        .parse::<PolicySpec>()?
        .resolve(model.config().num_layers)?;
    let phases = TokenPhases::new(ids.len(), s, policy.anchor_len(None, s)?)?;
    let mut whole = prefix.restricted(policy, phases)?;
    let whole = model.forward(&mut whole, &ids[s..], LogitRows::All, None)?;
    let from = policy.full_depth_below();
    let seq = prefix.restricted(policy, phases)?;
    let above = model.forward_above(seq, &ids[s..], from, record, LogitRows::All, None)?;
    let rows = |logits: Option<Tensor>| logits.context("rows asked for");
    Ok((rows(whole.logits)?, rows(above.logits)?))
}

/// The same bits, row by row.
fn same_bits(a: &Tensor, b: &Tensor) -> Result<bool> {
    let (a, b) = (a.to_vec2::<f32>()?, b.to_vec2::<f32>()?);
    Ok(a.len() == b.len()
        && a.iter().zip(&b).all(|(x, y)| {
            x.iter()
                .map(|v| v.to_bits())
                .eq(y.iter().map(|v| v.to_bits()))
        }))
}

/// Every policy of [`policies`] on `model`, both ways; the full model's
/// own rows at full depth.
fn check_model(name: &str, model: &Decoder, ids: &[u32], s: usize) -> Result<()> {
    let layers = model.config().num_layers;
    let (prefix, full, record) = full_run(model, ids, s)?;
    for spec in policies(model) {
        let (whole, above) = both_ways(model, (&prefix, &record), ids, s, &spec)?;
        ensure!(
            same_bits(&whole, &above)?,
            "{name}, {spec}: started above its shared layers, the logits differ from its whole pass"
        );
        if spec == format!("speed:{layers}+bos") {
            ensure!(
                same_bits(&above, &full)?,
                "{name}: a cut at full depth is not the full model"
            );
        }
    }
    Ok(())
}

#[test]
fn a_pass_started_above_the_shared_layers_is_the_policys_whole_pass_in_f32() -> Result<()> {
    let mut names: Vec<&'static str> = ORACLE_CASES.to_vec();
    names.extend(MOE_CASES);
    names.extend([QWEN35_CASE, GEMMA4_CASE, GEMMA4WIDE_CASE, GEMMA4MOE_CASE]);
    for OracleModel {
        name,
        model,
        ids,
        decode_start,
    } in models_of(&names)?
    {
        check_model(name, &model, &ids, decode_start)?;
    }
    Ok(())
}

#[test]
fn a_pass_started_above_is_the_whole_pass_with_quantized_products() -> Result<()> {
    for name in ["llama-gqa", "gemma3-sliding", QWEN35_CASE, GEMMA4_CASE] {
        let dir = oracle_case(name);
        let model = Decoder::load_as(
            &dir.join("model.q8_0.gguf"),
            WeightMode::Quantized,
            &Device::Cpu,
        )?;
        let ids = oracle_ids(name)?;
        let s = ids.len() / 2;
        check_model(name, &model, &ids, s)?;
    }
    Ok(())
}

#[test]
fn a_pass_started_above_is_the_whole_pass_on_the_real_model() -> Result<()> {
    let Some(path) = real_model() else {
        return Ok(());
    };
    let mut model = Decoder::load_as(&path, WeightMode::Quantized, &Device::Cpu)?;
    model.set_kv_dtype(candle_core::DType::F16)?;
    // a 40-token prompt, its last 12 the decode phase, as a sweep feeds it
    let ids: Vec<u32> = (0..52u32).map(|i| 1 + (i * 37) % 400).collect();
    let (prefix, _, record) = full_run(&model, &ids, 40)?;
    for spec in [
        "speed:1+bos",
        "speed:15",
        "speed:22+bos",
        "speed:29+bos",
        "knockout:7",
    ] {
        let (whole, above) = both_ways(&model, (&prefix, &record), &ids, 40, spec)?;
        ensure!(
            same_bits(&whole, &above)?,
            "SmolLM2, {spec}: the logits differ"
        );
    }
    Ok(())
}

#[test]
fn a_start_the_policy_or_the_model_does_not_allow_is_refused() -> Result<()> {
    let case = models_of(&["llama-gqa"])?.remove(0);
    let (model, ids, s) = (&case.model, &case.ids, case.decode_start);
    let layers = model.config().num_layers;
    let (prefix, _, record) = full_run(model, ids, s)?;
    let policy = "speed:2+bos".parse::<PolicySpec>()?.resolve(layers)?;
    let phases = TokenPhases::new(ids.len(), s, 1)?;
    let refused = |from: usize, tokens: &[u32], record: &PromptRecord| -> Result<String> {
        let seq = prefix.restricted(policy, phases)?;
        match model.forward_above(seq, tokens, from, record, LogitRows::All, None) {
            Err(e @ ModelError::NotAbove { .. }) => Ok(e.to_string()),
            other => anyhow::bail!("started at layer {from}: {:?}", other.map(|o| o.positions)),
        }
    };
    // above its cut the policy's layers are its own, not the full model's
    let msg = refused(3, &ids[s..], &record)?;
    ensure!(
        msg.contains("speed:2+bos") && msg.contains("layer 3"),
        "{msg}"
    );
    // a single token takes the decode step
    refused(2, &ids[s..s + 1], &record)?;
    // the record holds no states entering layer 2
    refused(2, &ids[s..], &PromptRecord::entering([1]))?;
    // nor for these tokens (the record's rows are for all of them)
    refused(2, &ids[s..ids.len() - 1], &record)?;
    Ok(())
}

/// Gemma 4's last layers read the K/V of lower layers: a pass started above
/// those needs the states entering them too, and without them is refused
/// by the layer's name rather than run on K/V the cache lacks.
#[test]
fn a_start_above_a_layer_whose_kv_is_read_needs_its_state() -> Result<()> {
    let case = models_of(&[GEMMA4_CASE])?.remove(0);
    let (model, ids, s) = (&case.model, &case.ids, case.decode_start);
    let layers = model.config().num_layers;
    // layers 4 and 5 read layers 3 and 2
    ensure!(model.entering_layers_above(layers - 2) == [layers - 2, 2, 3]);
    ensure!(model.entering_layers_above(3) == [3, 2]);
    ensure!(model.entering_layers_above(2) == [2]);
    let (prefix, _, _) = full_run(model, ids, s)?;
    let policy = "speed:4+bos".parse::<PolicySpec>()?.resolve(layers)?;
    let phases = TokenPhases::new(ids.len(), s, 1)?;
    let mut record = PromptRecord::entering([4, 3]);
    model.forward(
        &mut prefix.fork()?,
        &ids[s..],
        LogitRows::None,
        Some(&mut record),
    )?;
    let seq = prefix.restricted(policy, phases)?;
    match model.forward_above(seq, &ids[s..], 4, &record, LogitRows::All, None) {
        Err(e @ ModelError::NotAbove { .. }) => {
            let msg = e.to_string();
            ensure!(msg.contains("entering layer 2"), "{msg}");
        }
        other => anyhow::bail!(
            "ran without layer 2's state: {:?}",
            other.map(|o| o.positions)
        ),
    }
    Ok(())
}
