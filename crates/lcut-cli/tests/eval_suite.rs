//! `lcut eval --suite` end to end on the bundled model: several policies
//! in one run, shards (one given as `auto/N` from a job array's variable)
//! merged by `lcut eval-merge` into exactly the unsharded result, named
//! errors for bad suite lines and a missing shard index, an adapted model
//! compared with its base (and named in the result and in a diagnose
//! report), sweep's suite accuracy sharded and merged by `lcut merge`
//! (anchor-free beside BoS), sweep points of prompt shards merged into
//! the unsharded ones (each sweep naming its build, a merge of several
//! builds' shards naming each), and the bundled task evaluation without
//! `--suite` as before.

#![allow(clippy::unwrap_used)] // test helpers unwrap like the tests do

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use lcut_engine::suite::SuiteEval;

fn lcut(args: &[&str], env: &[(&str, &str)]) -> Output {
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
    cmd.envs(env.iter().copied());
    cmd.output().expect("lcut runs")
}

fn ok(args: &[&str], env: &[(&str, &str)]) -> String {
    let out = lcut(args, env);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "lcut {args:?} failed: {stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn read(path: &Path) -> SuiteEval {
    let mut e: SuiteEval = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    // wall times differ from run to run
    e.seconds = 0.0;
    for r in &mut e.items {
        r.seconds = 0.0;
    }
    e
}

/// A five-item suite in the bundled copy model's vocabulary.
fn write_suite(dir: &Path) -> String {
    let prompts = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/prompts/copy.jsonl"),
    )
    .unwrap();
    let mut lines = Vec::new();
    for (k, line) in prompts.lines().take(5).enumerate() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let prompt = v["prompt"].as_str().unwrap();
        let span = prompt
            .split('[')
            .nth(1)
            .unwrap()
            .split(']')
            .next()
            .unwrap()
            .trim();
        lines.push(
            serde_json::json!({
                "id": format!("c{k}"), "kind": if k % 2 == 0 { "even" } else { "odd" },
                "length": "short", "prompt": prompt, "answer": span, "scoring": "contains",
            })
            .to_string(),
        );
    }
    let path = dir.join("suite.jsonl");
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path.to_str().unwrap().to_string()
}

/// `lcut eval` of the bundled copy model on `suite` under `policies`, six
/// new tokens, the result in `json`.
fn copy_eval<'a>(suite: &'a str, policies: &'a str, json: &'a str) -> Vec<&'a str> {
    vec![
        "eval",
        "--model",
        "fixtures/models/copy-full",
        "--suite",
        suite,
        "--policy",
        policies,
        "--max-new-tokens",
        "6",
        "--json",
        json,
    ]
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn shards_merge_into_the_unsharded_run() {
    let tmp = tempfile::tempdir().unwrap();
    let suite = write_suite(tmp.path());
    let out = |name: &str| tmp.path().join(name).to_str().unwrap().to_string();
    let base = |json: &str| {
        vec![
            "eval".to_string(),
            "--model".into(),
            "fixtures/models/copy-full".into(),
            "--suite".into(),
            suite.clone(),
            "--policy".into(),
            "full,speed:2+bos".into(),
            "--max-new-tokens".into(),
            "6".into(),
            "--json".into(),
            out(json),
        ]
    };
    let whole = base("all.json");
    let stdout = ok(&strs(&whole), &[]);
    assert!(
        stdout.contains("policy=speed:2+bos") && stdout.contains("accuracy="),
        "{stdout}"
    );
    let mut s0 = base("s0.json");
    s0.extend(["--shard".into(), "0/2".into()]);
    ok(&strs(&s0), &[]);
    let mut s1 = base("s1.json");
    s1.extend(["--shard".into(), "auto/2".into()]);
    ok(&strs(&s1), &[("JOB_COMPLETION_INDEX", "1")]);
    for policy in ["full", "speed-2-bos"] {
        let merged = out(&format!("m.{policy}.json"));
        ok(
            &[
                "eval-merge",
                &out(&format!("s0.{policy}.json")),
                &out(&format!("s1.{policy}.json")),
                "--out",
                &merged,
            ],
            &[],
        );
        let whole = read(&tmp.path().join(format!("all.{policy}.json")));
        assert_eq!(whole.items.len(), 5);
        let shard = read(&tmp.path().join(format!("s1.{policy}.json")));
        assert_eq!(shard.shard, Some([1, 2]));
        assert_eq!(shard.items.len(), 2);
        assert_eq!(read(Path::new(&merged)), whole, "{policy}");
    }
    // one shard alone is not the whole suite
    let err = lcut(
        &["eval-merge", &out("s0.full.json"), "--out", &out("x.json")],
        &[],
    );
    assert!(!err.status.success());
    // a result names the build and level that ran it; shards from two
    // builds merge, and the merged result names both and says so
    let whole = read(&tmp.path().join("all.full.json"));
    assert_eq!(whole.made_by.len(), 1);
    assert!(
        whole.made_by[0].build.starts_with("lcut "),
        "{:?}",
        whole.made_by
    );
    let mut other = read(&tmp.path().join("s1.full.json"));
    other.made_by[0].build = "lcut 0.0.0 0123456789abcdef".into();
    std::fs::write(out("s1-other.json"), serde_json::to_string(&other).unwrap()).unwrap();
    let mixed = out("m-other.json");
    let stdout = ok(
        &[
            "eval-merge",
            &out("s0.full.json"),
            &out("s1-other.json"),
            "--out",
            &mixed,
        ],
        &[],
    );
    assert!(stdout.contains("Made by 2 builds"), "{stdout}");
    let merged = read(Path::new(&mixed));
    assert_eq!(merged.made_by.len(), 2);
    assert_eq!(merged.items, whole.items);
}

