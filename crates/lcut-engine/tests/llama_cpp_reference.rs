//! The quantized path (`--dtype q`) of the real model, SmolLM2-135M-Instruct
//! Q4_1, against llama.cpp on the same file (`fixtures/real/smollm2/
//! llama_cpp.json`, made by `fixtures/real/make_llama_cpp_logits.py` with
//! libllama): the logits of the four reference cases' decode rows (the
//! tokens before the decode start as one chunk, then one token at a time)
//! and of six chat prompts' greedy continuations, and the greedy tokens
//! themselves, with the K/V cache in f16 (both engines' default) and in
//! f32. In CI a missing model fails these tests.
//!
//! Both engines quantize each activation row to 8 bits per block of 32
//! before the integer dot products with the 4-bit weights, and neither
//! rounds in the same order (llama.cpp also keeps the activations' block
//! scales in f16, lcut in f32): a change in the last bit of a sum moves an
//! 8-bit activation by a whole step, and 30 layers carry it to the logits.
//! llama.cpp's own two runs (f16 against f32 cache) differ by up to 1.19 on
//! these rows and by 0.15 to 0.2 on average (requests whose greedy paths
//! stay the same); lcut against llama.cpp measured 1.07 to 1.35 at most and
//! 0.24 to 0.31 on average (the largest request's mean). The bounds, 2.0
//! and 0.4, are about 1.7x and 2x llama.cpp's own spread, and far below
//! what a wrong kernel does (a wrong block scale or a lost offset moves
//! logits by several units on every row, a wrong layer by tens).

use std::collections::HashMap;

use anyhow::{Context, Result, ensure};
use lcut_model::{DType, Decoder, Device, LogitRows, Tensor, WeightMode};
use lcut_policy::{Policy, TokenPhases};
use lcut_testkit::{real_model, real_reference};
use serde_json::Value;

/// Largest |logit difference| allowed on llama.cpp's top-8 ids of a row.
const TOL: f32 = 2.0;
/// Largest mean |logit difference| over a request's rows and top-8 ids.
const MEAN_TOL: f32 = 0.4;
/// Where llama.cpp's top-2 margin is above this, lcut's argmax must be its.
const MARGIN: f32 = 1.0;

/// One request llama.cpp ran: the ids given, how many ran as one chunk,
/// its rows (position, top ids and logits) and its greedy tokens.
struct Request {
    name: String,
    ids: Vec<u32>,
    prefill: usize,
    rows: Vec<(usize, Vec<(u32, f32)>)>,
    greedy: Vec<u32>,
}

fn ids_of(v: &Value) -> Result<Vec<u32>> {
    v.as_array()
        .context("ids")?
        .iter()
        .map(|x| x.as_u64().map(|n| n as u32).context("id"))
        .collect()
}

/// llama.cpp's requests for cache type `cache` (f16 or f32), with the ids
/// each ran (from case.json / reference.safetensors and chat.jsonl).
fn requests(cache: &str) -> Result<Vec<Request>> {
    let dir = real_reference();
    let fixture: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("llama_cpp.json"))?)?;
    let meta: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("case.json"))?)?;
    let tensors = candle_core::safetensors::load(dir.join("reference.safetensors"), &Device::Cpu)?;
    let mut given: HashMap<String, (Vec<u32>, usize)> = HashMap::new();
    for c in meta["cases"].as_array().context("cases")? {
        let name = c["name"].as_str().context("name")?.to_string();
        let ids = tensors[&format!("{name}.input_ids")]
            .to_dtype(DType::U32)?
            .to_vec1::<u32>()?;
        let start = c["decode_start"].as_u64().context("decode_start")? as usize;
        given.insert(name, (ids, start));
    }
    let chats = std::fs::read_to_string(dir.join("chat.jsonl"))?;
    for (i, line) in chats.lines().filter(|l| !l.trim().is_empty()).enumerate() {
        let v: Value = serde_json::from_str(line)?;
        let ids = ids_of(&v["ids"])?;
        let n = ids.len();
        given.insert(format!("chat{i}"), (ids, n));
    }
    let mut out = Vec::new();
    for r in fixture["runs"][cache].as_array().context("runs")? {
        let name = r["name"].as_str().context("name")?.to_string();
        let (ids, prefill) = given.remove(&name).context("a request of the fixture")?;
        let rows = r["rows"]
            .as_array()
            .context("rows")?
            .iter()
            .map(|row| {
                let top = row["top"]
                    .as_array()
                    .context("top")?
                    .iter()
                    .map(|p| {
                        Ok((
                            p[0].as_u64().context("id")? as u32,
                            p[1].as_f64().context("logit")? as f32,
                        ))
                    })
                    .collect::<Result<Vec<_>>>()?;
                Ok((row["pos"].as_u64().context("pos")? as usize, top))
            })
            .collect::<Result<Vec<_>>>()?;
        out.push(Request {
            greedy: ids_of(&r["greedy"])?,
            name,
            ids,
            prefill,
            rows,
        });
    }
    ensure!(
        out.len() == 10,
        "4 cases and 6 chat prompts, got {}",
        out.len()
    );
    Ok(out)
}

