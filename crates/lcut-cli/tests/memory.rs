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
    nothing_written_then_forced(&args, &out_dir);
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

/// A GGUF of Llama-3.2-1B's layout at a size written and diagnosed in a
/// second (2 layers, hidden 256, vocabulary 512), matrices in Q4_0, and the
/// bytes of weights the writer put in it.
fn tiny_gguf(dir: &std::path::Path) -> (std::path::PathBuf, u64) {
    let mut shape = lcut_synth::shapes::llama_3_2_1b();
    shape.name = "tiny-llama".into();
    shape.sizes.vocab_size = 512;
    shape.sizes.hidden_size = 256;
    shape.sizes.intermediate_size = 512;
    shape.sizes.num_layers = 2;
    shape.sizes.num_heads = 4;
    shape.sizes.num_kv_heads = 2;
    shape.tokens.bos = 500;
    shape.tokens.eos = 501;
    let path = dir.join("tiny.q4_0.gguf");
    let written = lcut_synth::write_model(
        &shape,
        lcut_synth::Format::GgufQ4_0,
        &path,
        &lcut_synth::WriteOptions::default(),
        &mut |_, _| {},
    )
    .expect("the tiny GGUF is written");
    (path, written.weight_bytes)
}

/// The figure a memory line gives for `part` (`weights`, `K/V`), in the
/// line's unit, and that unit's size in bytes.
fn figure(line: &str, part: &str) -> (f64, f64) {
    let unit = if line.contains(" GiB (") {
        f64::from(1u32 << 30)
    } else {
        f64::from(1u32 << 20)
    };
    let after = line
        .split_once(&format!("{part} "))
        .unwrap_or_else(|| panic!("no {part:?} in {line}"))
        .1;
    let number: String = after
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    (number.parse().expect("a figure"), unit)
}

/// A GGUF run in `--dtype q` keeps its matrices mapped from the file: the
/// memory line counts the weights as the file's tensor bytes (not four
/// bytes per parameter) and the K/V cache in f16 (the cache `--kv-dtype
/// auto` gives a quantized run). A run that does not fit is refused with
/// those figures, without suggesting `--dtype bf16` (which would not make a
/// quantized run smaller), and writes nothing; `--force` runs it.
#[test]
fn a_quantized_gguf_diagnose_names_its_mapped_figures_and_is_refused_unless_forced() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let (model, weight_bytes) = tiny_gguf(tmp.path());
    let file_bytes = std::fs::metadata(&model).expect("the GGUF").len();
    let out_dir = tmp.path().join("run");
    // about 600 tokens (the tiny vocabulary merges few): the K/V (2 layers
    // x K and V x 2 heads x 64 wide x 2 bytes per token) reads as a
    // fraction of a MiB, f16 told from f32
    let prompt = "the model and the layer of the token ".repeat(24);
    let args = [
        "diagnose",
        "--model",
        model.to_str().expect("utf-8 path"),
        "--dtype",
        "q",
        "--raw",
        "--prompt",
        &prompt,
        "--max-new-tokens",
        "4",
        "--out",
        out_dir.to_str().expect("utf-8 path"),
    ];
    let out = lcut_with_free("1M", &args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.starts_with("memory: 1 prompt of at most"))
        .unwrap_or_else(|| panic!("no memory line in: {stderr}"));
    let tokens: usize = line
        .split_whitespace()
        .nth(6)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no prompt length in {line}"));
    assert!(tokens > 400, "{line}");

    // the weights: the tensors' bytes the writer put in the file and its
    // header (resident once parsed), i.e. the file (within the line's
    // rounding), far below an f32 copy
    let (weights, unit) = figure(line, "weights");
    let expected = file_bytes as f64 / unit;
    assert!((weights - expected).abs() <= 0.05, "{expected:.2}: {line}");
    assert!(weight_bytes <= file_bytes && file_bytes - weight_bytes < 1 << 20);
    let params = 512 * 256 + 2 * (2 * 256 * 256 + 2 * 256 * 128 + 3 * 256 * 512);
    assert!(weights < 0.25 * f64::from(params * 4) / unit, "{line}");
    // the K/V of the prompt and its 4 new tokens in f16
    let (kv, _) = figure(line, "K/V");
    let kv_f16 = ((tokens + 4) * 2 * 2 * 2 * 64 * 2) as f64 / unit;
    assert!((kv - kv_f16).abs() <= 0.05, "{kv_f16:.2} expected: {line}");

    for part in [
        "will need about",
        "traces and probes",
        "the process before loading",
        "more than this machine has free (1.0 MiB)",
        "--force",
    ] {
        assert!(stderr.contains(part), "{part:?} missing from: {stderr}");
    }
    assert!(!stderr.contains("--dtype bf16"), "{stderr}");
    nothing_written_then_forced(&args, &out_dir);
}

/// A refused run wrote nothing in `out_dir`; the same run with `--force`
/// runs, warns and writes its report.
fn nothing_written_then_forced(args: &[&str], out_dir: &std::path::Path) {
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

/// `lcut bench` on a GGUF in `--dtype q` sizes its K/V in the cache's own
/// dtype (f16 under `--kv-dtype auto`), not the activations' f32, and
/// `--kv-dtype f32` doubles that figure.
#[test]
fn a_quantized_benchmark_counts_its_cache_in_the_cache_dtype() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let (model, _) = tiny_gguf(tmp.path());
    let model = model.to_str().expect("utf-8 path");
    let kv_figure = |kv_dtype: &str| {
        let args = [
            "bench",
            "--model",
            model,
            "--dtype",
            "q",
            "--kv-dtype",
            kv_dtype,
            "--policies",
            "full",
            "--prompt-lengths",
            "1k",
            "--new-tokens",
            "24",
        ];
        let out = lcut_with_free("1M", &args);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "{stderr}");
        let (kv, unit) = figure(&stderr, "K/V");
        kv * unit
    };
    // 1048 tokens x 2 layers x K and V x 2 heads x 64 wide
    let per_byte = (1024 + 24) * 2 * 2 * 2 * 64;
    let auto = kv_figure("auto");
    let f32 = kv_figure("f32");
    let mib = f64::from(1u32 << 20);
    assert!(
        (auto - f64::from(per_byte * 2)).abs() <= 0.05 * mib,
        "{auto}"
    );
    assert!((f32 - f64::from(per_byte * 4)).abs() <= 0.05 * mib, "{f32}");
}
