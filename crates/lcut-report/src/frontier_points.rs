//! Accuracy against the K/V a policy holds: one point per policy (its
//! accuracy over a suite with its 95% interval, and its K/V held as a share
//! of the full model's, measured), grouped in families (SPEED+BoS, kept
//! heads, SwiftKV/POP, SlimInfer, each press), read from `lcut eval --json`
//! results, a leaderboard run (`lcut eval --ratios`, whose x can also be
//! the compression ratio) or a paper's table. The HTML report, `lcut
//! frontier`, `lcut paper` and the viewer draw it.

use std::path::Path;

use lcut_policy::{Anchors, PolicyKind, PolicySpec};
use lcut_trace::{CategoryRow, LeaderboardTable, TraceError, read_json};
use serde::{Deserialize, Serialize};

/// What a frontier's x axis measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FrontierAxis {
    /// K/V held as a share of the full model's, measured.
    KvHeld,
    /// kvpress's compression ratio: the share of the prompt's K/V removed.
    CompressionRatio,
}

impl FrontierAxis {
    /// The axis title.
    pub fn label(self) -> &'static str {
        match self {
            Self::KvHeld => "K/V held (share of full, measured)",
            Self::CompressionRatio => "compression ratio (share of prompt K/V removed)",
        }
    }
}

/// One policy on a frontier.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FrontierPoint {
    /// Its family ([`family_of`]): one series per family.
    pub family: String,
    /// The policy as run.
    pub policy: String,
    /// Its x: K/V held of full, or the compression ratio.
    pub x: f64,
    /// Accuracy (or mean score) in [0, 1].
    pub accuracy: f64,
    /// 95% interval of the accuracy.
    pub ci95: [f64; 2],
    /// Items scored.
    pub n: usize,
    /// Of the items the full model answers right, how many it still does.
    pub kept_of_full: Option<usize>,
    /// Items the full model answers right.
    pub full_correct: Option<usize>,
}

/// Points of several policies on one axis; the full model's accuracy is a
/// reference line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Frontier {
    /// What x measures.
    pub axis: FrontierAxis,
    /// The points of every policy but the full model, in the order read.
    pub points: Vec<FrontierPoint>,
    /// The full model's accuracy, when a result holds it.
    pub full_accuracy: Option<f64>,
    /// The suite (or task) the accuracies are over.
    pub over: String,
}

/// The family a policy belongs to on a frontier: `SPEED+BoS` (and `SPEED`
/// or `SPEED+anchors` for other anchors), `kept heads` for SPEED with
/// kept (layer, K/V head) pairs, `SwiftKV/POP`, `SlimInfer`, `full`, a
/// press by its name (`press: knorm`), else the policy's name before `:`.
pub fn family_of(policy: &str) -> String {
    let Ok(spec) = policy.parse::<PolicySpec>() else {
        return match policy.split_once(':') {
            Some((name, _)) => name.to_string(),
            None => policy.to_string(),
        };
    };
    match spec.kind {
        PolicyKind::Full => "full".into(),
        PolicyKind::Speed if spec.heads.is_some() => "kept heads".into(),
        PolicyKind::Speed => match spec.anchors {
            Anchors::Bos => "SPEED+BoS".into(),
            Anchors::None => "SPEED".into(),
            _ => "SPEED+anchors".into(),
        },
        PolicyKind::Projected(_) => "SwiftKV/POP".into(),
        PolicyKind::Slim => "SlimInfer".into(),
        PolicyKind::Press(_) => {
            let name = policy.split(':').next().unwrap_or(policy);
            format!("press: {name}")
        }
        _ => policy.split(':').next().unwrap_or(policy).to_string(),
    }
}

/// The file a leaderboard run's folder holds its result in.
pub const LEADERBOARD_FILE: &str = "leaderboard.json";

/// The part of a leaderboard run's result a frontier needs.
#[derive(Debug, Deserialize)]
struct LeaderboardResult {
    table: LeaderboardTable,
}