/// kvpress's presses share one prompt run per item: a press scores the
/// same (answers, agreement, KL, K/V held) beside other presses, which
/// widen what that run observes, as alone.
#[test]
fn a_press_scores_the_same_beside_other_presses_as_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let suite = write_suite(tmp.path());
    let dir = |name: &str| tmp.path().join(name);
    let run = |policies: &str, out: &str| -> String {
        std::fs::create_dir_all(dir(out)).unwrap();
        let json = dir(out).join("r.json");
        let out = lcut(&copy_eval(&suite, policies, json.to_str().unwrap()), &[]);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        stderr
    };
    // the second Expected Attention counts its statistics from another
    // position: it cannot share the run, and runs its own prompt
    let presses = [
        "snapkv:0.5+window:4",
        "tova:0.5",
        "expected:0.5+sink:2",
        "knorm:0.5",
        "expected:0.5+sink:3",
    ];
    let said = run(&format!("full,{}", presses.join(",")), "together");
    // the one that runs apart is named, with why
    let apart = said
        .lines()
        .find(|l| l.starts_with("run apart"))
        .unwrap_or("");
    assert!(
        apart.contains("sink:3") && apart.contains("another span") && !apart.contains("tova"),
        "{said}"
    );
    for (k, press) in presses.iter().enumerate() {
        let alone = format!("alone{k}");
        run(&format!("full,{press}"), &alone);
        let files: Vec<PathBuf> = std::fs::read_dir(dir(&alone))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| !p.to_string_lossy().ends_with(".full.json"))
            .collect();
        assert_eq!(files.len(), 1, "{files:?}");
        let name = files[0].file_name().unwrap();
        let beside = read(&dir("together").join(name));
        assert_eq!(beside.items.len(), 5);
        assert_eq!(read(&files[0]), beside, "{press}");
    }
}

