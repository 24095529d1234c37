//! The plan and arithmetic of lcut's fused CUDA attention
//! (`crates/lcut-model/cuda/flash_attention.cu`), on the CPU: its tile
//! sizes and shared-memory layout, the encoding of which keys each query
//! reads, how a launch splits its keys, and [`attend_tiled`], the kernel's
//! twin — the same row tiles, key-tile skipping, online softmax with the
//! probabilities rounded to the storage type before the value product,
//! splits and their merge — so that CI tests the algorithm the GPU runs.
//!
//! Rows: a block holds one K/V head and [`ROW_TILE`] of its `group * n`
//! rows; row `r` is query head `g * group + r / n` at query `r % n`.

use half::{bf16, f16};

use super::{AttentionSpec, QuerySpans};
use crate::error::{KernelError, Result, check_len};

/// Rows (query head and query pairs) per block.
pub const ROW_TILE: usize = 64;

/// Threads per block (four warps of 16 rows).
pub const THREADS: usize = 128;

/// Head dims the kernel is built for.
pub const HEAD_DIMS: [usize; 7] = [16, 32, 64, 80, 96, 128, 256];

/// Keys per tile for `head_dim` (fewer for wide heads, to fit shared memory).
pub fn key_tile(head_dim: usize) -> usize {
    if head_dim <= 128 { 64 } else { 32 }
}

/// Dynamic shared memory of one block, in bytes, for 16-bit inputs: the
/// query tile, one key and one value tile (rows padded by 8), the scores
/// (f32), probabilities (16-bit) and output accumulators (f32) of four
/// warps of 16 rows. The kernel lays them out in this order.
pub fn shared_bytes(head_dim: usize) -> usize {
    let bc = key_tile(head_dim);
    let padded = head_dim + 8;
    let warps_rows = 4 * 16;
    2 * (ROW_TILE * padded + 2 * bc * padded)
        + 4 * warps_rows * (bc + 4)
        + 2 * warps_rows * (bc + 8)
        + 4 * warps_rows * (head_dim + 4)
}

/// Which keys each query reads, as the kernel takes it: the offsets of
/// each query's spans [n + 1], then the spans as (start, end) pairs.
pub fn encode_reads(spans: &QuerySpans) -> Result<Vec<u32>> {
    let n = spans.queries();
    let mut offsets = Vec::with_capacity(n + 1);
    let mut pairs = Vec::new();
    offsets.push(0u32);
    let narrow = |x: usize| {
        u32::try_from(x).map_err(|_| KernelError::Heads(format!("key index {x} past u32")))
    };
    for i in 0..n {
        for r in spans.of(i) {
            pairs.push(narrow(r.start)?);
            pairs.push(narrow(r.end)?);
        }
        offsets.push(narrow(pairs.len() / 2)?);
    }
    offsets.extend(pairs);
    Ok(offsets)
}

/// How many parts a launch of `blocks` blocks splits each block's keys
/// into, on a GPU of `processors` multiprocessors: enough blocks for two
/// per processor, each part at least four key tiles (a decode step's few
/// rows over a long cache get many parts; a prefill chunk gets one).
pub fn key_splits(blocks: usize, keys: usize, head_dim: usize, processors: usize) -> usize {
    let target = 2 * processors.max(1);
    if blocks >= target {
        return 1;
    }
    let tiles = keys.div_ceil(key_tile(head_dim));
    target.div_ceil(blocks.max(1)).min(tiles / 4).max(1)
}

/// The 16-bit type the kernel's inputs and probabilities are stored in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storage16 {
    /// bf16.
    Bf16,
    /// f16.
    F16,
}

impl Storage16 {
    /// `x` rounded to this type.
    pub fn round(self, x: f32) -> f32 {
        match self {
            Self::Bf16 => bf16::from_f32(x).to_f32(),
            Self::F16 => f16::from_f32(x).to_f32(),
        }
    }

    /// One unit of this type's rounding (2^-8 for bf16, 2^-11 for f16): what
    /// the fused kernel and its twin are held to, relative to the largest
    /// value, since they round the probabilities and the output to it.
    pub fn unit(self) -> f64 {
        match self {
            Self::Bf16 => 1.0 / 256.0,
            Self::F16 => 1.0 / 2048.0,
        }
    }
}

/// The shapes of one [`attend_tiled`] call.
#[derive(Debug, Clone, Copy)]
pub struct TiledShape {
    /// Queries per head.
    pub n: usize,
    /// Keys held per K/V head.
    pub keys: usize,
    /// K/V heads.
    pub kv_heads: usize,
    /// Values per head.
    pub head_dim: usize,
    /// Parts each block's keys are split into ([`key_splits`]).
    pub splits: usize,
}

/// One row's running softmax: maximum, sum and unnormalised output.
struct RowState {
    m: f32,
    l: f32,
    o: Vec<f32>,
}

