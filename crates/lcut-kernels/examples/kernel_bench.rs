//! What the decode kernels achieve against the machine's memory read
//! bandwidth, on SmolLM2-135M's shapes (30 layers; hidden 576, MLP 1536,
//! 9 query and 3 K/V heads of 64; tied Q8_0 LM head over 49,152 tokens):
//!
//! - the quantized products of one decode step over Q4_1 matrices of those
//!   shapes (random blocks, ~96 MB, far beyond the caches), per level and
//!   thread count, as ms per token and GB/s;
//! - attention of one token over a 4,096-token cache in f16 and f32 at
//!   every layer, with and without the probabilities a probe reads;
//! - dense f32 and bf16 products over eight layers' matrices;
//!
//! beside the 1- and 2-thread read bandwidth. Medians over interleaved
//! rounds; the machine's load is printed, and the CPU time the process used
//! beside the wall time, since a shared machine's wall times are noisy.
//!
//! `cargo run --release -p lcut-kernels --example kernel_bench [-- ROUNDS [quant|attention|dense]]`

use std::time::Instant;

use half::{bf16, f16};
use lcut_kernels::attention::{AttentionScratch, AttentionSpec, KvCache, KvData, KvLayout, attend};
use lcut_kernels::bandwidth::{DEFAULT_BYTES, measure_read};
use lcut_kernels::dense::{self, DenseMatrix, DenseWeights};
use lcut_kernels::isa::{ALL, Isa};
use lcut_kernels::quant::{self, Q8Rows, QuantFormat, QuantMatrix};
use lcut_kernels::testdata::{Rng, random_blocks};

const LAYERS: usize = 30;
const HIDDEN: usize = 576;
const MLP: usize = 1536;
const VOCAB: usize = 49152;
const HEADS: usize = 9;
const KV_HEADS: usize = 3;
const HEAD_DIM: usize = 64;
const CONTEXT: usize = 4096;

/// (rows, cols) of one layer's matrices: q, k, v, o, gate, up, down.
const SHAPES: [(usize, usize); 7] = [
    (HEADS * HEAD_DIM, HIDDEN),
    (KV_HEADS * HEAD_DIM, HIDDEN),
    (KV_HEADS * HEAD_DIM, HIDDEN),
    (HIDDEN, HEADS * HEAD_DIM),
    (MLP, HIDDEN),
    (MLP, HIDDEN),
    (HIDDEN, MLP),
];

/// The (wall, CPU) pair of the median wall time.
fn median(mut xs: Vec<(f64, f64)>) -> (f64, f64) {
    xs.sort_by(|a, b| a.0.total_cmp(&b.0));
    xs[xs.len() / 2]
}

fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a thread pool")
}

/// CPU time of every thread of this process so far, in seconds (Linux's
/// per-thread scheduler statistics; 0 elsewhere).
fn cpu_seconds() -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    let ns: u64 = tasks
        .filter_map(|t| t.ok())
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    ns as f64 / 1e9
}

/// Wall and CPU seconds of one call of `f`: the best of a few warm calls.
fn seconds(mut f: impl FnMut()) -> (f64, f64) {
    f();
    (0..3)
        .map(|_| {
            let (t, c) = (Instant::now(), cpu_seconds());
            f();
            (t.elapsed().as_secs_f64(), cpu_seconds() - c)
        })
        .fold(
            (f64::INFINITY, 0.0),
            |best, x| if x.0 < best.0 { x } else { best },
        )
}

/// One decode step's weights: every layer's matrices and the LM head.
struct Model {
    layers: Vec<Vec<(Vec<u8>, usize, usize)>>,
    head: Vec<u8>,
}

impl Model {
    fn random(rng: &mut Rng, format: QuantFormat) -> Self {
        let layers = (0..LAYERS)
            .map(|_| {
                SHAPES
                    .iter()
                    .map(|&(r, c)| (random_blocks(format, r * c / 32, rng), r, c))
                    .collect()
            })
            .collect();
        let head = random_blocks(QuantFormat::Q8_0, VOCAB * HIDDEN / 32, rng);
        Self { layers, head }
    }

    fn bytes(&self) -> usize {
        let layers: usize = self.layers.iter().flatten().map(|m| m.0.len()).sum();
        layers + self.head.len()
    }