/// The table of a leaderboard run at `path` (its folder, or its
/// leaderboard.json); `None` for a file that is not one.
fn leaderboard_at(path: &Path) -> Result<Option<LeaderboardTable>, TraceError> {
    let file = match path.is_dir() {
        true => path.join(LEADERBOARD_FILE),
        false => path.to_path_buf(),
    };
    let value: serde_json::Value = read_json(&file, "lcut eval result")?;
    if value.get("header").is_none() || value.get("table").is_none() {
        return Ok(None);
    }
    let run: LeaderboardResult =
        serde_json::from_value(value).map_err(|source| TraceError::Json {
            path: file,
            what: "leaderboard run",
            source,
        })?;
    Ok(Some(run.table))
}

/// The parts of an `lcut eval --suite ... --json` result a frontier needs.
#[derive(Debug, Deserialize)]
struct EvalResult {
    policy: String,
    suite: String,
    scores: Vec<EvalGroup>,
}

#[derive(Debug, Deserialize)]
struct EvalGroup {
    group: String,
    n: usize,
    accuracy: f64,
    ci95: [f64; 2],
    full_correct: usize,
    kept_of_full: usize,
    kv_ratio: f64,
}

impl Frontier {
    /// The frontier of `paths` on `axis`: one leaderboard run (its folder
    /// or leaderboard.json; `task` picks a task or `all`), or `lcut eval
    /// --suite ... --json` results (K/V held only). Bad input is refused by
    /// name: a leaderboard beside other files, the ratio axis without a
    /// leaderboard, a task the run does not have.
    pub fn read(
        paths: &[impl AsRef<Path>],
        axis: FrontierAxis,
        task: &str,
    ) -> Result<Self, TraceError> {
        let Some(first) = paths.first().map(|p| p.as_ref()) else {
            return Err(TraceError::invalid("frontier", "no results given"));
        };
        if let Some(table) = leaderboard_at(first)? {
            let context = first.display().to_string();
            if paths.len() > 1 {
                return Err(TraceError::invalid(
                    context,
                    "a leaderboard run is drawn alone (its table holds every method)",
                ));
            }
            if task != "all" && !table.tasks.iter().any(|t| t == task) {
                return Err(TraceError::invalid(
                    context,
                    format!("no task {task:?} (it has {})", table.tasks.join(", ")),
                ));
            }
            return Ok(Self::from_leaderboard(&table, task, axis));
        }
        if axis == FrontierAxis::CompressionRatio {
            return Err(TraceError::invalid(
                first.display().to_string(),
                "the compression ratio axis needs a leaderboard run (`lcut eval --ratios`); \
                 eval results hold the K/V held only",
            ));
        }
        Self::from_eval_files(paths)
    }

    /// The frontier of `lcut eval --suite ... --json` results (one policy
    /// each), on the K/V held axis over all items; a file that is no such
    /// result, or results of different suites, are refused by name.
    pub fn from_eval_files(paths: &[impl AsRef<Path>]) -> Result<Self, TraceError> {
        let mut frontier = Self {
            axis: FrontierAxis::KvHeld,
            points: Vec::new(),
            full_accuracy: None,
            over: String::new(),
        };
        for path in paths {
            let path = path.as_ref();
            let result: EvalResult = read_json(path, "lcut eval result")?;
            let invalid = |reason: String| TraceError::invalid(path.display().to_string(), reason);
            let all = result
                .scores
                .iter()
                .find(|g| g.group == "all")
                .ok_or_else(|| invalid("no score over all items".into()))?;
            if frontier.over.is_empty() {
                frontier.over = result.suite.clone();
            } else if frontier.over != result.suite {
                return Err(invalid(format!(
                    "scored on {}, the others on {}",
                    result.suite, frontier.over
                )));
            }
            let family = family_of(&result.policy);
            if family == "full" {
                frontier.full_accuracy = Some(all.accuracy);
                continue;
            }
            frontier.points.push(FrontierPoint {
                family,
                policy: result.policy,
                x: all.kv_ratio,
                accuracy: all.accuracy,
                ci95: all.ci95,
                n: all.n,
                kept_of_full: Some(all.kept_of_full),
                full_correct: Some(all.full_correct),
            });
        }
        Ok(frontier)
    }

