//! The second real model, Gemma 3 270M as a Q4_K_M GGUF (fetched by
//! `scripts/fetch-model.sh`), against what Hugging Face transformers made
//! from the same file (`fixtures/real/gemma3`): its SentencePiece tokenizer
//! on a corpus of 300+ strings, raw completion prompts (a base model: the
//! file has no chat template), logits at full depth and under SPEED+BoS at
//! two cutoffs on prompts shorter and longer than the 512-token sliding
//! window, the greedy continuation; and the quantized path (Q5_0, Q4_K,
//! Q6_K, Q8_0 read in place by lcut's kernels) against the dequantized one.
//! In CI a missing model fails these tests.

use std::collections::HashMap;
use std::path::Path;
use std::sync::OnceLock;

use anyhow::{Context, Result, ensure};
use lcut_model::{DType, Decoder, Device, LogitRows, Tensor, WeightMode, argmax_rows};
use lcut_policy::{Anchors, Policy, PolicyKind, TokenPhases};
use lcut_testkit::{real_gemma3, real_gemma3_reference};
use serde_json::Value;

/// Largest |logit difference| allowed against transformers: SmolLM2's
/// bound (both dequantize the same weights to f32; Gemma's logits are of
/// the same order, 26-28).
const LOGIT_TOL: f32 = 1e-2;
/// Where transformers' top-2 margin is above this, the argmax must agree.
const MARGIN: f32 = 0.05;

/// The model dequantized to f32, loaded once for the tests that read it
/// (its 262,144 x 640 embedding alone is 671 MB in f32).
fn dense(path: &Path) -> Result<&'static Decoder> {
    static DENSE: OnceLock<Decoder> = OnceLock::new();
    if let Some(model) = DENSE.get() {
        return Ok(model);
    }
    let model = Decoder::load(path, DType::F32, &Device::Cpu)?;
    Ok(DENSE.get_or_init(|| model))
}

fn read_jsonl(path: &Path) -> Result<Vec<Value>> {
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| Ok(serde_json::from_str(l)?))
        .collect()
}

fn ids_of(v: &Value) -> Result<Vec<u32>> {
    v.as_array()
        .context("ids")?
        .iter()
        .map(|x| x.as_u64().map(|n| n as u32).context("id"))
        .collect()
}

/// transformers' GGUF tokenizer for Gemma (runs of spaces spelled with
/// "▁", merges in vocabulary order, no space prepended, byte fallback,
/// `<bos>` added): the same ids on every string of the corpus.
#[test]
fn tokenization_equals_transformers_on_the_corpus() -> Result<()> {
    let Some(path) = real_gemma3() else {
        return Ok(());
    };
    let header_bytes = std::fs::read(&path)?;
    let header = lcut_model::gguf::GgufHeader::parse(&header_bytes, &path)?;
    let tok = lcut_engine::TextTokenizer::from_gguf(&header, &path)?;
    let corpus = read_jsonl(&real_gemma3_reference().join("tokenize.jsonl"))?;
    ensure!(corpus.len() >= 300, "corpus of {} strings", corpus.len());
    let mut wrong = Vec::new();
    for item in &corpus {
        let text = item["text"].as_str().context("text")?;
        let expected = ids_of(&item["ids"])?;
        let ours = tok.encode_with_special_tokens(text)?;
        if ours != expected {
            wrong.push(format!(
                "{text:?}: lcut {ours:?}, transformers {expected:?}"
            ));
        }
    }
    ensure!(
        wrong.is_empty(),
        "{} of {} strings tokenize differently:\n{}",
        wrong.len(),
        corpus.len(),
        wrong.join("\n")
    );
    Ok(())
}

/// One completion case of `fixtures/real/gemma3/case.json`.
struct RealCase {
    name: String,
    prompt: String,
    ids: Vec<u32>,
    prompt_len: usize,
    decode_start: usize,
    greedy: Vec<u32>,
}

fn real_cases() -> Result<(Vec<RealCase>, Value, HashMap<String, Tensor>)> {
    let dir = real_gemma3_reference();
    let meta: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("case.json"))?)?;
    let tensors = candle_core::safetensors::load(dir.join("reference.safetensors"), &Device::Cpu)?;
    let mut cases = Vec::new();
    for c in meta["cases"].as_array().context("cases")? {
        let name = c["name"].as_str().context("name")?.to_string();
        let ids = tensors[&format!("{name}.input_ids")]
            .to_dtype(DType::U32)?
            .to_vec1::<u32>()?;
        cases.push(RealCase {
            prompt: c["prompt"].as_str().context("prompt")?.to_string(),
            greedy: ids_of(&c["greedy"])?,
            prompt_len: c["prompt_len"].as_u64().context("prompt_len")? as usize,
            decode_start: c["decode_start"].as_u64().context("decode_start")? as usize,
            ids,
            name,
        });
    }
    Ok((cases, meta, tensors))
}

