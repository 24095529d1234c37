//! The seven transformers reference cases converted to GGUF by llama.cpp's
//! own converter (`fixtures/oracle/make_gguf.py`: F32 and Q8_0), loaded by
//! lcut and checked against transformers' logits: full depth and every
//! SPEED / anchor-free / SelfOnly policy, through the incremental path.
//! F32 must match as the folders do (1e-4), which also proves that
//! llama.cpp's Q/K row permutation, Gemma-2's stored (1 + w) norms and
//! Llama 3.1's `rope_freqs` are undone correctly.

use anyhow::{Context, Result, ensure};
use lcut_model::reference::{ReferenceCase, deviation};
use lcut_model::{DType, Decoder, Device, WeightMode, argmax_rows};
use lcut_testkit::oracle_case;

const CASES: [&str; 7] = [
    "llama-gqa",
    "llama31-rope-scaled",
    "qwen2-bias",
    "qwen3-qknorm",
    "mistral-window",
    "gemma2-softcap",
    "phi3-fused",
];

/// Q8_0 stores each weight with 8 bits and one f16 scale per 32 values; on
/// these random tiny models that moves logits by at most this fraction of
/// the largest reference logit (measured: see the README).
const Q8_MAX_REL: f32 = 0.03;
/// ... and by at most this on average.
const Q8_MEAN_REL: f32 = 0.006;

fn load(case: &str, file: &str, mode: WeightMode) -> Result<(ReferenceCase, Decoder)> {
    let dir = oracle_case(case);
    let reference = ReferenceCase::load(&dir)?;
    let model = Decoder::load_as(&dir.join(file), mode, &Device::Cpu)
        .with_context(|| format!("{case}/{file}"))?;
    Ok((reference, model))
}

#[test]
fn f32_gguf_of_every_architecture_matches_transformers() -> Result<()> {
    for case in CASES {
        let (reference, model) = load(case, "model.f32.gguf", WeightMode::Dense(DType::F32))?;
        let pairs = reference.logit_pairs(&model)?;
        ensure!(pairs.len() > 1, "{case}: no policy logits");
        for pair in pairs {
            let d = deviation(&pair.ours, &pair.reference)?;
            ensure!(
                d.max_abs <= 1e-4,
                "{case} (F32 GGUF): {} differs from transformers by {:e}",
                pair.key,
                d.max_abs
            );
        }
    }
    Ok(())
}

#[test]
fn gguf_greedy_continuation_equals_transformers() -> Result<()> {
    for case in CASES {
        let (reference, model) = load(case, "model.f32.gguf", WeightMode::Dense(DType::F32))?;
        let prompt_len = reference.tensors["greedy_full.prompt_len"]
            .to_dtype(DType::U32)?
            .to_vec1::<u32>()?[0] as usize;
        let expected = reference.tensors["greedy_full.tokens"]
            .to_dtype(DType::U32)?
            .to_vec1::<u32>()?;
        let mut ids = reference.ids[..prompt_len].to_vec();
        for _ in 0..expected.len() {
            let logits = model.teacher_forced_logits(&ids, None)?;
            let last = logits.narrow(0, ids.len() - 1, 1)?;
            ids.push(argmax_rows(&last)?[0]);
        }
        ensure!(
            ids[prompt_len..] == expected[..],
            "{case}: greedy {:?}, transformers {:?}",
            &ids[prompt_len..],
            expected
        );
    }
    Ok(())
}

#[test]
fn q8_0_gguf_stays_within_its_quantization_error() -> Result<()> {
    for case in CASES {
        for mode in [WeightMode::Dense(DType::F32), WeightMode::Quantized] {
            let (reference, model) = load(case, "model.q8_0.gguf", mode)?;
            for pair in reference.logit_pairs(&model)? {
                let d = deviation(&pair.ours, &pair.reference)?;
                ensure!(
                    d.max_abs <= Q8_MAX_REL * d.scale && d.mean_abs <= Q8_MEAN_REL * d.scale,
                    "{case} (Q8_0, {mode:?}): {}: max |d| {:e}, mean {:e}, scale {}",
                    pair.key,
                    d.max_abs,
                    d.mean_abs,
                    d.scale
                );
            }
        }
    }
    Ok(())
}

#[test]
fn quantized_matrices_stay_quantized() -> Result<()> {
    let path = oracle_case("llama-gqa").join("model.q8_0.gguf");
    let q = Decoder::load_as(&path, WeightMode::Quantized, &Device::Cpu)?;
    let dense = Decoder::load_as(&path, WeightMode::Dense(DType::F32), &Device::Cpu)?;
    ensure!(q.weight_mode() == WeightMode::Quantized);
    ensure!(q.dtype() == DType::F32, "activations run in f32");
    ensure!(
        q.quantized_matrices() > 0 && dense.quantized_matrices() == 0,
        "quantized {} vs dense {}",
        q.quantized_matrices(),
        dense.quantized_matrices()
    );
    Ok(())
}
