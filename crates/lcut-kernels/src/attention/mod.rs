//! Attention of one query token (all heads, grouped-query) over one
//! layer's K/V cache, reading only the cache rows it is given (a policy may
//! keep only some positions visible), with keys and values stored as f32,
//! f16 or bf16.
//!
//! A long cache's rows are split into parts by length, and the parts run on
//! rayon's threads; each part keeps a running maximum, sum and weighted
//! value sum per head (an online, or streaming, softmax) over blocks of
//! rows, so that a long cache is read once, at memory speed; the parts are
//! then merged in order. Where the parts begin depends on the number of
//! rows alone, never on the number of threads, so one thread and many give
//! the same bits. When asked, the
//! softmax probabilities come out too, exactly normalised, one row per head
//! ([heads, keys]): the raw scores are kept per part and normalised once
//! the global maximum and sum are known. [`attend_chunk`] attends the
//! query rows of a prefill chunk, each over its own rows.

mod portable;

#[cfg(target_arch = "x86_64")]
mod simd;

use std::ops::Range;

use half::{bf16, f16};
use rayon::prelude::*;

use crate::error::{KernelError, Result, check_len};
use crate::isa::Isa;
use crate::simd::Element;

/// Rows per block of the streaming softmax.
const BLOCK: usize = 64;

/// Fewest rows per part: caches shorter than two parts are attended in one
/// part, on the calling thread.
pub const ROWS_PER_PART: usize = 256;

/// Most parts a cache is split into (so that the merge and the parts'
/// scratch stay small beside the rows at 128K keys), enough for as many
/// threads.
const MAX_PARTS: usize = 64;

/// One layer's keys or values, in one storage type.
#[derive(Debug, Clone, Copy)]
pub enum KvData<'a> {
    /// f32 (the exact path).
    F32(&'a [f32]),
    /// f16 (llama.cpp's default cache type).
    F16(&'a [f16]),
    /// bf16.
    Bf16(&'a [bf16]),
}

impl KvData<'_> {
    fn len(&self) -> usize {
        match self {
            Self::F32(x) => x.len(),
            Self::F16(x) => x.len(),
            Self::Bf16(x) => x.len(),
        }
    }

    /// No values, of this data's type.
    pub fn empty(&self) -> KvData<'static> {
        match self {
            Self::F32(_) => KvData::F32(&[]),
            Self::F16(_) => KvData::F16(&[]),
            Self::Bf16(_) => KvData::Bf16(&[]),
        }
    }

    fn same_type(&self, other: &KvData<'_>) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(other)
    }
}

/// An element type a [`KvData`] may hold, to read one back as a slice.
pub(crate) trait KvElement: Element {
    /// The data as a slice of this type, when it holds this type.
    fn slice<'a>(data: KvData<'a>) -> Option<&'a [Self]>;
}

impl KvElement for f32 {
    fn slice<'a>(data: KvData<'a>) -> Option<&'a [Self]> {
        match data {
            KvData::F32(x) => Some(x),
            _ => None,
        }
    }
}

impl KvElement for f16 {
    fn slice<'a>(data: KvData<'a>) -> Option<&'a [Self]> {
        match data {
            KvData::F16(x) => Some(x),
            _ => None,
        }
    }
}

impl KvElement for bf16 {
    fn slice<'a>(data: KvData<'a>) -> Option<&'a [Self]> {
        match data {
            KvData::Bf16(x) => Some(x),
            _ => None,
        }
    }
}

/// Where value d of cache row t of K/V head h lives:
/// `h * head_stride + t * row_stride + d`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayout {
    /// K/V heads.
    pub kv_heads: usize,
    /// Values per head.
    pub head_dim: usize,
    /// Distance between heads (elements).
    pub head_stride: usize,
    /// Distance between rows (elements).
    pub row_stride: usize,
    /// Rows held (rows past this are never read).
    pub len: usize,
}

