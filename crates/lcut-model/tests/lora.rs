//! LoRA adapters on the llama-gqa oracle case: a zero adapter is the base
//! model, merging equals applying on the fly and merging by hand, an
//! adapter written by Python `peft` gives peft's logits, and bad adapters
//! are named errors.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use anyhow::{Result, ensure};
use lcut_model::lora::{LoraAdapter, LoraConfig, LoraMode, LoraPair, write_adapter};
use lcut_model::{DType, Decoder, Device, Tensor, WeightMode};
use lcut_parity::ReferenceCase;
use lcut_testkit::oracle_case;

const CASE: &str = "llama-gqa";
const ATTN: [&str; 4] = ["q_proj", "k_proj", "v_proj", "o_proj"];

/// Deterministic values in [-amp, amp).
fn noise(n: usize, seed: u64, amp: f32) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * amp
        })
        .collect()
}

fn base() -> Result<Decoder> {
    Ok(Decoder::load(&oracle_case(CASE), DType::F32, &Device::Cpu)?)
}

fn ids() -> Result<Vec<u32>> {
    Ok(ReferenceCase::load(&oracle_case(CASE))?.ids)
}

/// (out, in) of the attention projections of llama-gqa (hidden 64, 4 heads,
/// 2 KV heads, head_dim 16).
fn attn_dims(module: &str) -> (usize, usize) {
    match module {
        "k_proj" | "v_proj" => (32, 64),
        _ => (64, 64),
    }
}

/// Rank-`r` pairs on `modules` of every layer; B zero when `zero_b`.
fn pairs(
    r: usize,
    layers: &[usize],
    modules: &[&str],
    zero_b: bool,
) -> Result<BTreeMap<(usize, String), LoraPair>> {
    let mut out = BTreeMap::new();
    for &l in layers {
        for (i, m) in modules.iter().enumerate() {
            let (o, inp) = attn_dims(m);
            let seed = (l * 16 + i) as u64;
            let a = Tensor::from_vec(noise(r * inp, seed, 0.3), (r, inp), &Device::Cpu)?;
            let b = match zero_b {
                true => Tensor::zeros((o, r), DType::F32, &Device::Cpu)?,
                false => Tensor::from_vec(noise(o * r, seed + 1000, 0.3), (o, r), &Device::Cpu)?,
            };
            out.insert((l, format!("self_attn.{m}")), LoraPair { a, b });
        }
    }
    Ok(out)
}

fn config(r: usize) -> LoraConfig {
    let mut c = LoraConfig::new(r, 16.0, &ATTN);
    c.policy = Some("speed:4+bos".into());
    c
}

fn logits(model: &Decoder) -> Result<Tensor> {
    Ok(model.teacher_forced_logits(&ids()?, None)?)
}

fn max_diff(a: &Tensor, b: &Tensor) -> Result<f32> {
    Ok((a - b)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?)
}

#[test]
fn zero_adapter_is_the_base_model_exactly() -> Result<()> {
    let dir = tempfile::tempdir()?;
    write_adapter(
        dir.path(),
        &config(4),
        &pairs(4, &[0, 1, 2, 3, 4, 5], &ATTN, true)?,
    )?;
    let want = logits(&base()?)?;
    for mode in [LoraMode::Merge, LoraMode::OnTheFly] {
        let got = logits(&base()?.with_lora(dir.path(), mode)?)?;
        ensure!(
            max_diff(&got, &want)? == 0.0,
            "{mode:?}: zero adapter changed the logits"
        );
    }
    Ok(())
}

/// Write the llama-gqa model with scale·B·A added to its weights, by hand.
fn merge_by_hand(
    dir: &Path,
    pairs: &BTreeMap<(usize, String), LoraPair>,
    scale: f64,
) -> Result<()> {
    let src = oracle_case(CASE);
    std::fs::copy(src.join("config.json"), dir.join("config.json"))?;
    let mut w: HashMap<String, Tensor> =
        candle_core::safetensors::load(src.join("model.safetensors"), &Device::Cpu)?;
    for ((l, module), p) in pairs {
        let name = format!("model.layers.{l}.{module}.weight");
        let old = w
            .remove(&name)
            .ok_or_else(|| anyhow::anyhow!("no {name}"))?;
        let delta = (p.b.matmul(&p.a)? * scale)?;
        w.insert(name, (old + delta)?);
    }
    candle_core::safetensors::save(&w, dir.join("model.safetensors"))?;
    Ok(())
}

