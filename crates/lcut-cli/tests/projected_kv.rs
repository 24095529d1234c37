//! Projected prompt K/V (`swiftkv:C`, `pop:C`) through the commands a
//! policy runs through: `lcut bench` measures it beside full and SPEED with
//! the full model's K/V and a FLOP prediction between SPEED's and full's,
//! `lcut eval --suite` scores it on the bundled model under both names,
//! `lcut generate --compare` runs it in lockstep with full (and `swiftkv:L`
//! generates what full does), `lcut forward` writes transformers' rows for it
//! (`fixtures/oracle/*/swiftkv.safetensors`), and each names a cutoff out
//! of range.

#![allow(clippy::unwrap_used)] // test helpers unwrap like the tests do

use std::path::Path;
use std::process::{Command, Output};

use candle_core::{DType, Device, Tensor};
use lcut_engine::suite::SuiteEval;
use lcut_testkit::oracle_case;

fn lcut(args: &[&str]) -> Output {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    Command::new(env!("CARGO_BIN_EXE_lcut"))
        .args(args)
        .current_dir(repo)
        .output()
        .expect("lcut runs")
}

fn ok(args: &[&str]) -> String {
    let out = lcut(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "lcut {args:?} failed: {stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn bench_rows_hold_full_kv_and_predict_flops_between_speed_and_full() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("bench.json");
    let out_s = out.to_str().unwrap();
    #[rustfmt::skip]
    let args = [
        "bench", "--layers", "4", "--hidden", "64", "--heads", "4", "--kv-heads", "2",
        "--intermediate", "128", "--vocab", "300", "--prompt-lengths", "48,96",
        "--new-tokens", "4", "--policies", "speed:2+bos,swiftkv:2+bos,pop:2", "--json", out_s,
    ];
    let stdout = ok(&args);
    assert!(
        stdout.contains("swiftkv:2+bos") && stdout.contains("pop:2"),
        "{stdout}"
    );
    let rows = json(&out);
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 8, "full and three policies at two lengths");
    for len in [48, 96] {
        let row = |policy: &str| {
            rows.iter()
                .find(|r| r["policy"] == policy && r["prompt_len"] == len)
                .unwrap_or_else(|| panic!("no row {policy} @ {len}"))
        };
        let speed = row("speed:2+bos")["prefill_flops_ratio"].as_f64().unwrap();
        for policy in ["swiftkv:2+bos", "pop:2"] {
            let r = row(policy);
            assert_eq!(r["kv_ratio"].as_f64(), Some(1.0), "{r}");
            assert_eq!(r["kv_bytes"], row("full")["kv_bytes"], "{r}");
            assert_eq!(r["kv_bytes"], r["kv_bytes_formula"], "{r}");
            // decode reads every layer's prompt K/V, as full does
            assert_eq!(r["kv_bytes_resident"], row("full")["kv_bytes_resident"]);
            assert_eq!(r["new_tokens"], 4, "{r}");
            let flops = r["prefill_flops_ratio"].as_f64().unwrap();
            assert!(
                speed < flops && flops < 1.0,
                "{policy} @ {len}: {flops} vs SPEED {speed}"
            );
        }
    }
}

#[test]
fn eval_scores_projected_kv_on_the_bundled_model_under_both_names() {
    let tmp = tempfile::tempdir().unwrap();
    let prompts = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/prompts/copy.jsonl"),
    )
    .unwrap();
    let lines: Vec<String> = prompts
        .lines()
        .take(3)
        .enumerate()
        .map(|(k, line)| {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            let prompt = v["prompt"].as_str().unwrap();
            let span = prompt.split('[').nth(1).unwrap().split(']').next().unwrap();
            serde_json::json!({
                "id": format!("c{k}"), "kind": "copy", "length": "short",
                "prompt": prompt, "answer": span.trim(), "scoring": "contains",
            })
            .to_string()
        })
        .collect();
    let suite = tmp.path().join("suite.jsonl");
    std::fs::write(&suite, lines.join("\n") + "\n").unwrap();
    let out = tmp.path().join("e.json");
    #[rustfmt::skip]
    let stdout = ok(&[
        "eval", "--model", "fixtures/models/copy-full", "--suite", suite.to_str().unwrap(),
        "--policy", "full,swiftkv:2+bos,pop:3", "--max-new-tokens", "6",
        "--json", out.to_str().unwrap(),
    ]);
    assert!(
        stdout.contains("policy=swiftkv:2+bos") && stdout.contains("policy=pop:3"),
        "{stdout}"
    );
    let read = |name: &str| -> SuiteEval {
        serde_json::from_str(&std::fs::read_to_string(tmp.path().join(name)).unwrap()).unwrap()
    };
    let full = read("e.full.json");
    for (file, policy) in [
        ("e.swiftkv-2-bos.json", "swiftkv:2+bos"),
        ("e.pop-3.json", "pop:3"),
    ] {
        let e = read(file);
        assert_eq!(e.policy, policy);
        assert_eq!(e.items.len(), 3);
        // teacher-forced against the full model's answer, token by token
        let forced = e
            .items
            .iter()
            .all(|r| r.forced_tokens > 0 && r.agree <= r.forced_tokens);
        assert!(forced, "{policy}: {:?}", e.items);
    }
    assert_eq!(full.items.len(), 3);
}

