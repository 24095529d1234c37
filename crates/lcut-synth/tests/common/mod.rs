//! What the synth tests share: writing a shape from a seed, every format it
//! is written in loaded as every decoder it gives and held to the drawn
//! model's logits, and how far two logit tensors are apart. Each test
//! binary uses a part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
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