#[test]
fn merged_equals_on_the_fly_equals_merged_by_hand() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let layers = [1, 3, 4];
    let p = pairs(8, &layers, &ATTN, false)?;
    let mut cfg = config(8);
    cfg.layers = Some(layers.to_vec());
    write_adapter(dir.path(), &cfg, &p)?;
    let merged = logits(&base()?.with_lora(dir.path(), LoraMode::Merge)?)?;
    let fly = logits(&base()?.with_lora(dir.path(), LoraMode::OnTheFly)?)?;
    let by_hand_dir = tempfile::tempdir()?;
    merge_by_hand(by_hand_dir.path(), &p, cfg.scale())?;
    let by_hand = logits(&Decoder::load(
        by_hand_dir.path(),
        DType::F32,
        &Device::Cpu,
    )?)?;
    let plain = logits(&base()?)?;
    ensure!(
        max_diff(&merged, &plain)? > 1e-2,
        "the adapter made no difference"
    );
    for (what, d) in [
        ("merged vs on the fly", max_diff(&merged, &fly)?),
        ("merged vs by hand", max_diff(&merged, &by_hand)?),
        ("on the fly vs by hand", max_diff(&fly, &by_hand)?),
    ] {
        ensure!(d <= 1e-5, "{what}: {d:e} > 1e-5");
    }
    Ok(())
}

#[test]
fn quantized_gguf_merges_like_on_the_fly() -> Result<()> {
    let dir = tempfile::tempdir()?;
    write_adapter(
        dir.path(),
        &config(4),
        &pairs(4, &[0, 1, 2, 3, 4, 5], &ATTN, false)?,
    )?;
    let gguf = oracle_case(CASE).join("model.q8_0.gguf");
    let load = || Decoder::load_as(&gguf, WeightMode::Quantized, &Device::Cpu);
    let merged = load()?.with_lora(dir.path(), LoraMode::Merge)?;
    let fly = load()?.with_lora(dir.path(), LoraMode::OnTheFly)?;
    ensure!(
        fly.quantized_matrices() > merged.quantized_matrices(),
        "merging keeps the matrix dense"
    );
    let d = max_diff(&logits(&merged)?, &logits(&fly)?)?;
    ensure!(d <= 1e-4, "q8_0 merged vs on the fly: {d:e}");
    Ok(())
}

#[test]
fn written_adapter_reads_back() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut cfg = config(2);
    cfg.use_rslora = true;
    write_adapter(dir.path(), &cfg, &pairs(2, &[0, 5], &["q_proj"], false)?)?;
    let back = LoraAdapter::read(dir.path())?;
    ensure!(back.config == cfg, "config changed: {:?}", back.config);
    ensure!(back.pairs.len() == 2, "{} pairs", back.pairs.len());
    ensure!(
        (cfg.scale() - 16.0 / 2f64.sqrt()).abs() < 1e-12,
        "rslora scale"
    );
    Ok(())
}

/// An adapter written by Python `peft` (`fixtures/oracle/lora/make_lora.py`:
/// rsLoRA, r = 2, all seven projections of layers 1 and 4) gives peft's
/// logits, merged and on the fly.
#[test]
fn peft_adapter_gives_peft_logits() -> Result<()> {
    let dir = lcut_testkit::workspace_root().join("fixtures/oracle/lora");
    let reference =
        candle_core::safetensors::load(dir.join("reference.safetensors"), &Device::Cpu)?;
    let ids: Vec<u32> = reference["input_ids"]
        .to_vec1::<i64>()?
        .iter()
        .map(|&i| i as u32)
        .collect();
    let want = &reference["logits"];
    let rows = want.dim(0)?;
    let adapter = LoraAdapter::read(&dir.join("adapter"))?;
    ensure!(
        adapter.config.policy.as_deref() == Some("speed:4+bos"),
        "lcut_policy"
    );
    ensure!(adapter.pairs.len() == 14, "{} pairs", adapter.pairs.len());
    for mode in [LoraMode::Merge, LoraMode::OnTheFly] {
        let mut model = base()?;
        model.apply_lora(&adapter, mode)?;
        let got = model.teacher_forced_logits(&ids, None)?;
        let got = got.narrow(0, ids.len() - rows, rows)?;
        let d = max_diff(&got, want)?;
        ensure!(d <= 1e-4, "{mode:?}: logits differ from peft's by {d:e}");
    }
    Ok(())
}

/// The hash `LoraAdapter::read` keeps is the one `--lora` recorded before it
/// did: FNV-1a of `adapter_config.json` followed by
/// `adapter_model.safetensors`, read apart (recorded identities stay
/// comparable).
#[test]
fn read_keeps_the_hash_of_its_files() -> Result<()> {
    let dir = lcut_testkit::workspace_root().join("fixtures/oracle/lora/adapter");
    let mut bytes = std::fs::read(dir.join("adapter_config.json"))?;
    bytes.extend(std::fs::read(dir.join("adapter_model.safetensors"))?);
    let adapter = LoraAdapter::read(&dir)?;
    ensure!(
        adapter.hash == lcut_trace::hash_bytes(&bytes),
        "hash {} != {}",
        adapter.hash,
        lcut_trace::hash_bytes(&bytes)
    );
    Ok(())
}