impl KvLayout {
    /// Head-major rows: [kv_heads, capacity, head_dim] with `len` rows held.
    pub fn head_major(kv_heads: usize, head_dim: usize, capacity: usize, len: usize) -> Self {
        Self {
            kv_heads,
            head_dim,
            head_stride: capacity * head_dim,
            row_stride: head_dim,
            len,
        }
    }

    /// Elements a buffer needs to hold every row in this layout.
    fn extent(&self) -> usize {
        if self.len == 0 || self.kv_heads == 0 {
            return 0;
        }
        (self.kv_heads - 1) * self.head_stride + (self.len - 1) * self.row_stride + self.head_dim
    }
}

/// A layer's K/V cache: keys and values of one storage type in one layout
/// (its own rows) and, where the cache shares rows with others, rows of
/// another buffer picked by index, read before its own (see
/// [`KvCache::with_shared`]).
#[derive(Debug, Clone, Copy)]
pub struct KvCache<'a> {
    k: KvData<'a>,
    v: KvData<'a>,
    layout: KvLayout,
    shared: Option<SharedKv<'a>>,
}

/// Rows a cache reads from a buffer it shares with other caches (the
/// prompt's rows of one run, read by every policy forked from it): keys and
/// values in `layout` (whose `len` is the rows the buffer holds), and, for
/// each of the cache's first rows, the buffer row it is.
#[derive(Debug, Clone, Copy)]
pub struct SharedKv<'a> {
    /// Keys of the shared buffer.
    pub k: KvData<'a>,
    /// Values of the shared buffer.
    pub v: KvData<'a>,
    /// The shared buffer's layout.
    pub layout: KvLayout,
    /// The buffer row of each of the cache's first `rows.len()` rows.
    pub rows: &'a [u32],
}

impl<'a> KvCache<'a> {
    /// The cache over `k` and `v` (same type, each covering `layout`).
    pub fn new(k: KvData<'a>, v: KvData<'a>, layout: KvLayout) -> Result<Self> {
        if !k.same_type(&v) {
            return Err(KernelError::Heads(
                "keys and values must be stored in the same type".into(),
            ));
        }
        if layout.head_dim == 0 || layout.row_stride < layout.head_dim && layout.len > 1 {
            return Err(KernelError::Heads(format!(
                "rows of {} values {} apart overlap",
                layout.head_dim, layout.row_stride
            )));
        }
        for (what, data) in [("key cache", &k), ("value cache", &v)] {
            if data.len() < layout.extent() {
                return Err(KernelError::Length {
                    what,
                    expected: layout.extent(),
                    got: data.len(),
                });
            }
        }
        Ok(Self {
            k,
            v,
            layout,
            shared: None,
        })
    }

    /// This cache reading `shared`'s rows before its own: row i of the
    /// cache is buffer row `shared.rows[i]` of the shared buffer for i below
    /// `shared.rows.len()`, its own row `i - shared.rows.len()` after. The
    /// arithmetic over a row does not depend on where it is stored, so a
    /// cache that shares rows attends as one holding copies of them.
    pub fn with_shared(self, shared: SharedKv<'a>) -> Result<Self> {
        let (lay, own) = (shared.layout, self.layout);
        if !shared.k.same_type(&self.k) || !shared.v.same_type(&self.v) {
            return Err(KernelError::Heads(
                "shared and own keys and values must be stored in the same type".into(),
            ));
        }
        if (lay.kv_heads, lay.head_dim) != (own.kv_heads, own.head_dim) {
            return Err(KernelError::Heads(format!(
                "shared rows of {} K/V heads of {} values beside own rows of {} of {}",
                lay.kv_heads, lay.head_dim, own.kv_heads, own.head_dim
            )));
        }
        // the shared buffer covers its layout
        Self::new(shared.k, shared.v, lay)?;
        if let Some(&row) = shared.rows.iter().max()
            && row as usize >= lay.len
        {
            return Err(KernelError::Rows {
                start: row as usize,
                end: row as usize + 1,
                len: lay.len,
            });
        }
        Ok(Self {
            shared: Some(shared),
            ..self
        })
    }

