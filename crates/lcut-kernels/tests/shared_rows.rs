//! A cache that reads some of its rows from a buffer it shares with other
//! caches (`KvCache::with_shared`: the prompt's rows of one run, read by
//! every policy forked from it) attends bit for bit as a cache holding
//! copies of those rows: the one-query kernel (on one thread and split
//! across threads, with probabilities), the chunk kernel, on every level
//! the CPU runs and in the three storage types, with rows picked out of
//! order of their buffer's spacing, blocks that straddle the shared and the
//! own rows, and gaps in the rows read. Shapes that do not fit are errors.

// a list of one range of cache rows is a list of rows to read, not a range
#![allow(clippy::single_range_in_vec_init)]

use std::ops::Range;

use half::{bf16, f16};
use lcut_kernels::Element;
use lcut_kernels::attention::{
    AttentionScratch, AttentionSpec, CurrentKv, KvCache, KvData, KvLayout, QuerySpans, SharedKv,
    attend, attend_chunk,
};
use lcut_kernels::isa::{ALL, Isa};
use lcut_kernels::testdata::{IsaChecks, Rng};

const HEADS: usize = 6;
const KV_HEADS: usize = 2;
const HD: usize = 64;

/// A shared buffer, the rows a cache picks from it, and the cache's own
/// rows; plus the same rows copied into one buffer.
struct Case {
    /// The shared buffer [KV_HEADS, shared_cap, HD] and its rows held.
    shared_k: Vec<f32>,
    shared_v: Vec<f32>,
    shared_cap: usize,
    shared_len: usize,
    /// Buffer rows the cache reads first, in its order.
    picked: Vec<u32>,
    /// The cache's own rows [KV_HEADS, own_cap, HD], `own_len` held.
    own_k: Vec<f32>,
    own_v: Vec<f32>,
    own_cap: usize,
    own_len: usize,
}

impl Case {
    fn new(rng: &mut Rng, shared_len: usize, picked: Vec<u32>, own_len: usize) -> Self {
        let (shared_cap, own_cap) = (shared_len + 7, own_len + 3);
        let big = |rng: &mut Rng, n: usize| {
            let mut x = rng.normals(n, 1.0);
            x.iter_mut().step_by(53).for_each(|v| *v *= 5.0);
            x
        };
        Self {
            shared_k: big(rng, KV_HEADS * shared_cap * HD),
            shared_v: rng.normals(KV_HEADS * shared_cap * HD, 1.0),
            shared_cap,
            shared_len,
            picked,
            own_k: big(rng, KV_HEADS * own_cap * HD),
            own_v: rng.normals(KV_HEADS * own_cap * HD, 1.0),
            own_cap,
            own_len,
        }
    }

    fn rows(&self) -> usize {
        self.picked.len() + self.own_len
    }

    /// The picked shared rows then the own rows, copied into one buffer
    /// [KV_HEADS, rows, HD].
    fn copied(&self, shared: &[f32], own: &[f32]) -> Vec<f32> {
        let mut out = Vec::with_capacity(KV_HEADS * self.rows() * HD);
        for g in 0..KV_HEADS {
            for &r in &self.picked {
                let at = (g * self.shared_cap + r as usize) * HD;
                out.extend_from_slice(&shared[at..at + HD]);
            }
            for r in 0..self.own_len {
                let at = (g * self.own_cap + r) * HD;
                out.extend_from_slice(&own[at..at + HD]);
            }
        }
        out
    }

    /// (the cache sharing rows, the cache of copies) over stored data.
    fn caches<'a, T: Element>(
        &'a self,
        wrap: fn(&'a [T]) -> KvData<'a>,
        stored: &'a Stored<T>,
    ) -> (KvCache<'a>, KvCache<'a>) {
        let own = KvCache::new(
            wrap(&stored.own_k),
            wrap(&stored.own_v),
            KvLayout::head_major(KV_HEADS, HD, self.own_cap, self.own_len),
        )
        .expect("own rows fit");
        let sharing = own
            .with_shared(SharedKv {
                k: wrap(&stored.shared_k),
                v: wrap(&stored.shared_v),
                layout: KvLayout::head_major(KV_HEADS, HD, self.shared_cap, self.shared_len),
                rows: &self.picked,
            })
            .expect("shared rows fit");
        let copies = KvCache::new(
            wrap(&stored.copied_k),
            wrap(&stored.copied_v),
            KvLayout::head_major(KV_HEADS, HD, self.rows(), self.rows()),
        )
        .expect("copies fit");
        (sharing, copies)
    }
}

