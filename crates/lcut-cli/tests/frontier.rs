//! `lcut frontier`: eval results of one suite drawn as accuracy against
//! K/V held, one line per family (HTML and SVG); bad input (another suite,
//! the ratio axis without a leaderboard run, a file that is no result) is
//! refused by name before anything is written.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn lcut(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lcut"))
        .args(args)
        .output()
        .expect("lcut runs")
}

fn result(dir: &Path, name: &str, policy: &str, suite: &str, acc: f64, kv: f64) -> PathBuf {
    let text = format!(
        r#"{{"model":"m.gguf","suite":"{suite}","policy":"{policy}","items":[],
        "scores":[{{"group":"all","n":208,"accuracy":{acc},"ci95":[{lo},{hi}],
        "full_correct":154,"kept_of_full":{kept},"kv_ratio":{kv}}}]}}"#,
        lo = acc - 0.05,
        hi = acc + 0.05,
        kept = (acc * 154.0) as usize,
    );
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn eval_results_make_the_frontier_and_bad_input_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let files = [
        result(d, "full.json", "full", "s.jsonl", 0.74, 1.0),
        result(d, "s24.json", "speed:24+bos", "s.jsonl", 0.70, 0.811),
        result(d, "s22.json", "speed:22+bos", "s.jsonl", 0.13, 0.748),
        result(
            d,
            "heads.json",
            "speed:19+bos+heads:h.json",
            "s.jsonl",
            0.60,
            0.748,
        ),
        result(d, "knorm.json", "knorm:0.25", "s.jsonl", 0.70, 0.761),
    ];
    let out = d.join("out");
    let mut args = vec!["frontier", "--out", out.to_str().unwrap()];
    args.extend(files.iter().map(|f| f.to_str().unwrap()));
    let run = lcut(&args);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        stdout.contains("SPEED+BoS: 0.130 at 0.748, 0.700 at 0.811"),
        "{stdout}"
    );
    assert!(stdout.contains("kept heads: 0.600 at 0.748"), "{stdout}");
    let html = std::fs::read_to_string(out.join("frontier.html")).unwrap();
    for text in [
        "press: knorm",
        "speed:19+bos+heads:h.json",
        "92 of 154 (60%)",
        "full 0.740",
    ] {
        assert!(html.contains(text), "{text}");
    }
    let svg = std::fs::read_to_string(out.join("frontier.svg")).unwrap();
    assert!(svg.starts_with("<?xml") && svg.contains("xmlns=\"http://www.w3.org/2000/svg\""));
    assert_eq!(svg.matches("class=\"ci\"").count(), 4);

    let refused = |args: &[&str], needle: &str| {
        let bad = d.join("bad-out");
        let mut all = vec!["frontier", "--out", bad.to_str().unwrap()];
        all.extend_from_slice(args);
        let run = lcut(&all);
        assert!(!run.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert!(!bad.exists(), "nothing written for {args:?}");
    };
    let other = result(d, "other.json", "tova:0.25", "t.jsonl", 0.5, 0.76);
    refused(
        &[files[1].to_str().unwrap(), other.to_str().unwrap()],
        "t.jsonl",
    );
    refused(&["--x", "ratio", files[1].to_str().unwrap()], "leaderboard");
    let junk = d.join("junk.json");
    std::fs::write(&junk, "[1, 2]").unwrap();
    refused(&[junk.to_str().unwrap()], "junk.json");
    refused(&[files[0].to_str().unwrap()], "nothing to draw");
}