    /// The layout of the cache's own rows.
    pub fn layout(&self) -> KvLayout {
        self.layout
    }

    /// Rows the cache holds: the shared rows it reads, then its own.
    pub fn len(&self) -> usize {
        self.shared.map_or(0, |s| s.rows.len()) + self.layout.len
    }

    /// True when the cache holds no row.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The cache as slices of its element type `T` (`None` when it holds
    /// another type).
    fn typed<T: KvElement>(&self) -> Option<Typed<'a, T>> {
        let shared = match self.shared {
            Some(s) => Some(TypedShared {
                k: T::slice(s.k)?,
                v: T::slice(s.v)?,
                layout: s.layout,
                rows: s.rows,
            }),
            None => None,
        };
        Some(Typed {
            k: T::slice(self.k)?,
            v: T::slice(self.v)?,
            layout: self.layout,
            shared,
        })
    }
}

/// A [`KvCache`] read as slices of its element type.
#[derive(Clone, Copy)]
pub(crate) struct Typed<'a, T> {
    k: &'a [T],
    v: &'a [T],
    layout: KvLayout,
    shared: Option<TypedShared<'a, T>>,
}

/// The shared rows of a [`Typed`] cache.
#[derive(Clone, Copy)]
struct TypedShared<'a, T> {
    k: &'a [T],
    v: &'a [T],
    layout: KvLayout,
    rows: &'a [u32],
}

/// Row tables of one block of gathered rows (rows that are not equally
/// spaced in one buffer): kept between blocks so that a block allocates
/// nothing.
pub(crate) struct Gather<'a, T> {
    keys: Vec<&'a [T]>,
    values: Vec<&'a [T]>,
}

impl<T> Default for Gather<'_, T> {
    fn default() -> Self {
        Self {
            keys: Vec::new(),
            values: Vec::new(),
        }
    }
}

impl<'a, T: Element> Typed<'a, T> {
    /// Keys and values of the `count` cache rows from `start` of K/V head
    /// `g`: equally spaced rows of one buffer where they are the cache's own,
    /// else gathered row by row into `gather`'s tables.
    pub(crate) fn block<'t>(
        &self,
        g: usize,
        start: usize,
        count: usize,
        gather: &'t mut Gather<'a, T>,
    ) -> (Rows<'t, T>, Rows<'t, T>)
    where
        'a: 't,
    {
        let (lay, hd) = (self.layout, self.layout.head_dim);
        let shared_rows = self.shared.map_or(0, |s| s.rows.len());
        // `count` rows from element `at`, `stride` apart, of `k` and `v`
        let spaced = |k: &'a [T], v: &'a [T], at: usize, stride: usize| {
            let end = at + (count - 1) * stride + hd;
            let rows = |data| Rows {
                data,
                stride,
                count,
                width: hd,
                gathered: &[],
            };
            (rows(&k[at..end]), rows(&v[at..end]))
        };
        if start >= shared_rows {
            let at = g * lay.head_stride + (start - shared_rows) * lay.row_stride;
            return spaced(self.k, self.v, at, lay.row_stride);
        }
        // shared rows one after another in their buffer (a branch that keeps
        // a run of the prompt): equally spaced there
        if let Some(s) = self.shared
            && start + count <= shared_rows
            && s.rows[start..start + count]
                .windows(2)
                .all(|w| w[1] == w[0] + 1)
        {
            let sl = s.layout;
            let at = g * sl.head_stride + s.rows[start] as usize * sl.row_stride;
            return spaced(s.k, s.v, at, sl.row_stride);
        }
        gather.keys.clear();
        gather.values.clear();
        for row in start..start + count {
            let (k, v, at) = match self.shared {
                Some(s) if row < shared_rows => {
                    let sl = s.layout;
                    let at = g * sl.head_stride + s.rows[row] as usize * sl.row_stride;
                    (s.k, s.v, at)
                }
                _ => {
                    let at = g * lay.head_stride + (row - shared_rows) * lay.row_stride;
                    (self.k, self.v, at)
                }
            };
            gather.keys.push(&k[at..at + hd]);
            gather.values.push(&v[at..at + hd]);
        }
        let rows = |gathered: &'t [&'a [T]]| Rows {
            data: &[],
            stride: 0,
            count,
            width: hd,
            gathered,
        };
        (rows(&gather.keys), rows(&gather.values))
    }
}

