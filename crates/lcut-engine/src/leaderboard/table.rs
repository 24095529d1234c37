//! The cells of a leaderboard run: per task and over all tasks, each
//! configuration's mean score with its interval, the K/V it held and the
//! share of the prompt's K/V it removed (both measured), and on the timed
//! items its TTFT, TPOT and predicted prefill FLOPs against full's.

use lcut_trace::{LeaderboardCell, LeaderboardTable};

use super::timing::median;
use super::{LeaderboardHeader, LeaderboardItem};
use crate::suite::{RulerTask, wilson_mean};

/// The table of `items` (one run's, or merged shards').
pub fn build_table(header: &LeaderboardHeader, items: &[LeaderboardItem]) -> LeaderboardTable {
    let mut tasks: Vec<String> = Vec::new();
    for it in items {
        if !tasks.contains(&it.task) {
            tasks.push(it.task.clone());
        }
    }
    let configs = header.configs.len();
    let mut cells = Vec::new();
    for task in &tasks {
        let of_task: Vec<&LeaderboardItem> = items.iter().filter(|i| &i.task == task).collect();
        cells.extend((0..configs).map(|c| cell(task, c, &of_task)));
    }
    let all: Vec<&LeaderboardItem> = items.iter().collect();
    for c in 0..configs {
        let mut cell = cell("all", c, &all);
        // kvpress's average: the mean of the tasks' scores
        let per_task: Vec<&LeaderboardCell> = cells.iter().filter(|x| x.config == c).collect();
        if !per_task.is_empty() {
            let k = per_task.len() as f64;
            cell.score = per_task.iter().map(|x| x.score).sum::<f64>() / k;
            cell.full_score = per_task.iter().map(|x| x.full_score).sum::<f64>() / k;
            cell.ci95 = wilson_mean(cell.score, cell.n);
        }
        cells.push(cell);
    }
    let ruler = !tasks.is_empty() && tasks.iter().all(|t| RulerTask::parse(t).is_ok());
    let length = items
        .first()
        .and_then(|i| i.results.first())
        .map(|r| r.length.clone())
        .unwrap_or_default();
    let t = &header.timing;
    LeaderboardTable {
        dataset: if ruler {
            "ruler".into()
        } else {
            suite_name(&header.suite)
        },
        data_dir: label_tokens(&length).map_or(length, |n| n.to_string()),
        model: header.model.clone(),
        suite: header.suite.clone(),
        dtype: header.dtype.clone(),
        ratios: header.ratios.clone(),
        configs: header.configs.clone(),
        tasks,
        cells,
        items: items.len(),
        seconds: items
            .iter()
            .filter_map(|i| i.results.first())
            .map(|r| r.seconds)
            .sum(),
        notes: vec![
            "Score: RULER's string_match_all (the share of the reference strings found in the \
             answer, case-insensitive), string_match_part for qa_* (any one found); other \
             suites' rules count 1 or 0. `all` is the mean of the tasks' scores, as kvpress \
             averages them."
                .into(),
            "Interval: 95% Wilson interval at the mean score over the items (conservative for \
             partial scores, whose variance is at most p(1-p))."
                .into(),
            "K/V held: measured at the end of each policy's run teacher-forced on the full \
             model's answer; prompt K/V removed: the bytes full holds beyond the policy over \
             the context's bytes at full depth."
                .into(),
            format!(
                "Timing: the first {} item(s) of {}, the full model then each policy \
                 alone, {} new tokens, {} round(s); TTFT and TPOT ratios are medians over \
                 those items of the policy's over full's; prefill FLOPs are predicted from \
                 the tokens each layer ran.",
                t.items_per_task,
                match t.tasks.is_empty() {
                    true => "each task".to_string(),
                    false => format!("task(s) {} (the others are not timed)", t.tasks.join(", ")),
                },
                t.new_tokens,
                t.rounds
            ),
        ]
        .into_iter()
        .chain(super::left_out_lines(&header.left_out))
        .chain(crate::made_by::mixed_note(
            items.iter().map(|i| i.made_by.as_ref()),
        ))
        .collect(),
    }
}

/// One configuration's cell over `items`.
fn cell(task: &str, c: usize, items: &[&LeaderboardItem]) -> LeaderboardCell {
    let n = items.len();
    let mean = |f: &dyn Fn(&LeaderboardItem) -> f64| {
        if n == 0 {
            0.0
        } else {
            items.iter().map(|i| f(i)).sum::<f64>() / n as f64
        }
    };
    let score = mean(&|i| i.results[c].score());
    let timed: Vec<&LeaderboardItem> = items
        .iter()
        .copied()
        .filter(|i| i.timing.len() > c && !i.timing.is_empty())
        .collect();
    let ratio_of = |f: fn(&super::ItemTiming) -> f64| {
        (!timed.is_empty()).then(|| {
            median(
                timed
                    .iter()
                    .map(|i| f(&i.timing[c]) / f(&i.timing[0]).max(f64::MIN_POSITIVE))
                    .collect(),
            )
        })
    };
    LeaderboardCell {
        task: task.to_string(),
        config: c,
        n,
        score,
        ci95: wilson_mean(score, n),
        full_score: mean(&|i| i.results[c].full_score()),
        kv_bytes_held: mean(&|i| i.results[c].kv_bytes_held as f64),
        kv_bytes_full: mean(&|i| i.results[c].kv_bytes_full as f64),
        prompt_kv_removed: mean(&|i| {
            let r = &i.results[c];
            (r.kv_bytes_full as f64 - r.kv_bytes_held as f64) / (i.context_kv_bytes.max(1) as f64)
        }),
        timed: timed.len(),
        ttft_ratio: ratio_of(|t| t.ttft_s),
        tpot_ratio: ratio_of(|t| t.tpot_s),
        prefill_flops_ratio: (!timed.is_empty()).then(|| {
            median(
                timed
                    .iter()
                    .map(|i| i.timing[c].prefill_flops_ratio)
                    .collect(),
            )
        }),
    }
}

/// `runs/ruler-4k.jsonl` -> `ruler-4k`.
fn suite_name(path: &str) -> String {
    std::path::Path::new(path)
        .file_stem()
        .map_or_else(|| path.to_string(), |s| s.to_string_lossy().into_owned())
}

/// `4k` -> 4096, `1000` -> 1000.
fn label_tokens(label: &str) -> Option<usize> {
    match label.strip_suffix('k') {
        Some(k) => k.parse::<usize>().ok().map(|k| k * 1024),
        None => label.parse().ok(),
    }
}
