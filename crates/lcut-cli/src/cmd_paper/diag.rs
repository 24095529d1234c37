//! Figures 1 and 3: the diagnostic probe on suite items, at full depth
//! (part `layers`, whose traces also give Figure 1's full side and the
//! recommended cut) and under SPEED+BoS at C (part `masses`).

use anyhow::{Context, Result};
use lcut_engine::diagnose::{DiagnoseEvent, DiagnoseOptions, LabelledPrompt, diagnose_prepared};
use lcut_policy::PolicySpec;
use lcut_trace::PaperPart;
use serde_json::json;

use super::parts::Ctx;
use super::plan::speed_bos;
use super::store::PartFile;
use super::units::DiagUnit;

/// The greedy run of suite item `index` under `policy` with the probe.
fn trace_item(
    ctx: &Ctx,
    index: usize,
    policy: PolicySpec,
    on_step: &dyn Fn(usize, usize),
) -> Result<DiagUnit> {
    let session = &ctx.setup.session;
    let item = &ctx.setup.items[index];
    let sizes = &ctx.setup.settings.sizes;
    let prompt = LabelledPrompt {
        index,
        id: item.id.clone(),
        prompt: item.prepare(session)?,
    };
    let opts = DiagnoseOptions {
        max_new_tokens: sizes.diag_new_tokens,
        max_prompt_bins: sizes.max_prompt_bins,
        policy: Some(policy),
        ..DiagnoseOptions::default()
    };
    let mut report = diagnose_prepared(session, &[prompt], &opts, &mut |e| {
        if let DiagnoseEvent::Step {
            step, max_steps, ..
        } = e
        {
            on_step(*step, *max_steps);
        }
        true
    })?;
    let trace = report
        .traces
        .pop()
        .context("the diagnostic run gave no trace")?;
    Ok(DiagUnit {
        kind: item.kind.clone(),
        trace,
    })
}

/// Part `layers` (full depth) or `masses` (SPEED+BoS at C) over the
/// spread items.
pub fn diag_part(ctx: &Ctx, part: PaperPart) -> Result<PartFile<DiagUnit>> {
    let policy = match part {
        PaperPart::Masses => speed_bos(ctx.cut),
        _ => PolicySpec::full(),
    };
    let sizes = &ctx.setup.settings.sizes;
    let settings = json!({
        "policy": policy.to_string(),
        "items_per_kind": sizes.items_per_kind,
        "diag_new_tokens": sizes.diag_new_tokens,
        "max_prompt_bins": sizes.max_prompt_bins,
        "chat_template": true,
    });
    ctx.run_units(
        (part, settings),
        ctx.spread_items()?,
        &|i| ctx.item_id(i),
        &mut |index, progress| {
            trace_item(ctx, index, policy, &|step, max| {
                progress.message(&format!("{} step {step}/{max}", ctx.item_id(index)));
            })
        },
    )
}
