//! Layer-asymmetric KV cache: each layer holds only the tokens the policy
//! keeps there, at their original positions.

use candle_core::{DType, Tensor};

use crate::error::Result;

/// Keys and values of one layer, in position order.
#[derive(Debug)]
pub struct LayerCache {
    k: Option<Tensor>,
    v: Option<Tensor>,
    len: usize,
    reserved: usize,
    positions: Vec<usize>,
}

impl Default for LayerCache {
    fn default() -> Self {
        Self::new()
    }
}

impl LayerCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self {
            k: None,
            v: None,
            len: 0,
            reserved: 0,
            positions: Vec::new(),
        }
    }

    /// Number of tokens held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions of the held tokens, ascending.
    pub fn positions(&self) -> &[usize] {
        &self.positions
    }

    /// Ask for room for `extra` more tokens so that appending does not grow
    /// the buffers again (the engine knows prompt length and token budget).
    pub fn reserve(&mut self, extra: usize) {
        self.reserved = self.reserved.max(self.len + extra);
    }

    /// An independent copy: the tokens held are copied into buffers of its
    /// own (the spare room is not), so appending to the copy or to the
    /// original never writes into a buffer the other one reads. (Sharing a
    /// buffer with spare room, both would append into the same free slots.)
    pub fn fork(&self) -> Result<Self> {
        let held = |t: &Option<Tensor>| -> Result<Option<Tensor>> {
            match t {
                Some(t) if self.len > 0 => {
                    // `copy` keeps a view's layout (and the whole buffer
                    // behind it); a view of a buffer with spare room is
                    // strided, so compact it first
                    let held = t.narrow(1, 0, self.len)?;
                    Ok(Some(if held.is_contiguous() {
                        held.copy()?
                    } else {
                        held.contiguous()?
                    }))
                }
                _ => Ok(None),
            }
        };
        Ok(Self {
            k: held(&self.k)?,
            v: held(&self.v)?,
            len: self.len,
            reserved: self.reserved,
            positions: self.positions.clone(),
        })
    }

    /// Keys and values held, [kv_heads, len, head_dim] each, or None if empty.
    pub fn kv(&self) -> Result<Option<(Tensor, Tensor)>> {
        match (&self.k, &self.v) {
            (Some(k), Some(v)) if self.len > 0 => {
                Ok(Some((k.narrow(1, 0, self.len)?, v.narrow(1, 0, self.len)?)))
            }
            _ => Ok(None),
        }
    }

    /// The whole K and V buffers [kv_heads, capacity, head_dim] (rows past
    /// [`LayerCache::len`] are spare room), or None if empty.
    pub(crate) fn buffers(&self) -> Option<(&Tensor, &Tensor)> {
        match (&self.k, &self.v) {
            (Some(k), Some(v)) if self.len > 0 => Some((k, v)),
            _ => None,
        }
    }

    /// Bytes of K and V held (tokens held, not buffer capacity).
    pub fn bytes_held(&self) -> usize {
        match &self.k {
            Some(k) => {
                let (heads, _, dim) = k.dims3().unwrap_or((0, 0, 0));
                2 * heads * dim * self.len * k.dtype().size_in_bytes()
            }
            None => 0,
        }
    }

    /// Bytes of the buffers allocated (at least `bytes_held`).
    pub fn bytes_allocated(&self) -> usize {
        match &self.k {
            Some(k) => 2 * k.elem_count() * k.dtype().size_in_bytes(),
            None => 0,
        }
    }

    /// A copy holding only the tokens whose position satisfies `keep`.
    pub fn filtered(&self, keep: impl Fn(usize) -> bool) -> Result<Self> {
        let idx: Vec<u32> = (0..self.len as u32)
            .filter(|&i| keep(self.positions[i as usize]))
            .collect();
        let mut out = Self::new();
        out.reserved = self.reserved.saturating_sub(self.len - idx.len());
        // select from the whole buffers (contiguous; the indices are below
        // `len`): a view of the held part is not contiguous when the buffer
        // has spare room, and index_select needs contiguous input
        if let (Some(k), Some(v), false) = (&self.k, &self.v, idx.is_empty()) {
            let index = Tensor::new(idx.as_slice(), k.device())?;
            let positions: Vec<usize> = idx.iter().map(|&i| self.positions[i as usize]).collect();
            out.append(
                &k.index_select(&index, 1)?,
                &v.index_select(&index, 1)?,
                &positions,
            )?;
        }
        Ok(out)
    }

    /// Append `k`, `v` [kv_heads, n, head_dim] for tokens at `positions`
    /// (ascending and after every held position).
    pub fn append(&mut self, k: &Tensor, v: &Tensor, positions: &[usize]) -> Result<()> {
        let n = positions.len();
        if n == 0 {
            return Ok(());
        }
        debug_assert!(self.positions.last().is_none_or(|&p| p < positions[0]));
        let needed = self.len + n;
        let capacity = self.k.as_ref().map_or(0, |k| k.dim(1).unwrap_or(0));
        if needed > capacity {
            let new_cap = needed.max(self.reserved).max(capacity * 2);
            self.k = Some(grow(self.k.as_ref(), k, self.len, new_cap)?);
            self.v = Some(grow(self.v.as_ref(), v, self.len, new_cap)?);
        }
        if let (Some(kb), Some(vb)) = (&self.k, &self.v) {
            kb.slice_set(&k.contiguous()?, 1, self.len)?;
            vb.slice_set(&v.contiguous()?, 1, self.len)?;
        }
        self.len = needed;
        self.positions.extend_from_slice(positions);
        Ok(())
    }
}

