//! Matrix-vector products of one decode step on a SmolLM2-sized matrix
//! (1536 x 576) per ggml type: lcut's quantized kernel against candle's
//! quantized product and the dense f32 product, interleaved, median of
//! rounds. `cargo run --release -p lcut-model --example qdot_bench`.

use std::sync::Arc;
use std::time::Instant;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn time(reps: usize, mut f: impl FnMut()) -> f64 {
    let t = Instant::now();
    for _ in 0..reps {
        f();
    }
    t.elapsed().as_secs_f64() * 1e6 / reps as f64
}

fn main() -> candle_core::Result<()> {
    let dev = Device::Cpu;
    let (n, k, reps, rounds) = (1536, 576, 200, 7);
    let w = Tensor::randn(0f32, 0.1, (n, k), &dev)?;
    let x = Tensor::randn(0f32, 1.0, (1, k), &dev)?;
    let xs = x.flatten_all()?.to_vec1::<f32>()?;
    let dense = candle_nn::Linear::new(w.clone(), None);
    println!("{n} x {k}, one row, microseconds per product (median of {rounds} rounds)");
    for dtype in [GgmlDType::Q4_0, GgmlDType::Q4_1, GgmlDType::Q8_0] {
        let q = Arc::new(QTensor::quantize(&w, dtype)?);
        let data = q.data()?.to_vec();
        let candle = QMatMul::from_arc(q.clone())?;
        let (mut ours, mut theirs, mut f32s) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            ours.push(time(reps, || {
                std::hint::black_box(lcut_model::qdot::matmul(dtype, &data, n, k, &xs));
            }));
            theirs.push(time(reps, || {
                std::hint::black_box(candle.forward(&x).ok());
            }));
            f32s.push(time(reps, || {
                std::hint::black_box(dense.forward(&x).ok());
            }));
        }
        let (o, c, d) = (median(ours), median(theirs), median(f32s));
        println!(
            "{dtype:?}: lcut {o:.1}  candle {c:.1}  dense f32 {d:.1}   lcut/candle {:.2}  lcut/f32 {:.2}",
            o / c,
            o / d
        );
    }
    Ok(())
}