/// A rank-2 adapter on q and v of the bundled copy model's upper two
/// layers, nonzero, trained for `speed:2+bos` (written as PEFT lays it out).
fn write_adapter(dir: &Path) -> String {
    use candle_core::{Device, Tensor};
    use lcut_model::lora::{LoraConfig, LoraPair, write_adapter};
    let mut pairs = std::collections::BTreeMap::new();
    let fill = |n: usize, k: usize| {
        let v: Vec<f32> = (0..n * k)
            .map(|i| ((i * 7919 % 97) as f32 / 97.0 - 0.5) * 0.4)
            .collect();
        Tensor::from_vec(v, (n, k), &Device::Cpu).unwrap()
    };
    for layer in [2, 3] {
        for (module, out) in [("self_attn.q_proj", 128), ("self_attn.v_proj", 64)] {
            let pair = LoraPair {
                a: fill(2, 128),
                b: fill(out, 2),
            };
            pairs.insert((layer, module.to_string()), pair);
        }
    }
    let mut config = LoraConfig::new(2, 4.0, &["q_proj", "v_proj"]);
    config.layers = Some(vec![2, 3]);
    config.policy = Some("speed:2+bos".into());
    let path = dir.join("adapter");
    write_adapter(&path, &config, &pairs).unwrap();
    path.to_str().unwrap().to_string()
}

/// `lcut diagnose` of the bundled copy model (4 new tokens) into `out`.
fn diagnose(out: &Path, extra: &[&str]) {
    let mut a = vec![
        "diagnose",
        "--model",
        "fixtures/models/copy-full",
        "--max-new-tokens",
        "4",
        "--out",
        out.to_str().unwrap(),
    ];
    a.extend_from_slice(extra);
    ok(&a, &[]);
}

/// The `report.json` in `dir`.
fn read_report(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap()
}

#[test]
fn an_adapted_model_is_compared_with_its_base_and_named() {
    let tmp = tempfile::tempdir().unwrap();
    let suite = write_suite(tmp.path());
    let adapter = write_adapter(tmp.path());
    let json = |name: &str| tmp.path().join(name).to_str().unwrap().to_string();
    let eval = |extra: &[&str], out: &str| {
        let mut a = copy_eval(&suite, "full", out);
        a.extend_from_slice(extra);
        ok(&a, &[]);
        read(Path::new(out))
    };
    let plain = eval(&[], &json("plain.json"));
    let adapted = eval(&["--lora", &adapter], &json("adapted.json"));
    // without an adapter full depth is its own reference
    assert_eq!(plain.adapter, None);
    assert_eq!(plain.scores[0].mean_kl, 0.0);
    assert_eq!(plain.scores[0].kept_of_full, plain.scores[0].correct);
    // with one, the reference is the base model: the adapter's change shows
    let named = adapted.adapter.as_ref().expect("the adapter is named");
    assert_eq!(named.policy.as_deref(), Some("speed:2+bos"));
    assert_eq!((named.rank, named.mode.as_str()), (2, "merge"));
    assert!(adapted.scores[0].mean_kl > 1e-4, "{:?}", adapted.scores[0]);
    for (a, p) in adapted.items.iter().zip(&plain.items) {
        assert_eq!(a.full_generation, p.full_generation, "{}", a.id);
        assert_eq!(a.full_correct, p.full_correct, "{}", a.id);
    }
    // a diagnose report names the adapter in the model's identity
    let out = tmp.path().join("diag");
    diagnose(&out, &["--lora", &adapter]);
    let report = read_report(&out);
    assert_eq!(
        report["model"]["adapter"]["hash"].as_str(),
        Some(named.hash.as_str())
    );
}

#[test]
fn sweep_with_a_suite_sets_the_recommendation_beside_accuracy_per_cut() {
    let tmp = tempfile::tempdir().unwrap();
    let suite = write_suite(tmp.path());
    let out = tmp.path().join("sweep");
    // the sweep joins the diagnose report in the same folder
    diagnose(&out, &[]);
    let stdout = ok(
        &[
            "sweep",
            "--model",
            "fixtures/models/copy-full",
            "--max-new-tokens",
            "4",
            "--eval-suite",
            &suite,
            "--eval-max-new-tokens",
            "6",
            "--out",
            out.to_str().unwrap(),
        ],
        &[],
    );
    assert!(
        stdout.contains("smallest cutoff within 2 points of full accuracy"),
        "{stdout}"
    );
    let report = read_report(&out);
    let points = report["sweep"]["accuracy"].as_array().unwrap();
    let cuts: Vec<u64> = points
        .iter()
        .map(|p| p["l_cut"].as_u64().unwrap())
        .collect();
    assert_eq!(cuts, vec![1, 2, 3, 4], "one accuracy point per cutoff");
    for p in points {
        assert_eq!(p["n"].as_u64(), Some(5));
        let (k, acc) = (
            p["correct"].as_u64().unwrap(),
            p["accuracy"].as_f64().unwrap(),
        );
        assert!((acc - k as f64 / 5.0).abs() < 1e-6, "{p}");
    }
    // at full depth the copy model copies: the deepest cut is full and scores
    let full = points.last().unwrap()["correct"].as_u64().unwrap();
    assert!(full >= 3, "full depth copies {full} of 5");
    let rec = report["recommendation"]["l_cut"].as_u64().unwrap();
    assert!(
        stdout.contains(&format!(
            "At the recommended L_cut {rec}, accuracy on the suite is"
        )),
        "{stdout}"
    );
}

