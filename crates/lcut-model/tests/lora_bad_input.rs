//! Bad LoRA adapters are named errors that say which file, field or tensor
//! is at fault: a rank that is not the config's, a shape of another model,
//! another base, an unknown target, a missing tensor, malformed JSON.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Result, bail};
use lcut_model::lora::{LoraConfig, LoraMode, LoraPair, tensor_name, write_adapter};
use lcut_model::{DType, Decoder, Device, Tensor};
use lcut_testkit::{assert_mentions, oracle_case, shown};

type Pairs = BTreeMap<(usize, String), LoraPair>;

fn pair(r: usize, out: usize, inp: usize) -> Result<LoraPair> {
    Ok(LoraPair {
        a: Tensor::ones((r, inp), DType::F32, &Device::Cpu)?,
        b: Tensor::ones((out, r), DType::F32, &Device::Cpu)?,
    })
}

/// q_proj of every layer of llama-gqa (6 layers, [64, 64]) at rank `r`.
fn q_pairs(r: usize) -> Result<Pairs> {
    (0..6)
        .map(|l| Ok(((l, "self_attn.q_proj".to_string()), pair(r, 64, 64)?)))
        .collect()
}

/// The error message of putting the adapter in `dir` into llama-gqa.
fn error_of(dir: &Path) -> Result<String> {
    let model = Decoder::load(&oracle_case("llama-gqa"), DType::F32, &Device::Cpu)?;
    match model.with_lora(dir, LoraMode::Merge) {
        Ok(_) => bail!("the adapter in {} was accepted", dir.display()),
        Err(e) => Ok(e.to_string()),
    }
}

fn write(cfg: &LoraConfig, pairs: &Pairs) -> Result<tempfile::TempDir> {
    let dir = tempfile::tempdir()?;
    write_adapter(dir.path(), cfg, pairs)?;
    Ok(dir)
}

fn q_config(r: usize) -> LoraConfig {
    LoraConfig::new(r, 16.0, &["q_proj"])
}

#[test]
fn rank_in_config_differs_from_tensors() -> Result<()> {
    let dir = write(&q_config(4), &q_pairs(8)?)?;
    let msg = error_of(dir.path())?;
    let weights = shown(dir.path(), "adapter_model.safetensors");
    assert_mentions(
        &msg,
        &[
            &weights,
            &tensor_name(0, "self_attn.q_proj", "A"),
            "rank 8",
            "r = 4",
        ],
    );
    Ok(())
}

#[test]
fn wrong_shape_and_another_models_shape() -> Result<()> {
    let mut p = q_pairs(4)?;
    p.insert((2, "self_attn.q_proj".into()), pair(4, 64, 63)?);
    let dir = write(&q_config(4), &p)?;
    let msg = error_of(dir.path())?;
    assert_mentions(
        &msg,
        &[
            &tensor_name(2, "self_attn.q_proj", "A"),
            "[4, 63]",
            "[4, 64]",
        ],
    );
    // SmolLM2's q_proj is [576, 576]
    let smol: Pairs = (0..6)
        .map(|l| Ok(((l, "self_attn.q_proj".to_string()), pair(4, 576, 576)?)))
        .collect::<Result<_>>()?;
    let dir = write(&q_config(4), &smol)?;
    assert_mentions(&error_of(dir.path())?, &["[4, 576]", "another shape"]);
    Ok(())
}

#[test]
fn another_base_of_the_same_shape() -> Result<()> {
    let model = Decoder::load(&oracle_case("llama-gqa"), DType::F32, &Device::Cpu)?;
    let mut cfg = q_config(4);
    cfg.base_model = Some("other-model".into());
    cfg.base_fingerprint = Some(model.lora_fingerprint()?);
    let ok = write(&cfg, &q_pairs(4)?)?;
    model.clone().with_lora(ok.path(), LoraMode::OnTheFly)?;
    cfg.base_fingerprint = Some("1.5e0,2.5e0,1.5e0,1.5e0".into());
    let dir = write(&cfg, &q_pairs(4)?)?;
    let msg = error_of(dir.path())?;
    assert_mentions(
        &msg,
        &[
            &shown(dir.path(), "adapter_config.json"),
            "other-model",
            "another base",
        ],
    );
    Ok(())
}

#[test]
fn unknown_target_module() -> Result<()> {
    let dir = write(
        &LoraConfig::new(4, 8.0, &["q_proj", "c_attn"]),
        &q_pairs(4)?,
    )?;
    let msg = error_of(dir.path())?;
    assert_mentions(
        &msg,
        &[
            &shown(dir.path(), "adapter_config.json"),
            "`c_attn`",
            "q_proj",
        ],
    );
    Ok(())
}

#[test]
fn missing_tensors() -> Result<()> {
    // a layer without its pair
    let mut p = q_pairs(4)?;
    p.remove(&(3, "self_attn.q_proj".to_string()));
    let dir = write(&q_config(4), &p)?;
    assert_mentions(
        &error_of(dir.path())?,
        &[
            &tensor_name(3, "self_attn.q_proj", "A"),
            "missing",
            "layer 3",
        ],
    );
    // lora_A without lora_B: rewrite the file without one tensor
    let dir = write(&q_config(4), &q_pairs(4)?)?;
    let file = dir.path().join("adapter_model.safetensors");
    let mut all = candle_core::safetensors::load(&file, &Device::Cpu)?;
    let gone = tensor_name(1, "self_attn.q_proj", "B");
    all.remove(&gone);
    candle_core::safetensors::save(&all, &file)?;
    assert_mentions(&error_of(dir.path())?, &[&gone, "missing", "lora_A"]);
    Ok(())
}

