//! Decode attention: the portable path against a straightforward f64
//! softmax over the same keys, every SIMD path the CPU has against the
//! portable one (a path this machine does not run is counted and named on standard error), a cache long
//! enough to be split across threads, both cache layouts, the three storage
//! types, gaps between the rows read, the current token and the soft-cap.

// a list of one range of cache rows is a list of rows to read, not a range
#![allow(clippy::single_range_in_vec_init)]

use std::ops::Range;

use half::{bf16, f16};
use lcut_kernels::Element;
use lcut_kernels::attention::{
    AttentionScratch, AttentionSpec, CurrentKv, KvCache, KvData, KvLayout, attend,
};
use lcut_kernels::isa::{ALL, Isa};
use lcut_kernels::testdata::{IsaChecks, Rng};

/// One attention problem: shapes, a query, a cache (f32 values as stored)
/// and the rows read.
struct Case {
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    layout: KvLayout,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    rows: Vec<Range<usize>>,
    current: Option<(Vec<f32>, Vec<f32>)>,
    softcap: Option<f32>,
    /// Each head's sink logit (gpt-oss).
    sinks: Option<Vec<f32>>,
}

impl Case {
    #[allow(clippy::too_many_arguments)]
    fn new(
        rng: &mut Rng,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
        len: usize,
        token_major: bool,
        rows: &[Range<usize>],
        current: bool,
    ) -> Self {
        let capacity = len + 5;
        let layout = if token_major {
            KvLayout {
                kv_heads,
                head_dim,
                head_stride: head_dim,
                row_stride: kv_heads * head_dim,
                len,
            }
        } else {
            KvLayout::head_major(kv_heads, head_dim, capacity, len)
        };
        let size = kv_heads * capacity * head_dim;
        // a few large keys so that the softmax is far from uniform
        let mut k = rng.normals(size, 1.0);
        for i in (0..size).step_by(97) {
            k[i] *= 6.0;
        }
        Self {
            heads,
            kv_heads,
            head_dim,
            layout,
            q: rng.normals(heads * head_dim, 1.0),
            k,
            v: rng.normals(size, 1.0),
            rows: rows.to_vec(),
            current: current.then(|| {
                (
                    rng.normals(kv_heads * head_dim, 1.0),
                    rng.normals(kv_heads * head_dim, 1.0),
                )
            }),
            softcap: None,
            sinks: None,
        }
    }

