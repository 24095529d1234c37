//! Attention of a prefill chunk's query rows over one layer's K/V cache,
//! each query reading only its own cache rows (causal order, a sliding
//! window, a policy's visibility), without building a score matrix.
//!
//! Queries are taken in tiles of [`QUERY_TILE`] per K/V head: the tile
//! walks the union of its queries' rows in blocks, and each block of keys
//! and values, read once, serves every query of the tile that sees it and
//! every query head of the group (an online softmax per query and head, as
//! the one-query kernel keeps per part). Tiles run in parallel.

use std::ops::Range;

use rayon::prelude::*;

use super::{
    AttentionSpec, BLOCK, BlockOps, Gather, KvCache, KvData, Rows, Typed, mixed_types, portable,
};
use crate::error::{KernelError, Result, check_len};
use crate::isa::Isa;
use crate::simd::Element;

/// Query rows per tile: the keys and values of a block are read once for
/// all of them.
pub const QUERY_TILE: usize = 16;

use lcut_policy::keys::QuerySpans;

/// Attend the `n` queries `q` [heads, n, head_dim] (f32) over the cache,
/// query i reading the rows `spans.of(i)` (at least one), writing the
/// output [heads, n, head_dim] to `out`. `isa` above what the CPU runs
/// falls back to what it runs.
pub fn attend_chunk(
    isa: Isa,
    spec: &AttentionSpec<'_>,
    q: &[f32],
    cache: &KvCache<'_>,
    spans: &QuerySpans,
    out: &mut [f32],
) -> Result<()> {
    let layout = cache.layout;
    let (kv, hd, n) = (layout.kv_heads, layout.head_dim, spans.queries());
    if kv == 0 || !spec.heads.is_multiple_of(kv) {
        return Err(KernelError::Heads(format!(
            "{} query heads over {kv} K/V heads",
            spec.heads
        )));
    }
    check_len("chunk queries", spec.heads * n * hd, q.len())?;
    check_len("chunk attention output", spec.heads * n * hd, out.len())?;
    spec.check_sinks()?;
    for i in 0..n {
        let mut last = 0;
        for r in spans.of(i) {
            if r.start < last || r.end > cache.len() {
                return Err(KernelError::Rows {
                    start: r.start,
                    end: r.end,
                    len: cache.len(),
                });
            }
            last = r.end;
        }
        if spans.of(i).is_empty() {
            return Err(KernelError::Rows {
                start: 0,
                end: 0,
                len: cache.len(),
            });
        }
    }
    let chunk = Chunk {
        spec: *spec,
        q,
        n,
        kv,
        hd,
        group: spec.heads / kv,
        spans,
    };
    with_typed_cache!(isa, cache, |ops, typed| run(&ops, &chunk, &typed, out));
    Ok(())
}

/// One checked call's shapes.
struct Chunk<'a> {
    spec: AttentionSpec<'a>,
    q: &'a [f32],
    n: usize,
    kv: usize,
    hd: usize,
    group: usize,
    spans: &'a QuerySpans,
}

/// Every tile in parallel, then their outputs into place.
fn run<T: Element, O: BlockOps<T>>(ops: &O, c: &Chunk<'_>, cache: &Typed<'_, T>, out: &mut [f32]) {
    let tiles: Vec<Range<usize>> = (0..c.n)
        .step_by(QUERY_TILE)
        .map(|s| s..c.n.min(s + QUERY_TILE))
        .collect();
    let (heads, hd, n) = (c.spec.heads, c.hd, c.n);
    // each tile's output [queries][heads][head_dim]
    let results: Vec<Vec<f32>> = tiles
        .par_iter()
        .map(|t| {
            let mut o = vec![0f32; t.len() * heads * hd];
            let mut state = TileState::new(t.len(), c.group, hd);
            for g in 0..c.kv {
                tile(ops, c, cache, g, t.clone(), &mut state, &mut o);
            }
            o
        })
        .collect();
    for (t, o) in tiles.iter().zip(&results) {
        for (qi, row) in t.clone().zip(o.chunks_exact(heads * hd)) {
            for (h, vals) in row.chunks_exact(hd).enumerate() {
                out[(h * n + qi) * hd..(h * n + qi + 1) * hd].copy_from_slice(vals);
            }
        }
    }
}

/// The running softmax of a tile's queries for one K/V head's group.
struct TileState {
    /// Query heads of the group times head_dim, per query: the queries.
    q: Vec<f32>,
    maxes: Vec<f32>,
    sums: Vec<f32>,
    acc: Vec<f32>,
    scores: Vec<f32>,
}