/// A buffer of `cap` tokens holding the first `len` tokens of `old`.
fn grow(old: Option<&Tensor>, like: &Tensor, len: usize, cap: usize) -> Result<Tensor> {
    let (heads, _, dim) = like.dims3()?;
    let dtype: DType = like.dtype();
    let buf = Tensor::zeros((heads, cap, dim), dtype, like.device())?;
    if let Some(old) = old
        && len > 0
    {
        buf.slice_set(&old.narrow(1, 0, len)?.contiguous()?, 1, 0)?;
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn appends_in_order_and_counts_bytes() -> anyhow::Result<()> {
        let dev = Device::Cpu;
        let mut c = LayerCache::new();
        c.reserve(3);
        let a = Tensor::arange(0f32, 8., &dev)?.reshape((2, 2, 2))?;
        c.append(&a, &a, &[0, 1])?;
        let b = Tensor::arange(8f32, 12., &dev)?.reshape((2, 1, 2))?;
        c.append(&b, &b, &[5])?;
        c.append(&b, &b, &[6])?; // past the reservation: grows
        assert_eq!(c.positions(), &[0, 1, 5, 6]);
        assert_eq!(c.bytes_held(), 2 * 2 * 2 * 4 * 4);
        assert!(c.bytes_allocated() >= c.bytes_held());
        let (k, _) = c.kv()?.expect("non-empty");
        let k: Vec<Vec<Vec<f32>>> = k.to_vec3()?;
        assert_eq!(
            k[0],
            vec![vec![0., 1.], vec![2., 3.], vec![8., 9.], vec![8., 9.]]
        );
        assert_eq!(k[1][2], vec![10., 11.]);
        Ok(())
    }

    #[test]
    fn filtering_a_cache_with_spare_room_keeps_the_chosen_tokens() -> anyhow::Result<()> {
        let dev = Device::Cpu;
        let mut c = LayerCache::new();
        c.reserve(8); // buffers of 8 tokens, 3 held, 2 heads
        let x = Tensor::arange(0f32, 12., &dev)?.reshape((2, 3, 2))?;
        c.append(&x, &x, &[0, 4, 9])?;
        let f = c.filtered(|p| p != 4)?;
        assert_eq!(f.positions(), &[0, 9]);
        let (k, _) = f.kv()?.expect("non-empty");
        let k = k.to_vec3::<f32>()?;
        assert_eq!(k[0], vec![vec![0., 1.], vec![4., 5.]]);
        assert_eq!(k[1], vec![vec![6., 7.], vec![10., 11.]]);
        Ok(())
    }

    #[test]
    fn a_fork_and_its_original_append_independently() -> anyhow::Result<()> {
        let dev = Device::Cpu;
        let mut a = LayerCache::new();
        a.reserve(4); // room left after the first token: the buffer has spare capacity
        let x = Tensor::arange(0f32, 2., &dev)?.reshape((1, 1, 2))?;
        a.append(&x, &x, &[0])?;
        let mut b = a.fork()?;
        let ya = Tensor::new(&[[[10f32, 11.]]], &dev)?;
        let yb = Tensor::new(&[[[20f32, 21.]]], &dev)?;
        a.append(&ya, &ya, &[1])?;
        b.append(&yb, &yb, &[1])?;
        let (ka, _) = a.kv()?.expect("non-empty");
        let (kb, _) = b.kv()?.expect("non-empty");
        assert_eq!(ka.to_vec3::<f32>()?[0], vec![vec![0., 1.], vec![10., 11.]]);
        assert_eq!(kb.to_vec3::<f32>()?[0], vec![vec![0., 1.], vec![20., 21.]]);
        Ok(())
    }

    #[test]
    fn a_fork_of_a_cache_with_spare_room_can_be_filtered() -> anyhow::Result<()> {
        let dev = Device::Cpu;
        let mut c = LayerCache::new();
        c.reserve(8); // 2 heads: the held part of the buffer is a strided view
        let x = Tensor::arange(0f32, 12., &dev)?.reshape((2, 3, 2))?;
        c.append(&x, &x, &[0, 4, 9])?;
        let fork = c.fork()?;
        assert_eq!(fork.bytes_allocated(), fork.bytes_held());
        let f = fork.filtered(|p| p != 4)?;
        let (k, _) = f.kv()?.expect("non-empty");
        let k = k.to_vec3::<f32>()?;
        assert_eq!(k[0], vec![vec![0., 1.], vec![4., 5.]]);
        assert_eq!(k[1], vec![vec![6., 7.], vec![10., 11.]]);
        Ok(())
    }
}