    fn spec(&self) -> AttentionSpec<'_> {
        AttentionSpec {
            heads: self.heads,
            scale: 1.0 / (self.head_dim as f32).sqrt(),
            softcap: self.softcap,
            sinks: self.sinks.as_deref(),
        }
    }

    fn keys(&self) -> usize {
        self.rows.iter().map(|r| r.len()).sum::<usize>() + usize::from(self.current.is_some())
    }

    /// Output and probabilities in f64 from the f32 values `k`, `v` (the
    /// stored type's values).
    fn reference(&self, k: &[f32], v: &[f32]) -> (Vec<f64>, Vec<f64>) {
        let (hd, group, lay) = (self.head_dim, self.heads / self.kv_heads, self.layout);
        let mut out = vec![0.0; self.heads * hd];
        let mut probs = Vec::new();
        for h in 0..self.heads {
            let g = h / group;
            let qh = &self.q[h * hd..(h + 1) * hd];
            let mut keys: Vec<(&[f32], &[f32])> = Vec::new();
            for r in &self.rows {
                for t in r.clone() {
                    let at = g * lay.head_stride + t * lay.row_stride;
                    keys.push((&k[at..at + hd], &v[at..at + hd]));
                }
            }
            if let Some((ck, cv)) = &self.current {
                keys.push((&ck[g * hd..(g + 1) * hd], &cv[g * hd..(g + 1) * hd]));
            }
            let scale = 1.0 / (hd as f64).sqrt();
            let scores: Vec<f64> = keys
                .iter()
                .map(|(kk, _)| {
                    let s = scale
                        * qh.iter()
                            .zip(*kk)
                            .map(|(a, b)| f64::from(*a) * f64::from(*b))
                            .sum::<f64>();
                    match self.softcap {
                        Some(c) => f64::from(c) * (s / f64::from(c)).tanh(),
                        None => s,
                    }
                })
                .collect();
            // a sink is one more score with no value
            let sink = self.sinks.as_ref().map(|s| f64::from(s[h]));
            let m = scores
                .iter()
                .cloned()
                .chain(sink)
                .fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            let total: f64 = e.iter().sum::<f64>() + sink.map_or(0.0, |s| (s - m).exp());
            for (p, (_, vv)) in e.iter().zip(&keys) {
                for d in 0..hd {
                    out[h * hd + d] += p / total * f64::from(vv[d]);
                }
            }
            probs.extend(e.iter().map(|p| p / total));
        }
        (out, probs)
    }

    /// Run `isa` on the cache stored as `T`.
    fn run<'a, T: Element>(
        &self,
        isa: Isa,
        wrap: fn(&'a [T]) -> KvData<'a>,
        k: &'a [T],
        v: &'a [T],
    ) -> (Vec<f32>, Vec<f32>) {
        let cache = KvCache::new(wrap(k), wrap(v), self.layout).expect("cache fits");
        let mut out = vec![0f32; self.heads * self.head_dim];
        let mut probs = vec![0f32; self.heads * self.keys()];
        let current = self.current.as_ref().map(|(k, v)| CurrentKv { k, v });
        let mut scratch = AttentionScratch::default();
        attend(
            isa,
            &self.spec(),
            &self.q,
            &cache,
            &self.rows,
            current,
            &mut out,
            Some(&mut probs),
            &mut scratch,
        )
        .expect("shapes fit");
        // without the probabilities: the same output
        let mut again = vec![0f32; out.len()];
        attend(
            isa,
            &self.spec(),
            &self.q,
            &cache,
            &self.rows,
            current,
            &mut again,
            None,
            &mut scratch,
        )
        .expect("shapes fit");
        assert_eq!(
            out,
            again,
            "{}: probabilities changed the output",
            isa.name()
        );
        (out, probs)
    }

    /// Every path on every storage type against the reference and the
    /// portable path.
    fn check_all(&self, what: &str, checks: &mut IsaChecks) {
        let conv = |xs: &[f32]| -> (Vec<f16>, Vec<bf16>) {
            (
                xs.iter().map(|&v| f16::from_f32(v)).collect(),
                xs.iter().map(|&v| bf16::from_f32(v)).collect(),
            )
        };
        let ((k16, kb16), (v16, vb16)) = (conv(&self.k), conv(&self.v));
        let widen = |xs: &[f16]| xs.iter().map(|v| v.to_f32()).collect::<Vec<_>>();
        let widen_b = |xs: &[bf16]| xs.iter().map(|v| v.to_f32()).collect::<Vec<_>>();
        let types: Vec<StoredAs<'_>> = vec![
            (
                "f32",
                Box::new(|isa| self.run(isa, KvData::F32, &self.k, &self.v)),
                (self.k.clone(), self.v.clone()),
            ),
            (
                "f16",
                Box::new(|isa| self.run(isa, KvData::F16, &k16, &v16)),
                (widen(&k16), widen(&v16)),
            ),
            (
                "bf16",
                Box::new(|isa| self.run(isa, KvData::Bf16, &kb16, &vb16)),
                (widen_b(&kb16), widen_b(&vb16)),
            ),
        ];
        for (ty, run, (kf, vf)) in &types {
            let (want_out, want_p) = self.reference(kf, vf);
            let (p_out, p_probs) = run(Isa::Portable);
            close(
                &p_out,
                &want_out,
                2e-5,
                &format!("{what} {ty} portable output"),
            );
            close(
                &p_probs,
                &want_p,
                2e-6,
                &format!("{what} {ty} portable probabilities"),
            );
            for isa in ALL.into_iter().filter(|&i| i != Isa::Portable) {
                if !checks.runs(isa) {
                    continue;
                }
                let (o, p) = run(isa);
                let as64 = |x: &[f32]| x.iter().map(|&v| f64::from(v)).collect::<Vec<_>>();
                let name = isa.name();
                close(
                    &o,
                    &as64(&p_out),
                    1e-5,
                    &format!("{what} {ty} {name} output"),
                );
                close(
                    &p,
                    &as64(&p_probs),
                    1e-6,
                    &format!("{what} {ty} {name} probabilities"),
                );
            }
        }
    }
}

/// Runs one storage type of a case on a level: (output, probabilities).
type Runner<'a> = Box<dyn Fn(Isa) -> (Vec<f32>, Vec<f32>) + 'a>;

