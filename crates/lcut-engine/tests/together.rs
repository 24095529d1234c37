//! Generations stepped side by side (`Generation::step_together`, what
//! `lcut eval --suite`, `sweep --eval-suite` and the adapter trainer's
//! teacher use) against each generation stepped alone: prompts of
//! different lengths under different policies give the same tokens and
//! the same logits bit for bit, a generation that ends early stops
//! taking steps while the others go on, and a generation made to follow
//! another's choice (teacher forcing) records that choice.

use anyhow::{Context, Result, ensure};
use lcut_engine::{Generation, GenerationConfig, PreparedPrompt, Step};
use lcut_model::{DType, Decoder, Device};
use lcut_policy::PolicySpec;
use lcut_testkit::oracle_case as oracle;

fn reference_ids(name: &str) -> Result<Vec<u32>> {
    Ok(lcut_testkit::oracle_ids(name)?)
}

/// (prompt length, decode start, policy, most new tokens)
const RUNS: [(usize, usize, &str, usize); 4] = [
    (30, 24, "full", 7),
    (22, 18, "speed:2+bos", 7),
    (27, 20, "speed:1", 3),
    (30, 24, "slim:2@50%+block:2+unit:1", 7),
];

fn generations<'m>(model: &'m Decoder, ids: &[u32]) -> Result<Vec<Generation<'m>>> {
    let layers = model.config().num_layers;
    RUNS.iter()
        .map(|&(len, start, policy, max_new)| {
            let prompt = PreparedPrompt::from_ids(ids[..len].to_vec(), Some(start))?;
            let policy = policy.parse::<PolicySpec>()?.resolve(layers)?;
            let config = GenerationConfig {
                max_new_tokens: max_new,
                ..GenerationConfig::default()
            };
            Ok(Generation::new(model, prompt, policy, config)?)
        })
        .collect()
}

fn same(case: &str, i: usize, a: &Step, b: &Step) -> Result<()> {
    ensure!(
        a.token == b.token,
        "{case}, run {i}: token {} vs {}",
        a.token,
        b.token
    );
    let diff: f32 = (&a.logits - &b.logits)?.abs()?.max(0)?.to_scalar()?;
    ensure!(
        diff == 0.0,
        "{case}, run {i}, step {}: logits differ by {diff}",
        a.index
    );
    Ok(())
}

#[test]
fn generations_stepped_together_equal_each_stepped_alone() -> Result<()> {
    for case in ["llama-gqa", "qwen3-qknorm", "gemma2-softcap"] {
        let model = Decoder::load(&oracle(case), DType::F32, &Device::Cpu)?;
        let ids = reference_ids(case)?;
        let mut alone: Vec<Vec<Step>> = Vec::new();
        for mut g in generations(&model, &ids)? {
            let mut steps = Vec::new();
            while let Some(s) = g.step(None)? {
                steps.push(s);
            }
            alone.push(steps);
        }
        let mut gens = generations(&model, &ids)?;
        let mut together: Vec<Vec<Step>> = vec![Vec::new(); gens.len()];
        loop {
            let mut all: Vec<&mut Generation<'_>> = gens.iter_mut().collect();
            let steps = Generation::step_together(&mut all, |_, own| own)?;
            if steps.iter().all(Option::is_none) {
                break;
            }
            for (list, s) in together.iter_mut().zip(steps) {
                list.extend(s);
            }
        }
        for (i, (a, b)) in alone.iter().zip(&together).enumerate() {
            ensure!(
                a.len() == b.len(),
                "{case}, run {i}: {} steps vs {}",
                a.len(),
                b.len()
            );
            for (x, y) in a.iter().zip(b) {
                same(case, i, x, y)?;
            }
        }
    }
    Ok(())
}

