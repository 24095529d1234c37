//! The scored answers: Figure 4 (retrieval items, full and SPEED+BoS at a
//! few cuts, from one full prefill per item) and the table (every item
//! under every compared policy, and each adapter under its policy, as
//! `lcut eval --suite` runs them).

use anyhow::Result;
use lcut_engine::suite::{
    CutoffEvalOptions, SuiteEvalOptions, SuiteItem, accuracy_by_cutoff, cutoff_memory,
    evaluate_suite, largest_item_memory,
};
use lcut_policy::{Anchors, Policy};
use lcut_trace::PaperPart;
use serde_json::json;

use super::parts::Ctx;
use super::plan::{RETRIEVAL_KIND, retrieval_cuts};
use super::setup::Setup;
use super::store::PartFile;
use super::units::{RetrievalUnit, TableEntry};

/// Figure 4's cuts, deepest first, the full depth among them.
fn cuts(ctx: &Ctx) -> Vec<usize> {
    let layers = ctx.setup.session.model.config().num_layers;
    let mut cuts = ctx
        .setup
        .settings
        .retrieval_cuts
        .clone()
        .unwrap_or_else(|| retrieval_cuts(ctx.cut, layers));
    cuts.retain(|&c| c != layers);
    cuts.insert(0, layers);
    cuts
}

/// The name of SPEED+BoS at `cut` (the full model at the full depth).
fn cut_name(cut: usize, layers: usize) -> String {
    if cut == layers {
        Policy::full(layers).to_string()
    } else {
        super::plan::speed_bos(cut).to_string()
    }
}

/// How Figure 4 runs an item: SPEED+BoS at each of `cuts` from one full
/// prefill.
fn retrieval_options(setup: &Setup, cuts: &[usize]) -> CutoffEvalOptions {
    CutoffEvalOptions {
        cuts: cuts.to_vec(),
        anchors: vec![Anchors::Bos],
        max_new_tokens: setup.settings.sizes.answer_tokens,
        prefill_chunk: setup.settings.prefill_chunk,
        shard: None,
        memory_budget: setup.memory_budget,
    }
}

/// How the table runs an item under `policies`, as `lcut eval --suite`.
fn table_options(setup: &Setup, policies: Vec<String>) -> SuiteEvalOptions {
    SuiteEvalOptions {
        policies,
        max_new_tokens: setup.settings.sizes.answer_tokens,
        item_budgets: false,
        shard: None,
        prefill_chunk: setup.settings.prefill_chunk,
        memory_budget: setup.memory_budget,
    }
}

/// Print, before the scored parts in `wanted` run, what their item that
/// holds the most holds beside the weights and whether its policies run
/// in groups (the lines `lcut eval` and `lcut sweep` print).
pub fn memory_lines(ctx: &Ctx, wanted: &[PaperPart]) -> Result<()> {
    let setup = ctx.setup;
    let session = &setup.session;
    let budget = setup.memory_budget;
    let items = |indices: Vec<usize>| -> Vec<SuiteItem> {
        indices
            .into_iter()
            .map(|i| setup.items[i].clone())
            .collect()
    };
    if wanted.contains(&PaperPart::Retrieval) {
        let retrieval = items(ctx.shard_of(&retrieval_indices(ctx))?);
        let opts = retrieval_options(setup, &cuts(ctx));
        if let Some(m) = cutoff_memory(session, &retrieval, &opts)? {
            eprintln!("{}", m.line("the largest retrieval item", budget));
        }
    }
    if wanted.contains(&PaperPart::Table) {
        let all: Vec<usize> = (0..setup.items.len()).collect();
        let table = items(ctx.shard_of(&all)?);
        let opts = table_options(setup, ctx.compared_names());
        if let Some(m) = largest_item_memory(session, &table, &opts)? {
            eprintln!("{}", m.line("the table's largest item", budget));
        }
    }
    Ok(())
}

/// The suite's retrieval items, in suite order.
fn retrieval_indices(ctx: &Ctx) -> Vec<usize> {
    (0..ctx.setup.items.len())
        .filter(|&i| ctx.setup.items[i].kind == RETRIEVAL_KIND)
        .collect()
}