/// The arguments of `lcut sweep` of the bundled copy model (4 new tokens)
/// with `specific` ones, into `out`.
fn sweep_args<'a>(out: &'a Path, specific: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec![
        "sweep",
        "--model",
        "fixtures/models/copy-full",
        "--max-new-tokens",
        "4",
    ];
    a.extend_from_slice(specific);
    a.extend(["--out", out.to_str().unwrap()]);
    a
}

/// A diagnose then a sweep (`sweep_args` with `specific`) of `prompts`
/// into `out`; `shard` as `I/N` or none. Returns the sweep's stdout.
fn diagnose_and_sweep(out: &Path, prompts: &str, shard: Option<&str>, specific: &[&str]) -> String {
    let mut extra = vec!["--prompts", prompts];
    if let Some(s) = shard {
        extra.extend(["--shard", s]);
    }
    diagnose(out, &extra);
    let mut a = sweep_args(out, specific);
    a.extend_from_slice(&extra);
    ok(&a, &[])
}

/// `lcut sweep` of the bundled copy model (cuts 2 and 4, suite answers of
/// 6 tokens, anchor-free too) on `prompts` into `out`, after a diagnose of
/// the same prompts there; `shard` as `I/N` or none.
fn sweep_with_suite(out: &Path, prompts: &str, suite: &str, shard: Option<&str>) -> String {
    let specific = [
        "--cuts",
        "2,4",
        "--anchor-free",
        "--eval-suite",
        suite,
        "--eval-max-new-tokens",
        "6",
    ];
    diagnose_and_sweep(out, prompts, shard, &specific)
}

