//! `lcut paper --quick` end to end on the bundled model: every part written
//! (or skipped with its note on a suite without retrieval items), a rerun
//! that skips what is done, a changed setting refused by name before any
//! work, bad input refused before any work, and two shards joined by
//! `lcut paper-merge` into the unsharded run's numbers.

#![allow(clippy::unwrap_used)] // test helpers unwrap like the tests do

use std::path::Path;
use std::process::{Command, Output};

use lcut_trace::{PaperPart, PaperReport};

fn lcut(args: &[&str]) -> Output {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    Command::new(env!("CARGO_BIN_EXE_lcut"))
        .args(args)
        .current_dir(repo)
        .env_remove("SLURM_ARRAY_TASK_ID")
        .env_remove("JOB_COMPLETION_INDEX")
        .output()
        .expect("lcut runs")
}

/// stdout and stderr of a run that must succeed.
fn ok(args: &[&str]) -> (String, String) {
    let out = lcut(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "lcut {args:?} failed: {stderr}");
    (String::from_utf8_lossy(&out.stdout).into_owned(), stderr)
}

/// stderr of a run that must fail.
fn fails(args: &[&str]) -> String {
    let out = lcut(args);
    assert!(!out.status.success(), "lcut {args:?} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn report(dir: &Path) -> PaperReport {
    serde_json::from_str(&std::fs::read_to_string(dir.join("paper.json")).unwrap()).unwrap()
}

/// The bytes of every part file of `dir`, by name.
fn part_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir.join("parts"))
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn quick_writes_every_part_resumes_and_refuses_other_settings() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("paper");
    let dir = out.to_str().unwrap();
    let (stdout, stderr) = ok(&["paper", "--quick", "--out", dir]);
    // the scored parts say what their largest item holds before they run
    for what in ["the largest retrieval item", "the table's largest item"] {
        assert!(
            stderr.contains(&format!("memory: {what} holds about")),
            "{what}: {stderr}"
        );
    }
    for part in PaperPart::ALL {
        assert!(
            stdout.contains(&format!("{}. {part}: written", part.number())),
            "{part}: {stdout}"
        );
    }
    let r = report(&out);
    assert!(
        r.parts
            .iter()
            .all(|p| p.written && p.command.contains("--quick"))
    );
    // the bundled model recommends no cut: the paper's 3/4 of the depth
    assert_eq!((r.cut, r.recommended), (3, Some(4)));
    assert_eq!(r.masses.len(), 2);
    assert!(!r.timing.is_empty() && !r.retrieval.is_empty() && !r.loops.is_empty());
    assert!(
        r.table
            .iter()
            .any(|row| row.policy == "speed:3+bos" && row.group == "retrieval")
    );
    for file in [
        "paper.html",
        "paper.md",
        "figures/1-masses-speed.svg",
        "csv/5-table.csv",
    ] {
        assert!(out.join(file).is_file(), "{file}");
    }
    let before = part_files(&out);

    // a rerun skips every part: nothing left to run, nothing rewritten
    let (stdout, stderr) = ok(&["paper", "--quick", "--out", dir]);
    assert!(stdout.contains("6. loops: written"), "{stdout}");
    for part in PaperPart::ALL {
        assert!(
            stderr.contains(&format!("{part}: 0 of ")),
            "{part} ran again: {stderr}"
        );
    }
    assert!(part_files(&out) == before, "a rerun rewrote its parts");

    // another setting is refused by name, before any work
    let err = fails(&["paper", "--quick", "--loop-tokens", "30", "--out", dir]);
    assert!(err.contains("loop_tokens: 24 -> 30"), "{err}");
    assert!(part_files(&out) == before);
}

