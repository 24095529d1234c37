//! How fast one thread multiplies a quantized matrix by one activation row
//! (a decode step's product), in the file's row layout and interleaved, on
//! each instruction-set level this CPU runs: the fastest of many runs (the
//! least disturbed by other work on the machine), as GB of weights read
//! per second.
//!
//!     cargo run --release -p lcut-kernels --example quant_throughput [ROWS COLS RUNS]
//!
//! Defaults: 4096 x 2048 (a 1B model's MLP matrices are 8192 x 2048), 200
//! runs.

use std::time::Instant;

use lcut_kernels::isa::{ALL, Isa};
use lcut_kernels::quant::{PackedMatrix, Q8Rows, QuantFormat, QuantMatrix, matvec_rows};
use lcut_kernels::testdata::{Rng, bench_blocks};

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let rows = args.first().copied().unwrap_or(4096);
    let cols = args.get(1).copied().unwrap_or(2048);
    let runs = args.get(2).copied().unwrap_or(200);
    let only = std::env::var("FORMAT").ok();
    let mut rng = Rng::new(1);
    let x = rng.normals(8 * cols, 1.0);
    println!("{rows} x {cols}, fastest of {runs} runs, one thread");
    println!(
        "{:<6} {:<8} {:>6} {:>12} {:>12}",
        "format", "isa", "batch", "rows GB/s", "packed GB/s"
    );
    for format in [
        QuantFormat::Q4_0,
        QuantFormat::Q4_1,
        QuantFormat::Q5_0,
        QuantFormat::Q8_0,
        QuantFormat::Q4K,
        QuantFormat::Q5K,
        QuantFormat::Q6K,
        QuantFormat::Mxfp4,
    ] {
        if only.as_deref().is_some_and(|f| f != format.name()) {
            continue;
        }
        let data = bench_blocks(format, rows * cols / format.block_len(), &mut rng);
        let m = QuantMatrix::new(format, &data, rows, cols).expect("whole blocks");
        let packed = PackedMatrix::pack(&m, |r| r).expect("packs");
        for isa in ALL
            .into_iter()
            .filter(|i| i.enabled() && *i != Isa::Portable)
        {
            for n in [1, 4] {
                let mut acts = Q8Rows::new();
                acts.quantize(&x[..n * cols], n, cols)
                    .expect("whole blocks");
                let mut out = vec![0f32; rows * n];
                let mut best = |view: &QuantMatrix<'_>| {
                    let mut t = f64::INFINITY;
                    for _ in 0..runs {
                        let start = Instant::now();
                        matvec_rows(isa, view, &acts, 0..rows, &mut out).expect("shapes");
                        t = t.min(start.elapsed().as_secs_f64());
                    }
                    m.bytes() as f64 / t / 1e9
                };
                let (a, b) = (best(&m), best(&packed.view()));
                println!(
                    "{:<6} {:<8} {:>6} {:>12.1} {:>12.1}",
                    format.name(),
                    isa.name(),
                    n,
                    a,
                    b
                );
            }
        }
    }
}
