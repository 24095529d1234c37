//! Fixtures shared by lcut's tests: where the transformers reference cases
//! (`fixtures/oracle`) and the real model are, temporary model folders
//! copied from the cases, a word-level tokenizer with a chat template (so
//! that engine and viewer tests can run the real pipeline on a tiny model),
//! damaged-file mutants, an allocator that records the largest
//! allocation, and the helpers that hold an op with its own backward to
//! candle's composed ops. Reading the reference cases and checking logits against them
//! is `lcut-parity`'s; random-weight models of a shape are `lcut-synth`'s.

use std::io;
use std::path::{Path, PathBuf};

use serde_json::json;
use tempfile::TempDir;

pub mod alloc;
pub mod grads;
pub mod mutate;

/// The random number generators the mutators use, for tests' own generators.
pub use rand;

pub use mutate::{
    JsonMutants, MutantRun, json_mutants, mutant_count, mutants, safetensors_mutants, truncations,
};

/// The repository root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The eleven transformers reference cases in `fixtures/oracle`.
pub const ORACLE_CASES: [&str; 11] = [
    "llama-gqa",
    "llama31-rope-scaled",
    "qwen2-bias",
    "qwen3-qknorm",
    "mistral-window",
    "gemma2-softcap",
    "phi3-fused",
    "gemma3-sliding",
    "smollm3-nope",
    "olmo2-postnorm",
    "olmo3-sliding",
];

/// The transformers reference cases of mixture-of-experts models, in
/// `fixtures/oracle/moe` (Qwen3-MoE with a dense layer among sparse ones,
/// Qwen3-MoE as released, Mixtral, gpt-oss with its attention sinks; names
/// relative to `fixtures/oracle`):
/// run by the parity tests in f32 (the fused step's in `fused_step.rs`).
/// Apart from [`ORACLE_CASES`]: in bf16 they are not held to the dense
/// cases' bounds (`fixtures/oracle/README.md` says why).
pub const MOE_CASES: [&str; 4] = [
    "moe/qwen3moe-experts",
    "moe/qwen3moe-sparse",
    "moe/mixtral-top2",
    "moe/gptoss-sinks",
];

/// The transformers reference cases of the newest layouts, in
/// `fixtures/oracle/layouts` (Gemma 4 with per-type head widths, keys that
/// are the values, per-layer inputs and its last two layers reading earlier
/// layers' K/V; Qwen3.5 with three linear-attention layers to each full
/// one, dense and with experts; Gemma 4 with experts beside its dense
/// MLPs; names relative to `fixtures/oracle`): run by the tensor path's
/// parity tests in f32. Apart from [`ORACLE_CASES`]: their fused steps
/// are checked in `fused_step.rs` under the policies each layout runs, both
/// have GGUF files ([`LAYOUT_GGUF_CASES`]), and they have no bf16, lens,
/// SwiftKV or press references.
pub const LAYOUT_CASES: [&str; 5] = [
    GEMMA4_CASE,
    QWEN35_CASE,
    QWEN35MOE_CASE,
    GEMMA4MOE_CASE,
    GEMMA4WIDE_CASE,
];

/// The multimodal reference cases, in `fixtures/oracle/layouts`: Gemma 3's,
/// Gemma 4's and Qwen3.5's decoders (dense and with experts) inside
/// transformers' `*ForConditionalGeneration` wrappers beside a tiny vision
/// tower, as the published folders hold them (`text_config`, weights under
/// `model.language_model.`; Gemma 3's under `language_model.model.`, its
/// text config naming only what differs from the class defaults), run on
/// text alone. Qwen3.5's wrappers untie the LM head their text configs tie,
/// as transformers does. Run by the parity tests in f32 with
/// [`LAYOUT_CASES`]; they have no GGUF files (llama.cpp's converter writes a
/// wrapper's decoder as the text model's).
pub const WRAPPED_CASES: [&str; 4] = [
    "layouts/gemma3-vision",
    "layouts/gemma4-vision",
    "layouts/qwen35-vision",
    "layouts/qwen35moe-vision",
];