#[test]
fn a_suite_without_retrieval_skips_figure_4_with_its_note() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let suite = std::fs::read_to_string(repo.join("fixtures/suites/copy.jsonl")).unwrap();
    let copy_only: String = suite
        .lines()
        .filter(|l| l.contains("\"kind\": \"copy\""))
        .map(|l| format!("{l}\n"))
        .collect();
    let path = tmp.path().join("copy-only.jsonl");
    std::fs::write(&path, copy_only).unwrap();
    let out = tmp.path().join("paper");
    let (stdout, _) = ok(&[
        "paper",
        "--quick",
        "--suite",
        path.to_str().unwrap(),
        "--parts",
        "retrieval,table",
        "--cut",
        "3",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(
        stdout.contains("4. retrieval: skipped: the suite has no `retrieval` items"),
        "{stdout}"
    );
    assert!(
        stdout.contains("5. table: written") && stdout.contains("1. masses: not run"),
        "{stdout}"
    );
    let md = std::fs::read_to_string(out.join("paper.md")).unwrap();
    assert!(
        md.contains("skipped: the suite has no `retrieval` items (its kinds: copy)"),
        "{md}"
    );
}

#[test]
fn bad_input_is_refused_before_any_work() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("paper");
    let dir = out.to_str().unwrap();
    let err = fails(&["paper", "--quick", "--max-len", "8k", "--out", dir]);
    assert!(
        err.contains("--max-len 8k") && err.contains("context of 512"),
        "{err}"
    );
    let err = fails(&["paper", "--quick", "--cut", "5", "--out", dir]);
    assert!(err.contains("--cut 5") && err.contains("speed:5"), "{err}");
    let err = fails(&["paper", "--quick", "--shard", "0/2", "--out", dir]);
    assert!(err.contains("--shard needs --cut"), "{err}");
    let err = fails(&["paper", "--quick", "--parts", "figures", "--out", dir]);
    assert!(err.contains("unknown part \"figures\""), "{err}");
    assert!(!out.exists(), "a refused run left {}", out.display());
}

#[test]
fn shards_merge_into_the_unsharded_run() {
    let tmp = tempfile::tempdir().unwrap();
    let path = |name: &str| tmp.path().join(name).to_str().unwrap().to_string();
    let skip_timing = "masses,layers,retrieval,table,loops";
    let base = ["paper", "--quick", "--cut", "3", "--parts", skip_timing];
    let with = |extra: &[&str]| -> Vec<String> {
        base.iter().chain(extra).map(|s| s.to_string()).collect()
    };
    let run = |args: Vec<String>| ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    run(with(&["--out", &path("whole")]));
    for i in 0..2 {
        let shard = format!("{i}/2");
        run(with(&["--shard", &shard, "--out", &path(&format!("s{i}"))]));
    }
    let (stdout, _) = ok(&[
        "paper-merge",
        &path("s1"),
        &path("s0"),
        "--out",
        &path("merged"),
    ]);
    assert!(stdout.contains("5. table: written"), "{stdout}");
    let (whole, merged) = (
        report(&tmp.path().join("whole")),
        report(&tmp.path().join("merged")),
    );
    assert_eq!(merged.table, whole.table);
    assert_eq!(merged.retrieval, whole.retrieval);
    assert_eq!(merged.loops, whole.loops);
    assert_eq!(merged.layers, whole.layers);
    assert_eq!(merged.masses, whole.masses);
    assert_eq!(merged.suite.shard, None);
    // a shard's commands make that shard again; the merged run's, the whole
    let shard = report(&tmp.path().join("s1"));
    assert!(
        shard
            .parts
            .iter()
            .all(|p| p.command.contains("--shard 1/2"))
    );
    assert!(merged.parts.iter().all(|p| !p.command.contains("--shard")));
    // a shard given twice or missing is refused
    let err = fails(&[
        "paper-merge",
        &path("s0"),
        &path("s0"),
        "--out",
        &path("bad"),
    ]);
    assert!(err.contains("given twice"), "{err}");
    let err = fails(&["paper-merge", &path("s0"), "--out", &path("bad")]);
    assert!(err.contains("1 of 2 shards"), "{err}");
}

