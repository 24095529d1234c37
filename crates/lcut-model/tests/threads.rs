//! A sequence's logits do not depend on how many threads run it. Every
//! reference case (f32) from its decode start, and SmolLM2's
//! and Gemma 3's GGUFs (`--dtype q`, an f16 cache) are prefilled with a
//! prompt long enough that a decode step's attention splits its cache into
//! parts, then decoded greedily, on one thread and on two: the same
//! bits at every step, under the full model and SPEED with BoS. A
//! leaderboard shard runs on one thread; a user checking one of its items
//! runs on all of a machine's, and must get the shard's record.

use anyhow::{Context, Result, ensure};
use lcut_model::{DType, Decoder, Device, LogitRows, WeightMode, argmax_rows};
use lcut_parity::ReferenceCase;
use lcut_policy::{PolicySpec, TokenPhases};
use lcut_testkit::{LAYOUT_CASES, MOE_CASES, ORACLE_CASES, oracle_case, real_gemma3, real_model};

/// Prompt tokens: more than two of the attention kernel's parts of rows.
const PROMPT: usize = 700;

/// Decode steps after the prompt.
const STEPS: usize = 4;

/// Each step's logits, decoding greedily under `policy`: the prompt but its
/// last token prefilled, then that token and the tokens chosen after it.
fn decode(model: &Decoder, ids: &[u32], policy: &str) -> Result<Vec<Vec<f32>>> {
    let policy = policy
        .parse::<PolicySpec>()?
        .resolve(model.config().num_layers)?;
    let start = ids.len() - 1;
    let total = start + STEPS;
    let phases = TokenPhases::new(total, start, policy.anchor_len(None, start)?)?;
    let mut seq = model.new_sequence(policy, phases)?;
    seq.reserve(total);
    model.forward(&mut seq, &ids[..start], LogitRows::None, None)?;
    let mut token = ids[start];
    let mut rows = Vec::with_capacity(STEPS);
    for _ in 0..STEPS {
        let logits = model
            .forward(&mut seq, &[token], LogitRows::Last, None)?
            .logits
            .context("a decode step's logits")?;
        token = argmax_rows(&logits)?[0];
        rows.push(logits.flatten_all()?.to_vec1::<f32>()?);
    }
    Ok(rows)
}

/// `decode` on a pool of `threads` threads.
fn decode_on(threads: usize, model: &Decoder, ids: &[u32], policy: &str) -> Result<Vec<Vec<f32>>> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()?;
    pool.install(|| decode(model, ids, policy))
}

/// The GGUF at `path`, quantized with an f16 cache, on one thread and on
/// two: the same logits bit for bit. (The kernel's own test takes more
/// thread counts.)
fn check_gguf(name: &str, path: &std::path::Path) -> Result<()> {
    let mut model = Decoder::load_as(path, WeightMode::Quantized, &Device::Cpu)?;
    model.set_kv_dtype(DType::F16)?;
    let ids: Vec<u32> = (0..PROMPT as u32)
        .map(|i| 2 + (i * 7919) % 20_000)
        .collect();
    check(name, &model, &ids)
}

/// `model` decoding after `ids` on one thread and on two: the same logits
/// bit for bit, under the full model and SPEED with BoS at half depth.
fn check(name: &str, model: &Decoder, ids: &[u32]) -> Result<()> {
    let cut = (model.config().num_layers / 2).max(1);
    for policy in ["full".to_string(), format!("speed:{cut}+bos")] {
        let one = decode_on(1, model, ids, &policy)?;
        let two = decode_on(2, model, ids, &policy)?;
        for (step, (a, b)) in one.iter().zip(&two).enumerate() {
            let differ = a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits());
            let count = differ.count();
            ensure!(
                count == 0,
                "{name}, {policy}: step {step} on two threads differs from one thread's in {count} of {} logits",
                a.len()
            );
        }
    }
    Ok(())
}

#[test]
fn smollm2_decodes_the_same_bits_on_any_number_of_threads() -> Result<()> {
    match real_model() {
        Some(path) => check_gguf("SmolLM2 Q4_1", &path),
        None => Ok(()),
    }
}

#[test]
fn gemma3_decodes_the_same_bits_on_any_number_of_threads() -> Result<()> {
    match real_gemma3() {
        Some(path) => check_gguf("Gemma 3 Q4_K_M", &path),
        None => Ok(()),
    }
}

/// Every reference architecture, layout and family with experts (f32, the
/// dense kernels, the linear layers' recurrence, the experts' products,
/// gpt-oss's sinks), decoding from its case's decode start.
#[test]
fn every_reference_case_decodes_the_same_bits_on_any_number_of_threads() -> Result<()> {
    for name in ORACLE_CASES.iter().chain(&LAYOUT_CASES).chain(&MOE_CASES) {
        let case = ReferenceCase::load(&oracle_case(name))?;
        let model = case.model(DType::F32, &Device::Cpu)?;
        let start = case.policies[0].decode_start;
        check(name, &model, &case.ids[..=start])?;
    }
    Ok(())
}
