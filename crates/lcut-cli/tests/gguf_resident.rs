//! A GGUF loaded with `--dtype q` costs what the memory line says: its
//! bytes are held once. On a CPU with AVX2 its matrices are packed at load
//! (rows interleaved for the kernels) and the mapping's pages of each are
//! released, so the copy replaces them; elsewhere (or with `LCUT_REPACK=0`)
//! they stay in the mapped file, paged in as a forward reads them. Either
//! way the resident growth after loading and after a short forward agrees
//! with the line's estimate. Measured on this process's own resident memory
//! (`/proc/self/status`), so this file holds one test: no other test's
//! allocations run beside it.

#![allow(clippy::unwrap_used)] // test helpers unwrap like the tests do

use std::path::Path;
use std::process::Command;

use candle_core::Device;
use lcut_model::memory::{estimate, kv_cache_bytes, loaded_weight_bytes};
use lcut_model::{Decoder, LogitRows, ModelFiles, WeightMode, default_attention_block_elems};

const MIB: f64 = (1u64 << 20) as f64;

/// This process's resident memory: all of it, its anonymous part (heap,
/// stacks) and its file-backed part (mapped files, the binary), bytes;
/// `None` where `/proc/self/status` is not readable (not Linux).
fn resident() -> Option<(u64, u64, u64)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
    };
    Some((field("VmRSS:")?, field("RssAnon:")?, field("RssFile:")?))
}

/// Resident bytes of this process's mappings of the file `path`
/// (`/proc/self/smaps`).
fn mapped_resident(path: &Path) -> Option<u64> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let name = path.to_str()?;
    let mut inside = false;
    let mut total = 0;
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or("");
        if first.contains('-') && first.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            inside = line.ends_with(name);
        } else if inside && first == "Rss:" {
            total += words.next()?.parse::<u64>().ok()? * 1024;
        }
    }
    Some(total)
}

/// Growth from `before` to `after`, each part, in bytes (negative where a
/// part shrank: freed heap returned to the system).
fn growth(before: (u64, u64, u64), after: (u64, u64, u64)) -> (f64, f64, f64) {
    let d = |a: u64, b: u64| b as f64 - a as f64;
    (
        d(before.0, after.0),
        d(before.1, after.1),
        d(before.2, after.2),
    )
}

