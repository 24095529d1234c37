//! Models by name, offline: Hugging Face hub cache and Ollama store layouts
//! built in a temporary folder (files as links into `blobs/`, as the tools
//! write them), resolved by name, and every damaged layout refused with an
//! error naming the place, nothing written. Models loaded through a name
//! are checked against transformers' logits (the llama-gqa reference case).

use std::path::{Path, PathBuf};

use lcut_model::store::{
    ListedModel, ModelSource, StoreError, StoreKind, StoreRoots, list_models, resolve,
};
use lcut_model::{DType, Decoder, Device, ModelError, ModelFormat, ResolvedModel, WeightMode};
use lcut_parity::{ReferenceCase, deviation};
use lcut_testkit::{assert_mentions, oracle_case};

const MAIN: &str = "0123456789abcdef0123456789abcdef01234567";
const DEV: &str = "fedcba9876543210fedcba9876543210fedcba98";
const DIGEST: &str = "5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef";

/// A temporary hub cache and Ollama store.
struct Stores {
    dir: tempfile::TempDir,
}

impl Stores {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }

    fn hub(&self) -> PathBuf {
        self.dir.path().join("hub")
    }

    fn ollama(&self) -> PathBuf {
        self.dir.path().join("ollama")
    }

    fn roots(&self) -> StoreRoots {
        StoreRoots::at(self.hub(), self.ollama())
    }

    fn resolve(&self, reference: &str) -> Result<ResolvedModel, StoreError> {
        resolve(reference, &self.roots())
    }

    fn repo(&self, repo: &str) -> PathBuf {
        let dir = self
            .hub()
            .join(format!("models--{}", repo.replace('/', "--")));
        std::fs::create_dir_all(dir.join("refs")).expect("refs");
        std::fs::create_dir_all(dir.join("blobs")).expect("blobs");
        dir
    }

    /// A snapshot of `repo` holding `files` (name, source file) as links
    /// into the repository's `blobs/`, as huggingface_hub writes them.
    fn snapshot(&self, repo: &str, commit: &str, files: &[(&str, &Path)]) -> PathBuf {
        let dir = self.repo(repo);
        let snap = dir.join("snapshots").join(commit);
        for (name, source) in files {
            let blob = dir
                .join("blobs")
                .join(format!("{commit}-{}", name.replace('/', "_")));
            std::fs::copy(source, &blob).expect("blob");
            let link = snap.join(name);
            std::fs::create_dir_all(link.parent().expect("parent")).expect("snapshot");
            link_to(&blob, &link);
        }
        std::fs::create_dir_all(&snap).expect("snapshot");
        snap
    }

    fn set_ref(&self, repo: &str, branch: &str, commit: &str) {
        let file = self.repo(repo).join("refs").join(branch);
        std::fs::create_dir_all(file.parent().expect("parent")).expect("refs");
        std::fs::write(file, commit).expect("ref");
    }

    /// An Ollama model `host/namespace/name:tag` whose model layer is `gguf`.
    fn ollama_model(&self, manifest: &str, gguf: Option<&Path>, digest: &str) -> PathBuf {
        let blobs = self.ollama().join("blobs");
        std::fs::create_dir_all(&blobs).expect("blobs");
        if let Some(gguf) = gguf {
            std::fs::copy(gguf, blobs.join(format!("sha256-{digest}"))).expect("blob");
        }
        let json = format!(
            r#"{{"schemaVersion":2,"mediaType":"application/vnd.docker.distribution.manifest.v2+json",
            "config":{{"mediaType":"application/vnd.docker.container.image.v1+json","digest":"sha256:{DIGEST}","size":10}},
            "layers":[{{"mediaType":"application/vnd.ollama.image.model","digest":"sha256:{digest}","size":1}},
                      {{"mediaType":"application/vnd.ollama.image.template","digest":"sha256:{DIGEST}","size":1}}]}}"#
        );
        self.write_manifest(manifest, &json)
    }

    fn write_manifest(&self, manifest: &str, text: &str) -> PathBuf {
        let path = self.ollama().join("manifests").join(manifest);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("manifests");
        std::fs::write(&path, text).expect("manifest");
        path
    }

    /// Every path under the stores with its length: what a failed
    /// resolution must leave as it found.
    fn tree(&self) -> Vec<(PathBuf, u64)> {
        fn walk(dir: &Path, out: &mut Vec<(PathBuf, u64)>) {
            for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                let p = e.path();
                let len = std::fs::symlink_metadata(&p).map_or(0, |m| m.len());
                out.push((p.clone(), len));
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    walk(&p, out);
                }
            }
        }
        let mut out = vec![];
        walk(self.dir.path(), &mut out);
        out.sort();
        out
    }

    /// Resolve `reference`, which must fail, and check that nothing under
    /// the stores changed.
    fn refused(&self, reference: &str) -> StoreError {
        let before = self.tree();
        let err = self
            .resolve(reference)
            .expect_err("a damaged layout must be refused");
        assert_eq!(
            before,
            self.tree(),
            "resolving {reference} changed the stores"
        );
        err
    }
}