#[test]
fn sharded_suite_accuracy_merges_into_the_unsharded_one_with_anchor_free_points() {
    let tmp = tempfile::tempdir().unwrap();
    let suite = write_suite(tmp.path());
    // one prompt twice: the suite accuracy is what this test is about
    // (sweep points of distinct prompts: the test after it)
    let prompt = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/prompts/copy.jsonl"),
    )
    .unwrap();
    let line: serde_json::Value = serde_json::from_str(prompt.lines().next().unwrap()).unwrap();
    let prompts = tmp.path().join("prompts.jsonl");
    let twice: Vec<String> = ["a", "b"]
        .iter()
        .map(|id| serde_json::json!({"id": id, "prompt": line["prompt"]}).to_string())
        .collect();
    std::fs::write(&prompts, twice.join("\n") + "\n").unwrap();
    let prompts = prompts.to_str().unwrap();
    let dir = |name: &str| tmp.path().join(name);
    let stdout = sweep_with_suite(&dir("all"), prompts, &suite, None);
    assert!(
        stdout.contains("accuracy bos") && stdout.contains("accuracy none"),
        "both anchor settings are printed: {stdout}"
    );
    sweep_with_suite(&dir("s0"), prompts, &suite, Some("0/2"));
    sweep_with_suite(&dir("s1"), prompts, &suite, Some("1/2"));
    let merged = dir("merged");
    ok(
        &[
            "merge",
            dir("s1").to_str().unwrap(),
            dir("s0").to_str().unwrap(),
            "--out",
            merged.to_str().unwrap(),
        ],
        &[],
    );
    let whole = read_report(&dir("all"));
    let keys = |r: &serde_json::Value| -> Vec<(u64, String, u64, u64)> {
        r["sweep"]["accuracy"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                let n = |k: &str| p[k].as_u64().unwrap();
                let anchors = p["anchors"].as_str().unwrap().to_string();
                (n("l_cut"), anchors, n("correct"), n("n"))
            })
            .collect()
    };
    let want = keys(&whole);
    let shape: Vec<(u64, &str, u64)> = want.iter().map(|k| (k.0, k.1.as_str(), k.3)).collect();
    assert_eq!(
        shape,
        vec![(2, "bos", 5), (4, "bos", 5), (2, "none", 5), (4, "none", 5)]
    );
    // each shard scored its own items: 3 and 2 of the 5
    for (name, n, i) in [("s0", 3, 0), ("s1", 2, 1)] {
        let r = read_report(&dir(name));
        assert!(keys(&r).iter().all(|k| k.3 == n), "{name}: {:?}", keys(&r));
        assert_eq!(r["sweep"]["suite"]["shard"], serde_json::json!([i, 2]));
    }
    let merged = read_report(&merged);
    assert_eq!(keys(&merged), want, "correct counts per cut and anchors");
    assert_eq!(merged["sweep"]["accuracy"], whole["sweep"]["accuracy"]);
    assert_eq!(merged["sweep"]["suite"], whole["sweep"]["suite"]);
    assert!(merged["sweep"]["suite"].get("shard").is_none());
    // one shard alone covers neither the prompts nor the suite: a named error
    let out = lcut(
        &[
            "merge",
            dir("s0").to_str().unwrap(),
            "--out",
            dir("x").to_str().unwrap(),
        ],
        &[],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("prompt shards 0/2 .. 1/2"),
        "{err}"
    );
}

/// `lcut sweep` of the bundled copy model (cuts 1, 2 and 4, anchor-free
/// too, a SlimInfer point on the axis) on `prompts` into `out`, after a
/// diagnose of the same prompts there; `shard` as `I/N`.
fn sweep_prompts(out: &Path, prompts: &str, shard: Option<&str>) {
    let specific = [
        "--cuts",
        "1,2,4",
        "--anchor-free",
        "--policies",
        "slim:1@50%",
        "--context-len",
        "4k",
    ];
    diagnose_and_sweep(out, prompts, shard, &specific);
}

/// Whether `a` and `b` agree to 1e-5 relative (or both are null).
fn close(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => (x - y).abs() <= 1e-5 * x.abs().max(y.abs()).max(1e-6),
        _ => a == b,
    }
}

/// Checks that every field of `got` equals `want`'s, numbers to 1e-5
/// relative, arrays entry by entry; `what` names the point.
fn assert_close(got: &serde_json::Value, want: &serde_json::Value, what: &str) {
    let (g, w) = (got.as_object().unwrap(), want.as_object().unwrap());
    assert_eq!(
        g.keys().collect::<Vec<_>>(),
        w.keys().collect::<Vec<_>>(),
        "{what}"
    );
    for (k, wv) in w {
        let gv = &g[k];
        let same = match (gv.as_array(), wv.as_array()) {
            (Some(ga), Some(wa)) => {
                ga.len() == wa.len() && ga.iter().zip(wa).all(|(x, y)| close(x, y))
            }
            _ if gv.is_object() => {
                assert_close(gv, wv, &format!("{what}.{k}"));
                true
            }
            _ => close(gv, wv),
        };
        assert!(same, "{what}.{k}: merged {gv}, unsharded {wv}");
    }
}

/// What a record made by the `lcut` binary under test names as its
/// `made_by`: the binary's version and build ID, and the level its kernels
/// run at here (as `LCUT_ISA` may cap it, for this process as for it).
fn running_build() -> serde_json::Value {
    let binary = Path::new(env!("CARGO_BIN_EXE_lcut"));
    let id = lcut_engine::made_by::gnu_build_id(binary).expect("the linker writes a build ID");
    serde_json::json!({
        "build": format!("lcut {} {}", env!("CARGO_PKG_VERSION"), &id[..16]),
        "isa": lcut_kernels::Isa::detect().name(),
    })
}

