//! A prefill chunk's attention by lcut's kernel
//! ([`lcut_kernels::attention::attend_chunk`]): each query reads only the
//! cache rows its layer shows it, in place in the cache's buffers (f32, f16
//! or bf16), without a score matrix or a mask tensor.
//!
//! [`ChunkKernel::applies`] is the rule for when it runs; everything else
//! (a probe that wants the attention rows, a GPU, activations narrower than
//! f32, a cache that does not hold every key the chunk reads, keys out of
//! position order, a query that sees no key) takes the tensor path.

use candle_core::{DType, Device, Tensor};
use lcut_kernels::Isa;
use lcut_kernels::attention::{AttentionSpec, QuerySpans, attend_chunk};

use super::Decoder;
use super::step::with_cache_view;
use crate::cache::LayerCache;
use crate::error::Result;
use crate::sequence::Sequence;

/// The rows each query read at the previous layer, kept while the next
/// layer shows the same keys to the same queries under the same rule.
#[derive(Debug, Default)]
pub(super) struct ChunkSpans {
    key: Option<SpansKey>,
    spans: QuerySpans,
    /// Whether every query of the kept spans reads at least one row.
    complete: bool,
}

/// What the kept spans depend on: the rule class, the window, the query
/// positions and the key positions.
type SpansKey = (usize, Option<usize>, Vec<usize>, Vec<usize>);

/// When a chunk's attention runs on the kernel.
pub(super) struct ChunkKernel;

impl ChunkKernel {
    /// The kernel runs for a chunk whose queries `q` are f32 on the CPU
    /// when no probe asks for the attention rows (asked where the chunk's
    /// keys are every row of the layer's cache; a cache that keeps only
    /// some of the chunk's rows takes the tensor path).
    pub(super) fn applies(device: &Device, q: &Tensor, probe_wants_rows: bool) -> bool {
        device.is_cpu() && q.dtype() == DType::F32 && !probe_wants_rows
    }
}

impl Decoder {
    /// Layer `l`'s attention of the chunk's queries `q` [heads, n, head_dim]
    /// at `present` over every row of `cache`, or `None` when a query sees
    /// no key or the cache's keys are out of position order (the tensor
    /// path then runs).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attend_chunk_cached(
        &self,
        l: usize,
        window: Option<usize>,
        q: &Tensor,
        cache: &LayerCache,
        present: &[usize],
        seq: &Sequence,
        memo: &mut ChunkSpans,
    ) -> Result<Option<Tensor>> {
        let keys = cache.positions();
        if !keys.is_sorted() || !query_spans(seq, l, window, present, keys, memo) {
            return Ok(None);
        }
        let (heads, n, hd) = q.dims3()?;
        let spec = AttentionSpec {
            heads,
            scale: self.cfg.attn_scale as f32,
            softcap: self.cfg.attn_softcap.map(|c| c as f32),
        };
        let qs = q.flatten_all()?.to_vec1::<f32>()?;
        let mut out = vec![0f32; heads * n * hd];
        let done = with_cache_view(cache, self.cfg.num_kv_heads, |view| {
            let Some(view) = view else { return Ok(false) };
            attend_chunk(Isa::detect(), &spec, &qs, view, &memo.spans, &mut out)?;
            Ok(true)
        })?;
        if !done {
            return Ok(None);
        }
        Ok(Some(Tensor::from_vec(out, (heads, n, hd), &Device::Cpu)?))
    }
}

/// The cache rows (indices into `keys`) each query at `present` reads at
/// layer `l`, into `memo`: keys at or before the query, inside the window,
/// and those the policy shows it (asked key by key unless the layer's rule
/// shows every earlier key). False when a query reads no row.
fn query_spans(
    seq: &Sequence,
    l: usize,
    window: Option<usize>,
    present: &[usize],
    keys: &[usize],
    memo: &mut ChunkSpans,
) -> bool {
    let class = seq.rule.rule_class(l);
    if let Some((c, w, q, k)) = &memo.key
        && *c == class
        && *w == window
        && q == present
        && k == keys
    {
        return memo.complete;
    }
    memo.spans.clear();
    let mut complete = true;
    let mut spans = Vec::new();
    for &pos in present {
        let first = window.map_or(0, |w| keys.partition_point(|&k| k + w <= pos));
        let end = keys.partition_point(|&k| k <= pos);
        spans.clear();
        if class == 0 {
            spans.push(first..end.max(first));
        } else {
            let mut open: Option<usize> = None;
            for (i, &k) in keys.iter().enumerate().take(end).skip(first) {
                match (seq.key_visible(l, pos, k), open) {
                    (true, None) => open = Some(i),
                    (false, Some(start)) => {
                        spans.push(start..i);
                        open = None;
                    }
                    _ => {}
                }
            }
            if let Some(start) = open {
                spans.push(start..end);
            }
        }
        complete &= spans.iter().any(|r| !r.is_empty());
        memo.spans.push_query(spans.iter().cloned());
    }
    memo.key = Some((class, window, present.to_vec(), keys.to_vec()));
    memo.complete = complete;
    complete
}