#[cfg(unix)]
fn link_to(target: &Path, link: &Path) {
    std::os::unix::fs::symlink(target, link).expect("symlink");
}

#[cfg(not(unix))]
fn link_to(target: &Path, link: &Path) {
    std::fs::copy(target, link).expect("copy");
}

fn gqa() -> PathBuf {
    oracle_case("llama-gqa")
}

/// The llama-gqa reference case as a model folder's files.
fn gqa_folder() -> Vec<(&'static str, PathBuf)> {
    vec![
        ("config.json", gqa().join("config.json")),
        ("model.safetensors", gqa().join("model.safetensors")),
    ]
}

fn files<'a>(list: &'a [(&'static str, PathBuf)]) -> Vec<(&'static str, &'a Path)> {
    list.iter().map(|(n, p)| (*n, p.as_path())).collect()
}

fn shown(p: &Path) -> String {
    p.display().to_string()
}

/// The model a reference resolved to runs as transformers does.
fn matches_transformers(model: &ResolvedModel) {
    let decoder = Decoder::load_format(
        &model.path,
        model.format,
        WeightMode::Dense(DType::F32),
        &Device::Cpu,
    )
    .expect("load the resolved model");
    let reference = ReferenceCase::load(&gqa()).expect("reference case");
    let pairs = reference.logit_pairs(&decoder).expect("logits");
    assert!(!pairs.is_empty());
    for pair in pairs {
        let d = deviation(&pair.ours, &pair.reference).expect("deviation");
        assert!(d.max_abs <= 1e-4, "{}: {:e}", pair.key, d.max_abs);
    }
}

#[test]
fn a_hub_name_resolves_to_the_snapshot_refs_main_names() {
    let s = Stores::new();
    let folder = gqa_folder();
    // main names the later of the two snapshots, not the first found
    s.snapshot("org/gqa", MAIN, &files(&folder));
    let snap = s.snapshot("org/gqa", DEV, &files(&folder));
    s.set_ref("org/gqa", "main", DEV);
    let m = s.resolve("org/gqa").expect("resolves");
    assert_eq!(m.path, snap);
    assert_eq!(m.format, ModelFormat::Folder);
    assert_eq!(
        m.source,
        ModelSource::Hub {
            repo: "org/gqa".into(),
            revision: "main".into(),
            commit: DEV.into(),
            file: None,
        }
    );
    assert_eq!(m.name(), "org/gqa");
    matches_transformers(&m);
}

#[test]
fn a_branch_and_a_commit_prefix_pick_their_snapshot() {
    let s = Stores::new();
    let folder = gqa_folder();
    s.snapshot("org/gqa", MAIN, &files(&folder));
    let dev = s.snapshot("org/gqa", DEV, &files(&folder));
    s.set_ref("org/gqa", "main", MAIN);
    s.set_ref("org/gqa", "pr/1", DEV);
    let m = s.resolve("org/gqa@pr/1").expect("branch");
    assert_eq!(m.path, dev);
    assert_eq!(m.name(), "org/gqa@pr/1");
    let m = s.resolve("org/gqa@FEDCBA98").expect("prefix, any case");
    assert_eq!(m.path, dev);
    let m = s.resolve(&format!("org/gqa@{DEV}")).expect("full hash");
    assert_eq!(m.path, dev);
    // a prefix both commits share is refused, naming both
    let third = "fedc000000000000000000000000000000000000";
    s.snapshot("org/gqa", third, &files(&folder));
    let err = s.refused("org/gqa@fedc");
    assert!(matches!(err, StoreError::AmbiguousRevision { .. }), "{err}");
    assert_mentions(&err.to_string(), &[DEV, third, "models--org--gqa"]);
    // an unknown revision lists the branches and snapshots there are
    let err = s.refused("org/gqa@v2");
    assert!(matches!(err, StoreError::UnknownRevision { .. }), "{err}");
    assert_mentions(&err.to_string(), &["v2", "main", "pr/1", MAIN]);
}

#[test]
fn without_refs_main_the_only_snapshot_is_used_and_several_are_refused() {
    let s = Stores::new();
    let folder = gqa_folder();
    let snap = s.snapshot("org/gqa", MAIN, &files(&folder));
    assert_eq!(s.resolve("org/gqa").expect("one snapshot").path, snap);
    s.snapshot("org/gqa", DEV, &files(&folder));
    let err = s.refused("org/gqa");
    assert!(matches!(err, StoreError::UnknownRevision { .. }), "{err}");
    assert_mentions(&err.to_string(), &["main", MAIN, DEV, "@"]);
}

#[test]
fn gguf_files_in_a_hub_snapshot_are_chosen_by_name_or_tag() {
    let s = Stores::new();
    let f32 = gqa().join("model.f32.gguf");
    let q8 = gqa().join("model.q8_0.gguf");
    let one = s.snapshot("org/one-gguf", MAIN, &[("gqa-F32.gguf", &f32)]);
    s.set_ref("org/one-gguf", "main", MAIN);
    let m = s.resolve("org/one-gguf").expect("the only GGUF");
    assert_eq!(
        (m.path.clone(), m.format),
        (one.join("gqa-F32.gguf"), ModelFormat::Gguf)
    );
    matches_transformers(&m);

    let snap = s.snapshot(
        "org/two-gguf",
        MAIN,
        &[("gqa-F32.gguf", &f32), ("gqa-Q8_0.gguf", &q8)],
    );
    s.set_ref("org/two-gguf", "main", MAIN);
    let err = s.refused("org/two-gguf");
    assert!(matches!(err, StoreError::SeveralGguf { .. }), "{err}");
    assert_mentions(
        &err.to_string(),
        &[
            "org/two-gguf:FILE",
            "gqa-F32.gguf",
            "gqa-Q8_0.gguf",
            &shown(&snap),
        ],
    );
    let m = s.resolve("org/two-gguf:gqa-F32.gguf").expect("file name");
    assert_eq!(m.path, snap.join("gqa-F32.gguf"));
    assert_eq!(m.name(), "org/two-gguf:gqa-F32.gguf");
    let m = s
        .resolve("org/two-gguf@main:q8_0")
        .expect("quantization tag");
    assert_eq!(m.path, snap.join("gqa-Q8_0.gguf"));
    let err = s.refused("org/two-gguf:Q4_K_M");
    assert!(matches!(err, StoreError::NoSuchGguf { .. }), "{err}");
    assert_mentions(
        &err.to_string(),
        &["Q4_K_M", "gqa-F32.gguf", "gqa-Q8_0.gguf"],
    );
}

#[test]
fn an_ollama_name_resolves_to_its_model_blob() {
    let s = Stores::new();
    let gguf = gqa().join("model.f32.gguf");
    s.ollama_model("registry.ollama.ai/library/gqa/f32", Some(&gguf), DIGEST);
    let manifest = s.ollama_model("registry.ollama.ai/library/gqa/latest", Some(&gguf), DIGEST);
    let blob = s.ollama().join("blobs").join(format!("sha256-{DIGEST}"));
    let m = s.resolve("gqa:f32").expect("name:tag");
    assert_eq!(m.path, blob);
    // Ollama's blobs have no extension: the format comes from the resolver
    assert_eq!(m.format, ModelFormat::Gguf);
    assert_eq!(m.name(), "gqa:f32");
    matches_transformers(&m);
    let m = s.resolve("gqa").expect("the default tag");
    assert_eq!(
        m.source,
        ModelSource::Ollama {
            name: "gqa:latest".into(),
            manifest,
        }
    );
    s.ollama_model("registry.ollama.ai/me/gqa/v1", Some(&gguf), DIGEST);
    assert_eq!(s.resolve("me/gqa:v1").expect("namespace").path, blob);
    s.ollama_model("hf.co/org/gqa/Q8_0", Some(&gguf), DIGEST);
    assert_eq!(s.resolve("hf.co/org/gqa:Q8_0").expect("host").path, blob);
}

#[test]
fn a_hub_name_wins_over_an_ollama_name_and_an_existing_path_over_both() {
    let s = Stores::new();
    let folder = gqa_folder();
    let snap = s.snapshot("gqa", MAIN, &files(&folder));
    s.set_ref("gqa", "main", MAIN);
    s.ollama_model(
        "registry.ollama.ai/library/gqa/latest",
        Some(&gqa().join("model.f32.gguf")),
        DIGEST,
    );
    // the hub's old top-level names have no owner
    assert_eq!(s.resolve("gqa").expect("hub first").path, snap);
    // an existing path is never taken for a name (the CLI's end-to-end test
    // shows a relative one winning)
    let m = s.resolve(shown(&gqa()).as_str()).expect("path");
    assert_eq!(
        (m.path, m.format, m.source),
        (gqa(), ModelFormat::Folder, ModelSource::Path)
    );
}

#[test]
fn a_name_on_disk_nowhere_names_every_place_looked_in() {
    let s = Stores::new();
    std::fs::create_dir_all(s.hub()).expect("hub");
    let err = s.refused("org/absent");
    assert!(matches!(err, StoreError::NotFound { .. }), "{err}");
    assert_mentions(
        &err.to_string(),
        &[
            "org/absent",
            "never downloads",
            &shown(&s.hub()),
            "models--org--absent",
            &shown(&s.ollama()),
            "manifests/registry.ollama.ai/org/absent/latest",
            "does not exist",
        ],
    );
    // a name ending in .gguf is a file: no store is searched for it
    let err = s.refused("models/absent.Q4_K_M.gguf");
    let msg = err.to_string();
    assert_mentions(&msg, &["models/absent.Q4_K_M.gguf", "no such GGUF file"]);
    assert!(!msg.contains(&shown(&s.ollama())), "{msg}");
    // a missing tag lists the tags there are
    s.ollama_model("registry.ollama.ai/library/gqa/f32", None, DIGEST);
    let err = s.refused("gqa:q4");
    assert_mentions(&err.to_string(), &["gqa:q4", "tags of gqa there: f32"]);
    // the places come from the variables, which the message names
    let roots = StoreRoots::from_vars(|v| match v {
        "HF_HOME" => Some(s.dir.path().join("hf").into()),
        "HOME" => Some(s.dir.path().into()),
        _ => None,
    });
    let err = resolve("org/absent", &roots).expect_err("absent");
    assert_mentions(
        &err.to_string(),
        &[
            "$HF_HOME/hub",
            &shown(&s.dir.path().join("hf/hub")),
            "OLLAMA_MODELS is not set",
            &shown(&s.dir.path().join(".ollama/models")),
        ],
    );
}

#[test]
fn damaged_hub_repositories_are_named_errors() {
    let s = Stores::new();
    // a repository folder without any snapshot
    let repo = s.repo("org/empty");
    let err = s.refused("org/empty");
    assert!(matches!(err, StoreError::NoSnapshot { .. }), "{err}");
    assert_mentions(&err.to_string(), &[&shown(&repo), "snapshots", "org/empty"]);
    // refs/main naming a commit whose snapshot is missing
    s.snapshot("org/dangling", DEV, &files(&gqa_folder()));
    s.set_ref("org/dangling", "main", MAIN);
    let err = s.refused("org/dangling");
    assert!(matches!(err, StoreError::DanglingRef { .. }), "{err}");
    let repo = s.repo("org/dangling");
    assert_mentions(
        &err.to_string(),
        &[
            &shown(&repo.join("refs/main")),
            MAIN,
            &shown(&repo.join("snapshots").join(MAIN)),
        ],
    );
    // a branch file that holds no hash
    s.set_ref("org/dangling", "bad", "not a hash\n");
    let err = s.refused("org/dangling@bad");
    assert!(matches!(err, StoreError::BadRef { .. }), "{err}");
    // a snapshot file linking to a blob that is gone
    let snap = s.snapshot("org/partial", MAIN, &files(&gqa_folder()));
    s.set_ref("org/partial", "main", MAIN);
    let target = std::fs::read_link(snap.join("model.safetensors")).expect("link");
    std::fs::remove_file(&target).expect("remove blob");
    let err = s.refused("org/partial");
    assert!(matches!(err, StoreError::DanglingLink { .. }), "{err}");
    assert_mentions(
        &err.to_string(),
        &[&shown(&snap.join("model.safetensors")), &shown(&target)],
    );
    // a snapshot with neither config.json nor a GGUF file
    let snap = s.snapshot("org/bare", MAIN, &[("README.md", &gqa().join("case.json"))]);
    s.set_ref("org/bare", "main", MAIN);
    let err = s.refused("org/bare");
    assert!(matches!(err, StoreError::EmptySnapshot { .. }), "{err}");
    assert_mentions(&err.to_string(), &[&shown(&snap), "config.json", ".gguf"]);
}

#[test]
fn a_shard_index_naming_a_missing_shard_is_refused_by_the_loader() {
    let s = Stores::new();
    let dir = tempfile::tempdir().expect("dir");
    let index = dir.path().join("index.json");
    std::fs::write(
        &index,
        r#"{"weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
                           "lm_head.weight": "model-00002-of-00002.safetensors"}}"#,
    )
    .expect("index");
    let snap = s.snapshot(
        "org/sharded",
        MAIN,
        &[
            ("config.json", &gqa().join("config.json")),
            ("model.safetensors.index.json", &index),
            (
                "model-00001-of-00002.safetensors",
                &gqa().join("model.safetensors"),
            ),
        ],
    );
    s.set_ref("org/sharded", "main", MAIN);
    let m = s.resolve("org/sharded").expect("the folder resolves");
    let before = s.tree();
    let dense = WeightMode::Dense(DType::F32);
    let Err(err) = Decoder::load_format(&m.path, m.format, dense, &Device::Cpu) else {
        panic!("a missing shard must be refused");
    };
    assert_eq!(before, s.tree(), "loading changed the store");
    assert!(matches!(err, ModelError::MissingFile { .. }), "{err}");
    assert_mentions(
        &err.to_string(),
        &[
            &shown(&snap.join("model-00002-of-00002.safetensors")),
            "model.safetensors.index.json",
        ],
    );
}

