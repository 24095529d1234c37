//! Models by name end to end: a Hugging Face hub cache and an Ollama store
//! built in a temporary folder and handed to `lcut` through the variables
//! the tools read (set on the child process only). `lcut models` lists
//! them; `lcut tokenize`, `generate` and `forward` load them by name and
//! give what the same model gives by path; a relative path wins over a
//! name; a name on disk nowhere fails naming the places looked in.

#![allow(clippy::unwrap_used)] // test helpers unwrap like the tests do

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const MAIN: &str = "4b825dc642cb6eb9a060e54bf8d69288fbee4904";
const DIGEST: &str = "9a1f0c3b6e2d4f5a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn copy_full() -> PathBuf {
    repo_root().join("fixtures/models/copy-full")
}

/// A hub cache holding `org/copy` (the bundled copy model, files linked
/// into `blobs/`) and an Ollama store holding `gqa:f32` (a GGUF blob).
struct Stores {
    dir: tempfile::TempDir,
}

impl Stores {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("hub/models--org--copy");
        let snap = repo.join("snapshots").join(MAIN);
        std::fs::create_dir_all(&snap).unwrap();
        std::fs::create_dir_all(repo.join("blobs")).unwrap();
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        for entry in std::fs::read_dir(copy_full()).unwrap() {
            let entry = entry.unwrap();
            let blob = repo.join("blobs").join(entry.file_name());
            std::fs::copy(entry.path(), &blob).unwrap();
            link_to(&blob, &snap.join(entry.file_name()));
        }
        std::fs::write(repo.join("refs/main"), MAIN).unwrap();
        let ollama = dir.path().join("ollama");
        let manifest = ollama.join("manifests/registry.ollama.ai/library/gqa/f32");
        std::fs::create_dir_all(manifest.parent().unwrap()).unwrap();
        std::fs::create_dir_all(ollama.join("blobs")).unwrap();
        let gguf = lcut_testkit::oracle_case("llama-gqa").join("model.f32.gguf");
        std::fs::copy(gguf, ollama.join(format!("blobs/sha256-{DIGEST}"))).unwrap();
        std::fs::write(
            manifest,
            format!(
                r#"{{"schemaVersion":2,"layers":[{{"mediaType":"application/vnd.ollama.image.model","digest":"sha256:{DIGEST}","size":1}}]}}"#
            ),
        )
        .unwrap();
        Self { dir }
    }

    fn hub(&self) -> PathBuf {
        self.dir.path().join("hub")
    }

    fn ollama(&self) -> PathBuf {
        self.dir.path().join("ollama")
    }

    /// `lcut ARGS` in `cwd` with the stores in the child's environment only.
    fn lcut(&self, args: &[&str], cwd: &Path) -> Output {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_lcut"));
        for var in ["HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"] {
            cmd.env_remove(var);
        }
        cmd.env("HF_HUB_CACHE", self.hub())
            .env("OLLAMA_MODELS", self.ollama())
            .env("HOME", self.dir.path())
            .args(args)
            .current_dir(cwd)
            .output()
            .expect("lcut runs")
    }

    fn ok(&self, args: &[&str], cwd: &Path) -> String {
        let out = self.lcut(args, cwd);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "lcut {args:?} failed: {stderr}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

#[cfg(unix)]
fn link_to(target: &Path, link: &Path) {
    std::os::unix::fs::symlink(target, link).unwrap();
}

#[cfg(not(unix))]
fn link_to(target: &Path, link: &Path) {
    std::fs::copy(target, link).unwrap();
}

#[test]
fn a_hub_name_loads_the_same_model_as_its_path() {
    let s = Stores::new();
    let path = copy_full().display().to_string();
    let cwd = s.dir.path();
    let text = "copy: abc";
    let by_name = s.ok(&["tokenize", "--model", "org/copy", text], cwd);
    assert_eq!(by_name, s.ok(&["tokenize", "--model", &path, text], cwd));
    let generate = |model: &str, out: &str| {
        let out_path = cwd.join(out);
        s.ok(
            &[
                "generate",
                "--model",
                model,
                "--ids",
                "1,5,9,7,5",
                "--max-new-tokens",
                "4",
                "--json",
                out_path.to_str().unwrap(),
            ],
            cwd,
        );
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out_path).unwrap()).unwrap();
        json["tokens"].clone()
    };
    let tokens = generate("org/copy", "by-name.json");
    assert!(tokens.as_array().is_some_and(|t| !t.is_empty()), "{tokens}");
    assert_eq!(tokens, generate(&path, "by-path.json"));
}

