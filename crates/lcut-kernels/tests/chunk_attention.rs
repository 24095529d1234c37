//! Attention of a prefill chunk's query rows: every path the CPU has
//! against a straightforward f64 softmax over each query's own rows (a path
//! this machine does not run is named on standard error), and against the one-query kernel
//! over the same rows, for causal rows, a sliding window, rows with gaps (a
//! policy's anchors and the query itself), grouped-query heads, the soft-cap,
//! more queries than one tile and more rows than one block, in the three
//! cache storage types.

// a list of one range of cache rows is a list of rows to read, not a range
#![allow(clippy::single_range_in_vec_init)]

use std::ops::Range;

use half::{bf16, f16};
use lcut_kernels::Element;
use lcut_kernels::attention::{
    AttentionScratch, AttentionSpec, KvCache, KvData, KvLayout, QUERY_TILE, QuerySpans, attend,
    attend_chunk,
};
use lcut_kernels::isa::{ALL, Isa};
use lcut_kernels::testdata::{IsaChecks, Rng};

const HEADS: usize = 6;
const KV_HEADS: usize = 2;
const HD: usize = 32;

/// Which rows query i of a chunk starting at cache row `start` reads.
fn spans_of(kind: &str, start: usize, i: usize) -> Vec<Range<usize>> {
    let pos = start + i;
    match kind {
        "causal" => vec![0..pos + 1],
        "window" => vec![(pos + 1).saturating_sub(70)..pos + 1],
        // two anchors, the query itself and every third block of 8 before it
        _ => {
            let mut v = vec![0..2];
            let mut r = 8;
            while r + 8 <= pos {
                v.push(r..r + 8);
                r += 24;
            }
            if pos >= 2 && v.last().is_none_or(|l| l.end <= pos) {
                v.push(pos..pos + 1);
            }
            v
        }
    }
}

/// Output of query `qi` in f64 from the stored values.
#[allow(clippy::too_many_arguments)]
fn reference(
    q: &[f32],
    n: usize,
    qi: usize,
    k: &[f32],
    v: &[f32],
    lay: &KvLayout,
    spans: &[Range<usize>],
    softcap: Option<f32>,
) -> Vec<f64> {
    let group = HEADS / KV_HEADS;
    let mut out = vec![0.0; HEADS * HD];
    for h in 0..HEADS {
        let g = h / group;
        let qh = &q[(h * n + qi) * HD..(h * n + qi + 1) * HD];
        let rows: Vec<usize> = spans.iter().flat_map(|r| r.clone()).collect();
        let scale = 1.0 / (HD as f64).sqrt();
        let scores: Vec<f64> = rows
            .iter()
            .map(|&t| {
                let at = g * lay.head_stride + t * lay.row_stride;
                let s = scale
                    * qh.iter()
                        .zip(&k[at..at + HD])
                        .map(|(a, b)| f64::from(*a) * f64::from(*b))
                        .sum::<f64>();
                softcap.map_or(s, |c| f64::from(c) * (s / f64::from(c)).tanh())
            })
            .collect();
        let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
        let total: f64 = e.iter().sum();
        for (&t, p) in rows.iter().zip(&e) {
            let at = g * lay.head_stride + t * lay.row_stride;
            for d in 0..HD {
                out[h * HD + d] += p / total * f64::from(v[at + d]);
            }
        }
    }
    out
}

/// The cache stored as `T`, and its values back in f32.
fn stored<T: Element>(x: &[f32]) -> (Vec<T>, Vec<f32>) {
    let s: Vec<T> = x.iter().map(|&v| T::from_f32(v)).collect();
    let back = s.iter().map(|v| v.to_f32()).collect();
    (s, back)
}