/// The layout cases llama.cpp's converter writes as GGUF (`model.f32.gguf`,
/// `model.q8_0.gguf`): Gemma 4 as `gemma4` (per-layer K/V head counts, the
/// shared layers without K/V tensors, the full layers' proportional RoPE
/// as `rope_freqs`), Qwen3.5 as `qwen35` (its norms stored as 1 + w, its
/// decay rates as -exp(A_log) and its value heads reordered; Qwen3.5-MoE
/// as `qwen35moe`, its experts stacked and its shared expert as `*_shexp`;
/// Gemma 4's experts as `ffn_gate_up_exps` with the router's scales).
pub const LAYOUT_GGUF_CASES: [&str; 5] = [
    GEMMA4_CASE,
    QWEN35_CASE,
    QWEN35MOE_CASE,
    GEMMA4MOE_CASE,
    GEMMA4WIDE_CASE,
];

/// The Gemma 4 reference case (shared K/V, per-layer inputs).
pub const GEMMA4_CASE: &str = "layouts/gemma4-shared";

/// The Gemma 4 case whose shared layers' MLPs are twice as wide
/// (`use_double_wide_mlp`; GGUF: one `feed_forward_length` per layer).
pub const GEMMA4WIDE_CASE: &str = "layouts/gemma4-wide";

/// The Gemma 4 mixture-of-experts reference case: each layer's dense MLP
/// beside the top 2 of four experts, each branch with its own norms.
pub const GEMMA4MOE_CASE: &str = "layouts/gemma4-moe";

/// The Qwen3.5 reference case: eight layers, layers 3 and 7 full attention
/// with an output gate, the others linear attention (Gated DeltaNet).
pub const QWEN35_CASE: &str = "layouts/qwen35-hybrid";

/// The Qwen3.5-MoE reference case: [`QWEN35_CASE`]'s layers, every MLP the
/// top 3 of eight routed experts beside a shared expert with a sigmoid gate.
pub const QWEN35MOE_CASE: &str = "layouts/qwen35moe-shared";

/// Every reference case whose layers route tokens to experts: the
/// [`MOE_CASES`], Qwen3.5-MoE's and Gemma 4's (layout cases too).
pub const ROUTED_CASES: [&str; 6] = [
    MOE_CASES[0],
    MOE_CASES[1],
    MOE_CASES[2],
    MOE_CASES[3],
    QWEN35MOE_CASE,
    GEMMA4MOE_CASE,
];

/// The mixture-of-experts cases llama.cpp's converter writes as GGUF
/// (`model.f32.gguf`, `model.q8_0.gguf`): its `qwen3moe` has no dense
/// layers, so `moe/qwen3moe-experts` has none; gpt-oss's as llama.cpp runs
/// it (`moe/gptoss-gguf`, with `model.mxfp4.gguf` too), not
/// `moe/gptoss-sinks`, whose SwiGLU limit and YaRN ramp llama.cpp's
/// `gpt-oss` fixes otherwise.
pub const MOE_GGUF_CASES: [&str; 3] =
    ["moe/qwen3moe-sparse", "moe/mixtral-top2", "moe/gptoss-gguf"];

/// The folder of reference case `name` (e.g. `llama-gqa`): a model folder
/// (config.json, model.safetensors) with case.json and reference.safetensors.
pub fn oracle_case(name: &str) -> PathBuf {
    workspace_root().join("fixtures/oracle").join(name)
}

/// The token ids reference case `name` was run on (`input_ids` of its
/// reference.safetensors).
pub fn oracle_ids(name: &str) -> candle_core::Result<Vec<u32>> {
    let r = candle_core::safetensors::load(
        oracle_case(name).join("reference.safetensors"),
        &candle_core::Device::Cpu,
    )?;
    let ids = r.get("input_ids").ok_or_else(|| {
        candle_core::Error::Msg(format!("reference case {name} has no input_ids"))
    })?;
    ids.to_dtype(candle_core::DType::U32)?.to_vec1()
}

/// File name of the real model that `scripts/fetch-model.sh` puts in `models/`.
pub const REAL_MODEL: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// File name of the second real model, Gemma 3 270M (GGUF, Q4_K_M), that
/// `scripts/fetch-model.sh` puts in `models/`.
pub const REAL_GEMMA3: &str = "gemma-3-270m-q4_k_m.gguf";

/// The real model (SmolLM2-135M-Instruct, GGUF), when it has been fetched.
/// Without it a test skips with a message, except in CI (`CI=true`), where
/// a missing model is a failure: CI fetches it first.
pub fn real_model() -> Option<PathBuf> {
    fetched_model(REAL_MODEL)
}

/// Gemma 3 270M (GGUF), when it has been fetched; missing, as [`real_model`].
pub fn real_gemma3() -> Option<PathBuf> {
    fetched_model(REAL_GEMMA3)
}

