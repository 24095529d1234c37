//! The main job end to end on the bundled model: `lcut diagnose` with no
//! model or prompt arguments, then `lcut report` in every format, and the
//! report loads back into the same values.

#![allow(clippy::unwrap_used)] // test helpers unwrap like the tests do

use std::path::Path;
use std::process::Command;

fn lcut(args: &[&str], cwd: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_lcut"))
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("lcut runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "lcut {args:?} failed: {stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn diagnose_then_report_in_every_format() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let run_s = run.to_str().unwrap();
    let stdout = lcut(
        &["diagnose", "--max-new-tokens", "6", "--out", run_s],
        &repo,
    );
    assert!(stdout.contains("recommended L_cut = "), "{stdout}");

    let report = lcut_trace::read_report_json(&run.join("report.json")).unwrap();
    assert!(!report.traces.is_empty());
    assert!(
        report.settings.chat_template_used,
        "the bundled model has a chat template"
    );
    let l = report.model.num_layers;
    assert!((1..=l).contains(&report.recommendation.l_cut));
    // the bundled model really reads its prompt: generated tokens attend to it
    let prefill: f32 = report
        .curves
        .prefill
        .as_slice()
        .iter()
        .filter(|x| x.is_finite())
        .sum();
    assert!(
        prefill > 0.05 * l as f32 / 4.0,
        "prefill mass {prefill} too small"
    );

    lcut(&["report", run_s, "--format", "html,md,csv,json"], &repo);
    for ext in ["html", "md", "csv", "json"] {
        let text = std::fs::read_to_string(run.join(format!("report.{ext}"))).unwrap();
        assert!(text.len() > 100, "report.{ext} is nearly empty");
    }
    let html = std::fs::read_to_string(run.join("report.html")).unwrap();
    assert!(html.contains("<svg") && !html.contains("http://") && !html.contains("https://"));
    let again = lcut_trace::read_report_json(&run.join("report.json")).unwrap();
    assert_eq!(again, report, "the report changed on a round trip");
    let csv = std::fs::read_to_string(run.join("report.csv")).unwrap();
    assert_eq!(
        csv.lines().count(),
        l + 1,
        "one CSV row per layer plus the header"
    );
}

#[test]
fn sharded_diagnose_merges_into_the_whole() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let tmp = tempfile::tempdir().unwrap();
    let dir = |name: &str| tmp.path().join(name).to_str().unwrap().to_string();
    lcut(
        &["diagnose", "--max-new-tokens", "4", "--out", &dir("whole")],
        &repo,
    );
    lcut(
        &[
            "diagnose",
            "--max-new-tokens",
            "4",
            "--shard",
            "0/2",
            "--out",
            &dir("s0"),
        ],
        &repo,
    );
    lcut(
        &[
            "diagnose",
            "--max-new-tokens",
            "4",
            "--shard",
            "1/2",
            "--out",
            &dir("s1"),
        ],
        &repo,
    );
    lcut(
        &["merge", &dir("s1"), &dir("s0"), "--out", &dir("merged")],
        &repo,
    );
    let whole = lcut_trace::read_report_json(&tmp.path().join("whole/report.json")).unwrap();
    let merged = lcut_trace::read_report_json(&tmp.path().join("merged/report.json")).unwrap();
    assert_eq!(merged, whole);
    // the report names the build and level that measured it, the merge each
    // shard's: one here, so no note
    assert_eq!(whole.made_by.len(), 1, "{:?}", whole.made_by);
    assert!(whole.made_by[0].build.starts_with("lcut "));
    // a shard edited to another level merges into the same traces, naming both
    let s1 = tmp.path().join("s1/report.json");
    let mut other = lcut_trace::read_report_json(&s1).unwrap();
    other.made_by[0].isa = "portable".into();
    lcut_trace::write_report_json(&s1, &other).unwrap();
    let stdout = lcut(
        &["merge", &dir("s1"), &dir("s0"), "--out", &dir("mixed")],
        &repo,
    );
    assert!(
        stdout.contains("Made by 2 builds or instruction-set levels"),
        "{stdout}"
    );
    let mixed = lcut_trace::read_report_json(&tmp.path().join("mixed/report.json")).unwrap();
    assert_eq!(mixed.made_by.len(), 2);
    assert_eq!(
        lcut_trace::Report {
            made_by: whole.made_by.clone(),
            ..mixed
        },
        whole
    );
}

/// `diagnose --knockout --knockout-band 2` writes the knockout curve (one
/// entry per band start, none past the last layer) into the report and its
/// CSV, names where the prompt matters, and each entry is what `lcut sweep
/// --policies band:a..b` measures on the same prompts; a band wider than
/// the model is refused before anything is written.
#[test]
fn diagnose_knockout_is_the_sweep_of_its_bands() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let tmp = tempfile::tempdir().unwrap();
    let dir = |name: &str| tmp.path().join(name).to_str().unwrap().to_string();
    let stdout = lcut(
        &[
            "diagnose",
            "--max-new-tokens",
            "4",
            "--knockout",
            "--knockout-band",
            "2",
            "--out",
            &dir("ko"),
        ],
        &repo,
    );
    assert!(stdout.contains("Where the prompt matters"), "{stdout}");
    // without the lens only the knockout's vote is printed beside the votes
    assert!(
        stdout.contains("not among the votes: formation layer -, knockout "),
        "{stdout}"
    );
    let report = lcut_trace::read_report_json(&tmp.path().join("ko/report.json")).unwrap();
    let l = report.model.num_layers;
    let kl = &report.curves.knockout_kl;
    assert_eq!(kl.len(), l);
    assert!(kl[..l - 1].iter().all(|x| x.is_finite()) && kl[l - 1].is_nan());
    let bands: Vec<String> = (0..l - 1).map(|a| format!("band:{a}..{}", a + 1)).collect();
    lcut(
        &[
            "sweep",
            "--max-new-tokens",
            "4",
            "--cuts",
            &l.to_string(),
            "--policies",
            &bands.join(";"),
            "--out",
            &dir("sweep"),
        ],
        &repo,
    );
    let text = std::fs::read_to_string(tmp.path().join("sweep/sweep.json")).unwrap();
    let swept: lcut_trace::Sweep = serde_json::from_str(&text).unwrap();
    let points = &swept.policies;
    assert_eq!(points.len(), l - 1);
    for (a, p) in points.iter().enumerate() {
        assert_eq!(p.policy, bands[a]);
        assert!(
            (kl[a] - p.mean_kl).abs() <= 1e-4 + 1e-3 * p.mean_kl,
            "{}: {} against {}",
            p.policy,
            kl[a],
            p.mean_kl
        );
    }
    lcut(&["report", &dir("ko"), "--format", "csv,md"], &repo);
    let csv = std::fs::read_to_string(tmp.path().join("ko/report.csv")).unwrap();
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let col = header.iter().position(|c| *c == "knockout_kl").unwrap();
    let first: Vec<&str> = csv.lines().nth(1).unwrap().split(',').collect();
    assert_eq!(first[col].parse::<f32>().unwrap(), kl[0]);
    let md = std::fs::read_to_string(tmp.path().join("ko/report.md")).unwrap();
    assert!(md.contains("## Where the prompt matters"));

    let wide = (l + 1).to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_lcut"))
        .args([
            "diagnose",
            "--knockout",
            "--knockout-band",
            &wide,
            "--out",
            &dir("wide"),
        ])
        .current_dir(&repo)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(&format!("a knockout band of {wide} layers")),
        "{stderr}"
    );
    assert!(!tmp.path().join("wide/report.json").exists());
}