#[test]
fn damaged_ollama_manifests_are_named_errors() {
    let s = Stores::new();
    let gguf = gqa().join("model.f32.gguf");
    // no model layer
    let path = s.write_manifest(
        "registry.ollama.ai/library/nolayer/latest",
        &format!(
            r#"{{"layers":[{{"mediaType":"application/vnd.ollama.image.license","digest":"sha256:{DIGEST}"}}]}}"#
        ),
    );
    let err = s.refused("nolayer");
    assert!(matches!(err, StoreError::NoModelLayer { .. }), "{err}");
    assert_mentions(
        &err.to_string(),
        &[
            &shown(&path),
            "application/vnd.ollama.image.model",
            "image.license",
        ],
    );
    // a model layer naming a blob that is not there
    let manifest = s.ollama_model("registry.ollama.ai/library/noblob/latest", None, DIGEST);
    let err = s.refused("noblob:latest");
    assert!(matches!(err, StoreError::MissingBlob { .. }), "{err}");
    let blob = s.ollama().join("blobs").join(format!("sha256-{DIGEST}"));
    assert_mentions(&err.to_string(), &[&shown(&manifest), &shown(&blob)]);
    // not JSON
    let path = s.write_manifest(
        "registry.ollama.ai/library/garbled/latest",
        "{\"layers\": [",
    );
    let err = s.refused("garbled");
    assert!(matches!(err, StoreError::BadManifest { .. }), "{err}");
    assert_mentions(
        &err.to_string(),
        &[&shown(&path), "not a valid Ollama manifest"],
    );
    // a digest that would make a path outside blobs/
    s.ollama_model(
        "registry.ollama.ai/library/escape/latest",
        Some(&gguf),
        DIGEST,
    );
    let path = s.write_manifest(
        "registry.ollama.ai/library/escape/latest",
        r#"{"layers":[{"mediaType":"application/vnd.ollama.image.model","digest":"sha256:../../x"}]}"#,
    );
    let err = s.refused("escape");
    assert!(matches!(err, StoreError::BadManifest { .. }), "{err}");
    assert_mentions(&err.to_string(), &[&shown(&path), "sha256:../../x"]);
}

