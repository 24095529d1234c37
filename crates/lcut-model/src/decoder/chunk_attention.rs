//! A prefill chunk's attention by lcut's kernel
//! ([`lcut_kernels::attention::attend_chunk`]): each query reads only the
//! cache rows the key planner ([`KeyPlanner`]) gives it, in place in the cache's buffers (f32,
//! f16 or bf16), without a score matrix or a mask tensor; one call per
//! group of K/V heads that hold the same rows under the same rule.
//!
//! [`ChunkKernel::applies`] is the rule for when it runs; everything else
//! (a probe that wants the attention rows, a GPU, activations narrower than
//! f32, keys out of position order, a query that sees no key) takes the
//! tensor path.

use candle_core::{DType, Device, Tensor};
use lcut_kernels::Isa;
use lcut_kernels::attention::{AttentionSpec, attend_chunk};

use super::Decoder;
use super::step::with_group_view;
use crate::cache::LayerCache;
use crate::error::Result;
use crate::sequence::Sequence;
use lcut_policy::keys::{KeyPlanner, KeyQuery};

/// When a chunk's attention runs on the kernel.
pub(super) struct ChunkKernel;

impl ChunkKernel {
    /// The kernel runs for a chunk whose queries `q` are f32 on the CPU
    /// when no probe asks for the attention rows.
    pub(super) fn applies(device: &Device, q: &Tensor, probe_wants_rows: bool) -> bool {
        device.is_cpu() && q.dtype() == DType::F32 && !probe_wants_rows
    }
}

impl Decoder {
    /// Layer `l`'s attention of the chunk's queries `q` [heads, n, head_dim]
    /// at `present` over the rows of `cache` each reads, or `None` when a
    /// query sees no key or a group's keys are out of position order (the
    /// tensor path then runs).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attend_chunk_cached(
        &self,
        l: usize,
        window: Option<usize>,
        q: &Tensor,
        cache: &LayerCache,
        present: &[usize],
        seq: &Sequence,
        reads: &mut KeyPlanner,
    ) -> Result<Option<Tensor>> {
        let kv_heads = self.layers[l].attn.num_kv_heads();
        let ask = KeyQuery {
            layer: l,
            window,
            queries: present,
            kv_heads,
            own_rows: self.sharing.kept_by_own_rule(l),
        };
        let groups = reads.plan(seq.rule.as_ref(), &ask, cache);
        let sorted = groups
            .iter()
            .all(|g| cache.group_positions(g.rows).is_sorted());
        if !sorted || groups.iter().any(|g| !g.complete) {
            return Ok(None);
        }
        let (heads, n, hd) = q.dims3()?;
        let group_size = heads / kv_heads;
        let qs = q.flatten_all()?.to_vec1::<f32>()?;
        let mut out = vec![0f32; heads * n * hd];
        let sinks: Option<Vec<f32>> = self.layers[l]
            .attn
            .sinks()
            .map(|s| s.to_vec1::<f32>())
            .transpose()?;
        for g in groups {
            let head_range = g.heads.start * group_size..g.heads.end * group_size;
            let spec = AttentionSpec {
                heads: g.heads.len() * group_size,
                scale: self.cfg.attn_scale as f32,
                softcap: self.cfg.attn_softcap.map(|c| c as f32),
                sinks: sinks.as_deref().map(|s| &s[head_range]),
            };
            let part = g.heads.start * group_size * n * hd..g.heads.end * group_size * n * hd;
            let done = with_group_view(cache, g.heads.clone(), |view| {
                let Some(view) = view else { return Ok(false) };
                attend_chunk(
                    Isa::detect(),
                    &spec,
                    &qs[part.clone()],
                    view,
                    &g.spans,
                    &mut out[part.clone()],
                )?;
                Ok(true)
            })?;
            if !done {
                return Ok(None);
            }
        }
        Ok(Some(Tensor::from_vec(out, (heads, n, hd), &Device::Cpu)?))
    }
}