/// A storage type's name, runner, and keys and values as it stores them.
type StoredAs<'a> = (&'static str, Runner<'a>, (Vec<f32>, Vec<f32>));

fn close(got: &[f32], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (f64::from(g) - w).abs() <= tol * (1.0 + w.abs()),
            "{what}: element {i}: {g} vs {w}"
        );
    }
}

#[test]
fn short_caches_match_the_reference_in_both_layouts() {
    let mut checks = IsaChecks::new("attention::short_caches_match_the_reference_in_both_layouts");
    let mut rng = Rng::new(21);
    for (heads, kv, hd) in [(9, 3, 64), (4, 4, 32), (8, 1, 128), (6, 2, 80), (2, 1, 8)] {
        for token_major in [false, true] {
            for current in [false, true] {
                let case = Case::new(&mut rng, heads, kv, hd, 70, token_major, &[0..70], current);
                case.check_all(
                    &format!("{heads}/{kv}x{hd} token-major {token_major} current {current}"),
                    &mut checks,
                );
            }
        }
    }
}

/// gpt-oss's sinks: a score per head with no value joins each softmax, so
/// the output shrinks and the probabilities sum to one less the sink's
/// share; sinks far below, near and far above the scores (the last one
/// the maximum of the softmax), with the current token and a split cache.
#[test]
fn sinks_take_their_share_of_every_softmax() {
    let mut checks = IsaChecks::new("attention::sinks_take_their_share_of_every_softmax");
    let mut rng = Rng::new(29);
    for (len, rows) in [(70, vec![0..70]), (700, vec![0..1, 3..700])] {
        for level in [-30.0f32, 0.0, 1.5, 40.0] {
            let mut case = Case::new(&mut rng, 8, 2, 64, len, false, &rows, true);
            case.sinks = Some((0..8).map(|h| level + 0.25 * h as f32).collect());
            case.check_all(&format!("{len} rows, sinks near {level}"), &mut checks);
            let (_, probs) = case.run(Isa::Portable, KvData::F32, &case.k, &case.v);
            let keys = case.keys();
            let share: f32 = 1.0 - probs[..keys].iter().sum::<f32>();
            if level >= 40.0 {
                assert!(
                    share > 0.999,
                    "a sink far above the scores takes it all: {share}"
                );
            }
            if level <= -30.0 {
                assert!(share < 1e-6, "a sink far below takes nothing: {share}");
            }
        }
    }
    // one sink per query head, or a named error
    let mut case = Case::new(&mut rng, 8, 2, 64, 10, false, &[0..10], false);
    case.sinks = Some(vec![0.0; 7]);
    let cache =
        KvCache::new(KvData::F32(&case.k), KvData::F32(&case.v), case.layout).expect("fits");
    let mut out = vec![0f32; 8 * 64];
    let err = attend(
        Isa::Portable,
        &case.spec(),
        &case.q,
        &cache,
        &case.rows,
        None,
        &mut out,
        None,
        &mut AttentionScratch::default(),
    )
    .expect_err("seven sinks for eight heads");
    assert!(err.to_string().contains("attention sinks"), "{err}");
}

#[test]
fn only_the_rows_given_are_read() {
    let mut checks = IsaChecks::new("attention::only_the_rows_given_are_read");
    let mut rng = Rng::new(22);
    // anchors, a gap, a middle block, an empty range and a tail
    let rows = &[0..1, 5..40, 40..40, 90..130];
    let case = Case::new(&mut rng, 9, 3, 64, 130, false, rows, true);
    case.check_all("gapped rows", &mut checks);
    // a cache of rows read by none of them cannot change the result
    let mut other = Case::new(
        &mut Rng::new(22),
        9,
        3,
        64,
        130,
        false,
        &[0..1, 5..40, 40..40, 90..130],
        true,
    );
    for t in 1..5 {
        for g in 0..3 {
            let at = g * other.layout.head_stride + t * other.layout.row_stride;
            other.k[at..at + 64].fill(1e3);
            other.v[at..at + 64].fill(-1e3);
        }
    }
    let a = case.run(Isa::detect(), KvData::F32, &case.k, &case.v);
    let b = other.run(Isa::detect(), KvData::F32, &other.k, &other.v);
    assert_eq!(a, b);
}