#[test]
fn a_file_that_is_neither_folder_nor_gguf_is_not_a_model() {
    let dir = tempfile::tempdir().expect("dir");
    let txt = dir.path().join("notes.txt");
    std::fs::write(&txt, b"hello").expect("write");
    let err = resolve(&txt, &StoreRoots::default()).expect_err("not a model");
    assert!(matches!(err, StoreError::NotAModel { .. }), "{err}");
    assert_mentions(&err.to_string(), &[&shown(&txt), "GGUF", "hell"]);
    // a GGUF without the extension is a GGUF
    let blob = dir.path().join("blob");
    std::fs::copy(gqa().join("model.f32.gguf"), &blob).expect("copy");
    assert_eq!(
        ModelFormat::detect(&blob).expect("detect"),
        ModelFormat::Gguf
    );
}

#[test]
fn store_roots_follow_the_variables_the_tools_read() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        StoreRoots::from_vars(move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).into())
        })
    };
    let hub = |r: &StoreRoots| r.hub.as_ref().map(|h| h.path.clone());
    let ollama = |r: &StoreRoots| r.ollama.as_ref().map(|h| h.path.clone());
    let all = env(&[
        ("HF_HUB_CACHE", "/a"),
        ("HUGGINGFACE_HUB_CACHE", "/b"),
        ("HF_HOME", "/c"),
        ("XDG_CACHE_HOME", "/d"),
        ("HOME", "/home/u"),
        ("OLLAMA_MODELS", "/o"),
    ]);
    assert_eq!(hub(&all), Some("/a".into()));
    assert_eq!(
        all.hub.as_ref().map(|h| h.origin.as_str()),
        Some("from $HF_HUB_CACHE")
    );
    assert_eq!(ollama(&all), Some("/o".into()));
    let r = env(&[("HF_HUB_CACHE", ""), ("HUGGINGFACE_HUB_CACHE", "/b")]);
    assert_eq!(
        hub(&r),
        Some("/b".into()),
        "an empty variable counts as unset"
    );
    assert_eq!(
        hub(&env(&[("HF_HOME", "/c"), ("XDG_CACHE_HOME", "/d")])),
        Some("/c/hub".into())
    );
    assert_eq!(
        hub(&env(&[("XDG_CACHE_HOME", "/d")])),
        Some("/d/huggingface/hub".into())
    );
    let home = env(&[("HOME", "/home/u"), ("HF_HOME", "~/hf")]);
    assert_eq!(hub(&home), Some("/home/u/hf/hub".into()));
    assert_eq!(ollama(&home), Some("/home/u/.ollama/models".into()));
    let r = env(&[("HOME", "/home/u")]);
    assert_eq!(hub(&r), Some("/home/u/.cache/huggingface/hub".into()));
    assert_eq!(env(&[]), StoreRoots::default());
}

