//! `lcut eval --suite FILE --ratios R1,R2,...`: the leaderboard run (every
//! method at every compression ratio, the ratio mapped to each family's
//! knob), resumable from its folder's journal, sharded like the other long
//! jobs, and the files it writes: `leaderboard.json`, `leaderboard.csv`
//! (kvpress's columns first), `leaderboard.html`, and the paired
//! comparisons of its configurations (`leaderboard-pairs.json`, `.csv`:
//! which methods beat which at each ratio); `lcut eval-merge` joins shard
//! folders' `leaderboard.json` into the whole run's, each item once.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use lcut_diag::{PairSettings, PairedScores, ShardItems};
use lcut_engine::leaderboard::journal::{self, Journal};
use lcut_engine::leaderboard::{
    LeaderboardHeader, LeaderboardItem, LeaderboardRun, PromptRows, TimingSettings,
    leave_out_refused, left_out_lines, parse_ratios, plan, run_items, split_methods, table,
};
use lcut_engine::suite;
use lcut_trace::LeaderboardPairs;

use crate::cmd_eval::EvalCommand;
use crate::common::{ModelArgs, write_atomic};

/// The journal's name in the run's folder.
pub const JOURNAL: &str = "items.jsonl";
/// The whole result's name in the run's folder.
pub const RESULT: &str = "leaderboard.json";
/// The paired comparisons' name in the run's folder (and `.csv` beside it).
pub const PAIRS: &str = "leaderboard-pairs.json";

/// The mean of the items' context lengths (the tokens before the decode
/// start) in `session`'s tokens.
fn mean_context_tokens(
    session: &lcut_engine::Session,
    items: &[suite::SuiteItem],
) -> Result<usize> {
    anyhow::ensure!(!items.is_empty(), "the suite holds no item");
    let mut total = 0;
    for item in items {
        total += item.prepare(session)?.decode_start;
    }
    Ok(total / items.len())
}

/// Run the leaderboard of `args` (`--ratios` given) on the suite at `path`.
pub fn run(args: &EvalCommand, path: &Path, ratios: &str) -> Result<()> {
    let ratios = parse_ratios(ratios).context("--ratios")?;
    anyhow::ensure!(!ratios.is_empty(), "--ratios names no ratio");
    anyhow::ensure!(
        args.lora.lora.is_none(),
        "--ratios runs the model as it is: drop --lora"
    );
    let out = args
        .out
        .clone()
        .context("--ratios needs --out DIR (the run's folder: its journal, CSV and report)")?;
    let (items, suite_hash) = suite::read_suite_hashed(path)?;
    check_timing_tasks(&args.timing_tasks, &items, path)?;
    let pending =
        ModelArgs::cpu(Some(args.base.model.clone()), args.dtype, args.kv_dtype).open()?;
    let methods = split_methods(&args.base.policy);
    let (layers, windows) = (
        pending.config().num_layers,
        pending.config().sliding_window.clone(),
    );
    // every method and ratio checked before the model loads
    let mut configs = plan(&methods, &ratios, &PromptRows::uniform(layers))?;
    let session = pending.load()?;
    if windows.iter().any(Option::is_some) {
        // where layers slide, a cut's share is counted in the rows they
        // hold at the suite's prompts
        let n = mean_context_tokens(&session, &items)?;
        configs = plan(
            &methods,
            &ratios,
            &PromptRows::windowed(&windows, layers, n),
        )?;
    }
    // a method this model's layout refuses (a press on Gemma 4's shared
    // K/V, on Qwen3.5's recurrent layers) is left out, and said
    let (configs, left_out) = leave_out_refused(&session, configs)?;
    for line in left_out_lines(&left_out) {
        eprintln!("{line}");
    }
    let shard = args
        .shard
        .as_deref()
        .map(lcut_engine::shard::parse_shard)
        .transpose()?;
    let header = LeaderboardHeader {
        model: args.base.model.display().to_string(),
        suite: path.display().to_string(),
        suite_hash,
        suite_items: items.len(),
        dtype: args.dtype.name(),
        max_new_tokens: args
            .max_new_tokens
            .unwrap_or(crate::cmd_eval::DEFAULT_NEW_TOKENS),
        item_budgets: args.max_new_tokens.is_none(),
        prefill_chunk: lcut_engine::GenerationConfig::default().prefill_chunk,
        ratios,
        configs,
        timing: TimingSettings {
            items_per_task: args.timing_items,
            new_tokens: args.timing_tokens,
            rounds: args.timing_rounds,
            tasks: args.timing_tasks.clone(),
        },
        shard: shard.map(|(i, n)| [i, n]),
        left_out,
    };
    for c in &header.configs {
        let ratio = c.ratio.map_or_else(|| "-".into(), |r| r.to_string());
        eprintln!(
            "ratio {ratio:<6} {:<14} -> {:<22} {}",
            c.method, c.policy, c.note
        );
    }
    // a new run's folder and journal are written with its first item, so a
    // run refused before it leaves nothing in `out`
    let (mut journal, done) = Journal::open(&out.join(JOURNAL), &header)?;
    let resolved = header
        .configs
        .iter()
        .map(|c| suite::resolve_policy(&session, &c.policy))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(note) = crate::common::press_layers_note(&session.model, &resolved) {
        eprintln!("{note}");
    }
    if let Some(note) = crate::common::shared_run_note(&session, &items, &resolved)? {
        eprintln!("{note}");
    }
    let todo = lcut_engine::diagnose::shard_indices(items.len(), shard)?.len();
    if !done.is_empty() {
        eprintln!(
            "resuming: {} of {todo} items already in {}",
            done.len(),
            out.join(JOURNAL).display()
        );
        let current = lcut_engine::made_by::current();
        if let Some(note) =
            lcut_engine::made_by::resume_note(done.iter().map(|d| d.made_by.as_ref()), &current)
        {
            eprintln!("{note}");
        }
    }
    let bar = crate::common::count_bar(todo, "items");
    bar.set_position(done.len() as u64);
    let log_lines = !std::io::stderr().is_terminal();
    let mut count = done.len();
    let budget = crate::common::suite_memory_line(&session, &items, &header.suite_options(None))?;
    let all = run_items(&session, &items, (&header, budget), done, &mut |rec| {
        journal.append(rec)?;
        count += 1;
        let marks: String = rec
            .results
            .iter()
            .map(|r| match r.score() {
                s if s >= 1.0 => '+',
                s if s > 0.0 => '~',
                _ => '-',
            })
            .collect();
        if log_lines {
            eprintln!("item {count}/{todo} {} {marks}", rec.id);
        }
        bar.set_message(format!("{} {marks}", rec.id));
        bar.inc(1);
        Ok(true)
    })?;
    bar.finish_and_clear();
    crate::common::suite_memory_peak();
    let run = LeaderboardRun {
        table: table::build_table(&header, &all),
        header,
        items: all,
    };
    let pairs = write_run(&out, &run)?;
    print_summary(&run, &pairs, &out);
    Ok(())
}