#[test]
fn a_long_cache_split_across_threads_matches_the_reference() {
    let mut checks =
        IsaChecks::new("attention::a_long_cache_split_across_threads_matches_the_reference");
    let mut rng = Rng::new(23);
    let len = 3000;
    let case = Case::new(&mut rng, 9, 3, 64, len, false, &[0..1, 3..len], true);
    case.check_all("long cache", &mut checks);
    let token_major = Case::new(&mut rng, 8, 2, 128, 1100, true, &[0..1100], false);
    token_major.check_all("long token-major cache", &mut checks);
}

#[test]
fn the_soft_cap_bends_scores_before_the_softmax() {
    let mut checks = IsaChecks::new("attention::the_soft_cap_bends_scores_before_the_softmax");
    let mut rng = Rng::new(24);
    let mut case = Case::new(&mut rng, 4, 2, 64, 600, false, &[0..600], true);
    case.softcap = Some(0.8);
    case.check_all("soft-capped", &mut checks);
}

#[test]
fn bad_shapes_and_rows_are_errors() {
    let mut rng = Rng::new(25);
    let case = Case::new(&mut rng, 9, 3, 64, 10, false, &[0..10], false);
    let cache =
        KvCache::new(KvData::F32(&case.k), KvData::F32(&case.v), case.layout).expect("fits");
    let spec = case.spec();
    let mut out = vec![0f32; 9 * 64];
    let mut s = AttentionScratch::default();
    let mut run = |rows: &[Range<usize>], q: &[f32], out: &mut [f32], spec: &AttentionSpec| {
        attend(
            Isa::Portable,
            spec,
            q,
            &cache,
            rows,
            None,
            out,
            None,
            &mut s,
        )
    };
    assert!(run(&[0..10], &case.q, &mut out, &spec).is_ok());
    assert!(
        run(&[0..11], &case.q, &mut out, &spec).is_err(),
        "past the cache"
    );
    assert!(
        run(&[5..8, 2..4], &case.q, &mut out, &spec).is_err(),
        "not ascending"
    );
    assert!(run(&[], &case.q, &mut out, &spec).is_err(), "no keys");
    assert!(
        run(&[0..10], &case.q[..64], &mut out, &spec).is_err(),
        "short query"
    );
    let bad = AttentionSpec { heads: 8, ..spec };
    assert!(
        run(&[0..10], &case.q[..8 * 64], &mut out[..8 * 64], &bad).is_err(),
        "8 over 3"
    );
    let small = KvLayout {
        len: 200,
        ..case.layout
    };
    assert!(KvCache::new(KvData::F32(&case.k), KvData::F32(&case.v), small).is_err());
    let k16: Vec<f16> = case.k.iter().map(|&v| f16::from_f32(v)).collect();
    assert!(KvCache::new(KvData::F16(&k16), KvData::F32(&case.v), case.layout).is_err());
}

/// A cache long enough to be split into parts gives the same output and
/// probabilities, bit for bit, on one thread and on several: where the
/// parts begin depends on the cache alone, so a run resumed on another
/// thread count (a leaderboard shard on one, a user's check on all) decodes
/// the same tokens.
#[test]
fn a_split_cache_gives_the_same_bits_on_any_number_of_threads() {
    let mut rng = Rng::new(25);
    let mut sinks = Case::new(&mut rng, 8, 2, 64, 1500, false, &[0..1, 9..1500], true);
    sinks.sinks = Some((0..8).map(|h| 0.5 * h as f32).collect());
    let cases = [
        Case::new(&mut rng, 9, 3, 64, 4100, false, &[0..1, 3..4100], true),
        Case::new(&mut rng, 8, 2, 128, 1100, true, &[0..1100], false),
        Case::new(&mut rng, 4, 4, 32, 513, false, &[0..513], true),
        sinks,
    ];
    for (c, case) in cases.iter().enumerate() {
        let on = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("a thread pool");
            let f16s: Vec<f16> = case.k.iter().map(|&v| f16::from_f32(v)).collect();
            let v16: Vec<f16> = case.v.iter().map(|&v| f16::from_f32(v)).collect();
            pool.install(|| {
                (
                    case.run(Isa::detect(), KvData::F32, &case.k, &case.v),
                    case.run(Isa::detect(), KvData::F16, &f16s, &v16),
                )
            })
        };
        let one = on(1);
        for threads in [2, 3, 7] {
            assert!(
                on(threads) == one,
                "case {c} ({} keys): {threads} threads change the bits of one thread's",
                case.keys()
            );
        }
    }
}