#[test]
fn an_ollama_blob_without_extension_loads_as_gguf() {
    let s = Stores::new();
    let cwd = s.dir.path();
    let forward = |model: &str, out: &str| {
        let out_path = cwd.join(out);
        s.ok(
            &[
                "forward",
                "--model",
                model,
                "--ids",
                "1,5,9,7",
                "--no-attention",
                "--out",
                out_path.to_str().unwrap(),
            ],
            cwd,
        );
        let t = candle_core::safetensors::load(&out_path, &candle_core::Device::Cpu).unwrap();
        t["logits"].flatten_all().unwrap().to_vec1::<f32>().unwrap()
    };
    let gguf = lcut_testkit::oracle_case("llama-gqa").join("model.f32.gguf");
    let by_name = forward("gqa:f32", "by-name.safetensors");
    assert_eq!(
        by_name,
        forward(gguf.to_str().unwrap(), "by-path.safetensors")
    );
}

#[test]
fn a_relative_path_wins_over_a_hub_name() {
    let s = Stores::new();
    // the hub's org/copy is damaged: refs/main names a commit with no snapshot
    std::fs::write(s.hub().join("models--org--copy/refs/main"), "ab".repeat(20)).unwrap();
    let out = s.lcut(&["tokenize", "--model", "org/copy", "abc"], s.dir.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("refs/main") && stderr.contains(&"ab".repeat(20)),
        "{stderr}"
    );
    // a folder of that name in the working folder is taken first
    let cwd = tempfile::tempdir().unwrap();
    let local = cwd.path().join("org/copy");
    std::fs::create_dir_all(&local).unwrap();
    for entry in std::fs::read_dir(copy_full()).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), local.join(entry.file_name())).unwrap();
    }
    let by_path = s.ok(&["tokenize", "--model", "org/copy", "abc"], cwd.path());
    assert!(!by_path.trim().is_empty());
}

#[test]
fn a_name_on_disk_nowhere_names_the_places_looked_in() {
    let s = Stores::new();
    let out = s.lcut(
        &["generate", "--model", "org/absent", "--ids", "1"],
        s.dir.path(),
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    for part in [
        "org/absent",
        "never downloads",
        "$HF_HUB_CACHE",
        &s.hub().display().to_string(),
        "models--org--absent",
        "$OLLAMA_MODELS",
        &s.ollama().display().to_string(),
    ] {
        assert!(
            stderr.contains(part),
            "stderr does not mention {part:?}: {stderr}"
        );
    }
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn lcut_models_lists_both_stores() {
    let s = Stores::new();
    let table = s.ok(&["models"], s.dir.path());
    let row = |name: &str| {
        table
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("no row for {name}: {table}"))
            .split_whitespace()
            .collect::<Vec<_>>()
    };
    let copy = row("org/copy");
    assert_eq!(copy[1..3], ["hub", "safetensors"], "{table}");
    assert_eq!(copy[copy.len() - 2..], ["llama", "4"], "{table}");
    let gqa = row("gqa:f32");
    assert_eq!(gqa[1..3], ["ollama", "gguf"], "{table}");
    assert_eq!(gqa[gqa.len() - 2..], ["llama", "6"], "{table}");

    let json: serde_json::Value =
        serde_json::from_str(&s.ok(&["models", "--json"], s.dir.path())).unwrap();
    let models = json["models"].as_array().unwrap();
    assert_eq!(models.len(), 2, "{json}");
    let gguf_len = std::fs::metadata(s.ollama().join(format!("blobs/sha256-{DIGEST}")))
        .unwrap()
        .len();
    let gqa = models.iter().find(|m| m["name"] == "gqa:f32").unwrap();
    assert_eq!(gqa["size_bytes"], gguf_len);
    assert_eq!(gqa["format"], "gguf");
    assert_eq!(json["places"].as_array().unwrap().len(), 2);

    // with no stores on disk, each is skipped with a note
    let empty = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_lcut"))
        .arg("models")
        .env("HF_HUB_CACHE", empty.path().join("none"))
        .env("OLLAMA_MODELS", empty.path().join("nothing"))
        .output()
        .unwrap();
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("none") && stderr.contains("nothing") && stderr.contains("skipped"),
        "{stderr}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("no models found"));
}