#[allow(clippy::too_many_arguments)]
fn check<T: Element>(
    wrap: fn(&[T]) -> KvData<'_>,
    rng: &mut Rng,
    kind: &str,
    (start, n): (usize, usize),
    softcap: Option<f32>,
    checks: &mut IsaChecks,
) {
    let len = start + n;
    let lay = KvLayout::head_major(KV_HEADS, HD, len + 3, len);
    let size = KV_HEADS * (len + 3) * HD;
    let mut kf = rng.normals(size, 1.0);
    for i in (0..size).step_by(89) {
        kf[i] *= 6.0;
    }
    let (k, kf) = stored::<T>(&kf);
    let (v, vf) = stored::<T>(&rng.normals(size, 1.0));
    let q = rng.normals(HEADS * n * HD, 1.0);
    let cache = KvCache::new(wrap(k.as_slice()), wrap(v.as_slice()), lay).expect("fits");
    let spec = AttentionSpec {
        heads: HEADS,
        scale: 1.0 / (HD as f32).sqrt(),
        softcap,
        sinks: None,
    };
    let mut spans = QuerySpans::new();
    for i in 0..n {
        spans.push_query(spans_of(kind, start, i));
    }
    for isa in ALL {
        if !checks.runs(isa) {
            continue;
        }
        let mut out = vec![f32::NAN; HEADS * n * HD];
        attend_chunk(isa, &spec, &q, &cache, &spans, &mut out).expect("shapes");
        let mut scratch = AttentionScratch::default();
        for qi in 0..n {
            let want = reference(&q, n, qi, &kf, &vf, &lay, spans.of(qi), softcap);
            let qrow = query_row(&q, n, qi);
            let mut one = vec![0f32; HEADS * HD];
            let rows = spans.of(qi);
            attend(
                isa,
                &spec,
                &qrow,
                &cache,
                rows,
                None,
                &mut one,
                None,
                &mut scratch,
            )
            .expect("shapes");
            for h in 0..HEADS {
                for d in 0..HD {
                    let got = out[(h * n + qi) * HD + d];
                    let w = want[h * HD + d];
                    assert!(
                        (f64::from(got) - w).abs() <= 2e-5,
                        "{} {kind} query {qi} head {h} dim {d}: {got} vs {w}",
                        isa.name()
                    );
                    assert!((got - one[h * HD + d]).abs() <= 2e-5);
                }
            }
        }
    }
}

/// Query `qi` of the chunk's queries `q` [heads, n, head_dim] as one
/// decode query [heads, head_dim].
fn query_row(q: &[f32], n: usize, qi: usize) -> Vec<f32> {
    let mut row = vec![0f32; HEADS * HD];
    for h in 0..HEADS {
        row[h * HD..(h + 1) * HD].copy_from_slice(&q[(h * n + qi) * HD..(h * n + qi + 1) * HD]);
    }
    row
}

fn f32s(x: &[f32]) -> KvData<'_> {
    KvData::F32(x)
}
fn f16s(x: &[f16]) -> KvData<'_> {
    KvData::F16(x)
}
fn bf16s(x: &[bf16]) -> KvData<'_> {
    KvData::Bf16(x)
}

#[test]
fn chunk_queries_read_their_own_rows_as_the_reference_does() {
    let mut checks = IsaChecks::new("chunk_attention::chunk_queries_read_their_own_rows");
    let mut rng = Rng::new(11);
    let n = 2 * QUERY_TILE + 5;
    for kind in ["causal", "window", "gaps"] {
        for (start, softcap) in [(0, None), (150, None), (90, Some(5.0))] {
            check::<f32>(f32s, &mut rng, kind, (start, n), softcap, &mut checks);
        }
    }
    check::<f16>(f16s, &mut rng, "causal", (130, n), None, &mut checks);
    check::<bf16>(bf16s, &mut rng, "gaps", (130, n), Some(5.0), &mut checks);
}