#[test]
fn tensors_the_config_does_not_name() -> Result<()> {
    let mut p = q_pairs(4)?;
    p.insert((0, "self_attn.k_proj".into()), pair(4, 32, 64)?);
    let dir = write(&q_config(4), &p)?;
    assert_mentions(&error_of(dir.path())?, &["k_proj", "not in target_modules"]);
    let mut p = q_pairs(4)?;
    p.insert((9, "self_attn.q_proj".into()), pair(4, 64, 64)?);
    let dir = write(&q_config(4), &p)?;
    assert_mentions(
        &error_of(dir.path())?,
        &[
            &tensor_name(9, "self_attn.q_proj", "A"),
            "layer 9",
            "6 layers",
        ],
    );
    Ok(())
}

#[test]
fn malformed_config_and_missing_files() -> Result<()> {
    let dir = write(&q_config(4), &q_pairs(4)?)?;
    let config = dir.path().join("adapter_config.json");
    let cases: [(&str, &[&str]); 7] = [
        (
            "{\"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\"], \"lora_bias\": true}",
            &["`lora_bias`", "not supported"],
        ),
        ("{\"r\": 4, \"lora_alpha\": ", &["not valid JSON"]),
        ("[1, 2]", &["top level"]),
        (
            "{\"r\": 0, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\"]}",
            &["`r`", "positive integer"],
        ),
        (
            "{\"r\": 4, \"lora_alpha\": \"x\", \"target_modules\": [\"q_proj\"]}",
            &["`lora_alpha`"],
        ),
        (
            "{\"r\": 4, \"lora_alpha\": 8, \"target_modules\": \"q_.*\"}",
            &["`target_modules`"],
        ),
        (
            "{\"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\"], \"use_dora\": true}",
            &["`use_dora`", "DoRA"],
        ),
    ];
    for (text, parts) in cases {
        std::fs::write(&config, text)?;
        let msg = error_of(dir.path())?;
        assert_mentions(&msg, &[&shown(dir.path(), "adapter_config.json")]);
        assert_mentions(&msg, parts);
    }
    std::fs::remove_file(&config)?;
    assert_mentions(
        &error_of(dir.path())?,
        &[&shown(dir.path(), "adapter_config.json"), "cannot read"],
    );
    let dir = write(&q_config(4), &q_pairs(4)?)?;
    let weights = dir.path().join("adapter_model.safetensors");
    std::fs::write(&weights, b"\x10\0\0\0\0\0\0\0{not json")?;
    assert_mentions(
        &error_of(dir.path())?,
        &[&shown(dir.path(), "adapter_model.safetensors")],
    );
    Ok(())
}

/// On Gemma 4, whose layers differ (the shared layers 4 and 5 have no keys
/// or values of their own, the full layers 2 and 5 no values apart from the
/// keys, and wider heads), a pair is checked against its own layer: a pair
/// for a projection that layer lacks names the layer, and an adapter of
/// `k_proj` on every layer needs pairs only where a layer has one.
#[test]
fn gemma4_pairs_are_checked_layer_by_layer() -> Result<()> {
    let model = Decoder::load(
        &oracle_case(lcut_testkit::GEMMA4_CASE),
        DType::F32,
        &Device::Cpu,
    )?;
    // k_proj: [32, 64] on the sliding layers (2 K/V heads of 16), [32, 64]
    // on the full ones (1 of 32); none on the shared layers 4 and 5
    let k_pairs = |layers: &[usize]| -> Result<Pairs> {
        layers
            .iter()
            .map(|&l| Ok(((l, "self_attn.k_proj".to_string()), pair(4, 32, 64)?)))
            .collect()
    };
    let cfg = LoraConfig::new(4, 16.0, &["k_proj"]);
    let fine = write(&cfg, &k_pairs(&[0, 1, 2, 3])?)?;
    model.clone().with_lora(fine.path(), LoraMode::OnTheFly)?;
    let shared = write(&cfg, &k_pairs(&[0, 1, 2, 3, 4])?)?;
    let msg = match model.clone().with_lora(shared.path(), LoraMode::OnTheFly) {
        Ok(_) => bail!("a k_proj pair on the shared layer 4 was accepted"),
        Err(e) => e.to_string(),
    };
    assert_mentions(
        &msg,
        &[
            &tensor_name(4, "self_attn.k_proj", "A"),
            "layer 4 has no linear layer `self_attn.k_proj`",
        ],
    );
    // a full layer's values are its keys: no v_proj there
    let v = LoraConfig::new(4, 16.0, &["v_proj"]);
    let pairs: Pairs = [0, 1, 2]
        .iter()
        .map(|&l| Ok(((l, "self_attn.v_proj".to_string()), pair(4, 32, 64)?)))
        .collect::<Result<_>>()?;
    let msg = match model.with_lora(write(&v, &pairs)?.path(), LoraMode::Merge) {
        Ok(_) => bail!("a v_proj pair on the full layer 2 was accepted"),
        Err(e) => e.to_string(),
    };
    assert_mentions(&msg, &["layer 2 has no linear layer `self_attn.v_proj`"]);
    Ok(())
}