#[test]
fn sharded_sweep_points_merge_into_the_unsharded_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let prompts = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/prompts/copy.jsonl"),
    )
    .unwrap();
    let three: Vec<&str> = prompts.lines().take(3).collect();
    let path = tmp.path().join("prompts.jsonl");
    std::fs::write(&path, three.join("\n") + "\n").unwrap();
    let prompts = path.to_str().unwrap();
    let dir = |name: &str| tmp.path().join(name);
    sweep_prompts(&dir("all"), prompts, None);
    sweep_prompts(&dir("s0"), prompts, Some("0/2"));
    sweep_prompts(&dir("s1"), prompts, Some("1/2"));
    let merge = |shards: [&str; 2], out: &str| {
        lcut(
            &[
                "merge",
                dir(shards[0]).to_str().unwrap(),
                dir(shards[1]).to_str().unwrap(),
                "--out",
                dir(out).to_str().unwrap(),
            ],
            &[],
        )
    };
    let done = merge(["s1", "s0"], "merged");
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let whole = read_report(&dir("all"))["sweep"].clone();
    let merged = read_report(&dir("merged"))["sweep"].clone();
    let (s0, s1) = (
        read_report(&dir("s0"))["sweep"].clone(),
        read_report(&dir("s1"))["sweep"].clone(),
    );
    assert_eq!(s0["prompt_shard"], serde_json::json!([0, 2]));
    assert!(whole.get("prompt_shard").is_none() && merged.get("prompt_shard").is_none());
    // the shards scored different prompts (2 and 1 of them), so their
    // points differ and a plain mean of them is not the whole
    let tokens = |s: &serde_json::Value| s["points"][0]["tokens"].as_u64().unwrap();
    assert!(tokens(&s0) > tokens(&s1) && tokens(&s1) > 0);
    assert_eq!(tokens(&s0) + tokens(&s1), tokens(&whole));
    let kl_differs = s0["points"]
        .as_array()
        .unwrap()
        .iter()
        .zip(s1["points"].as_array().unwrap())
        .any(|(a, b)| !close(&a["mean_kl"], &b["mean_kl"]));
    assert!(kl_differs, "the shards' prompts give different KL");
    let points = whole["points"].as_array().unwrap();
    assert_eq!(points.len(), 6, "cuts 1, 2, 4 with and without BoS");
    assert_eq!(merged["points"].as_array().unwrap().len(), points.len());
    for (m, w) in merged["points"].as_array().unwrap().iter().zip(points) {
        assert_close(m, w, w["policy"].as_str().unwrap());
    }
    assert_eq!(whole["policies"].as_array().unwrap().len(), 1);
    for (m, w) in merged["policies"]
        .as_array()
        .unwrap()
        .iter()
        .zip(whole["policies"].as_array().unwrap())
    {
        assert_close(m, w, w["policy"].as_str().unwrap());
    }
    assert_eq!(merged["knee"], whole["knee"]);
    assert_eq!(merged["context_len"], whole["context_len"]);
    // every sweep names the build and level that ran it, the `lcut` binary
    // at this machine's level, and so does a merge of shards of one build,
    // without a note of several
    let running = running_build();
    for sweep in [&whole, &s0, &s1, &merged] {
        assert_eq!(sweep["made_by"], serde_json::json!([running]));
    }
    assert!(!String::from_utf8_lossy(&done.stdout).contains("Made by"));
    // a shard another build made: the merge names both, says so, and
    // pools the same points
    let mut other = read_report(&dir("s1"));
    let another =
        serde_json::json!({"build": "lcut 0.0.0 0123456789abcdef", "isa": running["isa"]});
    other["sweep"]["made_by"] = serde_json::json!([another]);
    std::fs::write(dir("s1").join("report.json"), other.to_string()).unwrap();
    let mixed = merge(["s0", "s1"], "mixed");
    let said = String::from_utf8_lossy(&mixed.stdout);
    assert!(
        mixed.status.success()
            && said.contains(
                "Made by 2 builds or instruction-set levels: lcut 0.0.0 0123456789abcdef on "
            ),
        "{said}"
    );
    assert!(
        said.contains(&format!(
            "{} on {}",
            running["build"].as_str().unwrap(),
            running["isa"].as_str().unwrap()
        )),
        "{said}"
    );
    let mixed = read_report(&dir("mixed"))["sweep"].clone();
    assert_eq!(mixed["made_by"], serde_json::json!([another, running]));
    for key in ["points", "policies", "knee", "context_len"] {
        assert_eq!(mixed[key], merged[key], "{key}");
    }
    // a shard written before sweeps recorded their builds merges too, and
    // the merge names the builds that did record themselves
    other["sweep"].as_object_mut().unwrap().remove("made_by");
    std::fs::write(dir("s1").join("report.json"), other.to_string()).unwrap();
    let unnamed = merge(["s0", "s1"], "unnamed");
    assert!(
        unnamed.status.success(),
        "{}",
        String::from_utf8_lossy(&unnamed.stderr)
    );
    let unnamed = read_report(&dir("unnamed"))["sweep"].clone();
    assert_eq!(unnamed["made_by"], serde_json::json!([running]));
    assert_eq!(unnamed["points"], merged["points"]);
    // a shard written before sweeps recorded their counts: a named error
    let mut old = read_report(&dir("s1"));
    for p in old["sweep"]["points"].as_array_mut().unwrap() {
        p.as_object_mut().unwrap().remove("tokens");
    }
    std::fs::write(dir("s1").join("report.json"), old.to_string()).unwrap();
    let out = merge(["s0", "s1"], "x");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("scored-token count") && err.contains("shard"),
        "{err}"
    );
}