impl TileState {
    fn new(queries: usize, group: usize, hd: usize) -> Self {
        Self {
            q: vec![0.0; queries * group * hd],
            maxes: vec![0.0; queries * group],
            sums: vec![0.0; queries * group],
            acc: vec![0.0; queries * group * hd],
            scores: vec![0.0; group * BLOCK],
        }
    }
}

/// Tile `t` of queries over K/V head `g`, into `o` ([query][head][dim]).
#[allow(clippy::too_many_arguments)]
fn tile<T: Element, O: BlockOps<T>>(
    ops: &O,
    c: &Chunk<'_>,
    cache: &Typed<'_, T>,
    g: usize,
    t: Range<usize>,
    st: &mut TileState,
    o: &mut [f32],
) {
    let (group, hd, n) = (c.group, c.hd, c.n);
    let gw = group * hd;
    for (i, qi) in t.clone().enumerate() {
        for gq in 0..group {
            let h = g * group + gq;
            let src = &c.q[(h * n + qi) * hd..(h * n + qi + 1) * hd];
            st.q[i * gw + gq * hd..i * gw + (gq + 1) * hd].copy_from_slice(src);
        }
    }
    st.maxes.fill(f32::NEG_INFINITY);
    st.sums.fill(0.0);
    st.acc.fill(0.0);
    let lo = t.clone().map(|i| c.spans.of(i)[0].start).min().unwrap_or(0);
    let hi = t.clone().map(|i| c.spans.of(i).last().map_or(0, |r| r.end));
    let hi = hi.max().unwrap_or(0);
    let mut cursor: Vec<usize> = vec![0; t.len()];
    let mut gather = Gather::default();
    for b in (lo..hi).step_by(BLOCK) {
        let block = b..hi.min(b + BLOCK);
        for (i, qi) in t.clone().enumerate() {
            let spans = c.spans.of(qi);
            while cursor[i] < spans.len() && spans[cursor[i]].end <= block.start {
                cursor[i] += 1;
            }
            let mut s = cursor[i];
            while s < spans.len() && spans[s].start < block.end {
                let piece = spans[s].start.max(block.start)..spans[s].end.min(block.end);
                let state = QueryState {
                    q: &st.q[i * gw..(i + 1) * gw],
                    maxes: &mut st.maxes[i * group..(i + 1) * group],
                    sums: &mut st.sums[i * group..(i + 1) * group],
                    acc: &mut st.acc[i * gw..(i + 1) * gw],
                };
                let scores = &mut st.scores[..group * piece.len()];
                let rows = cache.block(g, piece.start, piece.len(), &mut gather);
                step(ops, c, state, rows, scores);
                s += 1;
            }
        }
    }
    let heads = c.spec.heads;
    for i in 0..t.len() {
        for gq in 0..group {
            let h = g * group + gq;
            let at = i * group + gq;
            let (keep, total) = c.spec.with_sink(h, st.maxes[at], st.sums[at]);
            let inv = keep / total;
            let dst = &mut o[(i * heads + h) * hd..(i * heads + h + 1) * hd];
            let acc = &st.acc[i * gw + gq * hd..i * gw + (gq + 1) * hd];
            dst.iter_mut().zip(acc).for_each(|(d, a)| *d = a * inv);
        }
    }
}

/// One query's running softmax over its group's heads.
struct QueryState<'a> {
    q: &'a [f32],
    maxes: &'a mut [f32],
    sums: &'a mut [f32],
    acc: &'a mut [f32],
}

/// One piece of consecutive rows into one query's running softmax.
fn step<T: Element, O: BlockOps<T>>(
    ops: &O,
    c: &Chunk<'_>,
    st: QueryState<'_>,
    (keys, values): (Rows<'_, T>, Rows<'_, T>),
    s: &mut [f32],
) {
    let (group, hd, cnt) = (c.group, c.hd, keys.count);
    ops.scores(st.q, group, keys, c.spec.scale, s);
    if let Some(cap) = c.spec.softcap {
        crate::ops::portable_softcap_in_place(s, cap);
    }
    for gq in 0..group {
        let sh = &mut s[gq * cnt..(gq + 1) * cnt];
        let old = st.maxes[gq];
        let m = sh.iter().fold(old, |m, &x| m.max(x));
        let keep = if old == f32::NEG_INFINITY {
            0.0
        } else {
            (old - m).exp()
        };
        if keep != 1.0 {
            st.sums[gq] *= keep;
            st.acc[gq * hd..(gq + 1) * hd]
                .iter_mut()
                .for_each(|a| *a *= keep);
        }
        st.sums[gq] += ops.exp_sum(sh, m);
        st.maxes[gq] = m;
    }
    ops.accumulate(s, group, values, st.acc);
}