/// Write the `small` shape (8 layers, hidden 512, vocabulary 32000: a
/// 36 MB file) as a Q4_0 GGUF with `lcut synth`, in a child process so
/// that the writer's buffers never enter this process's resident memory.
fn write_small_gguf(path: &Path) {
    let out = Command::new(env!("CARGO_BIN_EXE_lcut"))
        .args([
            "synth",
            "--shape",
            "small",
            "--format",
            "gguf-q4_0",
            "--out",
        ])
        .arg(path)
        .output()
        .expect("lcut runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The total of the memory line `lcut generate` prints for `ids` (with
/// `new` new tokens) on `model` in `--dtype q`, less the process's own
/// part, bytes (to 0.1 MiB).
fn line_total_without_process(model: &Path, ids: &str, new: usize) -> f64 {
    let out = Command::new(env!("CARGO_BIN_EXE_lcut"))
        .args(["generate", "--dtype", "q", "--ids", ids, "--max-new-tokens"])
        .arg(new.to_string())
        .arg("--model")
        .arg(model)
        .output()
        .expect("lcut runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.starts_with("memory:") && l.contains("will need about"))
        .unwrap_or_else(|| panic!("no memory line in: {stderr}"));
    let number_after = |key: &str| -> f64 {
        let rest = line.split_once(key).unwrap().1;
        let n: String = rest
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        n.parse().unwrap()
    };
    assert!(line.contains(" MiB ("), "{line}");
    (number_after("need about ") - number_after("the process before loading ")) * MIB
}

/// The GGUF's matrices are held once: packed at load (the heap grows by
/// the matrices, the mapping's pages of them are released) or read in
/// place (loading grows the process by a small fraction of the file, the
/// heap by less still). After a forward of 8 tokens and 4 decode steps the
/// resident growth is at most the line's estimate (weights, K/V, attention,
/// activations) plus 10%, and at least the weights a forward reads whole
/// (every matrix but the embedding, whose unread rows stay on disk); well
/// under 2x the file.
#[test]
fn a_mapped_gguf_holds_what_the_memory_line_says() {
    let Some(start) = resident() else {
        eprintln!("skipped: /proc/self/status is not readable here (not Linux)");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("small.q4_0.gguf");
    write_small_gguf(&path);
    let file_bytes = std::fs::metadata(&path).unwrap().len();

    let (prompt, new) = (8usize, 4usize);
    let ids: Vec<u32> = (0..prompt as u32).map(|i| 1 + 997 * i).collect();
    let ids_arg = ids.iter().map(u32::to_string).collect::<Vec<_>>();
    let line_need = line_total_without_process(&path, &ids_arg.join(","), new);

    // the line's estimate, as `lcut generate` sizes it
    let cpu = Device::Cpu;
    let mode = WeightMode::Quantized;
    let files = ModelFiles::open(&path).unwrap();
    let cfg = files.config().clone();
    let total = prompt + new;
    let kv = kv_cache_bytes(&cfg, mode.default_kv_dtype(), total);
    let need = estimate(
        &cfg,
        mode.activation_dtype(),
        kv,
        total,
        512,
        default_attention_block_elems(&cpu),
    )
    .with_weights(loaded_weight_bytes(&files, mode));
    let need_bytes = need.total() as f64;
    assert!(
        (need_bytes - line_need).abs() <= 0.1 * MIB,
        "the line said {:.1} MiB, the estimate is {:.1} MiB",
        line_need / MIB,
        need_bytes / MIB
    );

    let before = resident().unwrap();
    let mut model = Decoder::from_files(files, mode, &cpu).unwrap();
    model.set_kv_dtype(mode.default_kv_dtype()).unwrap();
    let loaded = growth(before, resident().unwrap());

    let mut seq = model.new_full_sequence();
    let mut next = ids.clone();
    for _ in 0..=new {
        let out = model
            .forward(&mut seq, &next, LogitRows::Last, None)
            .unwrap();
        let logits = out.logits.unwrap();
        next = vec![
            logits
                .flatten_all()
                .unwrap()
                .argmax(0)
                .unwrap()
                .to_scalar()
                .unwrap(),
        ];
    }
    let ran = growth(before, resident().unwrap());
    let mapped = mapped_resident(&path).unwrap();

    // what a forward reads whole: every tensor but the embedding (Q4_0:
    // 18 bytes per 32 values), of which it reads only its tokens' rows
    let embedding = (cfg.vocab_size * cfg.hidden_size / 32 * 18) as f64;
    let read_whole = need.weights as f64 - embedding;
    let report = format!(
        "file {:.1} MiB; estimate {:.1} MiB (weights {:.1}); growth after load {:.1} MiB \
         (anonymous {:.1}, file-backed {:.1}), after the forward {:.1} MiB (anonymous {:.1}, \
         file-backed {:.1}), of it the file's mapping {:.1}; process at start {:.1} MiB",
        file_bytes as f64 / MIB,
        need_bytes / MIB,
        need.weights as f64 / MIB,
        loaded.0 / MIB,
        loaded.1 / MIB,
        loaded.2 / MIB,
        ran.0 / MIB,
        ran.1 / MIB,
        ran.2 / MIB,
        mapped as f64 / MIB,
        start.0 as f64 / MIB,
    );
    eprintln!("{report}");

    if lcut_model::mapped::packs_at_load() {
        // loading copies each matrix once, and the mapping keeps no second
        // copy of it
        assert!(
            loaded.1 >= 0.9 * read_whole && loaded.0 <= 1.1 * file_bytes as f64,
            "loading should hold the packed matrices once: {report}"
        );
        // of the mapping, at most the tensors left in it (the embedding,
        // the norms) stay resident: however much of them the system maps
        // around the rows a lookup reads, none of the packed matrices'
        // pages come back
        assert!(
            (mapped as f64) <= file_bytes as f64 - 0.9 * read_whole,
            "the mapping's pages of the packed matrices stayed resident: {report}"
        );
    } else {
        // loading copies no matrix: it reads headers and the norms
        assert!(
            loaded.0 < 0.25 * file_bytes as f64,
            "loading made the process resident in a copy: {report}"
        );
        // a forward pages the matrices in from the file, not onto the heap
        assert!(
            ran.1 < 0.25 * file_bytes as f64,
            "the forward's heap grew like a copy: {report}"
        );
        assert!(
            ran.2 >= 0.9 * read_whole,
            "the forward's pages of the file: {report}"
        );
    }
    // the line's estimate bounds the growth, within 10%, and is near it
    assert!(ran.0 <= 1.1 * need_bytes, "{report}");
    assert!(ran.0 >= 0.9 * read_whole, "{report}");
    assert!(ran.0 < 1.25 * file_bytes as f64, "{report}");
}
