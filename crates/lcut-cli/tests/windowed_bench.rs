//! `lcut bench` on a model whose layers slide (the Gemma 3 reference case:
//! five layers with a 12-key window, then one global layer) with prompts
//! longer than the window: the bytes the caches hold are the windowed
//! count, worked out here by hand, and SPEED's saving is the global layer's
//! share, not the share of layers a window-blind count would give.

#![allow(clippy::unwrap_used)] // test helpers unwrap like the tests do

use std::path::Path;
use std::process::Command;

use lcut_testkit::oracle_case;

/// `lcut ARGS` run from the workspace root.
fn lcut(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_lcut"))
        .args(args)
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
        .output()
        .unwrap()
}

#[test]
fn bench_counts_a_sliding_layer_at_its_window() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("bench.json");
    let model = oracle_case("gemma3-sliding");
    #[rustfmt::skip]
    let args = [
        "bench", "--model", model.to_str().unwrap(), "--prompt-lengths", "64,128",
        "--new-tokens", "4", "--policies", "speed:3+bos", "--json", out.to_str().unwrap(),
    ];
    let run = lcut(&args);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let rows: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let rows = rows.as_array().unwrap();
    // one K/V head of width 32 in f32: 256 bytes a row
    let row = 2 * 32 * 4;
    let (window, sliding) = (12, 5);
    for len in [64, 128] {
        let at = |policy: &str| {
            rows.iter()
                .find(|r| r["policy"] == policy && r["prompt_len"] == len)
                .unwrap_or_else(|| panic!("no row {policy} @ {len}"))
        };
        // the prompt and 3 fed new tokens: a sliding layer holds the last
        // window - 1 of them, the global layer all
        let tokens = len + 3;
        let full = row * (sliding * (window - 1) + tokens);
        // SPEED at 3: three sliding layers below the cut hold their window;
        // above it the two sliding layers hold the 4 decode-phase rows
        // (BoS has left their window), the global one BoS and those 4
        let speed = row * (3 * (window - 1) + 2 * 4 + 5);
        for (policy, bytes) in [("full", full), ("speed:3+bos", speed)] {
            let r = at(policy);
            assert_eq!(r["kv_bytes"].as_u64(), Some(bytes as u64), "{r}");
            assert_eq!(r["kv_bytes_formula"], r["kv_bytes"], "{r}");
            assert_eq!(r["kv_bytes_resident"], r["kv_bytes"], "{r}");
        }
        let ratio = at("speed:3+bos")["kv_ratio"].as_f64().unwrap();
        assert!((ratio - speed as f64 / full as f64).abs() < 1e-9, "{ratio}");
        // a window-blind count would have SPEED at 3 of 6 hold about half
        let blind = (3 * tokens + 3 * 5) as f64 / (6 * tokens) as f64;
        assert!(ratio < blind - 0.1, "{ratio} vs {blind}");
    }
}

/// A press on the same model compresses only the global layer, as kvpress
/// runs Gemma 3, and says so: the sliding layers hold their window, the
/// global one half the prompt and the fed tokens, which is the formula.
#[test]
fn bench_runs_a_press_on_the_global_layers_and_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("bench.json");
    let model = oracle_case("gemma3-sliding");
    #[rustfmt::skip]
    let args = [
        "bench", "--model", model.to_str().unwrap(), "--prompt-lengths", "64",
        "--new-tokens", "4", "--policies", "knorm:0.5", "--json", out.to_str().unwrap(),
    ];
    let run = lcut(&args);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    assert!(
        stderr.contains("knorm:0.5: compress the 1 of 6 layers without a sliding window (5)")
            && stderr.contains("leave the 5 sliding-window layers"),
        "{stderr}"
    );
    let rows: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let r = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["policy"] == "knorm:0.5")
        .unwrap();
    let (row, window, sliding) = (2 * 32 * 4, 12, 5);
    let bytes = row * (sliding * (window - 1) + 64 / 2 + 3);
    assert_eq!(r["kv_bytes"].as_u64(), Some(bytes as u64), "{r}");
    assert_eq!(r["kv_bytes_formula"], r["kv_bytes"], "{r}");
}

/// `lcut bench` on Gemma 4 (the reference case `layouts/gemma4-shared`):
/// layers 4 and 5 read the K/V of layers 3 and 2 and hold none, the full
/// layer 2 stores one head of 32 and the sliding layers two of 16. The
/// bytes held, worked out by hand, equal the layer-by-layer formula: a cut
/// at 4 keeps everything the full model stores (the layers above it store
/// nothing), a cut at 2 removes the prompt from layers 2 and 3.
#[test]
fn bench_counts_gemma4s_stored_kv_once_at_each_layers_width() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("bench.json");
    let model = oracle_case("layouts/gemma4-shared");
    #[rustfmt::skip]
    let args = [
        "bench", "--model", model.to_str().unwrap(), "--prompt-lengths", "64",
        "--new-tokens", "4", "--policies", "speed:4+bos,speed:2+bos",
        "--json", out.to_str().unwrap(),
    ];
    let run = lcut(&args);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let rows: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let rows = rows.as_array().unwrap();
    let at = |policy: &str| {
        rows.iter()
            .find(|r| r["policy"] == policy)
            .unwrap_or_else(|| panic!("no row {policy}"))
    };
    // f32 rows: 2 x 2 heads x 16 (sliding) = 2 x 1 head x 32 (full) = 256 B
    let (row, window, tokens) = (256, 12, 64 + 3);
    // three sliding layers hold window - 1 rows, the full layer all
    let full = row * (3 * (window - 1) + tokens);
    // above cut 2: layer 2 keeps BoS and the 4 decode-phase rows, layer 3
    // (sliding) the 4 decode-phase rows in its window
    let cut2 = row * (2 * (window - 1) + 5 + 4);
    for (policy, bytes) in [("full", full), ("speed:4+bos", full), ("speed:2+bos", cut2)] {
        let r = at(policy);
        assert_eq!(r["kv_bytes"].as_u64(), Some(bytes as u64), "{r}");
        assert_eq!(r["kv_bytes_formula"], r["kv_bytes"], "{r}");
    }
}