fn listed<'a>(listing: &'a [ListedModel], name: &str) -> &'a ListedModel {
    listing
        .iter()
        .find(|m| m.name == name)
        .unwrap_or_else(|| panic!("{name} is not listed: {listing:#?}"))
}

#[test]
fn the_listing_names_each_model_as_it_resolves() {
    let s = Stores::new();
    let folder = gqa_folder();
    let f32 = gqa().join("model.f32.gguf");
    let q8 = gqa().join("model.q8_0.gguf");
    s.snapshot("org/gqa", MAIN, &files(&folder));
    s.snapshot("org/gqa", DEV, &files(&folder));
    s.set_ref("org/gqa", "main", MAIN);
    s.set_ref("org/gqa", "dev", DEV);
    s.snapshot(
        "org/ggufs",
        MAIN,
        &[("a-F32.gguf", &f32), ("a-Q8_0.gguf", &q8)],
    );
    s.set_ref("org/ggufs", "main", MAIN);
    s.snapshot("org/dangling", DEV, &files(&folder));
    s.set_ref("org/dangling", "main", MAIN);
    s.ollama_model("registry.ollama.ai/library/gqa/q8", Some(&q8), DIGEST);
    s.ollama_model(
        "registry.ollama.ai/library/gone/latest",
        None,
        &DIGEST.replace('5', "6"),
    );

    let listing = list_models(&s.roots());
    assert!(listing.notes.is_empty(), "{:?}", listing.notes);
    let models = &listing.models;
    let len = |p: &Path| std::fs::metadata(p).expect("size").len();
    let folder_bytes = len(&gqa().join("config.json")) + len(&gqa().join("model.safetensors"));
    for (name, format, size) in [
        ("org/gqa", ModelFormat::Folder, folder_bytes),
        ("org/gqa@dev", ModelFormat::Folder, folder_bytes),
        ("org/ggufs:a-F32.gguf", ModelFormat::Gguf, len(&f32)),
        ("org/ggufs:a-Q8_0.gguf", ModelFormat::Gguf, len(&q8)),
        ("gqa:q8", ModelFormat::Gguf, len(&q8)),
    ] {
        let m = listed(models, name);
        assert_eq!(m.format, Some(format), "{name}");
        assert_eq!(m.size_bytes, size, "{name}");
        // config.json and the GGUF header agree with the reference case
        assert_eq!(m.architecture.as_deref(), Some("llama"), "{name}");
        assert_eq!(m.layers, Some(6), "{name}");
        assert!(m.supported && m.problem.is_none(), "{name}: {m:?}");
        // every listed name resolves to the listed path
        assert_eq!(s.resolve(name).expect("listed names resolve").path, m.path);
    }
    assert_eq!(listed(models, "gqa:q8").store, StoreKind::Ollama);
    let broken = listed(models, "org/dangling");
    assert_mentions(
        broken.problem.as_deref().unwrap_or(""),
        &["refs/main", MAIN],
    );
    let broken = listed(models, "gone:latest");
    assert_mentions(broken.problem.as_deref().unwrap_or(""), &["sha256-6f70"]);

    // absent stores are skipped with a note naming them
    let empty = tempfile::tempdir().expect("dir");
    let roots = StoreRoots::at(empty.path().join("no-hub"), empty.path().join("no-ollama"));
    let listing = list_models(&roots);
    assert!(listing.models.is_empty());
    assert_eq!(listing.notes.len(), 2);
    assert_mentions(
        &listing.notes.join("\n"),
        &["no-hub", "no-ollama", "does not exist"],
    );
}