/// Refuse a `--timing-tasks` name that no item of the suite has.
fn check_timing_tasks(tasks: &[String], items: &[suite::SuiteItem], path: &Path) -> Result<()> {
    let mut kinds: Vec<&str> = items.iter().map(|i| i.kind.as_str()).collect();
    kinds.sort_unstable();
    kinds.dedup();
    if let Some(unknown) = tasks.iter().find(|t| !kinds.contains(&t.as_str())) {
        anyhow::bail!(
            "--timing-tasks: {} has no item of task {unknown:?} (its tasks: {})",
            path.display(),
            kinds.join(", ")
        );
    }
    Ok(())
}

/// `lcut eval-merge --partial`: the items the journals in the run folders
/// `dirs` hold so far, as one run written into `out`.
pub fn merge_partial(dirs: &[PathBuf], out: &Path) -> Result<()> {
    let parts = dirs
        .iter()
        .map(|d| Ok(journal::read(&d.join(JOURNAL))?))
        .collect::<Result<Vec<_>>>()?;
    let shards: Vec<(&Path, &LeaderboardHeader, &[LeaderboardItem])> = dirs
        .iter()
        .zip(&parts)
        .map(|(d, (h, items))| (d.as_path(), h, &items[..]))
        .collect();
    check_shards(&shards, false)?;
    let run = lcut_engine::leaderboard::merge_partial(&parts)?;
    let pairs = write_run(out, &run)?;
    println!(
        "merged the {} items of {} journals (of the suite's {}) into {}",
        run.items.len(),
        parts.len(),
        run.header.suite_items,
        out.display()
    );
    print_summary(&run, &pairs, out);
    Ok(())
}

/// Check that the shards `parts` (each as named, with its header and
/// items) hold each item once and, with `whole`, every item of the suite,
/// naming the item and the shards where not. Shards of different runs are
/// left to the merge, which names what differs.
pub fn check_shards(
    parts: &[(&Path, &LeaderboardHeader, &[LeaderboardItem])],
    whole: bool,
) -> Result<()> {
    let key = |h: &LeaderboardHeader| LeaderboardHeader {
        shard: None,
        ..h.clone()
    };
    let Some((_, first, _)) = parts.first() else {
        return Ok(());
    };
    if parts.iter().any(|(_, h, _)| key(h) != key(first)) {
        return Ok(());
    }
    let shards: Vec<ShardItems> = parts
        .iter()
        .map(|(dir, _, items)| ShardItems {
            shard: dir.display().to_string(),
            items: items.iter().map(|i| (i.index, i.id.clone())).collect(),
        })
        .collect();
    lcut_diag::check_shard_items(&shards, whole.then_some(first.suite_items))?;
    Ok(())
}