/// On a Gemma 4 layout (a task model of the trainer's `gemma4:32/1`, its
/// last layer reading layer 2's K/V), `lcut paper` runs every part and
/// leaves out SwiftKV, whose projected K/V has no meaning in a layer that
/// stores none, saying so; `lcut eval --ratios` leaves out the presses the
/// same way and runs the rest (each had stopped at the first refused
/// policy, the paper after four of its six parts); a K/V budget's kept
/// heads are refused by name; and `lcut train-lora` trains an adapter on it.
#[test]
fn on_gemma4_what_its_layout_refuses_is_left_out_and_said() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("gemma4");
    let model_arg = model.to_str().unwrap();
    ok(&[
        "train",
        "--layout",
        "gemma4:32/1",
        "--out",
        model_arg,
        "--seed",
        "1",
        "--steps",
        "1",
        "--warmup",
        "1",
        "--batch-size",
        "4",
    ]);
    let paper = tmp.path().join("paper");
    let paper_arg = paper.to_str().unwrap();
    let suite = "fixtures/suites/copy.jsonl";
    let (_, stderr) = ok(&[
        "paper", "--model", model_arg, "--suite", suite, "--quick", "--cut", "3", "--out",
        paper_arg,
    ]);
    assert!(
        stderr.contains("left out on this model: swiftkv:3:")
            && stderr.contains("left out on this model: swiftkv:3+bos:")
            && stderr.contains("share K/V"),
        "{stderr}"
    );
    let r = report(&paper);
    for part in PaperPart::ALL {
        assert!(
            r.record(part).is_some_and(|p| p.written),
            "{part:?} not written"
        );
    }
    let md = std::fs::read_to_string(paper.join("paper.md")).unwrap();
    assert!(md.contains("selfonly:3+bos") && !md.contains("swiftkv"));
    let eval = tmp.path().join("eval");
    let eval_arg = eval.to_str().unwrap();
    // the leaderboard at ratio 0.5, its policies and folder to follow
    let grid = [
        "eval",
        "--model",
        model_arg,
        "--suite",
        suite,
        "--ratios",
        "0.5",
        "--timing-items",
        "0",
    ];
    let three = ["--policies", "full,speed+bos,snapkv", "--out", eval_arg];
    let (stdout, stderr) = ok(&[&grid[..], &three].concat());
    let said = "left out on this model: snapkv at 0.5: policy snapkv:0.5 does not run";
    assert!(
        stderr.contains(said) && stdout.contains(said),
        "{stderr}\n{stdout}"
    );
    let written = std::fs::read_to_string(eval.join("leaderboard.json")).unwrap();
    assert!(written.contains("\"left_out\"") && written.contains("speed:"));
    // nothing but the full model left: refused, naming why
    let none = tmp.path().join("none");
    let presses = [
        "--policies",
        "full,snapkv,tova",
        "--out",
        none.to_str().unwrap(),
    ];
    let err = fails(&[&grid[..], &presses].concat());
    assert!(
        err.contains("no method of --policies runs on this model besides full"),
        "{err}"
    );
    assert!(!none.exists());
    // a K/V budget's plans keep K/V heads, which the shared layer 3 does not
    // have: refused by name, from the model before the diagnosis and from a
    // report, with no head file written
    let diag = tmp.path().join("diag");
    let diag_arg = diag.to_str().unwrap();
    let prompts = "fixtures/prompts/copy.jsonl";
    let diagnose = [
        "diagnose",
        "--model",
        model_arg,
        "--prompts",
        prompts,
        "--max-new-tokens",
        "4",
        "--out",
        diag_arg,
    ];
    let err = fails(&[&diagnose[..], &["--kv-budget", "0.5"]].concat());
    assert!(
        err.contains("kept K/V heads (--kv-budget)") && err.contains("share K/V"),
        "{err}"
    );
    assert!(!diag.join("report.json").exists());
    let (stdout, _) = ok(&diagnose);
    // only layers 0-2 store K/V (layer 3 reads layer 2's), so cuts 3 and 4
    // hold the same prompt K/V, which the recommendation says at either
    let cut: usize = stdout
        .split("Recommended L_cut = ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no recommendation in\n{stdout}"));
    let same = "every cut from 3 to 4 holds all of the prompt's K/V (layers 0, 1 and 2)";
    assert_eq!(stdout.contains(same), cut >= 3, "{stdout}");
    assert_eq!(stdout.contains("saves no K/V memory"), cut == 3, "{stdout}");
    let err = fails(&["recommend", diag_arg, "--kv-budget", "0.5"]);
    assert!(err.contains("layer 3 stores no K/V of its own"), "{err}");
    assert!(!diag.join("heads-kv0.5.json").exists());
    // and an adapter trains on it (the shared layer 3 above the cut reads
    // layer 2's K/V; it has no keys or values of its own to adapt)
    let adapter = tmp.path().join("adapter");
    let (_, stderr) = ok(&[
        "train-lora",
        "--model",
        model_arg,
        "--policy",
        "speed:3+bos",
        "--prompts",
        "4",
        "--steps",
        "2",
        "--out",
        adapter.to_str().unwrap(),
    ]);
    assert!(
        stderr.contains("k_proj: not adapted on layers [3]")
            && adapter.join("adapter_model.safetensors").exists(),
        "{stderr}"
    );
}
