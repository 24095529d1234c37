//! How fast one thread runs a prefill chunk's quantized product (every
//! activation row against every weight row, `quant::matmul`, or
//! `quant::matmul_wide` for Q8_0 where it runs) on each instruction-set
//! level this CPU runs, per format: the fastest of a few runs, as GMAC/s
//! (multiply-adds per second), and which path ran (the tile micro-kernel,
//! Q8_0's tile on 16-bit activations, or the batched dot products).
//!
//!     cargo run --release -p lcut-kernels --example chunk_throughput [ROWS COLS N RUNS]
//!
//! Defaults: 2048 x 2048 weights (a 1B model's attention output), 512
//! activation rows (a prefill chunk), 3 runs. `FORMAT=Q4_K` runs one format,
//! `ISA=avx512` one level, `PACKED=1` the interleaved copy a model's
//! product reads (`PackedMatrix`) instead of the file's rows.

use std::time::Instant;

use lcut_kernels::isa::ALL;
use lcut_kernels::quant::{
    PackedMatrix, Q8Rows, Q16Rows, QuantMatrix, has_tiled_path, matmul, matmul_wide,
    takes_wide_activations,
};
use lcut_kernels::testdata::{Rng, bench_blocks};

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let rows = args.first().copied().unwrap_or(2048);
    let cols = args.get(1).copied().unwrap_or(2048);
    let n = args.get(2).copied().unwrap_or(512);
    let runs = args.get(3).copied().unwrap_or(3);
    let only = std::env::var("FORMAT").ok();
    let only_isa = std::env::var("ISA").ok();
    let packed = std::env::var("PACKED").is_ok_and(|p| p == "1");
    let mut rng = Rng::new(1);
    let x = rng.normals(n * cols, 1.0);
    let mut acts = Q8Rows::new();
    acts.quantize(&x, n, cols).expect("whole blocks");
    let mut wide = Q16Rows::new();
    wide.quantize(&x, n, cols).expect("whole blocks");
    let layout = if packed { "interleaved" } else { "file rows" };
    println!(
        "{rows} x {cols} weights ({layout}), {n} activation rows, fastest of {runs} runs, one thread"
    );
    println!("{:<6} {:<8} {:<8} {:>8}", "format", "isa", "path", "GMAC/s");
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("a pool of one thread");
    for format in lcut_kernels::quant::FORMATS {
        if only.as_deref().is_some_and(|f| f != format.name()) {
            continue;
        }
        let data = bench_blocks(format, rows * cols / format.block_len(), &mut rng);
        let file = QuantMatrix::new(format, &data, rows, cols).expect("whole blocks");
        let copy = packed.then(|| PackedMatrix::pack(&file, |r| r).expect("packs"));
        let m = copy.as_ref().map_or(file, PackedMatrix::view);
        let mut out = vec![0f32; n * rows];
        let mut scratch = Vec::new();
        for isa in ALL
            .into_iter()
            .filter(|i| i.enabled() && only_isa.as_deref().is_none_or(|o| o == i.name()))
        {
            let is_wide = takes_wide_activations(isa, format);
            let best = (0..runs)
                .map(|_| {
                    let t = Instant::now();
                    pool.install(|| {
                        if is_wide {
                            matmul_wide(isa, &m, &wide, &mut out, &mut scratch)
                        } else {
                            matmul(isa, &m, &acts, &mut out, &mut scratch)
                        }
                    })
                    .expect("shapes");
                    t.elapsed().as_secs_f64()
                })
                .fold(f64::INFINITY, f64::min);
            let path = match (is_wide, has_tiled_path(isa, format)) {
                (true, _) => "tile16",
                (false, true) => "tile",
                (false, false) => "batched",
            };
            let gmac = (rows * cols * n) as f64 / best / 1e9;
            println!(
                "{:<6} {:<8} {:<8} {:>8.1}",
                format.name(),
                isa.name(),
                path,
                gmac
            );
        }
    }
}