/// The paired comparisons of `run`'s configurations: each item's score
/// under each configuration, keyed by the item's id, compared pair by pair
/// at each ratio.
pub fn run_pairs(run: &LeaderboardRun) -> Result<LeaderboardPairs> {
    let configs = &run.header.configs;
    let mut scores = PairedScores::new(configs.len());
    for item in &run.items {
        anyhow::ensure!(
            item.results.len() == configs.len(),
            "item {} ({}) has {} results for {} configurations",
            item.index,
            item.id,
            item.results.len(),
            configs.len()
        );
        for (c, r) in item.results.iter().enumerate() {
            scores.insert(c, &item.id, r.score())?;
        }
    }
    Ok(lcut_diag::compare_configs(
        configs,
        &scores,
        &PairSettings::default(),
    )?)
}

/// Write `leaderboard.json`, `.csv` and `.html`, and the paired
/// comparisons (`leaderboard-pairs.json`, `.csv`), into `dir`; the
/// comparisons returned.
pub fn write_run(dir: &Path, run: &LeaderboardRun) -> Result<LeaderboardPairs> {
    let pairs = run_pairs(run)?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    write_atomic(
        &dir.join(RESULT),
        serde_json::to_string_pretty(run)?.as_bytes(),
    )?;
    write_atomic(
        &dir.join("leaderboard.csv"),
        lcut_report::render_leaderboard_csv(&run.table).as_bytes(),
    )?;
    write_atomic(
        &dir.join(PAIRS),
        serde_json::to_string_pretty(&pairs)?.as_bytes(),
    )?;
    write_atomic(
        &dir.join("leaderboard-pairs.csv"),
        lcut_report::render_leaderboard_pairs_csv(&run.table, &pairs).as_bytes(),
    )?;
    write_atomic(
        &dir.join("leaderboard.html"),
        lcut_report::render_leaderboard_html(&run.table, &pairs).as_bytes(),
    )?;
    Ok(pairs)
}

/// One line per configuration over all tasks, with the methods it beats;
/// one line per ratio of the pairs told apart.
fn print_summary(run: &LeaderboardRun, pairs: &LeaderboardPairs, dir: &Path) {
    let t = &run.table;
    let f = |x: Option<f64>| x.map_or_else(|| "-".into(), |v| format!("{v:.3}"));
    println!(
        "{} {} on {} ({} items, {:.0} s):",
        t.dataset, t.data_dir, t.model, t.items, t.seconds
    );
    for (c, cfg) in t.configs.iter().enumerate() {
        let Some(cell) = t.cell("all", c) else {
            continue;
        };
        println!(
            "{:<14} ratio={:.3} policy={:<22} score={:.3} [{:.3}, {:.3}] prompt_kv_removed={:.3} \
             kv_held={:.2}MiB ttft_x={} tpot_x={} flops_x={} beats={}",
            cfg.method,
            t.compression_ratio(c),
            cfg.policy,
            cell.score,
            cell.ci95[0],
            cell.ci95[1],
            cell.prompt_kv_removed,
            cell.kv_bytes_held / (1024.0 * 1024.0),
            f(cell.ttft_ratio),
            f(cell.tpot_ratio),
            f(cell.prefill_flops_ratio),
            lcut_report::beats_text(t, pairs, c)
        );
    }
    for group in pairs.groups() {
        let of_group: Vec<_> = pairs.pairs.iter().filter(|p| p.group == group).collect();
        let label = match of_group.first().and_then(|p| p.ratio) {
            Some(_) => format!("ratio {group}"),
            None => group.to_string(),
        };
        let apart = of_group.iter().filter(|p| p.winner().is_some()).count();
        let untested = of_group.iter().filter(|p| p.p.is_none()).count();
        println!(
            "{label}: {apart} of {} pairs told apart at {:.0}% (paired tests, Holm){}",
            of_group.len(),
            100.0 * (1.0 - pairs.alpha),
            match untested {
                0 => String::new(),
                n => format!(", {n} without a shared item"),
            }
        );
    }
    for line in left_out_lines(&run.header.left_out) {
        println!("{line}");
    }
    if let Some(note) =
        lcut_engine::made_by::mixed_note(run.items.iter().map(|i| i.made_by.as_ref()))
    {
        println!("{note}");
    }
    println!(
        "wrote {}, leaderboard.csv, leaderboard.html and {PAIRS} (.csv) in {}",
        RESULT,
        dir.display()
    );
}

/// Read a leaderboard result (a `leaderboard.json`, or a run folder
/// holding one); `None` when the file is another kind of result.
pub fn read_run(path: &Path) -> Result<Option<LeaderboardRun>> {
    let file: PathBuf = if path.is_dir() {
        path.join(RESULT)
    } else {
        path.to_path_buf()
    };
    let text =
        std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
    let value: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", file.display()))?;
    if value.get("header").is_none() || value.get("table").is_none() {
        return Ok(None);
    }
    serde_json::from_value(value)
        .map(Some)
        .with_context(|| format!("{} is not an `lcut eval --ratios` result", file.display()))
}