/// Gemma 3 by the names its stores give it: llama.cpp's `gemma3` GGUF in
/// Ollama (`gemma3:270m`) and in a hub snapshot, a `gemma3_text` folder in
/// the hub, all listed as supported and run as transformers runs them; the
/// multimodal `gemma3` folder is listed as not supported.
#[test]
fn gemma3_resolves_by_name_from_both_stores() {
    let s = Stores::new();
    let case = oracle_case("gemma3-sliding");
    let f32 = case.join("model.f32.gguf");
    s.ollama_model("registry.ollama.ai/library/gemma3/270m", Some(&f32), DIGEST);
    let folder = [
        ("config.json", case.join("config.json")),
        ("model.safetensors", case.join("model.safetensors")),
    ];
    s.snapshot("google/gemma-3-tiny", MAIN, &files(&folder));
    s.set_ref("google/gemma-3-tiny", "main", MAIN);
    s.snapshot("org/gemma-3-tiny-GGUF", MAIN, &[("tiny-F32.gguf", &f32)]);
    s.set_ref("org/gemma-3-tiny-GGUF", "main", MAIN);

    let listing = list_models(&s.roots());
    let reference = ReferenceCase::load(&case).expect("reference case");
    for (name, arch) in [
        ("gemma3:270m", "gemma3"),
        ("org/gemma-3-tiny-GGUF", "gemma3"),
        ("google/gemma-3-tiny", "gemma3_text"),
    ] {
        let m = listed(&listing.models, name);
        assert_eq!(m.architecture.as_deref(), Some(arch), "{name}");
        assert!(m.supported && m.problem.is_none(), "{name}: {m:?}");
        runs_as_reference(&s, name, &reference);
    }
}