/// The fused kernel's attention on the CPU: `q` [heads, n, head_dim], `k`
/// and `v` [kv_heads, keys, head_dim] (values of `storage`), `reads` from
/// [`encode_reads`]. Writes the output [heads, n, head_dim] (rounded to
/// `storage`) and each row's log-sum-exp [heads, n] (the sink included).
#[allow(clippy::too_many_arguments)]
pub fn attend_tiled(
    spec: &AttentionSpec<'_>,
    storage: Storage16,
    shape: TiledShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    reads: &[u32],
    out: &mut [f32],
    lse: &mut [f32],
) -> Result<()> {
    let TiledShape {
        n,
        keys,
        kv_heads,
        head_dim: hd,
        splits,
    } = shape;
    if kv_heads == 0 || !spec.heads.is_multiple_of(kv_heads) || splits == 0 {
        return Err(KernelError::Heads(format!(
            "{} query heads over {kv_heads} K/V heads in {splits} splits",
            spec.heads
        )));
    }
    check_len("tiled queries", spec.heads * n * hd, q.len())?;
    check_len("tiled keys", kv_heads * keys * hd, k.len())?;
    check_len("tiled values", kv_heads * keys * hd, v.len())?;
    check_len("tiled output", spec.heads * n * hd, out.len())?;
    check_len("tiled log-sum-exp", spec.heads * n, lse.len())?;
    spec.check_sinks()?;
    let spans_of = |i: usize| -> Vec<(usize, usize)> {
        let (a, b) = (reads[i] as usize, reads[i + 1] as usize);
        (a..b)
            .map(|s| {
                let p = n + 1 + 2 * s;
                (reads[p] as usize, reads[p + 1] as usize)
            })
            .collect()
    };
    let group = spec.heads / kv_heads;
    let rows = group * n;
    let bc = key_tile(hd);
    // per split, per (head, query) row: its partial state
    let mut parts: Vec<Vec<RowState>> = Vec::with_capacity(splits);
    for split in 0..splits {
        let mut states: Vec<RowState> = (0..spec.heads * n)
            .map(|_| RowState {
                m: f32::NEG_INFINITY,
                l: 0.0,
                o: vec![0.0; hd],
            })
            .collect();
        for g in 0..kv_heads {
            for row0 in (0..rows).step_by(ROW_TILE) {
                let tile_rows = row0..rows.min(row0 + ROW_TILE);
                // the union of the tile's spans, in whole key tiles
                let (mut lo, mut hi) = (usize::MAX, 0);
                for r in tile_rows.clone() {
                    let s = spans_of(r % n);
                    if let (Some(first), Some(last)) = (s.first(), s.last()) {
                        lo = lo.min(first.0);
                        hi = hi.max(last.1);
                    }
                }
                let (t_lo, t_hi) = match hi > lo {
                    true => (lo / bc, hi.div_ceil(bc)),
                    false => (0, 0),
                };
                let per = (t_hi - t_lo).div_ceil(splits);
                let begin = t_lo + split * per;
                let end = t_hi.min(begin + per);
                for r in tile_rows {
                    let (head, i) = (g * group + r / n, r % n);
                    let spans = spans_of(i);
                    let qrow = &q[(head * n + i) * hd..(head * n + i + 1) * hd];
                    let st = &mut states[head * n + i];
                    for t in begin..end {
                        tile_update(
                            spec,
                            storage,
                            (k, v),
                            (g, keys, hd),
                            qrow,
                            &spans,
                            t * bc..(t + 1) * bc,
                            st,
                        );
                    }
                }
            }
        }
        parts.push(states);
    }
    for row in 0..spec.heads * n {
        let head = row / n;
        let mut top = parts
            .iter()
            .map(|p| p[row].m)
            .fold(f32::NEG_INFINITY, f32::max);
        let sink = spec.sinks.map(|s| s[head]);
        if let Some(s) = sink {
            top = top.max(s);
        }
        let mut total = sink.map_or(0.0, |s| (s - top).exp());
        let weights: Vec<f32> = parts
            .iter()
            .map(|p| match p[row].m {
                f32::NEG_INFINITY => 0.0,
                m => (m - top).exp(),
            })
            .collect();
        for (p, w) in parts.iter().zip(&weights) {
            total += p[row].l * w;
        }
        for d in 0..hd {
            let acc: f32 = parts
                .iter()
                .zip(&weights)
                .map(|(p, w)| p[row].o[d] * w)
                .sum();
            out[row * hd + d] = storage.round(acc / total);
        }
        lse[row] = top + total.ln();
    }
    Ok(())
}

/// One key tile `cols` of one row: masked, scaled, capped scores, the
/// running maximum and sum moved on, the probabilities rounded to the
/// storage type and their values added.
#[allow(clippy::too_many_arguments)]
fn tile_update(
    spec: &AttentionSpec<'_>,
    storage: Storage16,
    (k, v): (&[f32], &[f32]),
    (g, keys, hd): (usize, usize, usize),
    qrow: &[f32],
    spans: &[(usize, usize)],
    cols: std::ops::Range<usize>,
    st: &mut RowState,
) {
    let scores: Vec<f32> = cols
        .clone()
        .map(|key| {
            if key >= keys || !spans.iter().any(|&(a, b)| key >= a && key < b) {
                return f32::NEG_INFINITY;
            }
            let krow = &k[(g * keys + key) * hd..(g * keys + key + 1) * hd];
            let mut s = qrow.iter().zip(krow).map(|(a, b)| a * b).sum::<f32>() * spec.scale;
            if let Some(c) = spec.softcap {
                s = c * (s / c).tanh();
            }
            s
        })
        .collect();
    let mx = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let m_new = st.m.max(mx);
    let alpha = if m_new == f32::NEG_INFINITY {
        1.0
    } else {
        (st.m - m_new).exp()
    };
    let mut sum = 0.0;
    for o in &mut st.o {
        *o *= alpha;
    }
    for (key, s) in cols.zip(scores) {
        if s == f32::NEG_INFINITY {
            continue;
        }
        let p = (s - m_new).exp();
        sum += p;
        let p16 = storage.round(p);
        let vrow = &v[(g * keys + key) * hd..(g * keys + key + 1) * hd];
        for (o, x) in st.o.iter_mut().zip(vrow) {
            *o += p16 * x;
        }
    }
    st.l = st.l * alpha + sum;
    st.m = m_new;
}