#[test]
fn bad_input_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let suite = write_suite(tmp.path());
    let run = |suite: &str, extra: &[&str]| {
        let mut a = vec![
            "eval",
            "--model",
            "fixtures/models/copy-full",
            "--suite",
            suite,
        ];
        a.extend_from_slice(extra);
        let out = lcut(&a, &[]);
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = run(&suite, &["--shard", "auto/3"]);
    assert!(
        err.contains("SLURM_ARRAY_TASK_ID") && err.contains("JOB_COMPLETION_INDEX"),
        "{err}"
    );
    let bad = tmp.path().join("bad.jsonl");
    let bad_s = bad.to_str().unwrap();
    for (line, what) in [
        ("{\"prompt\": \"copy : [ a ]\"}", "\"answer\""),
        (
            "{\"prompt\": \"p\", \"answer\": \"a\", \"scoring\": \"fuzzy\"}",
            "fuzzy",
        ),
        ("{\"prompt\": ", "malformed JSON"),
    ] {
        std::fs::write(
            &bad,
            format!("{{\"prompt\": \"p\", \"answer\": \"a\"}}\n{line}\n"),
        )
        .unwrap();
        let err = run(bad_s, &[]);
        assert!(err.contains("line 2") && err.contains(what), "{err}");
    }
    // items a policy cannot run are found before any item runs: a prompt
    // shorter than a press's observation window, one too long for the model
    let json = tmp.path().join("refused.json");
    let json_s = json.to_str().unwrap();
    let err = run(
        &suite,
        &["--policies", "full,snapkv:0.25+window:30", "--json", json_s],
    );
    assert!(
        err.contains("snapkv:0.25+window:30 cannot run")
            && err.contains("of the 5 item(s) to run, the first being item c0")
            && err.contains("nothing was run")
            && err.contains("shortest prompt"),
        "{err}"
    );
    let long = serde_json::json!({
        "id": "too-long", "prompt": "copy : was ".repeat(400), "answer": "a",
    });
    std::fs::write(
        &bad,
        std::fs::read_to_string(&suite).unwrap() + &long.to_string() + "\n",
    )
    .unwrap();
    let err = run(bad_s, &["--json", json_s]);
    assert!(
        err.contains("the model cannot run 1 of the 6 item(s)")
            && err.contains("item too-long")
            && err.contains("max_position_embeddings"),
        "{err}"
    );
    assert!(!json.exists(), "a refused run wrote {json_s}");
    // an item that does not fit the memory free even one policy at a time
    let tiny = lcut(
        &[
            "eval",
            "--model",
            "fixtures/models/copy-full",
            "--suite",
            &suite,
            "--policies",
            "full,speed:2+bos",
            "--json",
            json_s,
        ],
        &[("LCUT_AVAILABLE_MEMORY", "1K")],
    );
    let err = String::from_utf8_lossy(&tiny.stderr);
    assert!(!tiny.status.success());
    assert!(
        err.contains("memory: the largest item holds about")
            && err.contains("the memory free cannot run 5 of the 5 item(s)")
            && err.contains("an item's run needs about")
            && err.contains("nothing was run"),
        "{err}"
    );
    assert!(!json.exists(), "a refused run wrote {json_s}");
}

