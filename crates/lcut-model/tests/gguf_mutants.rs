//! Damaged GGUF files by the thousand: deterministic mutants of a real GGUF
//! (bit flips, truncations, lengths and counts replaced by huge values,
//! runs of 0xFF) must each be refused with an error or load, never panic.
//! Every mutant's header goes through the parser and, when that succeeds,
//! the configuration; every tenth is loaded as a whole model from a file.
//! `LCUT_MUTANTS=N` runs more.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

use lcut_model::gguf::{GgufHeader, model_config};
use lcut_model::{DType, Decoder, Device, WeightMode};
use lcut_testkit::{mutants, oracle_case};

const DEFAULT_MUTANTS: usize = 10_000;

#[test]
fn mutated_gguf_files_never_panic() {
    mutate("llama-gqa", 20261122);
}

/// An OLMo 3 file (llama.cpp's `olmo2` with a sliding window): its pattern
/// of sliding layers, the sliding layers' RoPE base, the norms after the
/// blocks and the whole-projection q/k norms damaged in turn.
#[test]
fn mutated_olmo3_gguf_files_never_panic() {
    mutate("olmo3-sliding", 20261126);
}

/// A Qwen3-MoE file (llama.cpp's `qwen3moe`): its expert counts, the
/// routers and the 3-D expert tensors damaged in turn.
#[test]
fn mutated_mixture_of_experts_gguf_files_never_panic() {
    mutate("moe/qwen3moe-sparse", 20261127);
}

/// A gpt-oss file with MXFP4 experts (llama.cpp's `gpt-oss`): the entries
/// of its sinks, routers and MXFP4 expert tensors (types, dimensions,
/// offsets) and, less often, their data damaged in turn.
#[test]
fn mutated_gpt_oss_mxfp4_gguf_files_never_panic() {
    mutate_file("moe/gptoss-gguf", "model.mxfp4.gguf", 20261128);
}

/// A Qwen3.5 file (llama.cpp's `qwen35`): its recurrent-layer flags, the
/// linear layers' head counts and widths, the convolution's kernel, the
/// decay rates (a non-negative `ssm_a` has no logarithm) and the linear
/// layers' tensors damaged in turn.
#[test]
fn mutated_qwen35_gguf_files_never_panic() {
    mutate(lcut_testkit::QWEN35_CASE, 20261129);
}

/// A Gemma 4 file (llama.cpp's `gemma4`): its per-layer K/V head counts,
/// head widths, shared-layer count, layer pattern, per-layer inputs and
/// `rope_freqs` damaged in turn.
#[test]
fn mutated_gemma4_gguf_files_never_panic() {
    mutate(lcut_testkit::GEMMA4_CASE, 20261130);
}

/// A Qwen3.5-MoE file (llama.cpp's `qwen35moe`): its expert counts and
/// widths, the shared expert's width, the routers, the 3-D expert tensors
/// and the shared expert's tensors damaged in turn.
#[test]
fn mutated_qwen35_moe_gguf_files_never_panic() {
    mutate(lcut_testkit::QWEN35MOE_CASE, 20261131);
}

/// A Gemma 4 file with experts beside its dense MLPs (`gemma4` with
/// routers): the expert counts, the routers and their scales, the fused
/// gate and up experts damaged in turn.
#[test]
fn mutated_gemma4_moe_gguf_files_never_panic() {
    mutate(lcut_testkit::GEMMA4MOE_CASE, 20261132);
}

/// A Gemma 4 file whose shared layers' MLPs are twice as wide (one
/// `feed_forward_length` per layer) damaged in turn.
#[test]
fn mutated_gemma4_wide_gguf_files_never_panic() {
    mutate(lcut_testkit::GEMMA4WIDE_CASE, 20261133);
}

/// [`mutate_file`] on `case`'s Q8_0 file.
fn mutate(case: &str, seed: u64) {
    mutate_file(case, "model.q8_0.gguf", seed);
}

/// `LCUT_MUTANTS` (default 10,000) mutants of `case`'s `file` from `seed`:
/// none panics, and most are refused.
fn mutate_file(case: &str, file: &str, seed: u64) {
    let path = oracle_case(case).join(file);
    let good = std::fs::read(&path).expect("fixture");
    let header_len = GgufHeader::parse(&good, &path).expect("valid").header_len;
    let count = std::env::var("LCUT_MUTANTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_MUTANTS);
    let dir = lcut_testkit::mutant_dir();
    let file = dir.path().join("mutant.gguf");
    let (mut parsed, mut loaded, mut refused) = (0, 0, 0);
    for (i, bytes) in mutants(&good, header_len, seed).take(count).enumerate() {
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            let Ok(header) = GgufHeader::parse(&bytes, Path::new("mutant.gguf")) else {
                return (false, false);
            };
            let config_ok = model_config(&header, Path::new("mutant.gguf"), &bytes).is_ok();
            let mut model_ok = false;
            if i % 10 == 0 {
                std::fs::write(&file, &bytes).expect("write mutant");
                for mode in [WeightMode::Dense(DType::F32), WeightMode::Quantized] {
                    if let Ok(model) = Decoder::load_as(&file, mode, &Device::Cpu) {
                        model_ok = model.teacher_forced_logits(&[1, 5, 9], None).is_ok();
                    }
                }
            }
            (config_ok, model_ok)
        }));
        match outcome {
            Ok((config_ok, model_ok)) => {
                parsed += usize::from(config_ok);
                loaded += usize::from(model_ok);
                refused += usize::from(!config_ok);
            }
            Err(_) => panic!("{case}: mutant {i} (seed {seed}) panicked"),
        }
    }
    eprintln!(
        "{case}: {count} mutants: {parsed} parsed to a configuration, {loaded} of the loaded tenth ran, {refused} refused"
    );
    assert!(
        refused > count / 10,
        "the mutations should damage most files"
    );
}