/// lcut's logits at llama.cpp's rows: the first `prefill` ids as one chunk,
/// then every later id (and the greedy tokens but the last) one at a time.
fn lcut_rows(model: &Decoder, r: &Request) -> Result<Vec<Tensor>> {
    let mut ids = r.ids.clone();
    ids.extend(r.greedy.iter().take(r.greedy.len().saturating_sub(1)));
    let phases = TokenPhases::new(r.prefill, r.prefill.saturating_sub(1), 1)?;
    let mut seq = model.new_sequence(Policy::full(model.config().num_layers), phases)?;
    let out = model.forward(&mut seq, &ids[..r.prefill], LogitRows::Last, None)?;
    let mut rows = vec![out.logits.context("logits")?.flatten_all()?];
    for &id in &ids[r.prefill..] {
        let out = model.forward(&mut seq, &[id], LogitRows::Last, None)?;
        rows.push(out.logits.context("logits")?.flatten_all()?);
    }
    Ok(rows)
}

/// lcut's greedy tokens after `prompt` (`n` of them), one step at a time.
fn lcut_greedy(model: &Decoder, prompt: &[u32], n: usize) -> Result<Vec<u32>> {
    let phases = TokenPhases::new(prompt.len(), prompt.len().saturating_sub(1), 1)?;
    let mut seq = model.new_sequence(Policy::full(model.config().num_layers), phases)?;
    let mut next = prompt.to_vec();
    let mut out = Vec::new();
    while out.len() < n {
        let logits = model
            .forward(&mut seq, &next, LogitRows::Last, None)?
            .logits
            .context("logits")?;
        let id = logits.flatten_all()?.argmax(0)?.to_scalar::<u32>()?;
        out.push(id);
        next = vec![id];
    }
    Ok(out)
}

fn check_cache(cache: &str, dtype: DType) -> Result<()> {
    let Some(path) = real_model() else {
        return Ok(());
    };
    let mut model = Decoder::load_as(&path, WeightMode::Quantized, &Device::Cpu)?;
    model.set_kv_dtype(dtype)?;
    let (mut worst, mut worst_mean, mut agree, mut decided) = (0f32, 0f32, 0, 0);
    for r in requests(cache)? {
        let ours = lcut_rows(&model, &r)?;
        ensure!(ours.len() == r.rows.len(), "{}: rows", r.name);
        let (mut sum, mut count) = (0f32, 0usize);
        for (i, (z, (pos, top))) in ours.iter().zip(&r.rows).enumerate() {
            let z = z.to_vec1::<f32>()?;
            for &(id, want) in top {
                let d = (z[id as usize] - want).abs();
                ensure!(
                    d <= TOL,
                    "{cache} cache, {} row {i} (position {pos}), id {id}: lcut {} vs llama.cpp {want}",
                    r.name,
                    z[id as usize]
                );
                worst = worst.max(d);
                sum += d;
                count += 1;
            }
            if top[0].1 - top[1].1 > MARGIN {
                let best = z
                    .iter()
                    .enumerate()
                    .fold(
                        (0, f32::NEG_INFINITY),
                        |b, (j, &v)| if v > b.1 { (j, v) } else { b },
                    )
                    .0;
                ensure!(
                    best as u32 == top[0].0,
                    "{cache} cache, {} row {i}: argmax {best} vs llama.cpp {} (margin {})",
                    r.name,
                    top[0].0,
                    top[0].1 - top[1].1
                );
                agree += 1;
            }
            decided += 1;
        }
        let mean = sum / count as f32;
        worst_mean = worst_mean.max(mean);
        ensure!(
            mean <= MEAN_TOL,
            "{cache} cache, {}: mean |logit difference| {mean}",
            r.name
        );
        // greedy tokens: the same up to llama.cpp's first close call
        if !r.greedy.is_empty() {
            let ours = lcut_greedy(&model, &r.ids, r.greedy.len())?;
            for (k, (a, b)) in ours.iter().zip(&r.greedy).enumerate() {
                let top = &r.rows[k].1;
                if top[0].1 - top[1].1 <= MARGIN {
                    break;
                }
                ensure!(
                    a == b,
                    "{cache} cache, {} greedy token {k}: lcut {a} vs llama.cpp {b}: {ours:?} vs {:?}",
                    r.name,
                    r.greedy
                );
            }
        }
    }
    eprintln!(
        "{cache} cache against llama.cpp: max |d| {worst}, largest mean |d| {worst_mean}, \
         argmax checked on {agree} of {decided} rows (margin above {MARGIN})"
    );
    Ok(())
}

#[test]
fn quantized_logits_and_greedy_tokens_match_llama_cpp_with_an_f16_cache() -> Result<()> {
    check_cache("f16", DType::F16)
}

#[test]
fn quantized_logits_and_greedy_tokens_match_llama_cpp_with_an_f32_cache() -> Result<()> {
    check_cache("f32", DType::F32)
}
