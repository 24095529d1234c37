//! What the synth tests share: writing a shape from a seed, every format it
//! is written in loaded as every decoder it gives and held to the drawn
//! model's logits, and how far two logit tensors are apart. Each test
//! binary uses a part of it.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use lcut_model::gguf::{GgufFile, GgufHeader};
use lcut_model::{Decoder, WeightMode};
use lcut_synth::shapes::ModelShape;
use lcut_synth::{Format, WriteOptions, write_model};

/// Write `shape` in `format` to `out`, its weights drawn from `seed`.
pub fn write(shape: &ModelShape, format: Format, out: &Path, seed: u64) {
    let opts = WriteOptions {
        seed,
        ..WriteOptions::default()
    };
    write_model(shape, format, out, &opts, &mut |_, _| {}).unwrap();
}

/// The largest |a - b|.
pub fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

/// The largest |a|.
pub fn max_abs(a: &Tensor) -> f32 {
    a.abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

/// The relative error a format's rounding allows against the drawn model's
/// logits: none in f32, 0.03 in bf16, 0.05 in Q8_0, `four_bit` in the
/// 4-bit formats and MXFP4.
pub fn rounding_bound(format: Format, four_bit: f32) -> f32 {
    match format {
        Format::SafetensorsF32 => 0.0,
        Format::SafetensorsBf16 => 0.03,
        Format::GgufQ8_0 => 0.05,
        _ => four_bit,
    }
}

/// Write `shape` in every format under `dir` (weights drawn from `seed`)
/// and load each file as every decoder it gives (dense in f32; from GGUF
/// also kept quantized): each decoder's logits of `tokens` are within
/// `rounding_bound(format, four_bit)` of `want`'s largest, and `check` then
/// sees the format, the file, the mode and the decoder.
pub fn every_format_computes(
    shape: &ModelShape,
    seed: u64,
    dir: &Path,
    (tokens, want): (&[u32], &Tensor),
    four_bit: f32,
    mut check: impl FnMut(Format, &Path, WeightMode, &Decoder),
) {
    for format in Format::ALL {
        let out = path_in(dir, shape, format);
        write(shape, format, &out, seed);
        let modes: &[WeightMode] = if format.is_gguf() {
            &[WeightMode::Dense(DType::F32), WeightMode::Quantized]
        } else {
            &[WeightMode::Dense(DType::F32)]
        };
        for &mode in modes {
            let model = Decoder::load_as(&out, mode, &Device::Cpu).unwrap();
            let logits = model.teacher_forced_logits(tokens, None).unwrap();
            let err = max_diff(&logits, want) / max_abs(want);
            assert!(
                err <= rounding_bound(format, four_bit),
                "{} as {format} ({}): relative error {err}",
                shape.name,
                mode.name()
            );
            check(format, &out, mode, &model);
        }
    }
}

/// Where [`every_format_computes`] writes `shape` in `format` under `dir`.
pub fn path_in(dir: &Path, shape: &ModelShape, format: Format) -> PathBuf {
    let ext = if format.is_gguf() { ".gguf" } else { "" };
    dir.join(format!("{}-{format}{ext}", shape.name))
}

/// Our GGUF file `ours` has the keys, tensor names, types and ranks
/// llama.cpp's converter gave the reference case `theirs` (its Q8_0 file):
/// the same architecture; every `{arch}.*` key it wrote, ours adding only
/// the vocabulary size and keys ending in one of `extra_keys`; and the same
/// tensors at the top and in the layers named by `layers` (`blk.0.`), each
/// of the same rank and type. The one exception is the type of a tensor
/// whose rows are not whole Q8_0 blocks of 32: the converter stores it in
/// F16 (checked), which a shape drawn wider does not need.
pub fn matches_converter(ours: &Path, theirs: &Path, layers: &[&str], extra_keys: &[&str]) {
    let case = theirs.display().to_string();
    let ours = GgufFile::open(ours).unwrap();
    let theirs = GgufFile::open(theirs).unwrap();
    let (ours, theirs) = (ours.header(), theirs.header());
    let arch = theirs.metadata["general.architecture"].as_str().unwrap();
    assert_eq!(
        ours.metadata["general.architecture"].as_str(),
        Some(arch),
        "{case}"
    );
    let keys = |h: &GgufHeader| -> Vec<String> {
        h.metadata
            .keys()
            .filter(|k| k.starts_with(&format!("{arch}.")))
            .cloned()
            .collect()
    };
    let (our_keys, their_keys) = (keys(ours), keys(theirs));
    for k in &their_keys {
        assert!(our_keys.contains(k), "{case}: no {k}");
    }
    for k in our_keys.iter().filter(|k| !their_keys.contains(k)) {
        let allowed = [".vocab_size"].iter().chain(extra_keys);
        assert!(
            allowed.into_iter().any(|e| k.ends_with(e)),
            "{case}: {k} is not the converter's"
        );
    }
    let picked = |h: &GgufHeader| -> BTreeMap<String, (Option<u32>, usize)> {
        h.tensors
            .iter()
            .filter(|(n, _)| !n.starts_with("blk.") || layers.iter().any(|l| n.starts_with(l)))
            .map(|(n, t)| (n.clone(), (Some(t.type_id), t.shape.len())))
            .collect()
    };
    let (mut ours_picked, mut theirs_picked) = (picked(ours), picked(theirs));
    for (name, t) in &theirs.tensors {
        // ggml's first dimension, our last, is the row's length
        let fits = t.shape.last().is_some_and(|c| c % 32 == 0) || t.type_id == 0;
        if fits || !theirs_picked.contains_key(name) {
            continue;
        }
        assert_eq!(t.type_id, 1, "{case}: {name}'s short rows are not F16");
        for map in [&mut ours_picked, &mut theirs_picked] {
            if let Some(entry) = map.get_mut(name) {
                entry.0 = None;
            }
        }
    }
    assert_eq!(ours_picked, theirs_picked, "{case}");
}
