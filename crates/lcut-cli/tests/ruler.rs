//! `lcut suite --ruler` and the leaderboard run `lcut eval --suite ...
//! --ratios ...` end to end on the bundled copy model (a 448-token RULER
//! suite, the model's context being 512): the suite written in chat form
//! within the target, every method mapped at every ratio, the CSV in
//! kvpress's columns, a rerun resuming from the journal, shards merged
//! into the unsharded run, and bad input named before any work.

#![allow(clippy::unwrap_used)] // test helpers unwrap like the tests do

use std::path::Path;
use std::process::{Command, Output};

use lcut_engine::leaderboard::LeaderboardRun;
use lcut_engine::suite::{Scoring, read_suite};
use lcut_trace::{LeaderboardPairs, PairTest};

const MODEL: &str = "fixtures/models/copy-full";

fn lcut(args: &[&str]) -> Output {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lcut"));
    cmd.args(args).current_dir(repo);
    for var in [
        "SLURM_ARRAY_TASK_ID",
        "SLURM_ARRAY_TASK_MIN",
        "JOB_COMPLETION_INDEX",
    ] {
        cmd.env_remove(var);
    }
    cmd.output().expect("lcut runs")
}

fn ok(args: &[&str]) -> String {
    let out = lcut(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "lcut {args:?} failed: {stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn fails(args: &[&str], parts: &[&str]) {
    let out = lcut(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "lcut {args:?} succeeded");
    for p in parts {
        assert!(stderr.contains(p), "lcut {args:?}: {p:?} not in {stderr}");
    }
}

/// The paired comparisons of the run in `dir`.
fn read_pairs(dir: &Path) -> LeaderboardPairs {
    let text = std::fs::read_to_string(dir.join("leaderboard-pairs.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The run in `dir`, wall times zeroed (they differ from run to run).
/// The test's leaderboard run of `suite` into `out`: four methods at two
/// ratios, short answers and timings.
fn leaderboard_args<'a>(suite: &'a str, out: &'a str) -> Vec<&'a str> {
    vec![
        "eval",
        "--model",
        MODEL,
        "--suite",
        suite,
        "--policies",
        "full,speed+bos,slim+block:16,swiftkv",
        "--ratios",
        "0.25,0.75",
        "--max-new-tokens",
        "4",
        "--timing-tokens",
        "3",
        "--out",
        out,
    ]
}

fn read_run(dir: &Path) -> LeaderboardRun {
    let text = std::fs::read_to_string(dir.join("leaderboard.json")).unwrap();
    let mut run: LeaderboardRun = serde_json::from_str(&text).unwrap();
    run.table.seconds = 0.0;
    for it in &mut run.items {
        for r in &mut it.results {
            r.seconds = 0.0;
        }
        for t in &mut it.timing {
            t.ttft_s = 0.0;
            t.tpot_s = 0.0;
        }
    }
    for c in &mut run.table.cells {
        c.ttft_ratio = None;
        c.tpot_ratio = None;
    }
    run
}

#[test]
fn ruler_suite_then_the_leaderboard_run() {
    let tmp = tempfile::tempdir().unwrap();
    let path = |name: &str| tmp.path().join(name).to_str().unwrap().to_string();
    let suite = path("ruler.jsonl");
    let stdout = ok(&[
        "suite",
        "--ruler",
        "448",
        "--model",
        MODEL,
        "--samples",
        "2",
        "--tasks",
        "niah_single_1,vt,qa_1",
        "--seed",
        "5",
        "--out",
        &suite,
    ]);
    assert!(
        stdout.contains("wrote 6 RULER items (chat form)"),
        "{stdout}"
    );
    let items = read_suite(Path::new(&suite)).unwrap();
    assert_eq!(items.len(), 6);
    for it in &items {
        assert!(
            it.question.is_some() && it.answer_prefix.is_some(),
            "{}",
            it.id
        );
        assert!(!it.completion);
        let rule = if it.kind == "qa_1" {
            Scoring::StringMatchPart
        } else {
            Scoring::StringMatchAll
        };
        assert_eq!(it.scoring, rule);
        assert_eq!(it.length, "448");
    }
    // the same seed writes the same file
    let again = path("again.jsonl");
    ok(&[
        "suite",
        "--ruler",
        "448",
        "--model",
        MODEL,
        "--samples",
        "2",
        "--tasks",
        "niah_single_1,vt,qa_1",
        "--seed",
        "5",
        "--out",
        &again,
    ]);
    assert_eq!(
        std::fs::read(&suite).unwrap(),
        std::fs::read(&again).unwrap()
    );

    let run = |out: &str, extra: &[&str]| {
        let mut a = leaderboard_args(&suite, out);
        a.extend_from_slice(extra);
        ok(&a)
    };
    let whole = path("whole");
    let stdout = run(&whole, &[]);
    assert!(
        stdout.contains("speed+bos") && stdout.contains("score="),
        "{stdout}"
    );
    let r = read_run(Path::new(&whole));
    // full, then each method at each ratio; SPEED's cut closest to the ratio
    let policies: Vec<&str> = r.header.configs.iter().map(|c| c.policy.as_str()).collect();
    assert_eq!(policies[0], "full");
    assert!(
        policies.contains(&"speed:3+bos") && policies.contains(&"speed:1+bos"),
        "{policies:?}"
    );
    assert!(
        policies.contains(&"swiftkv:3") && policies.contains(&"swiftkv:1"),
        "{policies:?}"
    );
    assert_eq!(r.header.configs.len(), 1 + 3 * 2);
    assert_eq!(r.items.len(), 6);
    // the first item of each task timed, every configuration
    assert_eq!(r.items.iter().filter(|i| !i.timing.is_empty()).count(), 3);
    for it in &r.items {
        assert_eq!(it.results.len(), 7);
        assert!(it.context_tokens < it.prompt_tokens, "{}", it.id);
    }
    // measured K/V: SPEED at 1 of 4 layers removes about 3/4 of the
    // prompt's, SwiftKV none
    let removed = |policy: &str| {
        let c = r
            .header
            .configs
            .iter()
            .position(|c| c.policy == policy)
            .unwrap();
        r.table.cell("all", c).unwrap().prompt_kv_removed
    };
    assert!(
        (removed("speed:1+bos") - 0.75).abs() < 0.02,
        "{}",
        removed("speed:1+bos")
    );
    assert_eq!(removed("swiftkv:1"), 0.0);
    assert_eq!(removed("full"), 0.0);
    // the CSV: kvpress's columns first, the full model as no_press at 0
    let csv = std::fs::read_to_string(Path::new(&whole).join("leaderboard.csv")).unwrap();
    let mut lines = csv.lines();
    let header = lines.next().unwrap();
    assert!(
        header.starts_with("dataset,data_dir,model,method,compression_ratio,score,task,policy"),
        "{header}"
    );
    let first = lines.next().unwrap();
    assert!(
        first.starts_with(&format!("ruler,448,{MODEL},no_press,0.000,")),
        "{first}"
    );
    assert_eq!(csv.lines().count(), 1 + 7 * 4, "{csv}");
    let html = std::fs::read_to_string(Path::new(&whole).join("leaderboard.html")).unwrap();
    assert!(
        html.contains("<svg") && html.contains("niah_single_1"),
        "html"
    );
    // every pair at each ratio (the full model and three methods: six
    // pairs) compared on all six items, each pair's test named
    let pairs = read_pairs(Path::new(&whole));
    assert_eq!(pairs.groups(), ["0.25", "0.75"]);
    assert_eq!(pairs.pairs.len(), 2 * 6);
    for p in &pairs.pairs {
        assert_eq!((p.n, p.only_a, p.only_b), (6, 0, 0), "{p:?}");
        assert_ne!(p.test, PairTest::None);
        assert!(p.p_holm.unwrap() >= p.p.unwrap(), "{p:?}");
    }
    assert!(html.contains("Which methods beat which"), "html");
    let csv = std::fs::read_to_string(Path::new(&whole).join("leaderboard-pairs.csv")).unwrap();
    assert!(
        csv.starts_with("ratio,method_a,policy_a,method_b,policy_b,test,n,only_a,only_b,"),
        "{csv}"
    );
    assert_eq!(csv.lines().count(), 1 + 12);
    assert!(
        stdout.contains("ratio 0.25: ") && stdout.contains("pairs told apart"),
        "{stdout}"
    );

    // a rerun resumes: every item is in the journal, nothing runs again
    let journal = std::fs::read_to_string(Path::new(&whole).join("items.jsonl")).unwrap();
    let rerun = lcut(&leaderboard_args(&suite, &whole));
    assert!(rerun.status.success());
    assert!(String::from_utf8_lossy(&rerun.stderr).contains("resuming: 6 of 6"));
    let after = std::fs::read_to_string(Path::new(&whole).join("items.jsonl")).unwrap();
    assert_eq!(after, journal);
    // every item names the build and instruction-set level that made it,
    // one for all, so the table has no note of several
    let items: Vec<serde_json::Value> = journal
        .lines()
        .skip(1)
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let made = &items[0]["made_by"];
    assert!(
        made["build"]
            .as_str()
            .is_some_and(|b| b.starts_with("lcut "))
            && made["isa"].as_str().is_some(),
        "{made}"
    );
    assert!(items.iter().all(|i| &i["made_by"] == made));
    assert!(!String::from_utf8_lossy(&rerun.stderr).contains("another build"));
    assert!(!String::from_utf8_lossy(&rerun.stdout).contains("Made by"));
    assert!(!r.table.notes.iter().any(|n| n.starts_with("Made by")));
    // a journal one of whose items another build made: the resume says so,
    // and so does the table
    let mut edited = journal.lines().map(str::to_string).collect::<Vec<_>>();
    let mut first: serde_json::Value = serde_json::from_str(&edited[1]).unwrap();
    first["made_by"]["build"] = "lcut 0.0.0 0123456789abcdef".into();
    edited[1] = first.to_string();
    std::fs::write(
        Path::new(&whole).join("items.jsonl"),
        edited.join("\n") + "\n",
    )
    .unwrap();
    let mixed = lcut(&leaderboard_args(&suite, &whole));
    assert!(mixed.status.success());
    let said = String::from_utf8_lossy(&mixed.stderr);
    assert!(
        said.contains("1 of the 6 items already journaled were made by another build"),
        "{said}"
    );
    let printed = String::from_utf8_lossy(&mixed.stdout);
    assert!(printed.contains("Made by 2 builds"), "{printed}");
    let notes = read_run(Path::new(&whole)).table.notes;
    assert!(
        notes
            .iter()
            .any(|n| n.starts_with("Made by 2 builds") && n.contains("1 by lcut 0.0.0")),
        "{notes:?}"
    );
    std::fs::write(Path::new(&whole).join("items.jsonl"), &journal).unwrap();
    // ... and an interrupted one: a cut last line is dropped and redone
    let lines: Vec<&str> = journal.lines().collect();
    let cut = format!(
        "{}\n{}",
        lines[..lines.len() - 1].join("\n"),
        &lines[lines.len() - 1][..40]
    );
    std::fs::write(Path::new(&whole).join("items.jsonl"), cut).unwrap();
    let stdout = run(&whole, &[]);
    assert!(stdout.contains("score="));
    assert_eq!(read_run(Path::new(&whole)), r);
    // other settings in the same folder are refused by name
    fails(
        &[
            "eval",
            "--model",
            MODEL,
            "--suite",
            &suite,
            "--policies",
            "full,speed+bos",
            "--ratios",
            "0.5",
            "--out",
            &whole,
        ],
        &["other settings", "configs"],
    );

    // a run refused before its first item leaves no folder and no journal
    let refused = path("refused");
    fails(
        &[
            "eval",
            "--model",
            MODEL,
            "--suite",
            &suite,
            "--policies",
            "full,speed+bos",
            "--ratios",
            "0.5",
            "--max-new-tokens",
            "100000",
            "--out",
            &refused,
        ],
        &["the model cannot run 6 of the 6 item(s)", "nothing was run"],
    );
    assert!(
        !Path::new(&refused).exists(),
        "a refused run wrote {refused}"
    );

    // shards merge into the unsharded run
    let (s0, s1) = (path("s0"), path("s1"));
    run(&s0, &["--shard", "0/2"]);
    run(&s1, &["--shard", "1/2"]);
    let merged = path("merged");
    ok(&["eval-merge", &s0, &s1, "--out", &merged]);
    assert_eq!(read_run(Path::new(&merged)), r);
    // the merged run keeps every item's score under every configuration,
    // keyed by its id, so the pairs are the unsharded run's
    assert_eq!(read_pairs(Path::new(&merged)), pairs);
    // an item missing, or in two shards, is named
    fails(
        &["eval-merge", &s0, "--out", &path("half")],
        &[
            "3 of the suite's 6 items are in no shard (positions 1, 3, 5)",
            "a shard missing or unfinished?",
        ],
    );
    let first = &read_run(Path::new(&s0)).items[0];
    fails(
        &["eval-merge", &s0, &s1, &s0, "--out", &path("twice")],
        &[
            &format!("item 0 ({}) is in both {s0} and {s0}", first.id),
            "a shard given twice?",
        ],
    );
    assert!(!Path::new(&path("half")).exists() && !Path::new(&path("twice")).exists());
    // a run not finished: its journals' items so far, marked partial
    let partial = path("partial");
    let stdout = ok(&["eval-merge", "--partial", &s0, "--out", &partial]);
    assert!(
        stdout.contains("the 3 items of 1 journals (of the suite's 6)"),
        "{stdout}"
    );
    let p = read_run(Path::new(&partial));
    let of_s0: Vec<usize> = read_run(Path::new(&s0))
        .items
        .iter()
        .map(|i| i.index)
        .collect();
    assert_eq!(p.items.iter().map(|i| i.index).collect::<Vec<_>>(), of_s0);
    assert!(
        p.table.notes[0].starts_with("Partial: 3 of the suite's 6 items"),
        "{:?}",
        p.table.notes
    );
    // both journals: the whole run's table
    ok(&["eval-merge", "--partial", &s0, &s1, "--out", &partial]);
    assert_eq!(read_run(Path::new(&partial)).table, r.table);
    fails(
        &["eval-merge", "--partial", &s0, &s0, "--out", &partial],
        &["is in both", "a shard given twice?"],
    );
    fails(
        &[
            "eval-merge",
            "--partial",
            &path("nowhere"),
            "--out",
            &partial,
        ],
        &["no journal here"],
    );
}

#[test]
fn bad_input_is_named_before_any_work() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("x.jsonl");
    let out = out.to_str().unwrap();
    fails(
        &["suite", "--ruler", "4k", "--model", MODEL, "--out", out],
        &["RULER length 4096", "context of 512"],
    );
    fails(
        &[
            "suite",
            "--ruler",
            "448",
            "--model",
            MODEL,
            "--tasks",
            "niah_single_9",
            "--out",
            out,
        ],
        &["unknown RULER task \"niah_single_9\"", "niah_multikey_3"],
    );
    fails(
        &[
            "suite", "--ruler", "200", "--model", MODEL, "--tasks", "cwe", "--out", out,
        ],
        &["too short for cwe"],
    );
    assert!(!Path::new(out).exists(), "a refused run wrote its file");
    let suite = tmp.path().join("s.jsonl");
    let suite = suite.to_str().unwrap();
    ok(&[
        "suite",
        "--ruler",
        "448",
        "--model",
        MODEL,
        "--samples",
        "1",
        "--tasks",
        "fwe",
        "--out",
        suite,
    ]);
    let dir = tmp.path().join("run");
    let dir = dir.to_str().unwrap();
    let eval = |policies: &str, ratios: &str| {
        vec![
            "eval".to_string(),
            "--model".into(),
            MODEL.into(),
            "--suite".into(),
            suite.into(),
            "--policies".into(),
            policies.into(),
            "--ratios".into(),
            ratios.into(),
            "--out".into(),
            dir.into(),
        ]
    };
    let strs = |v: &[String]| {
        v.iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join("\u{1}")
    };
    for (p, r, parts) in [
        ("full,speed+bos", "0.5,1.5", vec!["1.5", "outside (0, 1)"]),
        ("full,speed+bos", "0", vec!["outside (0, 1)"]),
        ("full,speed+bos", "half", vec!["\"half\" is not a number"]),
        ("full,h2o", "0.5", vec!["h2o", "speed, selfonly"]),
        ("full", "0.5", vec!["at least one method"]),
    ] {
        let a = eval(p, r);
        let joined = strs(&a);
        let args: Vec<&str> = joined.split('\u{1}').collect();
        fails(&args, &parts);
    }
    let mut timing = eval("full,speed+bos", "0.5");
    timing.extend(["--timing-tasks".into(), "fwe,vt".into()]);
    let joined = strs(&timing);
    let args: Vec<&str> = joined.split('\u{1}').collect();
    fails(
        &args,
        &["--timing-tasks", "no item of task \"vt\"", "its tasks: fwe"],
    );
    assert!(!Path::new(dir).exists(), "a refused run made its folder");
}
