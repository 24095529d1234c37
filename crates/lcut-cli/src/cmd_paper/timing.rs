//! Figure 2: TTFT, TPOT and K/V held per compared policy at each prompt
//! length, timed as `lcut bench` times them (random prompts, every policy
//! in each round, the median of the rounds, ratios against full in the
//! same run), beside the cost model's prediction from each sequence's
//! `Visibility` (`lcut_diag::predict_cost`).

use anyhow::Result;
use indicatif::ProgressBar;
use lcut_diag::{ByteSizes, FlopShape, PredictedCost, predict_cost};
use lcut_engine::PreparedPrompt;
use lcut_policy::Policy;
use lcut_trace::{PaperPart, TimingPoint};
use serde_json::json;

use super::parts::Ctx;
use super::plan::timing_lengths;
use super::store::PartFile;

use crate::cmd_bench::{
    BenchRow, LengthPoint, Rounds, measure_rounds, random_prompt, rows_at_length, warm_up,
};

/// The cost model's prediction for each policy on `prompt`, then `new` tokens.
fn predictions(
    ctx: &Ctx,
    prompt: &PreparedPrompt,
    policies: &[Policy],
    new: usize,
) -> Result<Vec<PredictedCost>> {
    let model = &ctx.setup.session.model;
    let shape = FlopShape::from(&ctx.setup.manifest.model);
    let bytes = ByteSizes {
        weights: model.decode_weight_bytes() as f64,
        kv_per_token_layer: model.kv_shape().bytes_per_token_layer() as f64,
    };
    policies
        .iter()
        .map(|p| {
            let vis = p.visibility(prompt.phases(p)?);
            Ok(predict_cost(&shape, bytes, vis.as_ref(), prompt.len(), new))
        })
        .collect()
}

/// Every policy at prompt length `len`: measured and predicted.
fn time_length(
    ctx: &Ctx,
    len: usize,
    policies: &[Policy],
    rounds: Rounds,
) -> Result<Vec<TimingPoint>> {
    let model = &ctx.setup.session.model;
    let cfg = model.config();
    let bos = cfg.bos_token_id.unwrap_or(1);
    let prompt =
        PreparedPrompt::from_ids(random_prompt(len, cfg.vocab_size, bos, len as u64), None)?;
    let runs = measure_rounds(model, &prompt, policies, rounds, &ProgressBar::hidden())?;
    let block = model.attention_block_elems();
    // Figure 2 reports no GB/s, so the machine's read bandwidth (which
    // `lcut bench` measures over a 256 MiB buffer) is not measured here
    let at = LengthPoint {
        len,
        block,
        bandwidth: f64::NAN,
    };
    let rows = rows_at_length(model, policies, &runs, at, rounds)?;
    let predicted = predictions(ctx, &prompt, policies, rounds.new_tokens)?;
    Ok(rows
        .iter()
        .zip(&predicted)
        .map(|(row, p): (&BenchRow, _)| {
            let (ttft, tpot, kv) = p.ratios(&predicted[0]);
            TimingPoint {
                policy: row.policy.clone(),
                prompt_len: row.prompt_len,
                new_tokens: row.new_tokens,
                ttft_s: row.ttft_s,
                tpot_s: row.tpot_s,
                kv_bytes: row.kv_bytes,
                ttft_ratio: row.ttft_ratio,
                tpot_ratio: row.tpot_ratio,
                kv_ratio: row.kv_ratio,
                predicted_ttft_ratio: ttft,
                predicted_tpot_ratio: tpot,
                predicted_kv_ratio: kv,
            }
        })
        .collect())
}

/// Part `timing`: the prompt lengths (this shard's) under every compared policy.
pub fn timing_part(ctx: &Ctx) -> Result<PartFile<Vec<TimingPoint>>> {
    let s = &ctx.setup.settings;
    let layers = ctx.setup.session.model.config().num_layers;
    let lengths = timing_lengths(s.max_len, s.sizes.timing_new_tokens);
    let policies = ctx
        .compared()
        .0
        .iter()
        .map(|p| p.resolve(layers))
        .collect::<Result<Vec<Policy>, _>>()?;
    let rounds = Rounds {
        new_tokens: s.sizes.timing_new_tokens,
        repeats: s.sizes.repeats,
        prefill_chunk: s.prefill_chunk,
    };
    let settings = json!({
        "policies": policies.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "prompt_lengths": lengths,
        "new_tokens": rounds.new_tokens,
        "repeats": rounds.repeats,
        "prefill_chunk": rounds.prefill_chunk,
        "prompts": "random token ids after BoS, raw (as lcut bench)",
    });
    let all: Vec<usize> = (0..lengths.len()).collect();
    let mut warm = false;
    ctx.run_units(
        (PaperPart::Timing, settings),
        ctx.shard_of(&all)?,
        &|k| format!("{} tokens", lengths.get(k).copied().unwrap_or(0)),
        &mut |k, progress| {
            if !warm {
                progress.message("warm-up");
                let bos = ctx.setup.session.model.config().bos_token_id.unwrap_or(1);
                warm_up(
                    &ctx.setup.session.model,
                    &policies,
                    &lengths,
                    rounds.prefill_chunk,
                    bos,
                )?;
                warm = true;
            }
            progress.message(&format!(
                "{} tokens, {} policies",
                lengths[k],
                policies.len()
            ));
            time_length(ctx, lengths[k], &policies, rounds)
        },
    )
}
