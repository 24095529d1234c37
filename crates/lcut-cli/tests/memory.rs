//! A run that cannot fit in memory is refused before it starts, with the
//! figures, instead of being killed half way through a prefill.

use std::process::Command;

#[test]
fn a_benchmark_too_large_for_the_machine_is_refused_with_the_figures() {
    // weights alone: 200 layers of width 32768 in f32, about 4 TiB
    let out = Command::new(env!("CARGO_BIN_EXE_lcut"))
        .args([
            "bench",
            "--layers",
            "200",
            "--hidden",
            "32768",
            "--heads",
            "64",
            "--kv-heads",
            "8",
            "--intermediate",
            "131072",
            "--prompt-lengths",
            "1k",
        ])
        .output()
        .expect("lcut runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("need about") && stderr.contains("weights") && stderr.contains("free"),
        "{stderr}"
    );
    // refused before drawing any weights (4 TiB could not have been drawn)
    assert!(stderr.contains("--dtype bf16"), "{stderr}");
}

/// A small model of the test fixtures, in the repository.
fn tiny_model() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/copy-full")
}

/// `lcut ARGS` with the machine's free memory set to `free`.
fn lcut_with_free(free: &str, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_lcut"))
        .env("LCUT_AVAILABLE_MEMORY", free)
        .args(args)
        .output()
        .expect("lcut runs")
}

/// `lcut diagnose` says what the run will need before loading the model,
/// refuses a run that needs more than the machine has free, naming the
/// figures and `--force`, and writes nothing; `--force` runs it anyway.
#[test]
fn a_diagnose_over_the_free_memory_is_refused_unless_forced() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let out_dir = tmp.path().join("run");
    let model = tiny_model();
    let args = [
        "diagnose",
        "--model",
        model.to_str().expect("utf-8 path"),
        "--prompt",
        "abc",
        "--max-new-tokens",
        "4",
        "--out",
        out_dir.to_str().expect("utf-8 path"),
    ];
    // the fixture's weights alone are 2.4 MB
    let out = lcut_with_free("1M", &args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    for part in [
        "memory: 1 prompt of at most",
        "need about",
        "weights",
        "K/V",
        "traces and probes",
        "more than this machine has free (1.0 MiB)",
        "--force",
    ] {
        assert!(stderr.contains(part), "{part:?} missing from: {stderr}");
    }
    // only what diagnose offers is suggested: it has no --prefill-chunk
    assert!(
        stderr.contains("--dtype bf16") && !stderr.contains("--prefill-chunk"),
        "{stderr}"
    );
    assert!(
        !out_dir.exists(),
        "a refused run wrote {}",
        out_dir.display()
    );

    let mut forced = args.to_vec();
    forced.push("--force");
    let out = lcut_with_free("1M", &forced);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("warning: --force"), "{stderr}");
    assert!(out_dir.join("report.json").is_file());
}

/// `lcut generate` is refused the same way, before loading the weights,
/// and writes no JSON; with room it runs.
#[test]
fn a_generation_over_the_free_memory_is_refused() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let json = tmp.path().join("out.json");
    let model = tiny_model();
    let args = [
        "generate",
        "--model",
        model.to_str().expect("utf-8 path"),
        "--ids",
        "2,5,6,7",
        "--max-new-tokens",
        "4",
        "--json",
        json.to_str().expect("utf-8 path"),
    ];
    let out = lcut_with_free("1M", &args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("8 tokens will need about") && stderr.contains("--force"),
        "{stderr}"
    );
    assert!(!json.exists(), "a refused run wrote its JSON");
    let out = lcut_with_free("1G", &args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(json.is_file());
}

/// A malformed memory figure is a named error, not a silent default.
#[test]
fn a_malformed_free_memory_figure_is_named() {
    let model = tiny_model();
    let out = lcut_with_free(
        "lots",
        &[
            "generate",
            "--model",
            model.to_str().expect("utf-8 path"),
            "--ids",
            "2,5",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("LCUT_AVAILABLE_MEMORY"), "{stderr}");
}
