//! A K/V budget on the bundled model: `lcut diagnose --kv-budget` checks
//! the candidate plans (SPEED+BoS first) on the run's prompts and writes
//! the chosen head file, which `lcut generate` then runs; `lcut recommend`
//! plans from the report alone; budgets outside (0, 1] are refused.

#![allow(clippy::unwrap_used)] // test helpers unwrap like the tests do

use std::path::Path;
use std::process::{Command, Output};

fn lcut(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lcut"))
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("lcut runs")
}

fn ok(args: &[&str], cwd: &Path) -> String {
    let out = lcut(args, cwd);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "lcut {args:?} failed: {stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_checked_budget_never_agrees_less_than_speed_and_its_head_file_runs() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let run_s = run.to_str().unwrap();
    let stdout = ok(
        &[
            "diagnose",
            "--max-new-tokens",
            "6",
            "--out",
            run_s,
            "--kv-budget",
            "0.8",
        ],
        &repo,
    );
    assert!(stdout.contains("(SPEED+BoS)"), "{stdout}");

    let text = std::fs::read_to_string(run.join("heads-kv0.8-check/candidates.json")).unwrap();
    let check: serde_json::Value = serde_json::from_str(&text).unwrap();
    let candidates = check["candidates"].as_array().unwrap();
    assert!(candidates.len() >= 2, "{text}");
    assert_eq!(candidates[0]["kept_pairs"], 0, "SPEED+BoS is checked first");
    let top = candidates[0]["cut"].as_u64().unwrap();
    for c in candidates {
        assert!(c["kv_share"].as_f64().unwrap() <= 0.8 + 1e-9, "{c}");
        assert!(c["cut"].as_u64().unwrap() <= top, "{c}");
    }
    let chosen = &candidates[check["chosen"].as_u64().unwrap() as usize];
    let agreement = |c: &serde_json::Value| c["top1_agreement"].as_f64().unwrap();
    assert!(
        candidates.iter().all(|c| agreement(chosen) >= agreement(c)),
        "the chosen plan agrees with full at least as well as every candidate: {text}"
    );

    // the chosen head file names its cut and runs as a policy
    let file = run.join("heads-kv0.8.json");
    let head_file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(head_file["cut"], chosen["cut"]);
    let generated = ok(
        &[
            "generate",
            "--policy",
            chosen["policy"].as_str().unwrap(),
            "--max-new-tokens",
            "4",
            "Name a color.",
        ],
        &repo,
    );
    assert!(!generated.trim().is_empty());

    // planned from the report alone, and said to be unchecked
    let unchecked = ok(&["recommend", run_s, "--kv-budget", "0.7"], &repo);
    assert!(unchecked.contains("masses alone"), "{unchecked}");
    assert!(run.join("heads-kv0.7.json").is_file());

    // a prefill budget of 2 layers: the cut and every kept pair below layer 2
    let file = tmp.path().join("prefill.json");
    let held = ok(
        &[
            "recommend",
            run_s,
            "--kv-budget",
            "0.9",
            "--prefill-layers",
            "2",
            "--out",
            file.to_str().unwrap(),
        ],
        &repo,
    );
    assert!(held.contains("prefill budget 2 of"), "{held}");
    let head_file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert!(head_file["cut"].as_u64().unwrap() <= 2, "{head_file}");
    for pair in head_file["heads"].as_array().unwrap() {
        assert!(pair[0].as_u64().unwrap() < 2, "{head_file}");
    }
    let out = lcut(
        &[
            "recommend",
            run_s,
            "--kv-budget",
            "0.9",
            "--prefill-layers",
            "0",
        ],
        &repo,
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("prefill budget"));
}

#[test]
fn a_budget_outside_the_range_is_refused_by_name() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let tmp = tempfile::tempdir().unwrap();
    for bad in ["0", "1.5", "most"] {
        let out = lcut(
            &[
                "recommend",
                tmp.path().to_str().unwrap(),
                "--kv-budget",
                bad,
            ],
            &repo,
        );
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("(0, 1]"), "{bad}: {stderr}");
    }
}

#[test]
fn the_budget_is_read_at_the_shape_of_the_prompts_to_be_served() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let run_s = run.to_str().unwrap();
    // a file that is not there is refused before the run writes anything
    let out = lcut(
        &[
            "diagnose",
            "--out",
            run_s,
            "--kv-budget",
            "0.8",
            "--kv-budget-at",
            "no-such-suite.jsonl",
        ],
        &repo,
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no-such-suite.jsonl"), "{stderr}");
    assert!(!run.join("report.json").exists());

    let stdout = ok(
        &[
            "diagnose",
            "--max-new-tokens",
            "4",
            "--out",
            run_s,
            "--kv-budget",
            "0.8",
            "--kv-budget-at",
            "fixtures/suites/copy.jsonl",
            "--kv-budget-new-tokens",
            "8",
        ],
        &repo,
    );
    assert!(
        stdout.contains("read at the") && stdout.contains("fixtures/suites/copy.jsonl"),
        "{stdout}"
    );
    let json = |p: &Path| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
    };
    let report = json(&run.join("report.json"));
    let layers = report["model"]["num_layers"].as_f64().unwrap();
    let check = json(&run.join("heads-kv0.8-check/candidates.json"));
    let at = &check["read_at"];
    let (a, p, d) = (
        at["anchors"].as_f64().unwrap(),
        at["prefill"].as_f64().unwrap(),
        at["decode"].as_f64().unwrap(),
    );
    // each served prompt decodes its generation prompt and 8 new tokens
    assert!(p > 0.0 && d >= 8.0, "{at}");
    let speed = &check["candidates"][0];
    assert_eq!(speed["kept_pairs"], 0);
    let cut = speed["cut"].as_f64().unwrap();
    let share = |c: f64| (layers * (a + d) + c * p) / (layers * (a + p + d));
    assert!(
        (speed["kv_share"].as_f64().unwrap() - share(cut)).abs() < 1e-9,
        "SPEED+BoS's share is the formula at the served shape: {check}"
    );
    // the largest cut that fits: one more layer would not
    assert!(share(cut) <= 0.8 + 1e-12 && (cut == layers || share(cut + 1.0) > 0.8));
    let head_file = json(&run.join("heads-kv0.8.json"));
    assert_eq!(head_file["read_at"], *at);
    assert_eq!(head_file["kv_budget"], 0.8);
}