/// Gemma 3 (transformers 4's layout, its text config mostly class
/// defaults), Gemma 4 and Qwen3.5 as published (their multimodal wrappers)
/// in a hub snapshot: listed as supported under their decoder's
/// architecture and layer count, and run as transformers runs the wrapper
/// on text.
#[test]
fn multimodal_wrappers_are_listed_and_run_as_their_decoders() {
    let s = Stores::new();
    let mut names = vec![];
    for (case, name) in [
        ("layouts/gemma3-vision", "google/gemma-3-tiny-it"),
        ("layouts/gemma4-vision", "google/gemma-4-tiny"),
        ("layouts/qwen35-vision", "Qwen/Qwen3.5-tiny"),
    ] {
        let dir = oracle_case(case);
        let folder = [
            ("config.json", dir.join("config.json")),
            ("model.safetensors", dir.join("model.safetensors")),
        ];
        s.snapshot(name, MAIN, &files(&folder));
        s.set_ref(name, "main", MAIN);
        names.push((name, dir));
    }
    let listing = list_models(&s.roots());
    let decoders = [("gemma3_text", 6), ("gemma4_text", 4), ("qwen3_5_text", 8)];
    for ((name, dir), (arch, layers)) in names.iter().zip(decoders) {
        let m = listed(&listing.models, name);
        assert_eq!(
            (m.architecture.as_deref(), m.layers),
            (Some(arch), Some(layers)),
            "{name}"
        );
        assert!(m.supported && m.problem.is_none(), "{name}: {m:?}");
        runs_as_reference(&s, name, &ReferenceCase::load(dir).expect("reference case"));
    }
}

/// Model `name` resolves in `s`, loads in f32 and gives `reference`'s
/// logits (full depth and every policy) within 1e-4.
fn runs_as_reference(s: &Stores, name: &str, reference: &ReferenceCase) {
    let resolved = s.resolve(name).expect("resolves");
    let decoder = Decoder::load_format(
        &resolved.path,
        resolved.format,
        WeightMode::Dense(DType::F32),
        &Device::Cpu,
    )
    .expect("loads");
    for pair in reference.logit_pairs(&decoder).expect("logits") {
        let d = deviation(&pair.ours, &pair.reference).expect("deviation");
        assert!(d.max_abs <= 1e-4, "{name} {}: {:e}", pair.key, d.max_abs);
    }
}
