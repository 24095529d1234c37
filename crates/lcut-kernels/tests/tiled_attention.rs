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
use lcut_kernels::testdata::Visibility::{Anchors, Causal, Window};
use lcut_kernels::testdata::{AttentionCase, Rng};

/// Runs `c` with inputs of `storage` in `splits` parts; returns the largest
/// output difference over the largest |value| and the largest log-sum-exp
/// difference.
fn run(c: &AttentionCase, storage: Storage16, splits: usize, seed: u64) -> (f64, f64) {
    let (n, hd) = (c.queries, c.head_dim);
    let mut rng = Rng::new(seed);
    let round = |x: Vec<f32>| -> Vec<f32> { x.into_iter().map(|x| storage.round(x)).collect() };
    let q = round(rng.normals(c.heads * n * hd, 1.0));
    let k = round(rng.normals(c.kv_heads * c.keys * hd, 1.0));
    let v = round(rng.normals(c.kv_heads * c.keys * hd, 1.0));
    let sinks: Vec<f32> = (0..c.heads).map(|_| rng.uniform(-1.0, 2.0)).collect();
    let spec = AttentionSpec {
        heads: c.heads,
        scale: 1.0 / (hd as f32).sqrt(),
        softcap: c.softcap,
        sinks: c.sinks.then_some(&sinks[..]),
    };
    let reads = encode_reads(&c.query_spans()).expect("key indices fit u32");
    let shape = TiledShape {
        n,
        keys: c.keys,
        kv_heads: c.kv_heads,
        head_dim: hd,
        splits,
    };
    let mut out = vec![0f32; c.heads * n * hd];
    let mut lse = vec![0f32; c.heads * n];
    attend_tiled(
        &spec, storage, shape, &q, &k, &v, &reads, &mut out, &mut lse,
    )
    .expect("shapes agree");
    let (want, want_lse) = c.reference(&spec, (&q, &k, &v), c.keys);
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

#[test]
fn tiled_attention_is_the_softmax_over_each_querys_keys() {
    let (bf16, f16) = (Storage16::Bf16, Storage16::F16);
    let mut cases = Vec::new();
    for kind in [Causal, Window(70), Anchors] {
        for heads in [(4, 1), (6, 2), (2, 2)] {
            cases.push((AttentionCase::new(kind, heads, 32, 37, 150), bf16));
        }
    }
    for &hd in &HEAD_DIMS {
        cases.push((AttentionCase::new(Causal, (4, 2), hd, 70, 70), f16));
    }
    let capped = AttentionCase {
        softcap: Some(5.0),
        ..AttentionCase::new(Causal, (4, 2), 64, 20, 90)
    };
    let with_sinks = AttentionCase {
        sinks: true,
        ..AttentionCase::new(Window(70), (4, 2), 64, 33, 200)
    };
    // a decode step: one query over a long cache
    let decode = AttentionCase {
        sinks: true,
        ..AttentionCase::new(Causal, (8, 2), 128, 1, 1000)
    };
    cases.extend([
        (capped, bf16),
        (with_sinks, bf16),
        (decode, bf16),
        (AttentionCase::new(Anchors, (8, 2), 128, 1, 1000), f16),
    ]);
    for (at, (c, storage)) in cases.iter().enumerate() {
        for splits in [1, 3] {
            let (dout, dlse) = run(c, *storage, splits, 7 + at as u64);
            let what = format!("{c:?} {storage:?} splits {splits}");
            assert!(
                dout <= storage.unit(),
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