/// The reference data made by transformers for Gemma 3 270M
/// (`fixtures/real/gemma3`).
pub fn real_gemma3_reference() -> PathBuf {
    workspace_root().join("fixtures/real/gemma3")
}

/// `models/<name>`, when `scripts/fetch-model.sh` has fetched it.
fn fetched_model(name: &str) -> Option<PathBuf> {
    let path = workspace_root().join("models").join(name);
    if path.is_file() {
        return Some(path);
    }
    let message = format!(
        "{} is missing: run scripts/fetch-model.sh to fetch the real models",
        path.display()
    );
    if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
        panic!("{message} (CI must run the real-model tests)");
    }
    eprintln!("skipping: {message}");
    None
}

/// The reference data made by transformers for the real model
/// (`fixtures/real/smollm2`).
pub fn real_reference() -> PathBuf {
    workspace_root().join("fixtures/real/smollm2")
}

/// Copy the model of reference case `case` (config and weights only) into `dir`.
pub fn copy_model(case: &str, dir: &Path) -> io::Result<()> {
    for name in ["config.json", "model.safetensors"] {
        std::fs::copy(oracle_case(case).join(name), dir.join(name))?;
    }
    Ok(())
}

/// A temporary folder for a mutation test's files, in memory where the
/// system has a tmpfs at `/dev/shm`, else the usual temporary folder. A
/// disk file system writes back each mutant that overwrites the file before
/// it (ext4's `auto_da_alloc` on a truncated and rewritten file): the config
/// mutants waited on the disk for 96% of their time (9.5 s against 0.4 s for
/// 300 of each case's).
pub fn mutant_dir() -> TempDir {
    let shm = Path::new("/dev/shm");
    let in_memory = shm
        .is_dir()
        .then(|| tempfile::tempdir_in(shm).ok())
        .flatten();
    in_memory.unwrap_or_else(|| tempfile::tempdir().expect("a temporary folder"))
}

/// A temporary folder holding the model of reference case `case`, for tests
/// that break it.
pub fn model_copy(case: &str) -> io::Result<TempDir> {
    let dir = tempfile::tempdir()?;
    copy_model(case, dir.path())?;
    Ok(dir)
}

/// Path of `name` in `dir` as error messages show it.
pub fn shown(dir: impl AsRef<Path>, name: &str) -> String {
    dir.as_ref().join(name).display().to_string()
}

/// Assert that the error message `msg` mentions every one of `parts` (the
/// file, field or value a user needs to see).
pub fn assert_mentions(msg: &str, parts: &[&str]) {
    for part in parts {
        assert!(
            msg.contains(part),
            "message does not mention {part:?}: {msg}"
        );
    }
}

/// The chat template of [`write_chat_tokenizer`]: BoS, then
/// `<|role|> content <|end|>` per message, then `<|assistant|>`.
pub const CHAT_TEMPLATE: &str = "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|> {{ m.content }} <|end|> {% endfor %}{% if add_generation_prompt %}<|assistant|> {% endif %}";

/// The special tokens of [`write_chat_tokenizer`], ids 0 to 6.
pub const CHAT_SPECIALS: [&str; 7] = [
    "<unk>",
    "<s>",
    "</s>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|end|>",
];

/// Write tokenizer.json (word level: [`CHAT_SPECIALS`] then `words`, ids in
/// that order) and tokenizer_config.json (BoS `<s>`, EoS `</s>`,
/// [`CHAT_TEMPLATE`]) into `dir`.
pub fn write_chat_tokenizer(dir: &Path, words: &[&str]) -> io::Result<()> {
    let vocab: serde_json::Map<String, serde_json::Value> = CHAT_SPECIALS
        .iter()
        .chain(words)
        .enumerate()
        .map(|(i, t)| (t.to_string(), json!(i)))
        .collect();
    let added: Vec<_> = CHAT_SPECIALS
        .iter()
        .enumerate()
        .map(|(i, t)| {
            json!({"id": i, "content": t, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": false},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
    });
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string())?;
    let config = json!({"bos_token": "<s>", "eos_token": "</s>", "chat_template": CHAT_TEMPLATE});
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string())
}

/// A chat-ready model folder in `dir`: the model of reference case `case`
/// and the tokenizer of [`write_chat_tokenizer`] over `words`.
pub fn chat_model(case: &str, dir: &Path, words: &[&str]) -> io::Result<()> {
    copy_model(case, dir)?;
    write_chat_tokenizer(dir, words)
}