/// One retrieval item's answers at every cut.
fn retrieval_unit(ctx: &Ctx, index: usize, cuts: &[usize]) -> Result<RetrievalUnit> {
    let session = &ctx.setup.session;
    let item = &ctx.setup.items[index];
    let layers = session.model.config().num_layers;
    let opts = retrieval_options(ctx.setup, cuts);
    let points = accuracy_by_cutoff(session, std::slice::from_ref(item), &opts, &mut |_, _| true)?;
    let prompt = item.prepare(session)?;
    Ok(RetrievalUnit {
        length: item.length.clone(),
        prompt_tokens: prompt.len(),
        answers: points
            .iter()
            .map(|p| (cut_name(p.l_cut, layers), p.correct == 1))
            .collect(),
    })
}

/// Part `retrieval`: the suite's retrieval items (this shard's).
pub fn retrieval_part(ctx: &Ctx) -> Result<PartFile<RetrievalUnit>> {
    let cuts = cuts(ctx);
    let settings = json!({
        "kind": RETRIEVAL_KIND,
        "cuts": cuts,
        "anchors": "bos",
        "max_new_tokens": ctx.setup.settings.sizes.answer_tokens,
    });
    ctx.run_units(
        (PaperPart::Retrieval, settings),
        ctx.shard_of(&retrieval_indices(ctx))?,
        &|i| ctx.item_id(i),
        &mut |index, progress| {
            progress.message(&ctx.item_id(index));
            retrieval_unit(ctx, index, &cuts)
        },
    )
}

/// One item under every compared policy, then under each adapter.
fn table_unit(ctx: &Ctx, index: usize, policies: &[String]) -> Result<Vec<TableEntry>> {
    let setup = ctx.setup;
    let items = std::slice::from_ref(&setup.items[index]);
    let opts = |policies: Vec<String>| table_options(setup, policies);
    let mut out = Vec::new();
    let lists = evaluate_suite(
        &setup.session,
        None,
        items,
        &opts(policies.to_vec()),
        &mut |_| {},
    )?;
    for (text, list) in policies.iter().zip(lists) {
        let policy = lcut_engine::suite::resolve_policy(&setup.session, text)?.to_string();
        out.extend(list.into_iter().map(|mut result| {
            result.index = index;
            TableEntry {
                policy: policy.clone(),
                adapter: None,
                result,
            }
        }));
    }
    for a in &setup.adapters {
        let text = a.policy.to_string();
        let lists = evaluate_suite(
            &a.session,
            Some(&setup.session),
            items,
            &opts(vec![text.clone()]),
            &mut |_| {},
        )?;
        let policy = lcut_engine::suite::resolve_policy(&setup.session, &text)?.to_string();
        out.extend(lists.into_iter().flatten().map(|mut result| {
            result.index = index;
            TableEntry {
                policy: policy.clone(),
                adapter: Some(a.identity.path.clone()),
                result,
            }
        }));
    }
    Ok(out)
}

/// Part `table`: every suite item (this shard's).
pub fn table_part(ctx: &Ctx) -> Result<PartFile<Vec<TableEntry>>> {
    let policies = ctx.compared_names();
    let adapters: Vec<_> = ctx
        .setup
        .adapters
        .iter()
        .map(|a| json!({"hash": a.identity.hash, "policy": a.policy.to_string()}))
        .collect();
    let settings = json!({
        "policies": policies,
        "adapters": adapters,
        "max_new_tokens": ctx.setup.settings.sizes.answer_tokens,
        "reference": "the full model's greedy answer (the base model's for an adapter)",
    });
    let all: Vec<usize> = (0..ctx.setup.items.len()).collect();
    ctx.run_units(
        (PaperPart::Table, settings),
        ctx.shard_of(&all)?,
        &|i| ctx.item_id(i),
        &mut |index, progress| {
            progress.message(&ctx.item_id(index));
            table_unit(ctx, index, &policies)
        },
    )
}