#[test]
fn a_generation_made_to_follow_another_records_its_choices() -> Result<()> {
    let model = Decoder::load(&oracle("llama-gqa"), DType::F32, &Device::Cpu)?;
    let ids = reference_ids("llama-gqa")?;
    let mut gens = generations(&model, &ids)?;
    let (lead, rest) = gens.split_at_mut(1);
    let mut chosen = 0;
    let mut pair = [&mut lead[0], &mut rest[0]];
    let steps = Generation::step_together(&mut pair, |i, own| {
        if i == 0 {
            chosen = own;
        }
        chosen
    })?;
    let first = steps[0].as_ref().context("the lead's first step")?;
    let second = steps[1].as_ref().context("the follower's first step")?;
    ensure!(second.token == first.token);
    ensure!(pair[1].produced() == [first.token]);
    Ok(())
}

/// A suite run whose item does not fit the memory given runs its policies
/// in groups, one after another from the same prompt run and the same full
/// continuation: every family scores exactly as in one group (answers,
/// agreement, KL, K/V held), and a budget below what one policy needs is
/// refused by name before any item runs.
#[test]
fn an_item_split_into_groups_scores_as_in_one() -> Result<()> {
    use lcut_engine::suite::{self, SuiteEvalOptions};
    let session = bundled_session()?;
    let items = copy_items(2)?;
    let opts = SuiteEvalOptions {
        policies: [
            "full",
            "speed:2+bos",
            "snapkv:0.5+window:4",
            "slim:2@50%+block:2+unit:1",
            "swiftkv:2+bos",
            "tova:0.5",
            "speed:1",
        ]
        .map(String::from)
        .to_vec(),
        max_new_tokens: 6,
        memory_budget: Some(u64::MAX),
        ..SuiteEvalOptions::default()
    };
    let memory = suite::largest_item_memory(&session, &items, &opts)?.context("items")?;
    let largest = memory.per_policy.iter().copied().max().unwrap_or(0);
    let fixed = memory.prompt_run + memory.full_generation + memory.transient;
    let run = |budget: u64| {
        let opts = SuiteEvalOptions {
            memory_budget: Some(budget),
            ..opts.clone()
        };
        suite::evaluate_suite(&session, None, &items, &opts, &mut |_| {})
    };
    let whole = run(u64::MAX)?;
    // room for the largest policy alone: groups of one or two
    let tight = fixed + largest;
    ensure!(memory.groups(Some(tight))?.len() >= 4, "{memory:?}");
    let split = run(tight)?;
    for (w, s) in whole.iter().flatten().zip(split.iter().flatten()) {
        let (mut w, mut s) = (w.clone(), s.clone());
        (w.seconds, s.seconds) = (0.0, 0.0);
        ensure!(w == s, "{w:?}\nvs\n{s:?}");
    }
    ensure!(whole.iter().flatten().count() == 2 * opts.policies.len());
    let err = run(tight - 1).err().context("refused")?.to_string();
    ensure!(
        err.contains("memory free") && err.contains("nothing was run"),
        "{err}"
    );
    Ok(())
}

/// A policy's own run and its run teacher-forced on the full model's
/// continuation are one run until the policy first chooses another token:
/// every policy's answer in a suite run is still its greedy generation run
/// alone, for policies that answer as the full model does (one run to the
/// end), that leave it after a few tokens, and that leave it at once.
#[test]
fn each_policys_answer_is_its_greedy_generation_alone() -> Result<()> {
    use lcut_engine::suite::{self, SuiteEvalOptions};
    let session = bundled_session()?;
    let items = copy_items(4)?;
    let opts = SuiteEvalOptions {
        policies: [
            "full",
            "speed:3+bos",
            "speed:2+bos",
            "speed:1",
            "snapkv:0.5+window:4",
            "slim:2@50%+block:2+unit:1",
            "swiftkv:2+bos",
            "tova:0.75",
        ]
        .map(String::from)
        .to_vec(),
        max_new_tokens: 8,
        memory_budget: Some(u64::MAX),
        ..SuiteEvalOptions::default()
    };
    let results = suite::evaluate_suite(&session, None, &items, &opts, &mut |_| {})?;
    let (mut whole, mut parted) = (0, 0);
    for (text, per_item) in opts.policies.iter().zip(&results) {
        let policy = suite::resolve_policy(&session, text)?;
        for (item, r) in items.iter().zip(per_item) {
            let prompt = item.prepare(&session)?;
            let alone = session.continue_greedy(
                &prompt,
                policy,
                opts.budget(item),
                opts.prefill_chunk,
                |_| true,
            )?;
            let want = session.generated_text(&alone.tokens);
            ensure!(
                r.generation == want,
                "{text} on {}: {:?} in the suite, {want:?} alone",
                item.id,
                r.generation
            );
            match r.agree == r.forced_tokens {
                true => whole += 1,
                false => parted += 1,
            }
        }
    }
    // both ways of running were taken
    ensure!(
        whole > items.len() && parted > 0,
        "{whole} whole, {parted} parted"
    );
    Ok(())
}

