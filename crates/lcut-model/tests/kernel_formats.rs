//! lcut-kernels reads ggml's block formats as ggml writes them: blocks
//! quantized by candle (a port of ggml's quantizers) dequantize to candle's
//! values bit for bit, and the kernels' products stay as close to the dense
//! product as candle's own quantized product does.

use anyhow::Result;
use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use lcut_kernels::Isa;
use lcut_kernels::quant::{self, Q8Rows, QuantFormat, QuantMatrix};
use lcut_kernels::testdata::Rng;

/// Each ggml type and the kernels' format for it.
const PAIRS: [(GgmlDType, QuantFormat); 8] = [
    (GgmlDType::Q4_0, QuantFormat::Q4_0),
    (GgmlDType::Q4_1, QuantFormat::Q4_1),
    (GgmlDType::Q5_0, QuantFormat::Q5_0),
    (GgmlDType::Q5_1, QuantFormat::Q5_1),
    (GgmlDType::Q8_0, QuantFormat::Q8_0),
    (GgmlDType::Q4K, QuantFormat::Q4K),
    (GgmlDType::Q5K, QuantFormat::Q5K),
    (GgmlDType::Q6K, QuantFormat::Q6K),
];

/// Weight matrices and activation rows drawn, each from its own seed.
const DRAWS: u64 = 16;

#[test]
fn kernels_read_candles_blocks_as_candle_does() -> Result<()> {
    let dev = Device::Cpu;
    let (rows, cols) = (48, 512);
    // per format, the squared distance of each product from the dense one,
    // summed over the draws: one draw's largest error varied up to 1.7x
    // between the two products (their activations round differently), a
    // sum over draws does not
    let mut ours = [0f64; PAIRS.len()];
    let mut candles = [0f64; PAIRS.len()];
    for seed in 0..DRAWS {
        // fixed draws: candle's own randn is seeded from the clock
        let mut rng = Rng::new(seed);
        let w = Tensor::from_vec(rng.normals(rows * cols, 0.1), (rows, cols), &dev)?;
        let xs = rng.normals(cols, 1.0);
        let x = Tensor::from_vec(xs.clone(), (1, cols), &dev)?;
        for (k, (ggml, format)) in PAIRS.into_iter().enumerate() {
            let q = std::sync::Arc::new(QTensor::quantize(&w, ggml)?);
            let bytes = q.data()?.to_vec();
            let dequantized_by_candle = q.dequantize(&dev)?;
            let theirs: Vec<f32> = dequantized_by_candle.flatten_all()?.to_vec1()?;
            let mut dequantized = vec![0f32; rows * cols];
            quant::dequantize(format, &bytes, &mut dequantized)?;
            assert_eq!(dequantized, theirs, "{ggml:?}: dequantized values");

            let m = QuantMatrix::new(format, &bytes, rows, cols)?;
            let mut acts = Q8Rows::new();
            acts.quantize(&xs, 1, cols)?;
            let mut out = vec![0f32; rows];
            quant::matvec(Isa::detect(), &m, &acts, &mut out, &mut Vec::new())?;
            let dense: Vec<f32> = x
                .matmul(&dequantized_by_candle.t()?)?
                .flatten_all()?
                .to_vec1()?;
            let candle: Vec<f32> = QMatMul::from_arc(q.clone())?
                .forward(&x)?
                .flatten_all()?
                .to_vec1()?;
            let squared = |a: &[f32]| -> f64 {
                a.iter()
                    .zip(&dense)
                    .map(|(u, v)| f64::from(u - v).powi(2))
                    .sum()
            };
            ours[k] += squared(&out);
            candles[k] += squared(&candle);
        }
    }
    for (k, (ggml, _)) in PAIRS.into_iter().enumerate() {
        // 8-bit activations cost both products about the same
        let (ours, candle) = (ours[k].sqrt(), candles[k].sqrt());
        assert!(
            ours <= 1.5 * candle,
            "{ggml:?}: kernels off by {ours} (root of the summed squares) where candle is off by {candle}"
        );
    }
    Ok(())
}