/// The token being decoded, when its keys and values are not (or not yet)
/// in the cache: [kv_heads, head_dim] each, in f32. It is read after every
/// cache row (it is the newest position).
#[derive(Debug, Clone, Copy)]
pub struct CurrentKv<'a> {
    /// Keys.
    pub k: &'a [f32],
    /// Values.
    pub v: &'a [f32],
}

/// The attention's constants.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionSpec<'a> {
    /// Query heads (a multiple of the cache's K/V heads).
    pub heads: usize,
    /// Score scale (1 / sqrt(head_dim) unless the model says otherwise).
    pub scale: f32,
    /// Gemma-2's soft-cap: scores become `cap tanh(score / cap)`.
    pub softcap: Option<f32>,
    /// gpt-oss's learned sink logit of each query head [heads]: one more
    /// score in the head's softmax, with no value, so that the
    /// probabilities of the keys sum to one less the sink's share.
    pub sinks: Option<&'a [f32]>,
}

impl AttentionSpec<'_> {
    /// The denominator and output scale of a head whose keys' running
    /// softmax has maximum `m` and sum `sum` (relative to `m`), with its
    /// sink when the spec has one: `(scale, total)` so that the output is
    /// `acc * scale / total` (`scale` 1 without a sink).
    pub(crate) fn with_sink(&self, head: usize, m: f32, sum: f32) -> (f32, f32) {
        match self.sinks {
            None => (1.0, sum),
            Some(s) => {
                let top = m.max(s[head]);
                let keep = if m == f32::NEG_INFINITY {
                    0.0
                } else {
                    (m - top).exp()
                };
                (keep, sum * keep + (s[head] - top).exp())
            }
        }
    }

    /// The sink logits, when given, must be one per query head.
    pub(crate) fn check_sinks(&self) -> Result<()> {
        match self.sinks {
            Some(s) => check_len("attention sinks", self.heads, s.len()),
            None => Ok(()),
        }
    }
}

/// Buffers kept between calls, so that a decode step allocates nothing.
#[derive(Debug, Clone, Default)]
pub struct AttentionScratch {
    state: Vec<f32>,
    scores: Vec<f32>,
}

/// `count` rows of `width` values, `stride` apart, starting at `data[0]`,
/// or, where `gathered` is not empty, the rows it lists (rows of a shared
/// buffer picked by index).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rows<'a, T> {
    pub data: &'a [T],
    pub stride: usize,
    pub count: usize,
    pub width: usize,
    pub gathered: &'a [&'a [T]],
}

impl<'a, T> Rows<'a, T> {
    /// Row `j`'s `width` values.
    #[inline(always)]
    pub(crate) fn row(&self, j: usize) -> &'a [T] {
        match self.gathered.is_empty() {
            true => &self.data[j * self.stride..j * self.stride + self.width],
            false => &self.gathered[j][..self.width],
        }
    }
}