/// The bundled copy model, in f32 on the CPU.
fn bundled_session() -> Result<lcut_engine::Session> {
    let root = lcut_engine::workspace_root();
    Ok(lcut_engine::Session::load(
        &root.join(lcut_engine::BUNDLED_MODEL),
        DType::F32,
        &Device::Cpu,
    )?)
}

/// The first `n` prompts of the bundled model's copy task as suite items
/// (answer: the span to copy).
fn copy_items(n: usize) -> Result<Vec<lcut_engine::suite::SuiteItem>> {
    let root = lcut_engine::workspace_root();
    let prompts = std::fs::read_to_string(root.join("fixtures/prompts/copy.jsonl"))?;
    let lines: Vec<String> = prompts
        .lines()
        .take(n)
        .enumerate()
        .map(|(k, line)| {
            let v: serde_json::Value = serde_json::from_str(line)?;
            let prompt = v["prompt"].as_str().context("a prompt")?;
            let answer = prompt.split(['[', ']']).nth(1).context("a span")?.trim();
            Ok(serde_json::json!({
                "id": format!("c{k}"), "kind": "copy", "length": "short",
                "prompt": prompt, "answer": answer, "scoring": "contains",
            })
            .to_string())
        })
        .collect::<Result<_>>()?;
    Ok(lcut_engine::suite::parse_suite(
        &lines.join("\n"),
        std::path::Path::new("copy"),
    )?)
}

/// A cutoff sweep over a suite whose cutoffs do not fit the memory at once
/// decodes them in groups from the same prompt run: the same accuracy at
/// every cutoff and anchor setting as in one group, and a budget below one
/// cutoff's answer is refused by name before any item runs.
#[test]
fn a_cutoff_sweep_split_into_groups_scores_as_in_one() -> Result<()> {
    use lcut_engine::suite::{self, CutoffEvalOptions};
    let session = bundled_session()?;
    let items = copy_items(8)?;
    let opts = CutoffEvalOptions {
        cuts: vec![1, 2, 3, 4],
        anchors: vec![lcut_policy::Anchors::Bos, lcut_policy::Anchors::None],
        max_new_tokens: 8,
        prefill_chunk: 16,
        shard: None,
        memory_budget: Some(u64::MAX),
    };
    let memory = suite::cutoff_memory(&session, &items, &opts)?.context("items")?;
    let largest = memory.per_policy.iter().copied().max().unwrap_or(0);
    let tight = memory.prompt_run + largest;
    ensure!(memory.groups(Some(tight))?.len() >= 4, "{memory:?}");
    let run = |budget: u64| {
        let opts = CutoffEvalOptions {
            memory_budget: Some(budget),
            ..opts.clone()
        };
        suite::accuracy_by_cutoff(&session, &items, &opts, &mut |_, _| true)
    };
    let whole = run(u64::MAX)?;
    ensure!(whole.len() == 8);
    // the bundled model reads its prompt at the top layer: the points differ
    ensure!(
        whole.iter().any(|p| p.correct != whole[0].correct),
        "{whole:?}"
    );
    ensure!(run(tight)? == whole);
    let err = run(tight - 1).err().context("refused")?.to_string();
    ensure!(err.contains("beside the weights, more than"), "{err}");
    Ok(())
}