    /// The frontier of a leaderboard run over `task` (`all` for the mean of
    /// the tasks): one family per method as written, x the compression
    /// ratio or the K/V held.
    pub fn from_leaderboard(t: &LeaderboardTable, task: &str, axis: FrontierAxis) -> Self {
        let points = (0..t.configs.len())
            .filter(|&c| t.configs[c].family != "full")
            .filter_map(|c| {
                let cell = t.cell(task, c)?;
                let x = match axis {
                    FrontierAxis::CompressionRatio => t.compression_ratio(c),
                    FrontierAxis::KvHeld => {
                        cell.kv_bytes_held / cell.kv_bytes_full.max(f64::MIN_POSITIVE)
                    }
                };
                Some(FrontierPoint {
                    family: t.configs[c].method.clone(),
                    policy: t.configs[c].policy.clone(),
                    x,
                    accuracy: cell.score,
                    ci95: cell.ci95,
                    n: cell.n,
                    kept_of_full: None,
                    full_correct: None,
                })
            })
            .collect();
        Self {
            axis,
            points,
            full_accuracy: t.cell(task, 0).map(|c| c.score),
            over: task.to_string(),
        }
    }

    /// The frontier of a paper's table (`lcut paper`): its rows over all
    /// items, on the K/V held axis; a row run with an adapter is a family
    /// of its own (`SPEED+BoS + adapter`).
    pub fn from_paper_table(rows: &[CategoryRow], over: &str) -> Self {
        let mut frontier = Self {
            axis: FrontierAxis::KvHeld,
            points: Vec::new(),
            full_accuracy: None,
            over: over.to_string(),
        };
        for row in rows.iter().filter(|r| r.group == "all") {
            let family = family_of(&row.policy);
            if family == "full" && row.adapter.is_none() {
                frontier.full_accuracy = Some(row.accuracy);
                continue;
            }
            frontier.points.push(FrontierPoint {
                family: match row.adapter {
                    Some(_) => format!("{family} + adapter"),
                    None => family,
                },
                policy: row.policy.clone(),
                x: row.kv_ratio,
                accuracy: row.accuracy,
                ci95: row.ci95,
                n: row.n,
                kept_of_full: None,
                full_correct: Some(row.full_correct),
            });
        }
        frontier
    }

    /// The families in order of first appearance.
    pub fn families(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for p in &self.points {
            if !out.contains(&p.family.as_str()) {
                out.push(&p.family);
            }
        }
        out
    }

    /// The points of `family`, by x (ties by accuracy, highest first).
    pub fn series(&self, family: &str) -> Vec<&FrontierPoint> {
        let mut out: Vec<&FrontierPoint> =
            self.points.iter().filter(|p| p.family == family).collect();
        out.sort_by(|a, b| a.x.total_cmp(&b.x).then(b.accuracy.total_cmp(&a.accuracy)));
        out
    }