#[test]
fn generate_compares_projected_kv_with_full_in_lockstep() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("g.json");
    #[rustfmt::skip]
    let stdout = ok(&[
        "generate", "--model", "fixtures/models/copy-full", "--ids", "1,5,6,7,8,9,10,11,12,13",
        "--decode-start", "8", "--policy", "swiftkv:2+bos", "--compare", "full",
        "--max-new-tokens", "5", "--json", out.to_str().unwrap(),
    ]);
    assert!(
        stdout.contains("[swiftkv:2+bos]") && stdout.contains("agreement"),
        "{stdout}"
    );
    let cmp = json(&out);
    let outputs = cmp["outputs"].as_array().unwrap();
    assert_eq!(outputs.len(), 2);
    let (full, ours) = (&outputs[0], &outputs[1]);
    assert_eq!(ours["policy"], "swiftkv:2+bos");
    assert_eq!(ours["kv_bytes_held"], full["kv_bytes_held"], "{ours}");
    assert_eq!(ours["kv_bytes_held"], ours["kv_bytes_formula"], "{ours}");
}

#[test]
fn swiftkv_at_the_depth_generates_what_full_generates() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("g.json");
    // a random-weight 6-layer Llama: no end-of-sequence token cuts the run short
    let model = oracle_case("llama-gqa");
    #[rustfmt::skip]
    ok(&[
        "generate", "--model", model.to_str().unwrap(), "--ids", "1,5,6,7,8,9,10,11,12,13",
        "--decode-start", "8", "--policy", "swiftkv:6", "--compare", "full",
        "--max-new-tokens", "6", "--json", out.to_str().unwrap(),
    ]);
    let cmp = json(&out);
    let outputs = cmp["outputs"].as_array().unwrap();
    assert_eq!(outputs[0]["tokens"], outputs[1]["tokens"]);
    let steps = cmp["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 6);
    for step in steps {
        assert_eq!(step["agree"][1], true, "{step}");
        let kl = step["kl"][1].as_f64().unwrap();
        assert!(kl.abs() < 1e-6, "{step}");
    }
}

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims());
    let d = (a - b).unwrap().abs().unwrap().flatten_all().unwrap();
    d.max(0).unwrap().to_scalar().unwrap()
}

#[test]
fn forward_writes_the_rows_transformers_gives_and_full_at_the_depth() {
    let dir = oracle_case("llama-gqa");
    let reference =
        candle_core::safetensors::load(dir.join("swiftkv.safetensors"), &Device::Cpu).unwrap();
    let full_ref =
        candle_core::safetensors::load(dir.join("reference.safetensors"), &Device::Cpu).unwrap();
    let ids: Vec<u32> = reference["input_ids"]
        .to_dtype(DType::U32)
        .unwrap()
        .to_vec1()
        .unwrap();
    let s = reference["decode_start"].to_vec1::<i64>().unwrap()[0] as usize;
    let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
    let (ids, start) = (ids.join(","), s.to_string());
    let tmp = tempfile::tempdir().unwrap();
    let t = full_ref["logits"].dim(0).unwrap();
    let full_rows = full_ref["logits"].narrow(0, s, t - s).unwrap();
    for (policy, key) in [
        ("swiftkv:2+bos", Some("logits.swiftkv.c2.bos")),
        ("pop:4", Some("logits.swiftkv.c4.noanchor")),
        ("swiftkv:6", None),
    ] {
        let out = tmp
            .path()
            .join(format!("{}.safetensors", policy.replace(':', "-")));
        #[rustfmt::skip]
        ok(&[
            "forward", "--model", dir.to_str().unwrap(), "--ids", &ids, "--decode-start", &start,
            "--policy", policy, "--out", out.to_str().unwrap(),
        ]);
        let ours = candle_core::safetensors::load(&out, &Device::Cpu).unwrap();
        let want = key.map_or(&full_rows, |k| &reference[k]);
        let diff = max_diff(&ours["logits"], want);
        assert!(diff <= 1e-4, "{policy}: {diff}");
        // the policy moves the rows, so the match above is not full's
        if key.is_some() {
            assert!(max_diff(&ours["logits"], &full_rows) > 1e-2, "{policy}");
        }
    }
}

#[test]
fn a_cutoff_out_of_range_is_named_by_every_command() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("x.json");
    let out = out.to_str().unwrap();
    #[rustfmt::skip]
    let runs: [&[&str]; 3] = [
        &["bench", "--layers", "4", "--hidden", "64", "--heads", "4", "--kv-heads", "2",
          "--intermediate", "128", "--vocab", "300", "--prompt-lengths", "16",
          "--policies", "swiftkv:5+bos"],
        &["generate", "--model", "fixtures/models/copy-full", "--ids", "1,5,6",
          "--policy", "pop:9", "--json", out],
        &["forward", "--model", "fixtures/models/copy-full", "--ids", "1,5,6",
          "--policy", "swiftkv:0", "--out", out],
    ];
    for args in runs {
        let o = lcut(args);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?}");
        assert!(
            stderr.contains("out of range") && stderr.contains("4 layers"),
            "{args:?}: {stderr}"
        );
    }
    let o = lcut(&[
        "generate",
        "--model",
        "fixtures/models/copy-full",
        "--policy",
        "swiftkv:2+system",
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("swiftkv keeps either no anchor or `+bos`"),
        "{stderr}"
    );
}
