//! Gemma 3's GGUF metadata (`gemma3.*`) as llama.cpp reads it: the layer
//! pattern (llama.cpp's period 6 when the file names none, a period or one
//! flag per layer when it does), the sliding layers' RoPE base
//! (`rope.freq_base_swa`, 10,000 when absent), and every missing or
//! inconsistent key refused by name. The files are the `gemma3-sliding`
//! reference case as llama.cpp's converter wrote it, with one key changed.

use anyhow::{Result, ensure};
use candle_core::quantized::QTensor;
use candle_core::quantized::gguf_file::{self, Value};
use lcut_model::gguf::GgufFile;
use lcut_model::{DType, Decoder, Device, ModelError, Tensor};
use lcut_testkit::{assert_mentions, oracle_case, oracle_ids};

const CASE: &str = "gemma3-sliding";

/// The case's F32 GGUF with `edit` applied to its metadata, written to a
/// temporary file.
fn edited(
    edit: impl FnOnce(&mut Vec<(String, Value)>),
) -> Result<(tempfile::TempDir, std::path::PathBuf)> {
    let src = oracle_case(CASE).join("model.f32.gguf");
    let mut reader = std::fs::File::open(&src)?;
    let content = gguf_file::Content::read(&mut reader)?;
    let mut metadata: Vec<(String, Value)> = content
        .metadata
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    metadata.sort_by(|a, b| a.0.cmp(&b.0));
    edit(&mut metadata);
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    let tensors: Vec<(String, QTensor)> = names
        .into_iter()
        .map(|n| Ok((n.clone(), content.tensor(&mut reader, n, &Device::Cpu)?)))
        .collect::<Result<_>>()?;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("gemma3.gguf");
    let meta: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut std::fs::File::create(&path)?, &meta, &refs)?;
    Ok((dir, path))
}

fn set(meta: &mut Vec<(String, Value)>, key: &str, value: Value) {
    meta.retain(|(k, _)| k != key);
    meta.push((key.to_string(), value));
}

fn remove(meta: &mut Vec<(String, Value)>, key: &str) {
    meta.retain(|(k, _)| k != key);
}

/// The config of the case's file with `edit` applied, or its error.
fn config_of(
    edit: impl FnOnce(&mut Vec<(String, Value)>),
) -> Result<std::result::Result<lcut_model::ModelConfig, (String, ModelError)>> {
    let (_dir, path) = edited(edit)?;
    Ok(GgufFile::open(&path)
        .map(|f| f.config().clone())
        .map_err(|e| (path.display().to_string(), e)))
}

fn windows(cfg: &lcut_model::ModelConfig) -> Vec<bool> {
    cfg.sliding_window.iter().map(Option::is_some).collect()
}

#[test]
fn the_converted_file_reads_as_llama_cpp_reads_it() -> Result<()> {
    let file = GgufFile::open(&oracle_case(CASE).join("model.f32.gguf"))?;
    let cfg = file.config();
    ensure!(cfg.arch == lcut_model::Arch::Gemma3);
    ensure!(windows(cfg) == [true, true, true, true, true, false]);
    ensure!(cfg.sliding_window[0] == Some(12));
    let local = cfg.sliding_rope.expect("a sliding RoPE");
    ensure!((cfg.rope.theta, local.theta) == (1e6, 20000.0));
    ensure!(cfg.rope.scaling == lcut_model::RopeScaling::Linear { factor: 8.0 });
    ensure!(local.scaling == lcut_model::RopeScaling::None);
    ensure!(cfg.attn_scale == 32f64.powf(-0.5));
    ensure!(
        cfg.qk_norm == lcut_model::config::QkNorm::PerHead
            && cfg.norms == lcut_model::config::NormPlacement::Sandwich
            && !cfg.norm_weight_offset
    );
    Ok(())
}

#[test]
fn a_pattern_in_the_file_is_read_as_a_period_or_per_layer_flags() -> Result<()> {
    let period = config_of(|m| set(m, "gemma3.attention.sliding_window_pattern", Value::U32(3)))?
        .map_err(|(_, e)| e)?;
    ensure!(windows(&period) == [true, true, false, true, true, false]);
    let flags = [false, true, true, false, true, true];
    let per_layer = config_of(|m| {
        let v = flags.iter().map(|&b| Value::Bool(b)).collect();
        set(
            m,
            "gemma3.attention.sliding_window_pattern",
            Value::Array(v),
        )
    })?
    .map_err(|(_, e)| e)?;
    ensure!(windows(&per_layer) == flags);
    // without `rope.freq_base_swa`, llama.cpp's 10,000
    let default_base =
        config_of(|m| remove(m, "gemma3.rope.freq_base_swa"))?.map_err(|(_, e)| e)?;
    ensure!(default_base.sliding_rope.map(|r| r.theta) == Some(10_000.0));
    Ok(())
}