#[test]
fn without_a_suite_the_bundled_task_is_evaluated() {
    let stdout = ok(
        &["eval", "--model", "fixtures/models/copy-full", "--n", "3"],
        &[],
    );
    assert!(
        stdout
            .trim_end()
            .lines()
            .last()
            .unwrap()
            .starts_with("exact_match="),
        "{stdout}"
    );
}

#[test]
fn suite_command_writes_the_committed_file() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("s.jsonl");
    let stdout = ok(&["suite", "--out", out.to_str().unwrap()], &[]);
    assert!(stdout.contains("208 items"), "{stdout}");
    let committed =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/suites/smollm2.jsonl");
    assert_eq!(
        std::fs::read(out).unwrap(),
        std::fs::read(committed).unwrap()
    );
    let out = tmp.path().join("c.jsonl");
    let stdout = ok(
        &[
            "suite",
            "--form",
            "completion",
            "--out",
            out.to_str().unwrap(),
        ],
        &[],
    );
    assert!(stdout.contains("208 items"), "{stdout}");
    let committed =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/suites/completion.jsonl");
    assert_eq!(
        std::fs::read(out).unwrap(),
        std::fs::read(committed).unwrap()
    );
}

/// Run lcut with its stdout a pipe whose reader has gone (`lcut ... | head`
/// after head has exited).
fn lcut_into_closed_pipe(args: &[&str]) {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut child = Command::new(env!("CARGO_BIN_EXE_lcut"))
        .args(args)
        .current_dir(repo)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("lcut runs");
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("lcut ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "lcut {args:?}: {stderr}");
}

#[test]
fn results_are_written_when_stdout_is_closed() {
    let tmp = tempfile::tempdir().unwrap();
    let suite = write_suite(tmp.path());
    let out = |name: &str| tmp.path().join(name).to_str().unwrap().to_string();
    for (i, name) in ["s0.json", "s1.json"].iter().enumerate() {
        let shard = format!("{i}/2");
        lcut_into_closed_pipe(&[
            "eval",
            "--model",
            "fixtures/models/copy-full",
            "--suite",
            &suite,
            "--policy",
            "full,speed:2+bos",
            "--max-new-tokens",
            "4",
            "--shard",
            &shard,
            "--json",
            &out(name),
        ]);
    }
    for policy in ["full", "speed-2-bos"] {
        let (s0, s1) = (
            out(&format!("s0.{policy}.json")),
            out(&format!("s1.{policy}.json")),
        );
        assert!(
            Path::new(&s0).exists() && Path::new(&s1).exists(),
            "{policy}"
        );
        let merged = out(&format!("m.{policy}.json"));
        lcut_into_closed_pipe(&["eval-merge", &s0, &s1, "--out", &merged]);
        assert_eq!(read(Path::new(&merged)).items.len(), 5, "{policy}");
    }
    // the sweep's report, with its suite accuracy
    let run = tmp.path().join("run");
    diagnose(&run, &[]);
    lcut_into_closed_pipe(&sweep_args(
        &run,
        &[
            "--cuts",
            "2,4",
            "--eval-suite",
            &suite,
            "--eval-max-new-tokens",
            "4",
        ],
    ));
    let report = read_report(&run);
    assert_eq!(
        report["sweep"]["accuracy"].as_array().map(Vec::len),
        Some(2)
    );
}
