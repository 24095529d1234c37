//! Every ggml type lcut runs quantized (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and
//! the K-quants Q2_K..Q6_K): a random Llama-shaped model (hidden 256, a
//! multiple of the K-quants' 256-value blocks) written as GGUF by candle with
//! its matrices in that type, loaded by lcut both ways: the quantized
//! products (`--dtype q`; 24 rows, so single-chunk products run quantized,
//! read in place from the mapped file by lcut's kernels for Q4_0, Q4_1,
//! Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K and by candle for the others) must
//! stay close to the dequantized path, and so must the decode steps after
//! a prefill (keeping the quantized prefill's top-1 tokens): on the fused
//! step for the kernels' types, on the tensor path (candle's products,
//! `Unfused::CandleQuantized`) for the others. (The dequantized path itself
//! is held to transformers by the reference cases.)

use std::collections::HashMap;

use anyhow::{Result, ensure};
use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use lcut_model::{DType, Decoder, Device, LogitRows, Tensor, Unfused, WeightMode};
use lcut_parity::deviation;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const HIDDEN: usize = 256;
const FFN: usize = 512;
const VOCAB: usize = 512;
const LAYERS: usize = 2;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = HIDDEN / HEADS;

/// The model's tensors as llama.cpp names them, with their shapes [rows, cols].
fn shapes() -> Vec<(String, Vec<usize>)> {
    let mut out = vec![
        ("token_embd.weight".to_string(), vec![VOCAB, HIDDEN]),
        ("output_norm.weight".to_string(), vec![HIDDEN]),
        ("output.weight".to_string(), vec![VOCAB, HIDDEN]),
    ];
    for l in 0..LAYERS {
        let p = format!("blk.{l}");
        out.extend([
            (format!("{p}.attn_norm.weight"), vec![HIDDEN]),
            (format!("{p}.ffn_norm.weight"), vec![HIDDEN]),
            (format!("{p}.attn_q.weight"), vec![HIDDEN, HIDDEN]),
            (
                format!("{p}.attn_k.weight"),
                vec![KV_HEADS * HEAD_DIM, HIDDEN],
            ),
            (
                format!("{p}.attn_v.weight"),
                vec![KV_HEADS * HEAD_DIM, HIDDEN],
            ),
            (format!("{p}.attn_output.weight"), vec![HIDDEN, HIDDEN]),
            (format!("{p}.ffn_gate.weight"), vec![FFN, HIDDEN]),
            (format!("{p}.ffn_up.weight"), vec![FFN, HIDDEN]),
            (format!("{p}.ffn_down.weight"), vec![HIDDEN, FFN]),
        ]);
    }
    out
}

/// Write the model with its matrices in `dtype` (norms in F32).
fn write_gguf(path: &std::path::Path, dtype: GgmlDType, seed: u64) -> Result<()> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut tensors: Vec<(String, QTensor)> = Vec::new();
    for (name, shape) in shapes() {
        let n: usize = shape.iter().product();
        let (center, spread, ty) = if shape.len() == 1 {
            (1.0, 0.1, GgmlDType::F32)
        } else {
            (0.0, 0.08, dtype)
        };
        let values: Vec<f32> = (0..n)
            .map(|_| center + rng.random_range(-spread..spread))
            .collect();
        let t = Tensor::from_vec(values, shape, &Device::Cpu)?;
        tensors.push((name, QTensor::quantize(&t, ty)?));
    }
    let arch = Value::String("llama".into());
    let u = |n: usize| Value::U32(n as u32);
    let metadata: Vec<(&str, Value)> = vec![
        ("general.architecture", arch),
        ("llama.block_count", u(LAYERS)),
        ("llama.embedding_length", u(HIDDEN)),
        ("llama.feed_forward_length", u(FFN)),
        ("llama.attention.head_count", u(HEADS)),
        ("llama.attention.head_count_kv", u(KV_HEADS)),
        ("llama.context_length", u(256)),
        ("llama.rope.freq_base", Value::F32(10000.0)),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        ("tokenizer.ggml.bos_token_id", u(1)),
    ];
    let meta_refs: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (*k, v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut file = std::fs::File::create(path)?;
    gguf_file::write(&mut file, &meta_refs, &tensor_refs)?;
    Ok(())
}