    /// Every product of one token, each with its input quantized.
    fn step(&self, isa: Isa, format: QuantFormat, acts: &mut Q8Rows, out: &mut [f32]) {
        let x: Vec<f32> = (0..MLP).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
        let mut scratch = Vec::new();
        for layer in &self.layers {
            for (data, r, c) in layer {
                let m = QuantMatrix::new(format, data, *r, *c).expect("shape");
                acts.quantize(&x[..*c], 1, *c).expect("whole blocks");
                quant::matvec(isa, &m, acts, &mut out[..*r], &mut scratch).expect("shape");
            }
        }
        let head = QuantMatrix::new(QuantFormat::Q8_0, &self.head, VOCAB, HIDDEN).expect("shape");
        acts.quantize(&x[..HIDDEN], 1, HIDDEN)
            .expect("whole blocks");
        quant::matvec(isa, &head, acts, &mut out[..VOCAB], &mut scratch).expect("shape");
    }
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(5);
    let mut levels: Vec<Isa> = ALL.into_iter().filter(|i| i.available()).collect();
    let names: Vec<&str> = levels.iter().map(|i| i.name()).collect();
    println!(
        "levels this CPU runs: {} (chosen: {})",
        names.join(", "),
        Isa::detect().name()
    );
    if levels.len() > 1 {
        // the reference path is there for correctness, not speed
        levels.retain(|&i| i != Isa::Portable);
    }
    println!(
        "load: {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    let bw: Vec<f64> = [1, 2]
        .iter()
        .map(|&t| measure_read(DEFAULT_BYTES, t, 5).gb_per_s)
        .collect();
    println!(
        "read bandwidth ({} MiB, best of 5): 1 thread {:.1} GB/s, 2 threads {:.1} GB/s",
        DEFAULT_BYTES >> 20,
        bw[0],
        bw[1]
    );
    let only = std::env::args().nth(2).unwrap_or_default();
    let mut rng = Rng::new(7);
    if only.is_empty() || only == "quant" {
        quantized_step(&mut rng, &levels, &bw, rounds);
    }
    if only.is_empty() || only == "attention" {
        attention(&mut rng, &levels, &bw, rounds);
    }
    if only.is_empty() || only == "dense" {
        dense_products(&mut rng, &levels, &bw, rounds);
    }
}

fn quantized_step(rng: &mut Rng, levels: &[Isa], bw: &[f64], rounds: usize) {
    let model = Model::random(rng, QuantFormat::Q4_1);
    let mb = model.bytes() as f64 / 1e6;
    println!(
        "\nquantized products of one decode step: {LAYERS} layers of Q4_1 + Q8_0 LM head, {mb:.1} MB"
    );
    println!("level     threads  ms/token  cpu ms   GB/s  of read bandwidth");
    let mut acts = Q8Rows::new();
    let mut out = vec![0f32; VOCAB];
    for threads in [1, 2] {
        let pool = pool(threads);
        let mut times: Vec<Vec<(f64, f64)>> = vec![Vec::new(); levels.len()];
        for _ in 0..rounds {
            for (i, &isa) in levels.iter().enumerate() {
                let s = pool.install(|| {
                    seconds(|| model.step(isa, QuantFormat::Q4_1, &mut acts, &mut out))
                });
                times[i].push(s);
            }
        }
        for (i, isa) in levels.iter().enumerate() {
            let (s, cpu) = median(times[i].clone());
            let gbs = mb / 1e3 / s;
            println!(
                "{:<9} {threads:>7} {:>9.2} {:>7.2} {gbs:>6.1} {:>8.0}%",
                isa.name(),
                s * 1e3,
                cpu * 1e3,
                100.0 * gbs / bw[threads - 1]
            );
        }
    }
}

/// One layer's cache in a storage type.
fn caches<T: Copy>(rng: &mut Rng, conv: fn(f32) -> T) -> Vec<(Vec<T>, Vec<T>)> {
    let n = KV_HEADS * CONTEXT * HEAD_DIM;
    (0..LAYERS)
        .map(|_| {
            let k = rng.normals(n, 1.0).into_iter().map(conv).collect();
            let v = rng.normals(n, 1.0).into_iter().map(conv).collect();
            (k, v)
        })
        .collect()
}

fn attention(rng: &mut Rng, levels: &[Isa], bw: &[f64], rounds: usize) {
    let f16s = caches(rng, f16::from_f32);
    let f32s = caches(rng, |v| v);
    let q = rng.normals(HEADS * HEAD_DIM, 1.0);
    let spec = AttentionSpec {
        heads: HEADS,
        scale: 1.0 / (HEAD_DIM as f32).sqrt(),
        softcap: None,
        sinks: None,
    };
    let layout = KvLayout::head_major(KV_HEADS, HEAD_DIM, CONTEXT, CONTEXT);
    let rows = std::slice::from_ref(&(0..CONTEXT));
    println!(
        "\nattention of one token over a {CONTEXT}-token cache at each of {LAYERS} layers ({HEADS} heads, {KV_HEADS} K/V heads x {HEAD_DIM})"
    );
    println!("cache  probs  level     threads  ms/token  cpu ms   GB/s  of read bandwidth");
    let mut out = vec![0f32; HEADS * HEAD_DIM];
    let mut probs = vec![0f32; HEADS * CONTEXT];
    let mut scratch = AttentionScratch::default();
    let f16c: Vec<KvCache<'_>> = f16s
        .iter()
        .map(|(k, v)| KvCache::new(KvData::F16(k), KvData::F16(v), layout).expect("fits"))
        .collect();
    let f32c: Vec<KvCache<'_>> = f32s
        .iter()
        .map(|(k, v)| KvCache::new(KvData::F32(k), KvData::F32(v), layout).expect("fits"))
        .collect();
    let cases = [("f16", &f16c, 2usize), ("f32", &f32c, 4)];
    for (name, layers, elem) in cases {
        let mb = (LAYERS * 2 * KV_HEADS * CONTEXT * HEAD_DIM * elem) as f64 / 1e6;
        for with_probs in [false, true] {
            for threads in [1, 2] {
                let pool = pool(threads);
                for &isa in levels {
                    let times: Vec<(f64, f64)> = (0..rounds)
                        .map(|_| {
                            pool.install(|| {
                                seconds(|| {
                                    for c in layers {
                                        let p = with_probs.then_some(&mut probs[..]);
                                        attend(
                                            isa,
                                            &spec,
                                            &q,
                                            c,
                                            rows,
                                            None,
                                            &mut out,
                                            p,
                                            &mut scratch,
                                        )
                                        .expect("shapes");
                                    }
                                })
                            })
                        })
                        .collect();
                    let (s, cpu) = median(times);
                    let gbs = mb / 1e3 / s;
                    println!(
                        "{name:<6} {:<6} {:<9} {threads:>7} {:>9.2} {:>7.2} {gbs:>6.1} {:>8.0}%",
                        if with_probs { "yes" } else { "no" },
                        isa.name(),
                        s * 1e3,
                        cpu * 1e3,
                        100.0 * gbs / bw[threads - 1]
                    );
                }
            }
        }
    }
}

fn dense_products(rng: &mut Rng, levels: &[Isa], bw: &[f64], rounds: usize) {
    const DENSE_LAYERS: usize = 8;
    let mats: Vec<(Vec<f32>, usize, usize)> = (0..DENSE_LAYERS)
        .flat_map(|_| SHAPES.iter().map(|&(r, c)| (r, c)).collect::<Vec<_>>())
        .map(|(r, c)| (rng.normals(r * c, 0.05), r, c))
        .collect();
    let bf: Vec<Vec<bf16>> = mats
        .iter()
        .map(|m| m.0.iter().map(|&v| bf16::from_f32(v)).collect())
        .collect();
    let x = rng.normals(MLP, 1.0);
    let mut out = vec![0f32; MLP];
    let params: usize = mats.iter().map(|m| m.1 * m.2).sum();
    println!("\ndense products over {DENSE_LAYERS} layers' matrices ({params} values)");
    println!("dtype  level     threads  ms/pass  cpu ms   GB/s  of read bandwidth");
    for (dtype, elem) in [("f32", 4usize), ("bf16", 2)] {
        let mb = (params * elem) as f64 / 1e6;
        for threads in [1, 2] {
            let pool = pool(threads);
            for &isa in levels {
                let times: Vec<(f64, f64)> = (0..rounds)
                    .map(|_| {
                        pool.install(|| {
                            seconds(|| {
                                let mut scratch = Vec::new();
                                for (i, (w, r, c)) in mats.iter().enumerate() {
                                    let data = if dtype == "f32" {
                                        DenseWeights::F32(w)
                                    } else {
                                        DenseWeights::Bf16(&bf[i])
                                    };
                                    let m = DenseMatrix::new(data, *r, *c).expect("shape");
                                    dense::matvec(
                                        isa,
                                        &m,
                                        &x[..*c],
                                        1,
                                        &mut out[..*r],
                                        &mut scratch,
                                    )
                                    .expect("shape");
                                }
                            })
                        })
                    })
                    .collect();
                let (s, cpu) = median(times);
                let gbs = mb / 1e3 / s;
                println!(
                    "{dtype:<6} {:<9} {threads:>7} {:>8.2} {:>7.2} {gbs:>6.1} {:>8.0}%",
                    isa.name(),
                    s * 1e3,
                    cpu * 1e3,
                    100.0 * gbs / bw[threads - 1]
                );
            }
        }
    }
}