/// A case's buffers in one storage type.
struct Stored<T> {
    shared_k: Vec<T>,
    shared_v: Vec<T>,
    own_k: Vec<T>,
    own_v: Vec<T>,
    copied_k: Vec<T>,
    copied_v: Vec<T>,
}

impl<T: Element> Stored<T> {
    fn of(case: &Case) -> Self {
        let to = |x: &[f32]| x.iter().map(|&v| T::from_f32(v)).collect::<Vec<T>>();
        Self {
            shared_k: to(&case.shared_k),
            shared_v: to(&case.shared_v),
            own_k: to(&case.own_k),
            own_v: to(&case.own_v),
            copied_k: to(&case.copied(&case.shared_k, &case.own_k)),
            copied_v: to(&case.copied(&case.shared_v, &case.own_v)),
        }
    }
}

fn spec() -> AttentionSpec<'static> {
    AttentionSpec {
        heads: HEADS,
        scale: 1.0 / (HD as f32).sqrt(),
        softcap: None,
        sinks: None,
    }
}

/// Output and probabilities of one query over `rows` of `cache`.
fn one_query(isa: Isa, cache: &KvCache<'_>, q: &[f32], rows: &[Range<usize>]) -> Vec<u32> {
    let keys: usize = rows.iter().map(|r| r.len()).sum::<usize>() + 1;
    let (ck, cv) = (vec![0.25f32; KV_HEADS * HD], vec![-0.5f32; KV_HEADS * HD]);
    let mut out = vec![0f32; HEADS * HD];
    let mut probs = vec![0f32; HEADS * keys];
    attend(
        isa,
        &spec(),
        q,
        cache,
        rows,
        Some(CurrentKv { k: &ck, v: &cv }),
        &mut out,
        Some(&mut probs),
        &mut AttentionScratch::default(),
    )
    .expect("shapes fit");
    out.iter().chain(&probs).map(|x| x.to_bits()).collect()
}

/// Outputs of a chunk of queries, each reading its `spans`.
fn chunk(isa: Isa, cache: &KvCache<'_>, q: &[f32], spans: &QuerySpans) -> Vec<u32> {
    let mut out = vec![0f32; q.len()];
    attend_chunk(isa, &spec(), q, cache, spans, &mut out).expect("shapes fit");
    out.iter().map(|x| x.to_bits()).collect()
}

fn same_bits<T: Element>(case: &Case, wrap: for<'a> fn(&'a [T]) -> KvData<'a>, what: &str) {
    let mut checks = IsaChecks::new("shared rows attend as copies");
    let stored = Stored::<T>::of(case);
    let (sharing, copies) = case.caches(wrap, &stored);
    assert_eq!(sharing.len(), copies.len());
    let mut rng = Rng::new(7);
    let q = rng.normals(HEADS * HD, 1.0);
    let n = case.rows();
    // every row; rows with gaps (an anchor, a run across the shared/own
    // boundary, the newest rows)
    let mid = case.picked.len();
    let read: [Vec<Range<usize>>; 2] = [
        vec![0..n],
        vec![0..1, mid.saturating_sub(70)..(mid + 5).min(n), n - 3..n],
    ];
    let chunk_q = rng.normals(HEADS * 5 * HD, 1.0);
    let mut spans = QuerySpans::new();
    for i in 0..5 {
        spans.push_query([0..2, mid.saturating_sub(100)..n - 4 + i]);
    }
    for isa in ALL {
        if !checks.runs(isa) {
            continue;
        }
        for rows in &read {
            assert_eq!(
                one_query(isa, &sharing, &q, rows),
                one_query(isa, &copies, &q, rows),
                "{what} {} one query over {rows:?}",
                isa.name()
            );
        }
        assert_eq!(
            chunk(isa, &sharing, &chunk_q, &spans),
            chunk(isa, &copies, &chunk_q, &spans),
            "{what} {} chunk",
            isa.name()
        );
    }
}