/// A base model's raw prompt: `<bos>` and the text's ids, the decode phase
/// from the last prompt token, as transformers' `tokenizer(text)` gives.
#[test]
fn raw_prompts_are_transformers_ids() -> Result<()> {
    let Some(path) = real_gemma3() else {
        return Ok(());
    };
    let prompts = lcut_engine::PromptTokenizer::load(&path)?;
    ensure!(
        !prompts.has_chat_template(),
        "the base model's GGUF has no chat template"
    );
    for c in real_cases()?.0 {
        let p = prompts.prepare_text(&c.prompt, None, true)?;
        ensure!(p.ids == c.ids[..c.prompt_len], "{}: prompt ids", c.name);
        ensure!(p.decode_start == c.decode_start, "{}: decode start", c.name);
    }
    Ok(())
}

/// Logits of rows `decode_start..T` under a cutoff (SPEED+BoS; `l_cut = L`
/// is the full model), the whole sequence as one chunk.
fn decode_rows(model: &Decoder, c: &RealCase, l_cut: usize) -> Result<Tensor> {
    let layers = model.config().num_layers;
    let policy = if l_cut == layers {
        Policy::full(layers)
    } else {
        Policy::new(PolicyKind::Speed, l_cut, layers, Anchors::Bos)?
    };
    let phases = TokenPhases::new(c.ids.len(), c.decode_start, 1)?;
    let mut seq = model.new_sequence(policy, phases)?;
    let out = model.forward(&mut seq, &c.ids, LogitRows::All, None)?;
    let first = out.positions.partition_point(|&p| p < c.decode_start);
    let logits = out.logits.context("logits")?;
    Ok(logits.narrow(0, first, c.ids.len() - c.decode_start)?)
}

/// Logits of rows `decode_start..T` at full depth, the prompt as one chunk
/// and then one token per forward call, as generation runs.
fn step_rows(model: &Decoder, c: &RealCase) -> Result<Tensor> {
    let phases = TokenPhases::new(c.prompt_len, c.decode_start, 1)?;
    let mut seq = model.new_sequence(Policy::full(model.config().num_layers), phases)?;
    let out = model.forward(&mut seq, &c.ids[..c.prompt_len], LogitRows::Last, None)?;
    let mut rows = vec![out.logits.context("logits")?];
    for &id in &c.ids[c.prompt_len..] {
        let out = model.forward(&mut seq, &[id], LogitRows::Last, None)?;
        rows.push(out.logits.context("logits")?);
    }
    Ok(Tensor::cat(&rows, 0)?)
}

fn max_abs(t: &Tensor) -> Result<f32> {
    Ok(t.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?)
}

/// Each row's max, mean, std (unbiased) and logsumexp [rows, 4], as the
/// reference stores them.
fn row_stats(rows: &Tensor) -> Result<Tensor> {
    let n = rows.dim(1)? as f64;
    let max = rows.max_keepdim(1)?;
    let mean = rows.mean_keepdim(1)?;
    let centered = rows.broadcast_sub(&mean)?;
    let std = (centered.sqr()?.sum_keepdim(1)? / (n - 1.0))?.sqrt()?;
    let lse = (rows.broadcast_sub(&max)?.exp()?.sum_keepdim(1)?.log()? + &max)?;
    Ok(Tensor::cat(&[&max, &mean, &std, &lse], 1)?)
}