#[test]
fn rows_outside_the_cache_or_a_query_reading_nothing_are_errors() {
    let lay = KvLayout::head_major(KV_HEADS, HD, 4, 4);
    let kv = vec![0f32; KV_HEADS * 4 * HD];
    let cache = KvCache::new(KvData::F32(&kv), KvData::F32(&kv), lay).expect("fits");
    let spec = AttentionSpec {
        heads: HEADS,
        scale: 1.0,
        softcap: None,
        sinks: None,
    };
    let (q, mut out) = (vec![0f32; HEADS * HD], vec![0f32; HEADS * HD]);
    let isa = Isa::detect();
    let mut spans = QuerySpans::new();
    spans.push_query([0..5]);
    assert!(attend_chunk(isa, &spec, &q, &cache, &spans, &mut out).is_err());
    spans.clear();
    spans.push_query([]);
    assert!(attend_chunk(isa, &spec, &q, &cache, &spans, &mut out).is_err());
    spans.clear();
    spans.push_query([2..4, 0..1]);
    assert!(attend_chunk(isa, &spec, &q, &cache, &spans, &mut out).is_err());
    spans.clear();
    spans.push_query([0..4]);
    attend_chunk(isa, &spec, &q, &cache, &spans, &mut out).expect("fits");
    assert!(attend_chunk(isa, &spec, &q, &cache, &spans, &mut out[1..]).is_err());
}

/// gpt-oss's sinks in the chunk kernel: each query's output equals the
/// one-query kernel's with the same sinks (which `tests/attention.rs` holds
/// to an f64 softmax with the sink as one more score), for sinks below,
/// among and far above the scores, and differs from the output without
/// them.
#[test]
fn chunk_queries_give_the_sinks_their_share() {
    let mut checks = IsaChecks::new("chunk_attention::chunk_queries_give_the_sinks_their_share");
    let mut rng = Rng::new(12);
    let (start, n) = (40, QUERY_TILE + 3);
    let len = start + n;
    let lay = KvLayout::head_major(KV_HEADS, HD, len, len);
    let size = KV_HEADS * len * HD;
    let (k, v) = (rng.normals(size, 1.0), rng.normals(size, 1.0));
    let q = rng.normals(HEADS * n * HD, 1.0);
    let cache = KvCache::new(KvData::F32(&k), KvData::F32(&v), lay).expect("fits");
    let mut spans = QuerySpans::new();
    for i in 0..n {
        spans.push_query(spans_of("window", start, i));
    }
    for level in [-20.0f32, 0.5, 30.0] {
        let sinks: Vec<f32> = (0..HEADS).map(|h| level + 0.5 * h as f32).collect();
        let with = AttentionSpec {
            heads: HEADS,
            scale: 1.0 / (HD as f32).sqrt(),
            softcap: None,
            sinks: Some(&sinks),
        };
        let without = AttentionSpec {
            sinks: None,
            ..with
        };
        for isa in ALL {
            if !checks.runs(isa) {
                continue;
            }
            let mut out = vec![f32::NAN; HEADS * n * HD];
            attend_chunk(isa, &with, &q, &cache, &spans, &mut out).expect("shapes");
            let mut plain = vec![f32::NAN; HEADS * n * HD];
            attend_chunk(isa, &without, &q, &cache, &spans, &mut plain).expect("shapes");
            let mut scratch = AttentionScratch::default();
            for qi in 0..n {
                let qrow = query_row(&q, n, qi);
                let mut one = vec![0f32; HEADS * HD];
                let rows = spans.of(qi);
                attend(
                    isa,
                    &with,
                    &qrow,
                    &cache,
                    rows,
                    None,
                    &mut one,
                    None,
                    &mut scratch,
                )
                .expect("shapes");
                for h in 0..HEADS {
                    for d in 0..HD {
                        let got = out[(h * n + qi) * HD + d];
                        assert!(
                            (got - one[h * HD + d]).abs() <= 2e-5,
                            "{} sinks near {level}: query {qi} head {h} dim {d}: {got} vs {}",
                            isa.name(),
                            one[h * HD + d]
                        );
                    }
                }
            }
            let moved = out
                .iter()
                .zip(&plain)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            if level > 0.0 {
                assert!(
                    moved > 1e-3,
                    "{} sinks near {level} changed nothing",
                    isa.name()
                );
            }
        }
    }
}