/// A long shared buffer (split across threads), every third row and a run
/// of neighbours picked, and own rows after them.
fn long_case() -> Case {
    let mut rng = Rng::new(11);
    let picked: Vec<u32> = (0..1500u32)
        .filter(|r| r % 3 == 0 || (700..760).contains(r))
        .collect();
    Case::new(&mut rng, 1500, picked, 37)
}

#[test]
fn shared_rows_attend_as_copies_in_f32() {
    same_bits::<f32>(&long_case(), |x| KvData::F32(x), "f32");
}

#[test]
fn a_run_of_shared_rows_attends_as_copies() {
    // a branch that keeps every prompt row but the first few, and one that
    // keeps a run with one row missing inside a block
    let mut rng = Rng::new(13);
    let all = Case::new(&mut rng, 700, (3..700u32).collect(), 20);
    same_bits::<f16>(&all, |x| KvData::F16(x), "a run");
    let gap: Vec<u32> = (0..700u32).filter(|&r| r != 100).collect();
    let holed = Case::new(&mut rng, 700, gap, 20);
    same_bits::<f32>(&holed, |x| KvData::F32(x), "a run with a hole");
}

#[test]
fn shared_rows_attend_as_copies_in_f16() {
    same_bits::<f16>(&long_case(), |x| KvData::F16(x), "f16");
}

#[test]
fn shared_rows_attend_as_copies_in_bf16() {
    same_bits::<bf16>(&long_case(), |x| KvData::Bf16(x), "bf16");
}

#[test]
fn a_cache_of_shared_rows_alone_attends_as_copies() {
    // a branch before its first own row: every row shared, one block
    // shorter than the kernel's
    let mut rng = Rng::new(3);
    let case = Case::new(&mut rng, 40, vec![0, 2, 3, 9, 17, 18, 39, 20], 0);
    let stored = Stored::<f32>::of(&case);
    let (sharing, copies) = case.caches(KvData::F32, &stored);
    let q = rng.normals(HEADS * HD, 1.0);
    for isa in ALL.into_iter().filter(|i| i.available()) {
        assert_eq!(
            one_query(isa, &sharing, &q, &[0..8]),
            one_query(isa, &copies, &q, &[0..8]),
            "{}",
            isa.name()
        );
    }
}

#[test]
fn shared_rows_that_do_not_fit_are_errors() {
    let mut rng = Rng::new(5);
    let case = Case::new(&mut rng, 10, vec![0, 9], 2);
    let stored = Stored::<f32>::of(&case);
    let f16s: Vec<f16> = stored.shared_k.iter().map(|&v| f16::from_f32(v)).collect();
    let own = KvCache::new(
        KvData::F32(&stored.own_k),
        KvData::F32(&stored.own_v),
        KvLayout::head_major(KV_HEADS, HD, case.own_cap, case.own_len),
    )
    .expect("own rows fit");
    let shared = |rows: &'static [u32], layout| SharedKv {
        k: KvData::F32(&stored.shared_k),
        v: KvData::F32(&stored.shared_v),
        layout,
        rows,
    };
    let lay = KvLayout::head_major(KV_HEADS, HD, case.shared_cap, case.shared_len);
    // a row past the rows the buffer holds
    let err = own.with_shared(shared(&[0, 10], lay)).unwrap_err();
    assert!(err.to_string().contains("10"), "{err}");
    // another head count or width
    let other = KvLayout::head_major(1, HD, case.shared_cap, case.shared_len);
    assert!(own.with_shared(shared(&[0], other)).is_err());
    // a buffer shorter than its layout
    let long = KvLayout::head_major(KV_HEADS, HD, case.shared_cap * 4, case.shared_len);
    assert!(own.with_shared(shared(&[0], long)).is_err());
    // another storage type
    let mixed = SharedKv {
        k: KvData::F16(&f16s),
        v: KvData::F16(&f16s),
        layout: lay,
        rows: &[0],
    };
    assert!(own.with_shared(mixed).is_err());
    // rows read past the shared and own rows held
    let sharing = own.with_shared(shared(&[0, 9], lay)).expect("fits");
    assert_eq!(sharing.len(), 4);
    let mut out = vec![0f32; HEADS * HD];
    let q = vec![0f32; HEADS * HD];
    let past = attend(
        Isa::Portable,
        &spec(),
        &q,
        &sharing,
        &[0..5],
        None,
        &mut out,
        None,
        &mut AttentionScratch::default(),
    );
    assert!(past.is_err());
}
