//! The CPU twin of lcut's fused CUDA attention (`attention::tiled`): its
//! row tiles, key-tile skipping, online softmax with probabilities rounded
//! to bf16 or f16, key splits and their merge give the attention of a
//! straightforward f64 softmax over each query's own keys (outputs and
//! log-sum-exp), for causal chunks over a cache, sliding windows, a policy's
//! anchors with gaps, grouped heads, the soft cap and sinks, every head dim
//! the kernel is built for, and rows and keys that fill no whole tile.

use lcut_kernels::attention::tiled::{
    HEAD_DIMS, ROW_TILE, Storage16, TiledShape, attend_tiled, encode_reads, key_splits, key_tile,
    shared_bytes,
};
use lcut_kernels::attention::{AttentionSpec, QuerySpans};
use lcut_kernels::testdata::Rng;
use lcut_kernels::testdata::Visibility::{self, Anchors, Causal, Window};

struct Case {
    kind: Visibility,
    heads: usize,
    kv_heads: usize,
    hd: usize,
    n: usize,
    keys: usize,
    softcap: Option<f32>,
    sinks: bool,
    storage: Storage16,
}

/// Output [heads, n, hd] and log-sum-exp [heads, n] in f64.
fn reference(
    c: &Case,
    spec: &AttentionSpec<'_>,
    q: &[f32],
    k: &[f32],
    v: &[f32],
) -> (Vec<f64>, Vec<f64>) {
    let (group, start) = (c.heads / c.kv_heads, c.keys - c.n);
    let mut out = vec![0.0; c.heads * c.n * c.hd];
    let mut lse = vec![0.0; c.heads * c.n];
    for h in 0..c.heads {
        let g = h / group;
        for i in 0..c.n {
            let qh = &q[(h * c.n + i) * c.hd..(h * c.n + i + 1) * c.hd];
            let rows: Vec<usize> = c.kind.spans(start + i).into_iter().flatten().collect();
            let scores: Vec<f64> = rows
                .iter()
                .map(|&t| {
                    let kr = &k[(g * c.keys + t) * c.hd..(g * c.keys + t + 1) * c.hd];
                    let s = f64::from(spec.scale)
                        * qh.iter()
                            .zip(kr)
                            .map(|(a, b)| f64::from(*a) * f64::from(*b))
                            .sum::<f64>();
                    c.softcap
                        .map_or(s, |cap| f64::from(cap) * (s / f64::from(cap)).tanh())
                })
                .collect();
            let sink = spec.sinks.map(|s| f64::from(s[h]));
            let m = scores
                .iter()
                .copied()
                .chain(sink)
                .fold(f64::NEG_INFINITY, f64::max);
            let total: f64 = scores
                .iter()
                .chain(sink.as_ref())
                .map(|s| (s - m).exp())
                .sum();
            lse[h * c.n + i] = m + total.ln();
            for (&t, s) in rows.iter().zip(&scores) {
                let p = (s - m).exp() / total;
                let vr = &v[(g * c.keys + t) * c.hd..(g * c.keys + t + 1) * c.hd];
                for (o, x) in out[(h * c.n + i) * c.hd..].iter_mut().zip(vr) {
                    *o += p * f64::from(*x);
                }
            }
        }
    }
    (out, lse)
}

/// Runs `c` in `splits` parts; returns the largest output difference over
/// the largest |value| and the largest log-sum-exp difference.
fn run(c: &Case, splits: usize, seed: u64) -> (f64, f64) {
    let mut rng = Rng::new(seed);
    let round = |x: Vec<f32>| -> Vec<f32> { x.into_iter().map(|x| c.storage.round(x)).collect() };
    let q = round(rng.normals(c.heads * c.n * c.hd, 1.0));
    let k = round(rng.normals(c.kv_heads * c.keys * c.hd, 1.0));
    let v = round(rng.normals(c.kv_heads * c.keys * c.hd, 1.0));
    let sinks: Vec<f32> = (0..c.heads).map(|_| rng.uniform(-1.0, 2.0)).collect();
    let spec = AttentionSpec {
        heads: c.heads,
        scale: 1.0 / (c.hd as f32).sqrt(),
        softcap: c.softcap,
        sinks: c.sinks.then_some(&sinks[..]),
    };
    let mut spans = QuerySpans::new();
    for i in 0..c.n {
        spans.push_query(c.kind.spans(c.keys - c.n + i));
    }
    let reads = encode_reads(&spans).expect("key indices fit u32");
    let shape = TiledShape {
        n: c.n,
        keys: c.keys,
        kv_heads: c.kv_heads,
        head_dim: c.hd,
        splits,
    };
    let mut out = vec![0f32; c.heads * c.n * c.hd];
    let mut lse = vec![0f32; c.heads * c.n];
    attend_tiled(
        &spec, c.storage, shape, &q, &k, &v, &reads, &mut out, &mut lse,
    )
    .expect("shapes agree");
    let (want, want_lse) = reference(c, &spec, &q, &k, &v);
    let vmax = v.iter().fold(0f32, |a, x| a.max(x.abs())) as f64;
    let dout = out
        .iter()
        .zip(&want)
        .map(|(a, b)| (f64::from(*a) - b).abs())
        .fold(0.0, f64::max);
    let dlse = lse
        .iter()
        .zip(&want_lse)
        .map(|(a, b)| (f64::from(*a) - b).abs())
        .fold(0.0, f64::max);
    (dout / vmax, dlse)
}

