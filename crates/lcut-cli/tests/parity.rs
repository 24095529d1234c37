//! `lcut parity`: the check a user runs on a new device passes on the
//! reference cases (in bf16 also next to transformers' own bf16 logits),
//! and fails, naming the case, when logits are off.

#![allow(clippy::unwrap_used)] // test helpers unwrap like the tests do

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use candle_core::{Device, Tensor};

fn oracle() -> PathBuf {
    lcut_testkit::workspace_root().join("fixtures/oracle")
}

fn parity(cases: &Path, dtype: &str, json: &Path) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lcut"));
    cmd.args(["parity", "--dtype", dtype, "--cases"])
        .arg(cases)
        .arg("--json")
        .arg(json);
    if dtype == "bf16" {
        // transformers' own bf16 logits: lcut's rounding error must stay near theirs
        cmd.arg("--transformers-logits").arg(oracle().join("bf16"));
    }
    cmd.output().expect("lcut runs")
}

fn report(json: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap()
}

#[test]
fn every_reference_case_passes_in_f32_and_bf16() {
    let dir = tempfile::tempdir().unwrap();
    for dtype in ["f32", "bf16"] {
        let json = dir.path().join(format!("{dtype}.json"));
        let out = parity(&oracle(), dtype, &json);
        assert!(
            out.status.success(),
            "{dtype}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let r = report(&json);
        assert_eq!(r["pass"], true);
        let rows = r["rows"].as_array().unwrap();
        // every case, each with full logits and its SPEED/SelfOnly policies
        let cases: std::collections::BTreeSet<&str> =
            rows.iter().map(|r| r["case"].as_str().unwrap()).collect();
        let expected: std::collections::BTreeSet<&str> =
            lcut_testkit::ORACLE_CASES.into_iter().collect();
        assert_eq!(cases, expected);
        assert!(rows.len() > expected.len() * 4);
        // and each case's full model decoded a token at a time
        for case in &expected {
            let stepped =
                |r: &&serde_json::Value| r["case"] == *case && r["logits"] == "logits.steps";
            assert!(
                rows.iter().any(|r| stepped(&r)),
                "{case}: no row decoded a token at a time"
            );
        }
        if dtype == "bf16" {
            // bf16 is also compared with lcut itself on the CPU in f32, and
            // with how far transformers in bf16 is from its f32 logits
            assert!(rows.iter().all(|r| r["vs_cpu_f32"]["max_abs"].is_number()));
            assert!(rows.iter().all(|r| {
                let ours = r["vs_transformers"]["mean_abs"].as_f64().unwrap();
                let theirs = r["transformers_same_dtype"]["mean_abs"].as_f64().unwrap();
                ours <= 1.5 * theirs
            }));
        }
    }
}

#[test]
fn logits_off_by_a_little_fail_and_name_the_case() {
    let dir = tempfile::tempdir().unwrap();
    let case = dir.path().join("cases/llama-gqa");
    std::fs::create_dir_all(&case).unwrap();
    for f in ["case.json", "config.json", "model.safetensors"] {
        std::fs::copy(oracle().join("llama-gqa").join(f), case.join(f)).unwrap();
    }
    let mut tensors: HashMap<String, Tensor> = candle_core::safetensors::load(
        oracle().join("llama-gqa/reference.safetensors"),
        &Device::Cpu,
    )
    .unwrap();
    // shift one logit by 1e-3: far inside bf16 rounding, ten times the f32 bound
    let logits = tensors["logits"].to_vec2::<f32>().unwrap();
    let mut shifted = logits.clone();
    shifted[3][7] += 1e-3;
    let (rows, cols) = (shifted.len(), shifted[0].len());
    tensors.insert(
        "logits".into(),
        Tensor::from_vec(shifted.concat(), (rows, cols), &Device::Cpu).unwrap(),
    );
    candle_core::safetensors::save(&tensors, case.join("reference.safetensors")).unwrap();

    let json = dir.path().join("f32.json");
    let out = parity(&dir.path().join("cases"), "f32", &json);
    assert!(!out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let failing: Vec<&str> = stdout.lines().filter(|l| l.ends_with("NO")).collect();
    assert_eq!(failing.len(), 1, "{stdout}");
    assert!(failing[0].starts_with("llama-gqa") && failing[0].contains("logits "));
    assert_eq!(report(&json)["pass"], false);
}

#[test]
fn a_folder_without_cases_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = parity(dir.path(), "f32", &dir.path().join("x.json"));
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("case.json"), "{stderr}");
    assert!(!dir.path().join("x.json").exists());
}