fn logits(path: &std::path::Path, mode: WeightMode, ids: &[u32]) -> Result<Tensor> {
    let model = Decoder::load_as(path, mode, &Device::Cpu)?;
    Ok(model.teacher_forced_logits(ids, None)?)
}

/// Where the decode steps start: the tokens before it are one prefill chunk.
const DECODE_START: usize = 8;

/// The logits of the tokens from [`DECODE_START`] on, each decoded alone
/// after the prompt before it (the fused step where the model has one).
fn decoded_logits(model: &Decoder, ids: &[u32]) -> Result<Tensor> {
    let mut seq = model.new_full_sequence();
    model.forward(&mut seq, &ids[..DECODE_START], LogitRows::None, None)?;
    let mut rows = Vec::new();
    for i in DECODE_START..ids.len() {
        let out = model.forward(&mut seq, &ids[i..=i], LogitRows::Last, None)?;
        rows.push(out.logits.expect("a decode row"));
    }
    Ok(Tensor::cat(&rows, 0)?)
}

#[test]
fn every_quantized_type_loads_both_ways() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ids: Vec<u32> = (0..24).map(|i| (i * 37 + 1) % VOCAB as u32).collect();
    let types = [
        GgmlDType::Q4_0,
        GgmlDType::Q4_1,
        GgmlDType::Q5_0,
        GgmlDType::Q5_1,
        GgmlDType::Q8_0,
        GgmlDType::Q2K,
        GgmlDType::Q3K,
        GgmlDType::Q4K,
        GgmlDType::Q5K,
        GgmlDType::Q6K,
    ];
    let mut report = HashMap::new();
    for (i, dtype) in types.into_iter().enumerate() {
        let path = dir.path().join(format!("m{i}.gguf"));
        write_gguf(&path, dtype, i as u64)?;
        let dense = logits(&path, WeightMode::Dense(DType::F32), &ids)?;
        let model = Decoder::load_as(&path, WeightMode::Quantized, &Device::Cpu)?;
        ensure!(
            model.quantized_matrices() == LAYERS * 7 + 1,
            "{dtype:?} kept quantized"
        );
        // the types lcut's kernels read stay in the mapped file, no copy,
        // and decode on the fused step
        let kernel_types = !matches!(dtype, GgmlDType::Q2K | GgmlDType::Q3K);
        let mapped = if kernel_types { LAYERS * 7 + 1 } else { 0 };
        ensure!(
            model.mapped_matrices() == mapped,
            "{dtype:?}: {} matrices read in place, expected {mapped}",
            model.mapped_matrices()
        );
        let unfused = (!kernel_types).then_some(Unfused::CandleQuantized);
        let reason = model.unfused_reason()?;
        ensure!(
            reason == unfused,
            "{dtype:?}: decode path {reason:?}, expected {unfused:?}"
        );
        let quant = model.teacher_forced_logits(&ids, None)?;
        let d = deviation(&quant, &dense)?;
        report.insert(format!("{dtype:?}"), d.max_abs / d.scale);
        ensure!(
            d.max_abs <= 0.05 * d.scale && d.top1_agreement >= 0.9,
            "{dtype:?}: quantized vs dequantized max {} (scale {}), top-1 {}",
            d.max_abs,
            d.scale,
            d.top1_agreement
        );
        // the decode steps: within the same bound of the dequantized
        // logits, and keeping the quantized prefill's top-1 token (on this
        // random model a few rows are near ties, which the weights' own
        // rounding already flips against the dequantized ones)
        let decoded = decoded_logits(&model, &ids)?;
        let rows = ids.len() - DECODE_START;
        let d = deviation(&decoded, &dense.narrow(0, DECODE_START, rows)?)?;
        report.insert(format!("{dtype:?} decode"), d.max_abs / d.scale);
        ensure!(
            d.max_abs <= 0.05 * d.scale,
            "{dtype:?} decode: quantized vs dequantized max {} (scale {})",
            d.max_abs,
            d.scale
        );
        let p = deviation(&decoded, &quant.narrow(0, DECODE_START, rows)?)?;
        ensure!(
            p.max_abs <= 0.05 * p.scale && p.top1_agreement >= 0.9,
            "{dtype:?}: decode vs prefill max {} (scale {}), top-1 {}",
            p.max_abs,
            p.scale,
            p.top1_agreement
        );
    }
    eprintln!("quantized vs dequantized, max |d| / scale: {report:?}");
    Ok(())
}
