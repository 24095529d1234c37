//! The repetition loops: long greedy generations of the spread items under
//! every compared policy (part `loops`); which of them end in a loop is
//! decided when the report is assembled (`lcut_diag::ends_in_loop`).

use anyhow::Result;
use lcut_engine::StopReason;
use lcut_engine::suite::resolve_policy;
use lcut_trace::PaperPart;
use serde_json::json;

use super::parts::Ctx;
use super::store::PartFile;
use super::units::LoopEntry;

/// One item's generation under each policy.
fn loop_unit(ctx: &Ctx, index: usize, policies: &[String]) -> Result<Vec<LoopEntry>> {
    let session = &ctx.setup.session;
    let item = &ctx.setup.items[index];
    let prompt = item.prepare(session)?;
    let sizes = &ctx.setup.settings.sizes;
    policies
        .iter()
        .map(|text| {
            let policy = resolve_policy(session, text)?;
            let out = session.continue_greedy(
                &prompt,
                policy,
                sizes.loop_tokens,
                ctx.setup.settings.prefill_chunk,
                |_| true,
            )?;
            let stopped = out.stop == StopReason::StopToken;
            let mut tokens = out.tokens;
            if stopped {
                tokens.pop();
            }
            let text = session
                .tokenizer
                .as_ref()
                .map_or_else(String::new, |t| t.decode(&tokens));
            Ok(LoopEntry {
                policy: policy.to_string(),
                tokens,
                stopped,
                text,
            })
        })
        .collect()
}

/// Part `loops`: the spread items (this shard's) under every compared policy.
pub fn loops_part(ctx: &Ctx) -> Result<PartFile<Vec<LoopEntry>>> {
    let policies = ctx.compared_names();
    let sizes = &ctx.setup.settings.sizes;
    let settings = json!({
        "policies": policies,
        "items_per_kind": sizes.items_per_kind,
        "max_new_tokens": sizes.loop_tokens,
        "loop": format!(
            "a period of 1 to {} tokens repeated at least {} times at the end",
            lcut_diag::LOOP_MAX_PERIOD,
            lcut_diag::LOOP_MIN_REPEATS
        ),
    });
    ctx.run_units(
        (PaperPart::Loops, settings),
        ctx.spread_items()?,
        &|i| ctx.item_id(i),
        &mut |index, progress| {
            progress.message(&ctx.item_id(index));
            loop_unit(ctx, index, &policies)
        },
    )
}