/// The twin's error, relative to the largest value: one unit of the
/// storage type's rounding (2^-8 for bf16, 2^-11 for f16), which the
/// probabilities and the output are rounded to (measured: 8.2e-4 and 2.9e-4).
fn bound(storage: Storage16) -> f64 {
    match storage {
        Storage16::Bf16 => 1.0 / 256.0,
        Storage16::F16 => 1.0 / 2048.0,
    }
}

#[test]
fn tiled_attention_is_the_softmax_over_each_querys_keys() {
    let mut cases = Vec::new();
    for kind in [Causal, Window(70), Anchors] {
        for (heads, kv_heads) in [(4, 1), (6, 2), (2, 2)] {
            cases.push(Case {
                kind,
                heads,
                kv_heads,
                hd: 32,
                n: 37,
                keys: 150,
                softcap: None,
                sinks: false,
                storage: Storage16::Bf16,
            });
        }
    }
    for &hd in &HEAD_DIMS {
        cases.push(Case {
            kind: Causal,
            heads: 4,
            kv_heads: 2,
            hd,
            n: 70,
            keys: 70,
            softcap: None,
            sinks: false,
            storage: Storage16::F16,
        });
    }
    cases.push(Case {
        kind: Causal,
        heads: 4,
        kv_heads: 2,
        hd: 64,
        n: 20,
        keys: 90,
        softcap: Some(5.0),
        sinks: false,
        storage: Storage16::Bf16,
    });
    cases.push(Case {
        kind: Window(70),
        heads: 4,
        kv_heads: 2,
        hd: 64,
        n: 33,
        keys: 200,
        softcap: None,
        sinks: true,
        storage: Storage16::Bf16,
    });
    // a decode step: one query over a long cache
    cases.push(Case {
        kind: Causal,
        heads: 8,
        kv_heads: 2,
        hd: 128,
        n: 1,
        keys: 1000,
        softcap: None,
        sinks: true,
        storage: Storage16::Bf16,
    });
    cases.push(Case {
        kind: Anchors,
        heads: 8,
        kv_heads: 2,
        hd: 128,
        n: 1,
        keys: 1000,
        softcap: None,
        sinks: false,
        storage: Storage16::F16,
    });
    for (at, c) in cases.iter().enumerate() {
        for splits in [1, 3] {
            let (dout, dlse) = run(c, splits, 7 + at as u64);
            let what = format!(
                "{:?} heads {}/{} hd {} n {} keys {} cap {:?} sinks {} {:?} splits {splits}",
                c.kind, c.heads, c.kv_heads, c.hd, c.n, c.keys, c.softcap, c.sinks, c.storage
            );
            assert!(
                dout <= bound(c.storage),
                "{what}: output off by {dout:.2e} of the largest value"
            );
            assert!(dlse <= 1e-5, "{what}: log-sum-exp off by {dlse:.2e}");
        }
    }
}

#[test]
fn the_plan_fits_the_gpu_and_splits_only_what_is_too_few() {
    for &hd in &HEAD_DIMS {
        // within an H100's 227 KiB a block may take
        assert!(
            shared_bytes(hd) <= 227 * 1024,
            "head dim {hd}: {} bytes",
            shared_bytes(hd)
        );
        assert_eq!(key_tile(hd) % 16, 0);
    }
    assert_eq!(ROW_TILE % 16, 0);
    // a prefill chunk of 2048 queries over 8 K/V heads fills 132 processors
    assert_eq!(key_splits(2048 * 4 / ROW_TILE * 8, 32768, 128, 132), 1);
    // a decode step (8 blocks) over 32K keys is split, into parts of at least four tiles
    let s = key_splits(8, 32768, 128, 132);
    assert_eq!(s, 33);
    assert_eq!(key_splits(8, 200, 128, 132), 1);
    // the reads' encoding: offsets, then (start, end) pairs
    let mut spans = QuerySpans::new();
    spans.push_query([0..1, 5..9]);
    spans.push_query(std::iter::once(0..10));
    assert_eq!(
        encode_reads(&spans).unwrap(),
        vec![0, 2, 3, 0, 1, 5, 9, 0, 10]
    );
}