/// The per-block steps each instruction-set level provides.
pub(crate) trait BlockOps<T>: Sync {
    /// `out[g * keys.count + j] = scale * (q_g . key_j)` for the `groups`
    /// query heads `q_g = q[g * width..]`.
    fn scores(&self, q: &[f32], groups: usize, keys: Rows<'_, T>, scale: f32, out: &mut [f32]);
    /// `acc[g * width..] += sum_j p[g * values.count + j] value_j`.
    fn accumulate(&self, p: &[f32], groups: usize, values: Rows<'_, T>, acc: &mut [f32]);
    /// `x[i] = e^(x[i] - m)`; returns their sum.
    fn exp_sum(&self, x: &mut [f32], m: f32) -> f32;
}

/// `$body` with `$ops` bound to the block steps of the best level `$isa`
/// allows on this CPU.
macro_rules! with_best_ops {
    ($isa:expr, |$ops:ident| $body:expr) => {{
        #[cfg(target_arch = "x86_64")]
        {
            if let Some($ops) = $crate::attention::simd::Ops::<$crate::simd::avx512::Avx512>::new()
                .filter(|_| $isa >= Isa::Avx512)
            {
                $body
            } else if let Some($ops) =
                $crate::attention::simd::Ops::<$crate::simd::avx2::Avx2>::new()
                    .filter(|_| $isa >= Isa::Avx2)
            {
                $body
            } else {
                let $ops = portable::Ops;
                $body
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let $ops = portable::Ops;
            $body
        }
    }};
}

/// `$body` with `$ops` bound as by [`with_best_ops`] and `$cache` to the
/// cache read as slices of its one element type ([`Typed`]); a cache whose
/// keys and values differ in type returns an error from the caller.
macro_rules! with_typed_cache {
    ($isa:expr, $kv:expr, |$ops:ident, $cache:ident| $body:expr) => {
        match ($kv.k, $kv.v) {
            (KvData::F32(_), KvData::F32(_)) => {
                let $cache = $kv.typed::<f32>().ok_or_else(mixed_types)?;
                with_best_ops!($isa, |$ops| $body)
            }
            (KvData::F16(_), KvData::F16(_)) => {
                let $cache = $kv.typed::<half::f16>().ok_or_else(mixed_types)?;
                with_best_ops!($isa, |$ops| $body)
            }
            (KvData::Bf16(_), KvData::Bf16(_)) => {
                let $cache = $kv.typed::<half::bf16>().ok_or_else(mixed_types)?;
                with_best_ops!($isa, |$ops| $body)
            }
            _ => return Err(mixed_types()),
        }
    };
}

/// The error of a cache whose keys and values are of different types.
fn mixed_types() -> KernelError {
    KernelError::Heads("keys and values must be stored in the same type".into())
}

/// `x[i] = e^(x[i] - m)` in place, returning their sum: the attention's
/// vectorized `exp` at the best level `isa` allows on this CPU, for a
/// softmax over a row the caller owns (a vocabulary's logits).
pub fn exp_sum(isa: Isa, x: &mut [f32], m: f32) -> f32 {
    with_best_ops!(isa, |ops| BlockOps::<f32>::exp_sum(&ops, x, m))
}

mod chunk;
pub mod tiled;

pub use chunk::{QUERY_TILE, attend_chunk};
/// The rows each query of a chunk reads, as the key planner
/// ([`lcut_policy::keys::KeyPlanner`]) gives them.
pub use lcut_policy::keys::QuerySpans;

/// Attend one query `q` [heads, head_dim] over the cache rows `rows`
/// (ascending, non-overlapping ranges inside the cache) and `current`,
/// writing the output [heads, head_dim] to `out` and, when given, the
/// probabilities [heads, keys] to `probs` (keys: the rows in order, then
/// `current`). `isa` above what the CPU runs falls back to what it runs.
#[allow(clippy::too_many_arguments)]
pub fn attend(
    isa: Isa,
    spec: &AttentionSpec<'_>,
    q: &[f32],
    cache: &KvCache<'_>,
    rows: &[Range<usize>],
    current: Option<CurrentKv<'_>>,
    out: &mut [f32],
    probs: Option<&mut [f32]>,
    scratch: &mut AttentionScratch,
) -> Result<()> {
    let call = Call::new(spec, q, cache, rows, current, out.len(), probs.as_deref())?;
    with_typed_cache!(isa, cache, |ops, typed| run(
        &ops, &call, &typed, out, probs, scratch
    ));
    Ok(())
}

/// One checked call's shapes.
struct Call<'a> {
    spec: AttentionSpec<'a>,
    q: &'a [f32],
    layout: KvLayout,
    rows: &'a [Range<usize>],
    current: Option<CurrentKv<'a>>,
    /// Cache rows read.
    total: usize,
    /// Query heads per K/V head.
    group: usize,
}

impl<'a> Call<'a> {
    fn new(
        spec: &AttentionSpec<'a>,
        q: &'a [f32],
        cache: &KvCache<'_>,
        rows: &'a [Range<usize>],
        current: Option<CurrentKv<'a>>,
        out: usize,
        probs: Option<&[f32]>,
    ) -> Result<Self> {
        let layout = cache.layout;
        let (kv, hd) = (layout.kv_heads, layout.head_dim);
        if kv == 0 || !spec.heads.is_multiple_of(kv) {
            return Err(KernelError::Heads(format!(
                "{} query heads over {kv} K/V heads",
                spec.heads
            )));
        }
        check_len("query", spec.heads * hd, q.len())?;
        check_len("attention output", spec.heads * hd, out)?;
        spec.check_sinks()?;
        let mut last = 0;
        for r in rows {
            if r.start < last || r.start > r.end || r.end > cache.len() {
                return Err(KernelError::Rows {
                    start: r.start,
                    end: r.end,
                    len: cache.len(),
                });
            }
            last = r.end;
        }
        if let Some(c) = &current {
            check_len("current key", kv * hd, c.k.len())?;
            check_len("current value", kv * hd, c.v.len())?;
        }
        let total: usize = rows.iter().map(|r| r.len()).sum();
        let keys = total + usize::from(current.is_some());
        if keys == 0 {
            return Err(KernelError::Rows {
                start: 0,
                end: 0,
                len: cache.len(),
            });
        }
        if let Some(p) = probs {
            check_len("attention probabilities", spec.heads * keys, p.len())?;
        }
        Ok(Self {
            spec: *spec,
            q,
            layout,
            rows,
            current,
            total,
            group: spec.heads / kv,
        })
    }

    /// Keys in all: cache rows then the current token.
    fn keys(&self) -> usize {
        self.total + usize::from(self.current.is_some())
    }

    /// f32 per part's state: max and sum per head, value sums, block scores.
    fn state_len(&self) -> usize {
        let (h, hd) = (self.spec.heads, self.layout.head_dim);
        2 * h + h * hd + self.group * BLOCK
    }
}

/// Where each part of `total` cache rows starts and ends (virtual key
/// indices: the rows of every range, in order): one part per
/// [`ROWS_PER_PART`] rows, at most [`MAX_PARTS`], each a whole number of
/// blocks but the last. A function of `total` alone: the thread count
/// decides only which thread runs a part, so the merged sums, and the bits,
/// are the same on any number of threads.
fn part_bounds(total: usize) -> Vec<Range<usize>> {
    if total == 0 {
        return Vec::new();
    }
    let parts = (total / ROWS_PER_PART).clamp(1, MAX_PARTS);
    let per = total.div_ceil(parts).div_ceil(BLOCK) * BLOCK;
    (0..total)
        .step_by(per)
        .map(|s| s..(s + per).min(total))
        .collect()
}

/// The call with block steps `ops`: parts in parallel, then the merge.
fn run<T: Element, O: BlockOps<T>>(
    ops: &O,
    call: &Call<'_>,
    cache: &Typed<'_, T>,
    out: &mut [f32],
    probs: Option<&mut [f32]>,
    scratch: &mut AttentionScratch,
) {
    let parts = part_bounds(call.total);
    let state_len = call.state_len();
    let heads = call.spec.heads;
    scratch.state.resize(parts.len().max(1) * state_len, 0.0);
    let want_probs = probs.is_some();
    let per = parts.first().map_or(0, |p| p.len());
    if want_probs {
        scratch.scores.resize(heads * call.total, 0.0);
    }
    let one = |range: Range<usize>, state: &mut [f32], scores: &mut [f32]| {
        part(ops, call, cache, range, state, scores);
    };
    match (parts.len(), want_probs) {
        (0, _) => {}
        (1, true) => one(parts[0].clone(), &mut scratch.state, &mut scratch.scores),
        (1, false) => one(parts[0].clone(), &mut scratch.state, &mut []),
        (_, true) => scratch
            .state
            .par_chunks_mut(state_len)
            .zip(scratch.scores.par_chunks_mut(heads * per))
            .zip(parts.par_iter())
            .for_each(|((st, sc), r)| one(r.clone(), st, sc)),
        (_, false) => scratch
            .state
            .par_chunks_mut(state_len)
            .zip(parts.par_iter())
            .for_each(|(st, r)| one(r.clone(), st, &mut [])),
    }
    merge(
        ops,
        call,
        &parts,
        &mut scratch.state,
        &scratch.scores,
        out,
        probs,
    );
}

/// The cache rows of virtual keys `range`: (first row, rows) pieces.
fn pieces(rows: &[Range<usize>], range: Range<usize>) -> impl Iterator<Item = (usize, usize)> + '_ {
    let mut seen = 0;
    rows.iter().filter_map(move |r| {
        let (lo, hi) = (seen, seen + r.len());
        seen = hi;
        let (a, b) = (range.start.max(lo), range.end.min(hi));
        (a < b).then(|| (r.start + (a - lo), b - a))
    })
}

/// One part: the streaming softmax over the cache rows of virtual keys
/// `range`, for every head. `state` gets each head's running maximum, sum
/// and value sums; `scores` (when not empty) each head's raw scores
/// [heads, range.len()].
fn part<T: Element, O: BlockOps<T>>(
    ops: &O,
    call: &Call<'_>,
    cache: &Typed<'_, T>,
    range: Range<usize>,
    state: &mut [f32],
    scores: &mut [f32],
) {
    let (heads, group) = (call.spec.heads, call.group);
    let lay = call.layout;
    let hd = lay.head_dim;
    let (maxes, rest) = state.split_at_mut(heads);
    let (sums, rest) = rest.split_at_mut(heads);
    let (acc, block) = rest.split_at_mut(heads * hd);
    maxes.fill(f32::NEG_INFINITY);
    sums.fill(0.0);
    acc.fill(0.0);
    let part_len = range.len();
    let mut done = 0;
    let mut gather = Gather::default();
    for (first, count) in pieces(call.rows, range) {
        for start in (first..first + count).step_by(BLOCK) {
            let n = BLOCK.min(first + count - start);
            for g in 0..lay.kv_heads {
                let (keys, values) = cache.block(g, start, n, &mut gather);
                let qg = &call.q[g * group * hd..(g + 1) * group * hd];
                let s = &mut block[..group * n];
                ops.scores(qg, group, keys, call.spec.scale, s);
                if let Some(cap) = call.spec.softcap {
                    crate::ops::portable_softcap_in_place(s, cap);
                }
                for gq in 0..group {
                    let h = g * group + gq;
                    let sh = &mut s[gq * n..(gq + 1) * n];
                    if !scores.is_empty() {
                        scores[h * part_len + done..h * part_len + done + n].copy_from_slice(sh);
                    }
                    let m = sh.iter().fold(maxes[h], |m, &x| m.max(x));
                    let keep = if maxes[h] == f32::NEG_INFINITY {
                        0.0
                    } else {
                        (maxes[h] - m).exp()
                    };
                    if keep != 1.0 {
                        sums[h] *= keep;
                        acc[h * hd..(h + 1) * hd]
                            .iter_mut()
                            .for_each(|a| *a *= keep);
                    }
                    sums[h] += ops.exp_sum(sh, m);
                    maxes[h] = m;
                }
                let ag = &mut acc[g * group * hd..(g + 1) * group * hd];
                ops.accumulate(s, group, values, ag);
            }
            done += n;
        }
    }
}

/// Merge the parts (and the current token) into `out`, and normalise the
/// kept scores into `probs`.
fn merge<T: Element, O: BlockOps<T>>(
    ops: &O,
    call: &Call<'_>,
    parts: &[Range<usize>],
    state: &mut [f32],
    scores: &[f32],
    out: &mut [f32],
    probs: Option<&mut [f32]>,
) {
    let (heads, hd, group) = (call.spec.heads, call.layout.head_dim, call.group);
    let state_len = call.state_len();
    let keys = call.keys();
    let mut probs = probs;
    for h in 0..heads {
        let g = h / group;
        let qh = &call.q[h * hd..(h + 1) * hd];
        // the current token's score
        let current = call.current.map(|c| {
            let kh = &c.k[g * hd..(g + 1) * hd];
            let mut s = call.spec.scale * qh.iter().zip(kh).map(|(a, b)| a * b).sum::<f32>();
            if let Some(cap) = call.spec.softcap {
                s = cap * (s / cap).tanh();
            }
            (s, &c.v[g * hd..(g + 1) * hd])
        });
        let part_max = |p: usize| state[p * state_len + h];
        let mut m = (0..parts.len())
            .map(part_max)
            .fold(f32::NEG_INFINITY, f32::max);
        if let Some((s, _)) = current {
            m = m.max(s);
        }
        let o = &mut out[h * hd..(h + 1) * hd];
        o.fill(0.0);
        let mut total = 0f32;
        for p in 0..parts.len() {
            let st = &state[p * state_len..(p + 1) * state_len];
            let (pm, ps) = (st[h], st[heads + h]);
            if pm == f32::NEG_INFINITY {
                continue;
            }
            let w = (pm - m).exp();
            total += ps * w;
            let pacc = &st[2 * heads + h * hd..2 * heads + (h + 1) * hd];
            o.iter_mut().zip(pacc).for_each(|(o, a)| *o += w * a);
        }
        let mut self_p = 0f32;
        if let Some((s, vh)) = current {
            self_p = (s - m).exp();
            total += self_p;
            o.iter_mut().zip(vh).for_each(|(o, v)| *o += self_p * v);
        }
        // a sink's share joins the denominator (relative to its own maximum
        // where it is the larger)
        let (keep, total) = call.spec.with_sink(h, m, total);
        let inv = keep / total;
        o.iter_mut().for_each(|x| *x *= inv);
        if let Some(pr) = probs.as_deref_mut() {
            let row = &mut pr[h * keys..(h + 1) * keys];
            let mut at = 0;
            for part in parts {
                let first = part.start * heads;
                let src = &scores[first + h * part.len()..first + (h + 1) * part.len()];
                let dst = &mut row[at..at + part.len()];
                dst.copy_from_slice(src);
                ops.exp_sum(dst, m);
                at += part.len();
            }
            if call.current.is_some() {
                row[keys - 1] = self_p;
            }
            row.iter_mut().for_each(|x| *x *= inv);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cover_every_row_once_in_whole_blocks() {
        assert!(part_bounds(0).is_empty());
        for total in [1, 63, 511, 512, 700, 4099, 65_536, 131_072 + 5] {
            let p = part_bounds(total);
            assert_eq!(p.first().map(|r| r.start), Some(0), "{total}");
            assert_eq!(p.last().map(|r| r.end), Some(total), "{total}");
            for w in p.windows(2) {
                assert_eq!(w[0].end, w[1].start);
                assert_eq!(w[0].len() % BLOCK, 0, "{total}");
            }
            assert!(p.iter().all(|r| !r.is_empty()), "{total}");
            assert!(p.len() <= MAX_PARTS, "{total}");
            // short caches stay whole; long ones are split
            assert_eq!(p.len() == 1, total < 2 * ROWS_PER_PART, "{total}");
        }
    }
}