#[test]
fn a_pattern_that_moves_the_global_layer_changes_the_logits() -> Result<()> {
    let ids = oracle_ids(CASE)?;
    let logits = |path: &std::path::Path| -> Result<Tensor> {
        let model = Decoder::load(path, DType::F32, &Device::Cpu)?;
        Ok(model.teacher_forced_logits(&ids, None)?)
    };
    let same = [true, true, true, true, true, false];
    let (_a, as_is) = edited(|m| {
        let v = same.iter().map(|&b| Value::Bool(b)).collect();
        set(
            m,
            "gemma3.attention.sliding_window_pattern",
            Value::Array(v),
        )
    })?;
    let (_b, moved) = edited(|m| set(m, "gemma3.attention.sliding_window_pattern", Value::U32(3)))?;
    let original = logits(&oracle_case(CASE).join("model.f32.gguf"))?;
    let d_same = (logits(&as_is)? - &original)?
        .abs()?
        .flatten_all()?
        .max(0)?;
    let d_moved = (logits(&moved)? - &original)?
        .abs()?
        .flatten_all()?
        .max(0)?;
    ensure!(
        d_same.to_scalar::<f32>()? == 0.0,
        "the same pattern written out"
    );
    ensure!(
        d_moved.to_scalar::<f32>()? > 1e-2,
        "a global layer at 2 reads more"
    );
    Ok(())
}

#[test]
fn missing_and_inconsistent_keys_are_named() -> Result<()> {
    let window = "gemma3.attention.sliding_window";
    let pattern = "gemma3.attention.sliding_window_pattern";
    type Edit = Box<dyn FnOnce(&mut Vec<(String, Value)>)>;
    let cases: Vec<(Edit, &str, &str)> = vec![
        (
            Box::new(move |m| set(m, window, Value::U32(0))),
            window,
            "positive",
        ),
        (Box::new(move |m| remove(m, window)), window, "missing"),
        (
            Box::new(move |m| {
                set(m, pattern, Value::Array(vec![Value::Bool(true); 7]));
            }),
            pattern,
            "one flag per layer (6",
        ),
        (
            Box::new(move |m| set(m, pattern, Value::U32(7))),
            pattern,
            "layer count (6",
        ),
        (
            Box::new(move |m| set(m, pattern, Value::U32(0))),
            pattern,
            "period",
        ),
        (
            Box::new(move |m| {
                set(m, pattern, Value::Array(vec![Value::F32(1.5); 6]));
            }),
            pattern,
            "true or false",
        ),
        (
            Box::new(|m| remove(m, "gemma3.block_count")),
            "gemma3.block_count",
            "positive integer",
        ),
        (
            Box::new(|m| set(m, "gemma3.rope.freq_base_swa", Value::F32(-1.0))),
            "gemma3.rope.freq_base_swa",
            "positive",
        ),
    ];
    for (edit, key, what) in cases {
        let (path, err) = match config_of(edit)? {
            Ok(_) => anyhow::bail!("{key} ({what}): the file was read"),
            Err(e) => e,
        };
        ensure!(
            matches!(err, ModelError::GgufMetadata { .. }),
            "{key}: {err}"
        );
        assert_mentions(&err.to_string(), &[&path, key, what]);
    }
    Ok(())
}

/// A key the file leaves out means what llama.cpp makes of it, not what a
/// Hugging Face config's class default would (transformers' Gemma 3 has 4
/// K/V heads and BoS 2 by default): no K/V head count is as many as the
/// heads, no BoS is none.
#[test]
fn a_missing_key_is_llama_cpps_default_not_the_config_class_default() -> Result<()> {
    let cfg = config_of(|m| {
        // 8 heads, not the class default's 4 K/V heads
        set(m, "gemma3.attention.head_count", Value::U32(8));
        remove(m, "gemma3.attention.head_count_kv");
        remove(m, "tokenizer.ggml.bos_token_id");
    })?
    .map_err(|(p, e)| anyhow::anyhow!("{p}: {e}"))?;
    ensure!(
        cfg.num_kv_heads == cfg.num_heads,
        "{} K/V heads",
        cfg.num_kv_heads
    );
    ensure!(cfg.bos_token_id.is_none(), "BoS {:?}", cfg.bos_token_id);
    Ok(())
}