    /// The family's frontier: the points more accurate than every point of
    /// the family that holds no more K/V (at a smaller or equal K/V held, or
    /// a larger or equal compression ratio), by x; the others are dominated.
    pub fn envelope(&self, family: &str) -> Vec<&FrontierPoint> {
        let mut series = self.series(family);
        if self.axis == FrontierAxis::CompressionRatio {
            // more compression holds less: walk from the largest ratio
            series.sort_by(|a, b| b.x.total_cmp(&a.x).then(b.accuracy.total_cmp(&a.accuracy)));
        }
        let mut best = f64::NEG_INFINITY;
        let mut on: Vec<&FrontierPoint> = series
            .into_iter()
            .filter(|p| {
                let on = p.accuracy > best;
                best = best.max(p.accuracy);
                on
            })
            .collect();
        on.sort_by(|a, b| a.x.total_cmp(&b.x));
        on
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_fall_in_their_families() {
        for (policy, family) in [
            ("full", "full"),
            ("speed:22+bos", "SPEED+BoS"),
            ("speed:22", "SPEED"),
            ("speed:20+bos+heads:6", "kept heads"),
            ("speed:19+bos+heads:runs/x/heads-kv0.75.json", "kept heads"),
            ("swiftkv:22+bos", "SwiftKV/POP"),
            ("pop:22", "SwiftKV/POP"),
            ("slim:9@64.29%", "SlimInfer"),
            ("knorm:0.25", "press: knorm"),
            ("streamingllm:0.25", "press: streamingllm"),
        ] {
            assert_eq!(family_of(policy), family, "{policy}");
        }
    }

    #[test]
    fn the_envelope_drops_the_points_another_beats_at_no_more_kv() {
        let point = |x: f64, accuracy: f64| FrontierPoint {
            family: "kept heads".into(),
            policy: format!("{x}/{accuracy}"),
            x,
            accuracy,
            ci95: [0.0, 1.0],
            n: 10,
            kept_of_full: None,
            full_correct: None,
        };
        let f = Frontier {
            axis: FrontierAxis::KvHeld,
            points: vec![
                point(0.75, 0.39),
                point(0.70, 0.38),
                point(0.75, 0.60),
                point(0.79, 0.50),
                point(0.81, 0.65),
            ],
            full_accuracy: None,
            over: String::new(),
        };
        let on: Vec<(f64, f64)> = f
            .envelope("kept heads")
            .iter()
            .map(|p| (p.x, p.accuracy))
            .collect();
        assert_eq!(on, vec![(0.70, 0.38), (0.75, 0.60), (0.81, 0.65)]);
        assert_eq!(f.series("kept heads").len(), 5);
        // on the ratio axis more x holds less: the most compressed plan is
        // also the most accurate and beats every other
        let f = Frontier {
            axis: FrontierAxis::CompressionRatio,
            ..f
        };
        let on: Vec<(f64, f64)> = f
            .envelope("kept heads")
            .iter()
            .map(|p| (p.x, p.accuracy))
            .collect();
        assert_eq!(on, vec![(0.81, 0.65)]);
    }

    fn eval_json(policy: &str, suite: &str, accuracy: f64, kv: f64) -> String {
        format!(
            r#"{{"policy":"{policy}","suite":"{suite}","model":"m","items":[],"scores":[
            {{"group":"retrieval","n":4,"accuracy":0.0,"ci95":[0,1],"full_correct":1,"kept_of_full":0,"kv_ratio":0.1}},
            {{"group":"all","n":10,"accuracy":{accuracy},"ci95":[0.1,0.9],"full_correct":8,"kept_of_full":6,"kv_ratio":{kv}}}]}}"#
        )
    }

    #[test]
    fn eval_results_make_points_on_the_kv_axis() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: String| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        let files = [
            write("a.json", eval_json("full", "s.jsonl", 0.8, 1.0)),
            write("b.json", eval_json("speed:24+bos", "s.jsonl", 0.7, 0.81)),
            write("c.json", eval_json("speed:22+bos", "s.jsonl", 0.1, 0.75)),
            write("d.json", eval_json("knorm:0.25", "s.jsonl", 0.6, 0.76)),
        ];
        let f = Frontier::from_eval_files(&files).unwrap();
        assert_eq!(f.full_accuracy, Some(0.8));
        assert_eq!(f.families(), vec!["SPEED+BoS", "press: knorm"]);
        let speed = f.series("SPEED+BoS");
        // by x, the "all" group's figures
        assert_eq!(
            speed.iter().map(|p| (p.x, p.accuracy)).collect::<Vec<_>>(),
            vec![(0.75, 0.1), (0.81, 0.7)]
        );
        assert_eq!(
            (speed[0].kept_of_full, speed[0].full_correct),
            (Some(6), Some(8))
        );
        assert_eq!(f.envelope("SPEED+BoS").len(), 2);
        // another suite's result, or a file that is no result, is refused by name
        let other = write("e.json", eval_json("speed:20+bos", "t.jsonl", 0.1, 0.7));
        let err = Frontier::from_eval_files(&[&files[1], &other])
            .unwrap_err()
            .to_string();
        assert!(err.contains("e.json") && err.contains("t.jsonl"), "{err}");
        let junk = write("f.json", "{\"policy\": 3}".into());
        let err = Frontier::from_eval_files(&[junk]).unwrap_err().to_string();
        assert!(err.contains("f.json"), "{err}");
    }
}
