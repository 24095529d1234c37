//! lcut-kernels reads ggml's block formats as ggml writes them: blocks
//! quantized by candle (a port of ggml's quantizers) dequantize to candle's
//! values bit for bit, and the kernels' products stay as close to the dense
//! product as candle's own quantized product does.

use anyhow::Result;
use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use lcut_kernels::Isa;
use lcut_kernels::quant::{self, Q8Rows, QuantFormat, QuantMatrix};

#[test]
fn kernels_read_candles_blocks_as_candle_does() -> Result<()> {
    let dev = Device::Cpu;
    let (rows, cols) = (48, 512);
    let w = Tensor::randn(0f32, 0.1, (rows, cols), &dev)?;
    let x = Tensor::randn(0f32, 1.0, (1, cols), &dev)?;
    let xs: Vec<f32> = x.flatten_all()?.to_vec1()?;
    let pairs = [
        (GgmlDType::Q4_0, QuantFormat::Q4_0),
        (GgmlDType::Q4_1, QuantFormat::Q4_1),
        (GgmlDType::Q5_0, QuantFormat::Q5_0),
        (GgmlDType::Q5_1, QuantFormat::Q5_1),
        (GgmlDType::Q8_0, QuantFormat::Q8_0),
        (GgmlDType::Q4K, QuantFormat::Q4K),
        (GgmlDType::Q6K, QuantFormat::Q6K),
    ];
    for (ggml, format) in pairs {
        let q = std::sync::Arc::new(QTensor::quantize(&w, ggml)?);
        let bytes = q.data()?.to_vec();
        let theirs: Vec<f32> = q.dequantize(&dev)?.flatten_all()?.to_vec1()?;
        let mut ours = vec![0f32; rows * cols];
        quant::dequantize(format, &bytes, &mut ours)?;
        assert_eq!(ours, theirs, "{ggml:?}: dequantized values");

        let m = QuantMatrix::new(format, &bytes, rows, cols)?;
        let mut acts = Q8Rows::new();
        acts.quantize(&xs, 1, cols)?;
        let mut out = vec![0f32; rows];
        quant::matvec(Isa::detect(), &m, &acts, &mut out, &mut Vec::new())?;
        let dense: Vec<f32> = x
            .matmul(&q.dequantize(&dev)?.t()?)?
            .flatten_all()?
            .to_vec1()?;
        let candle: Vec<f32> = QMatMul::from_arc(q.clone())?
            .forward(&x)?
            .flatten_all()?
            .to_vec1()?;
        let err = |a: &[f32]| -> f32 {
            a.iter()
                .zip(&dense)
                .map(|(u, v)| (u - v).abs())
                .fold(0.0, f32::max)
        };
        let scale = dense.iter().fold(0f32, |m, v| m.max(v.abs()));
        // 8-bit activations cost both products about the same
        assert!(
            err(&out) <= 1.5 * err(&candle) + 1e-4 * scale,
            "{ggml:?}: kernels off by {} where candle is off by {}",
            err(&out),
            err(&candle)
        );
    }
    Ok(())
}