#[test]
fn dequantized_logits_match_transformers_at_full_depth_and_under_speed() -> Result<()> {
    let Some(path) = real_gemma3() else {
        return Ok(());
    };
    let model = dense(&path)?;
    let (cases, meta, tensors) = real_cases()?;
    ensure!(cases.len() >= 3);
    let window = meta["sliding_window"].as_u64().context("window")? as usize;
    ensure!(
        cases.iter().any(|c| c.prompt_len > window),
        "a prompt longer than the sliding window"
    );
    let probe_ids = tensors["probe_ids"].to_dtype(DType::U32)?;
    let (mut worst, mut agree, mut rows) = (0f32, 0usize, 0usize);
    for c in &cases {
        for p in meta["policies"].as_array().context("policies")? {
            let pname = p["name"].as_str().context("policy name")?;
            let l_cut = p["l_cut"].as_u64().context("l_cut")? as usize;
            let key = format!("{}.{pname}", c.name);
            let ours = decode_rows(model, c, l_cut)?;
            let top_idx = tensors[&format!("{key}.top_idx")].to_dtype(DType::U32)?;
            let top_val = &tensors[&format!("{key}.top_val")];
            let scale = max_abs(top_val)?;
            let n = ours.dim(0)?;
            let probes = probe_ids.unsqueeze(0)?.repeat((n, 1))?;
            let stats = &tensors[&format!("{key}.stats")];
            for (what, mine, theirs) in [
                ("top-64 logits", ours.gather(&top_idx, 1)?, top_val.clone()),
                (
                    "logits at the probe ids",
                    ours.gather(&probes, 1)?,
                    tensors[&format!("{key}.probe_val")].clone(),
                ),
                ("row statistics", row_stats(&ours)?, stats.clone()),
            ] {
                let d = max_abs(&(mine - theirs)?)?;
                worst = worst.max(d / scale);
                ensure!(
                    d <= LOGIT_TOL,
                    "{key}: {what} differ by {d:e} (largest logit {scale})"
                );
            }
            let top = top_val.to_vec2::<f32>()?;
            let best = top_idx.to_vec2::<u32>()?;
            let ours_best = argmax_rows(&ours)?;
            for (r, (vals, ids)) in top.iter().zip(&best).enumerate() {
                rows += 1;
                agree += usize::from(ours_best[r] == ids[0]);
                if vals[0] - vals[1] > MARGIN {
                    ensure!(
                        ours_best[r] == ids[0],
                        "{key}: row {r}: argmax {} vs transformers {} (margin {})",
                        ours_best[r],
                        ids[0],
                        vals[0] - vals[1]
                    );
                }
            }
        }
    }
    eprintln!(
        "largest |logit difference| against transformers: {worst:e} of the largest logit; \
         top-1 agreement {agree}/{rows}"
    );
    Ok(())
}

#[test]
fn greedy_continuation_equals_transformers() -> Result<()> {
    let Some(path) = real_gemma3() else {
        return Ok(());
    };
    let model = dense(&path)?;
    let (cases, ..) = real_cases()?;
    for c in &cases {
        ensure!(c.greedy.len() >= 12);
        let prompt = lcut_engine::PreparedPrompt::from_ids(
            c.ids[..c.prompt_len].to_vec(),
            Some(c.decode_start),
        )?;
        let config = lcut_engine::GenerationConfig {
            max_new_tokens: c.greedy.len(),
            stop_tokens: Vec::new(),
            ..lcut_engine::GenerationConfig::default()
        };
        let full = Policy::full(model.config().num_layers);
        let out = lcut_engine::Generation::new(model, prompt, full, config)?.run(|_| true)?;
        ensure!(
            out.tokens == c.greedy,
            "{}: lcut {:?}\ntransformers {:?}",
            c.name,
            out.tokens,
            c.greedy
        );
    }
    Ok(())
}

/// Single-row quantized products quantize the activations to 8 bits (as
/// ggml does) before the integer dot products with the Q5_0, Q4_K, Q6_K and
/// Q8_0 weights: the logits (up to ~28) move from the dequantized f32 path
/// by at most SmolLM2's bounds (measured on Gemma: 1.14 at worst, largest
/// mean 0.14, top-1 agreement 67 of 68 rows).
const QUANTIZED_TOL: f32 = 2.5;
/// ... and by at most this on average.
const QUANTIZED_MEAN_TOL: f32 = 0.3;

#[test]
fn quantized_path_stays_close_to_the_dequantized_one() -> Result<()> {
    let Some(path) = real_gemma3() else {
        return Ok(());
    };
    let dense = dense(&path)?;
    let quant = Decoder::load_as(&path, WeightMode::Quantized, &Device::Cpu)?;
    ensure!(
        quant.mapped_matrices() == 18 * 7 + 1,
        "every projection and the head read in place ({} mapped)",
        quant.mapped_matrices()
    );
    ensure!(quant.unfused_reason()?.is_none(), "Gemma 3 decodes fused");
    let (cases, ..) = real_cases()?;
    let (mut worst, mut mean, mut agree, mut rows) = (0f32, 0f32, 0usize, 0usize);
    for c in &cases {
        let layers = dense.config().num_layers;
        let a = decode_rows(dense, c, layers)?;
        let b = step_rows(&quant, c)?;
        let diff = (&a - &b)?.abs()?.flatten_all()?;
        worst = worst.max(diff.max(0)?.to_scalar::<f32>()?);
        mean = mean.max(diff.mean(0)?.to_scalar::<f32>()?);
        let (x, y) = (argmax_rows(&a)?, argmax_rows(&b)?);
        agree += x.iter().zip(&y).filter(|(p, q)| p == q).count();
        rows += x.len();
    }
    eprintln!(
        "quantized vs dequantized: max |d| {worst}, largest mean |d| {mean}, \
         top-1 agreement {agree}/{rows}"
    );
    ensure!(worst <= QUANTIZED_TOL, "quantized logits differ by {worst}");
    ensure!(mean <= QUANTIZED_MEAN_TOL, "on average by {mean}");
    ensure!(agree * 10 >= rows * 9, "top-1 agreement {agree}/{rows}");
    Ok(())
}
