//! Layer-asymmetric KV cache: each layer holds only the tokens the policy
//! keeps there, at their original positions. Where a policy keeps different
//! tokens for different K/V heads of a layer, the layer's cache is split:
//! each head holds its own rows, so bytes held are what each head keeps,
//! never masked rows. Rows no later query reads (older than a sliding
//! window, or prompt rows a policy drops once the prompt has run) leave the
//! cache: from the front in place, from the middle by a copy.

use std::ops::Range;

use candle_core::{DType, Tensor};

use crate::error::Result;

/// Rows of a buffer that another cache owns, read by index: a fork's
/// prompt rows, held once for every policy forked from one run.
#[derive(Debug, Clone)]
struct SharedPart {
    /// Keys of the whole buffer [buffer heads, capacity, head_dim].
    k: Tensor,
    /// Values of the whole buffer.
    v: Tensor,
    /// First of the buffer's heads that are this group's heads.
    first_head: usize,
    /// This group's heads.
    heads: usize,
    /// The buffer row of each shared row held, in position order.
    rows: Vec<u32>,
}

impl SharedPart {
    /// The part's rows as a tensor of their own [heads, rows, head_dim]
    /// (a copy).
    fn gathered(&self, t: &Tensor) -> Result<Tensor> {
        let index = Tensor::new(self.rows.as_slice(), t.device())?;
        Ok(t.narrow(0, self.first_head, self.heads)?
            .index_select(&index, 1)?)
    }
}

/// Rows held by a set of K/V heads that hold the same tokens: rows read
/// from a buffer shared with other caches (where the cache was forked from
/// another), then rows of its own, keys and values [heads, capacity,
/// head_dim] with rows `start..start + len` live; all in position order.
#[derive(Debug)]
struct Rows {
    shared: Option<SharedPart>,
    k: Option<Tensor>,
    v: Option<Tensor>,
    /// First live row of the own buffers (rows dropped from the front before it).
    start: usize,
    /// Live rows of the own buffers.
    len: usize,
    /// Rows (shared and own) room is asked for.
    reserved: usize,
    /// Positions of the shared rows, then of the own rows.
    positions: Vec<usize>,
}

impl Rows {
    fn new() -> Self {
        Self {
            shared: None,
            k: None,
            v: None,
            start: 0,
            len: 0,
            reserved: 0,
            positions: Vec::new(),
        }
    }

    /// Rows read from the shared buffer.
    fn shared_len(&self) -> usize {
        self.shared.as_ref().map_or(0, |s| s.rows.len())
    }

    /// Rows held: shared, then own.
    fn held(&self) -> usize {
        self.shared_len() + self.len
    }

    fn capacity(&self) -> usize {
        self.k.as_ref().map_or(0, |k| k.dim(1).unwrap_or(0))
    }

    /// Heads, head width and bytes per value of the rows held.
    fn shape(&self) -> Option<(usize, usize, usize)> {
        if let Some(k) = &self.k {
            let (heads, _, dim) = k.dims3().ok()?;
            return Some((heads, dim, k.dtype().size_in_bytes()));
        }
        let s = self.shared.as_ref()?;
        let (_, _, dim) = s.k.dims3().ok()?;
        Some((s.heads, dim, s.k.dtype().size_in_bytes()))
    }

    /// Bytes of the keys and values held, shared rows included (what this
    /// cache's policy holds, as if alone).
    fn bytes_held(&self) -> usize {
        self.shape()
            .map_or(0, |(heads, dim, size)| 2 * heads * dim * self.held() * size)
    }

    /// Bytes of the buffers this cache allocated (a shared buffer is its
    /// owner's).
    fn bytes_allocated(&self) -> usize {
        match &self.k {
            Some(k) => 2 * k.elem_count() * k.dtype().size_in_bytes(),
            None => 0,
        }
    }

    fn live(&self, t: &Option<Tensor>) -> Result<Option<Tensor>> {
        match t {
            Some(t) if self.len > 0 => Ok(Some(t.narrow(1, self.start, self.len)?)),
            _ => Ok(None),
        }
    }

    /// The live own rows of buffer `t` at indices `idx` (of the live rows),
    /// of the heads `heads` of the buffer (every head when `None`), as a
    /// buffer of their own.
    fn own_rows(&self, t: &Tensor, idx: &[u32], heads: &Option<Range<usize>>) -> Result<Tensor> {
        // select from the whole buffers (contiguous): a view of the live part
        // is not contiguous when the buffer has spare room, and index_select
        // needs contiguous input
        let rows: Vec<u32> = idx.iter().map(|&i| i + self.start as u32).collect();
        let index = Tensor::new(rows.as_slice(), t.device())?;
        let t = t.index_select(&index, 1)?;
        Ok(match heads {
            Some(h) if h.len() != t.dim(0)? => t.narrow(0, h.start, h.len())?,
            _ => t,
        })
    }

    /// A copy that reads the rows held without copying them: the shared
    /// rows from their buffer, and this cache's own live rows from its
    /// buffers, which become shared (rows past them are written by this
    /// cache only, never read by the copy). Where this cache holds both, its
    /// own rows are copied (a copy reads one shared buffer).
    fn fork(&self) -> Result<Self> {
        let all: Vec<usize> = (0..self.held()).collect();
        self.pick(None, &all, true)
    }

    /// A copy of the rows held at indices `idx` (of the rows held,
    /// ascending), of the heads `heads` of the buffer (every head when
    /// `None`). Shared rows stay shared; own rows are shared when `share`
    /// and this cache reads no shared buffer, else copied.
    fn pick(&self, heads: Option<Range<usize>>, idx: &[usize], share: bool) -> Result<Self> {
        let ns = self.shared_len();
        let split = idx.partition_point(|&i| i < ns);
        let (from_shared, from_own) = idx.split_at(split);
        let own_idx: Vec<u32> = from_own.iter().map(|&i| (i - ns) as u32).collect();
        let narrow = |first: usize, count: usize| match &heads {
            Some(h) if h.len() != count => (first + h.start, h.len()),
            _ => (first, count),
        };
        let mut out = Self::new();
        out.reserved = self.reserved.saturating_sub(self.held() - idx.len());
        out.shared = match (&self.shared, &self.k, &self.v) {
            (Some(s), _, _) if !from_shared.is_empty() => {
                let (first_head, heads) = narrow(s.first_head, s.heads);
                Some(SharedPart {
                    k: s.k.clone(),
                    v: s.v.clone(),
                    first_head,
                    heads,
                    rows: from_shared.iter().map(|&i| s.rows[i]).collect(),
                })
            }
            (None, Some(k), Some(v)) if share && !own_idx.is_empty() => {
                let (first_head, heads) = narrow(0, k.dim(0)?);
                Some(SharedPart {
                    k: k.clone(),
                    v: v.clone(),
                    first_head,
                    heads,
                    rows: own_idx.iter().map(|&i| i + self.start as u32).collect(),
                })
            }
            _ => None,
        };
        out.positions = from_shared.iter().map(|&i| self.positions[i]).collect();
        let own_shared = self.shared.is_none() && share;
        if let (Some(k), Some(v), false, false) = (&self.k, &self.v, own_idx.is_empty(), own_shared)
        {
            let positions: Vec<usize> = own_idx
                .iter()
                .map(|&i| self.positions[ns + i as usize])
                .collect();
            out.append(
                &self.own_rows(k, &own_idx, &heads)?,
                &self.own_rows(v, &own_idx, &heads)?,
                &positions,
            )?;
        } else if own_shared {
            out.positions
                .extend(own_idx.iter().map(|&i| self.positions[ns + i as usize]));
        }
        Ok(out)
    }

    /// A copy of the rows held whose position satisfies `keep`, of the
    /// heads `heads` of the buffer (every head when `None`); own rows shared
    /// as [`Rows::pick`] says.
    fn select(
        &self,
        heads: Option<Range<usize>>,
        keep: impl Fn(usize) -> bool,
        share: bool,
    ) -> Result<Self> {
        let idx: Vec<usize> = (0..self.held())
            .filter(|&i| keep(self.positions[i]))
            .collect();
        self.pick(heads, &idx, share)
    }

    /// Drop the rows held at positions below `first`, in place.
    fn drop_below(&mut self, first: usize) {
        let n = self.positions.partition_point(|&p| p < first);
        if n == 0 {
            return;
        }
        self.positions.drain(..n);
        // the room asked for counted the rows dropped
        self.reserved = self.reserved.saturating_sub(n);
        let ns = self.shared_len();
        if let Some(s) = &mut self.shared {
            s.rows.drain(..n.min(ns));
            if s.rows.is_empty() {
                self.shared = None;
            }
        }
        let own = n.saturating_sub(ns);
        self.start += own;
        self.len -= own;
        if self.len == 0 {
            self.start = 0;
        }
    }

    fn append(&mut self, k: &Tensor, v: &Tensor, positions: &[usize]) -> Result<()> {
        let n = positions.len();
        if n == 0 {
            return Ok(());
        }
        debug_assert!(self.positions.last().is_none_or(|&p| p < positions[0]));
        let capacity = self.capacity();
        if self.start + self.len + n > capacity {
            // rows dropped from the front leave room to reuse: move the live
            // rows to the front of a buffer of the same size when they fit
            let needed = self.len + n;
            let new_cap = if needed <= capacity {
                capacity
            } else {
                let reserved = self.reserved.saturating_sub(self.shared_len());
                needed.max(reserved).max(capacity * 2)
            };
            self.k = Some(regrow(self.k.as_ref(), k, self.start, self.len, new_cap)?);
            self.v = Some(regrow(self.v.as_ref(), v, self.start, self.len, new_cap)?);
            self.start = 0;
        }
        if let (Some(kb), Some(vb)) = (&self.k, &self.v) {
            let at = self.start + self.len;
            kb.slice_set(&k.contiguous()?, 1, at)?;
            vb.slice_set(&v.contiguous()?, 1, at)?;
        }
        self.len += n;
        self.positions.extend_from_slice(positions);
        Ok(())
    }

    /// Keys and values of every row held [heads, rows, head_dim]: the
    /// shared rows gathered before the own live rows (copies where rows are
    /// shared, views of the own buffers otherwise).
    fn kv(&self) -> Result<Option<(Tensor, Tensor)>> {
        let own = match (self.live(&self.k)?, self.live(&self.v)?) {
            (Some(k), Some(v)) => Some((k, v)),
            _ => None,
        };
        let Some(s) = &self.shared else {
            return Ok(own);
        };
        let (sk, sv) = (s.gathered(&s.k)?, s.gathered(&s.v)?);
        Ok(Some(match own {
            Some((k, v)) => (Tensor::cat(&[&sk, &k], 1)?, Tensor::cat(&[&sv, &v], 1)?),
            None => (sk, sv),
        }))
    }
}

/// A buffer of `cap` rows holding the `len` rows of `old` from `start`.
fn regrow(
    old: Option<&Tensor>,
    like: &Tensor,
    start: usize,
    len: usize,
    cap: usize,
) -> Result<Tensor> {
    let (heads, _, dim) = like.dims3()?;
    let dtype: DType = like.dtype();
    let buf = Tensor::zeros((heads, cap, dim), dtype, like.device())?;
    if let Some(old) = old
        && len > 0
    {
        buf.slice_set(&old.narrow(1, start, len)?.contiguous()?, 1, 0)?;
    }
    Ok(buf)
}

/// One group of a layer's K/V heads that hold the same rows, as the
/// attention kernels read it: the rows read from a shared buffer, then the
/// cache's own live rows.
#[derive(Debug, Clone, Copy)]
pub struct GroupBuffers<'a> {
    /// The rows read from a buffer another cache owns, when there are any.
    pub shared: Option<SharedBuffers<'a>>,
    /// The cache's own live rows, when there are any.
    pub own: Option<OwnBuffers<'a>>,
}

/// A group's own rows: the whole buffers [heads of the buffer, capacity,
/// head_dim], the group's heads among the buffer's, and the live rows.
#[derive(Debug, Clone, Copy)]
pub struct OwnBuffers<'a> {
    /// Keys, the whole buffer.
    pub k: &'a Tensor,
    /// Values, the whole buffer.
    pub v: &'a Tensor,
    /// The group's heads among the buffer's heads.
    pub heads: (usize, usize),
    /// First live row.
    pub start: usize,
    /// Live rows.
    pub len: usize,
}

/// A group's shared rows: the whole shared buffers [heads of the buffer,
/// capacity, head_dim], the group's heads among the buffer's, and the
/// buffer row of each row held.
#[derive(Debug, Clone, Copy)]
pub struct SharedBuffers<'a> {
    /// Keys, the whole shared buffer.
    pub k: &'a Tensor,
    /// Values, the whole shared buffer.
    pub v: &'a Tensor,
    /// The group's heads among the buffer's heads.
    pub heads: (usize, usize),
    /// The buffer row of each shared row held, in position order.
    pub rows: &'a [u32],
}

/// Keys and values of one layer, in position order.
#[derive(Debug)]
pub struct LayerCache {
    /// One group holding every K/V head's rows (shared), or one group per
    /// K/V head (split).
    groups: Vec<Rows>,
    /// Rows at positions below this were checked against what the policy
    /// keeps once the prompt has run.
    checked_below: usize,
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
            groups: vec![Rows::new()],
            checked_below: 0,
        }
    }

    /// Whether each K/V head holds its own rows.
    pub fn is_split(&self) -> bool {
        self.groups.len() > 1
    }

    /// Number of tokens held (by the head that holds the most, when split).
    pub fn len(&self) -> usize {
        self.groups.iter().map(Rows::held).max().unwrap_or(0)
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.groups.iter().all(|g| g.held() == 0)
    }

    /// Positions of the held tokens, ascending (the first head's, when the
    /// cache is split: see [`LayerCache::head_positions`]).
    pub fn positions(&self) -> &[usize] {
        &self.groups[0].positions
    }

    /// Positions of the tokens K/V head `head` holds, ascending.
    pub fn head_positions(&self, head: usize) -> &[usize] {
        match self.is_split() {
            true => self.groups.get(head).map_or(&[], |g| &g.positions),
            false => &self.groups[0].positions,
        }
    }

    /// Ask for room for `extra` more tokens so that appending does not grow
    /// the buffers again (the engine knows prompt length and token budget).
    pub fn reserve(&mut self, extra: usize) {
        for g in &mut self.groups {
            g.reserved = g.reserved.max(g.held() + extra);
        }
    }

    /// A copy to continue apart: it reads the rows held without copying
    /// them (from this cache's buffers, which both then read; this cache
    /// writes only past those rows, and the copy into buffers of its own),
    /// so appending to the copy or to the original never changes a row the
    /// other one reads. A fork of a fork reads the same shared buffer.
    pub fn fork(&self) -> Result<Self> {
        Ok(Self {
            groups: self
                .groups
                .iter()
                .map(Rows::fork)
                .collect::<Result<Vec<_>>>()?,
            checked_below: self.checked_below,
        })
    }

    /// Keys and values held, [kv_heads, len, head_dim] each, or None if
    /// empty or split (see [`LayerCache::group_kv`]).
    pub fn kv(&self) -> Result<Option<(Tensor, Tensor)>> {
        if self.is_split() {
            return Ok(None);
        }
        self.group_kv(0)
    }

    /// The keys and values held by row group `group` (the whole cache when
    /// shared, K/V head `group` when split), [heads, len, head_dim]: rows
    /// read from a shared buffer are gathered into a copy.
    pub fn group_kv(&self, group: usize) -> Result<Option<(Tensor, Tensor)>> {
        match self.groups.get(group) {
            Some(g) => g.kv(),
            None => Ok(None),
        }
    }

    /// Row groups: 1 when shared, one per K/V head when split.
    pub fn groups(&self) -> usize {
        self.groups.len()
    }

    /// Positions held by row group `group`.
    pub(crate) fn group_positions(&self, group: usize) -> &[usize] {
        self.groups.get(group).map_or(&[], |g| &g.positions)
    }

    /// The buffers of K/V heads `heads` as the kernels read them: from the
    /// shared rows, or from the split cache's group of head `heads.start`
    /// (one head). `None` when those heads hold nothing.
    pub(crate) fn buffers(&self, heads: Range<usize>) -> Option<GroupBuffers<'_>> {
        let (g, within) = match self.is_split() {
            true => (self.groups.get(heads.start)?, (0, 1)),
            false => (&self.groups[0], (heads.start, heads.end)),
        };
        let own = match (&g.k, &g.v) {
            (Some(k), Some(v)) if g.len > 0 => Some(OwnBuffers {
                k,
                v,
                heads: within,
                start: g.start,
                len: g.len,
            }),
            _ => None,
        };
        let shared = g.shared.as_ref().map(|s| SharedBuffers {
            k: &s.k,
            v: &s.v,
            heads: (s.first_head + within.0, s.first_head + within.1),
            rows: &s.rows,
        });
        (own.is_some() || shared.is_some()).then_some(GroupBuffers { shared, own })
    }

    /// Bytes of K and V held (tokens held by each head, not buffer capacity).
    pub fn bytes_held(&self) -> usize {
        self.groups.iter().map(Rows::bytes_held).sum()
    }

    /// Bytes of the buffers this cache allocated (at least `bytes_held`
    /// unless it reads rows of a buffer it shares with the cache it was
    /// forked from: those are the owner's).
    pub fn bytes_allocated(&self) -> usize {
        self.groups.iter().map(Rows::bytes_allocated).sum()
    }

    /// A copy holding only the tokens whose position satisfies `keep`, in
    /// buffers of its own (rows this cache reads from a shared buffer stay
    /// shared).
    pub fn filtered(&self, keep: impl Fn(usize) -> bool) -> Result<Self> {
        self.filtered_by_head(1, false, |_, p| keep(p))
    }

    /// A branch holding only the tokens whose position satisfies `keep`,
    /// reading them from this cache's buffers as [`LayerCache::fork`] does.
    pub fn branch(&self, keep: impl Fn(usize) -> bool) -> Result<Self> {
        self.branch_by_head(1, false, |_, p| keep(p))
    }

    /// A copy holding, for each of the `kv_heads` heads, only the tokens for
    /// which `keep(head, position)` holds: split when `per_head` (the heads
    /// may keep different tokens) or when this cache is split, shared
    /// otherwise (`keep` asked for head 0). The rows are copied into buffers
    /// of its own (so that a policy that drops rows frees them), but for the
    /// rows this cache reads from a shared buffer, which stay shared.
    pub fn filtered_by_head(
        &self,
        kv_heads: usize,
        per_head: bool,
        keep: impl Fn(usize, usize) -> bool,
    ) -> Result<Self> {
        self.picked(kv_heads, per_head, false, keep)
    }

    /// [`LayerCache::filtered_by_head`] as a branch: the rows kept are read
    /// from this cache's buffers as [`LayerCache::fork`] does.
    pub fn branch_by_head(
        &self,
        kv_heads: usize,
        per_head: bool,
        keep: impl Fn(usize, usize) -> bool,
    ) -> Result<Self> {
        self.picked(kv_heads, per_head, true, keep)
    }

    /// The tokens `keep` allows per head, own rows shared when `share`.
    fn picked(
        &self,
        kv_heads: usize,
        per_head: bool,
        share: bool,
        keep: impl Fn(usize, usize) -> bool,
    ) -> Result<Self> {
        let groups = match (per_head, self.is_split()) {
            (false, false) => vec![self.groups[0].select(None, |p| keep(0, p), share)?],
            // a split cache stays split: its heads hold different rows
            (_, true) => (0..self.groups.len())
                .map(|h| self.groups[h].select(None, |p| keep(h, p), share))
                .collect::<Result<Vec<_>>>()?,
            (true, false) => (0..kv_heads)
                .map(|h| self.groups[0].select(Some(h..h + 1), |p| keep(h, p), share))
                .collect::<Result<Vec<_>>>()?,
        };
        Ok(Self {
            groups,
            checked_below: self.checked_below,
        })
    }

    /// Append `k`, `v` [kv_heads, n, head_dim] for tokens at `positions`
    /// (ascending and after every held position), to every head.
    pub fn append(&mut self, k: &Tensor, v: &Tensor, positions: &[usize]) -> Result<()> {
        self.append_by_head(k, v, positions, |_, _| true)
    }

    /// Append `k`, `v` [kv_heads, n, head_dim] for tokens at `positions`;
    /// a split cache's head `h` takes the tokens for which `keep(h, pos)`
    /// holds (a shared cache takes every token).
    pub fn append_by_head(
        &mut self,
        k: &Tensor,
        v: &Tensor,
        positions: &[usize],
        keep: impl Fn(usize, usize) -> bool,
    ) -> Result<()> {
        if !self.is_split() {
            return self.groups[0].append(k, v, positions);
        }
        for (h, g) in self.groups.iter_mut().enumerate() {
            let rows: Vec<u32> = (0..positions.len() as u32)
                .filter(|&i| keep(h, positions[i as usize]))
                .collect();
            if rows.is_empty() {
                continue;
            }
            let (kh, vh) = (k.narrow(0, h, 1)?, v.narrow(0, h, 1)?);
            let (kh, vh, pos) = match rows.len() == positions.len() {
                true => (kh, vh, positions.to_vec()),
                false => {
                    let idx = Tensor::new(rows.as_slice(), k.device())?;
                    let pos = rows.iter().map(|&i| positions[i as usize]).collect();
                    (kh.index_select(&idx, 1)?, vh.index_select(&idx, 1)?, pos)
                }
            };
            g.append(&kh, &vh, &pos)?;
        }
        Ok(())
    }

    /// Rows at positions below this were checked against what the policy
    /// keeps once the prompt has run (0 before the decode phase).
    pub(crate) fn checked_below(&self) -> usize {
        self.checked_below
    }

    /// Forget which rows were checked against a policy (a cache handed to
    /// another policy's sequence is checked against that policy anew).
    pub(crate) fn forget_checks(&mut self) {
        self.checked_below = 0;
    }

    /// Drop every row at a position below `first` (a sliding window's rows
    /// no later query reads), in place.
    pub fn drop_below(&mut self, first: usize) {
        for g in &mut self.groups {
            g.drop_below(first);
        }
    }

    /// Keep, of the rows not yet checked, those `keep(head, position)`
    /// allows for each of the `kv_heads` heads, splitting the cache when
    /// `per_head` and the heads keep different rows; every row is checked
    /// once. Rows are copied only when some row goes.
    pub fn retain_checked(
        &mut self,
        kv_heads: usize,
        per_head: bool,
        keep: impl Fn(usize, usize) -> bool,
    ) -> Result<()> {
        let from = self.checked_below;
        let heads = if self.is_split() || per_head {
            kv_heads
        } else {
            1
        };
        let drops = self.groups.iter().enumerate().any(|(i, g)| {
            let heads: Vec<usize> = match self.is_split() {
                true => vec![i],
                false => (0..heads).collect(),
            };
            let unchecked = &g.positions[g.positions.partition_point(|&p| p < from)..];
            unchecked
                .iter()
                .any(|&p| heads.iter().any(|&h| !keep(h, p)))
        });
        if let Some(&last) = self.groups.iter().filter_map(|g| g.positions.last()).max() {
            self.checked_below = self.checked_below.max(last + 1);
        }
        if !drops {
            return Ok(());
        }
        let checked = from;
        let keep = |h: usize, p: usize| p < checked || keep(h, p);
        *self = Self {
            checked_below: self.checked_below,
            ..self.filtered_by_head(kv_heads, per_head, keep)?
        };
        Ok(())
    }
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
        // the fork reads the original's rows: it holds them, allocates none
        assert_eq!(fork.bytes_held(), c.bytes_held());
        assert_eq!(fork.bytes_allocated(), 0);
        let f = fork.filtered(|p| p != 4)?;
        let (k, _) = f.kv()?.expect("non-empty");
        let k = k.to_vec3::<f32>()?;
        assert_eq!(k[0], vec![vec![0., 1.], vec![4., 5.]]);
        assert_eq!(k[1], vec![vec![6., 7.], vec![10., 11.]]);
        Ok(())
    }

    /// The rows a cache holds, head by head, as the kernels read them.
    fn read(c: &LayerCache, heads: std::ops::Range<usize>) -> anyhow::Result<Vec<f32>> {
        use crate::decoder::read_group_rows;
        read_group_rows(c, heads)
    }

    #[test]
    fn branches_read_the_rows_they_keep_from_one_buffer() -> anyhow::Result<()> {
        let dev = Device::Cpu;
        let mut full = LayerCache::new();
        full.reserve(8);
        // 2 heads, 5 prompt rows: head h, row r holds (10 h + r, -(10 h + r))
        let x = Tensor::from_vec(
            (0..2)
                .flat_map(|h| {
                    (0..5).flat_map(move |r| [(10 * h + r) as f32, -((10 * h + r) as f32)])
                })
                .collect::<Vec<_>>(),
            (2, 5, 2),
            &dev,
        )?;
        full.append(&x, &x, &[0, 1, 2, 3, 4])?;
        // a press's branch keeps 0, 2 and 3; a per-head plan keeps 0 and 4
        // for head 1 only
        let mut press = full.branch(|p| p != 1 && p != 4)?;
        let heads = full.branch_by_head(2, true, |h, p| h == 0 || p == 0 || p == 4)?;
        assert_eq!(press.bytes_allocated() + heads.bytes_allocated(), 0);
        assert_eq!(press.positions(), &[0, 2, 3]);
        assert_eq!(heads.head_positions(1), &[0, 4]);
        // the original and the branch go on apart
        let y = Tensor::full(50f32, (2, 1, 2), &dev)?;
        let z = Tensor::full(70f32, (2, 1, 2), &dev)?;
        full.append(&y, &y, &[5])?;
        press.append(&z, &z, &[5])?;
        assert_eq!(
            read(&press, 0..1)?,
            vec![0., 0., 2., -2., 3., -3., 70., 70.]
        );
        assert_eq!(
            read(&full, 0..2)?,
            [
                vec![0., 0., 1., -1., 2., -2., 3., -3., 4., -4., 50., 50.],
                vec![
                    10., -10., 11., -11., 12., -12., 13., -13., 14., -14., 50., 50.
                ]
            ]
            .concat()
        );
        assert_eq!(read(&heads, 1..2)?, vec![10., -10., 14., -14.]);
        // the tensor path's copy holds the same rows
        let (k, _) = press.kv()?.expect("rows held");
        assert_eq!(
            k.to_vec3::<f32>()?[1],
            vec![
                vec![10., -10.],
                vec![12., -12.],
                vec![13., -13.],
                vec![70., 70.]
            ]
        );
        // a policy that drops rows of a branch keeps reading the rest shared;
        // a window drops the oldest
        press.retain_checked(2, false, |_, p| p != 2)?;
        assert_eq!(press.positions(), &[0, 3, 5]);
        press.drop_below(1);
        assert_eq!(read(&press, 0..1)?, vec![3., -3., 70., 70.]);
        assert_eq!(press.bytes_held(), 2 * 2 * 2 * 2 * 4);
        // a fork of a branch reads the same buffer, and copies its own rows
        let again = press.fork()?;
        assert_eq!(read(&again, 0..2)?, read(&press, 0..2)?);
        // the original growing past its room moves to a new buffer: the
        // branches keep reading the rows they were given
        let before = read(&again, 0..2)?;
        for p in 6..20 {
            let w = Tensor::full(p as f32, (2, 1, 2), &dev)?;
            full.append(&w, &w, &[p])?;
        }
        assert_eq!(full.len(), 20);
        assert_eq!(read(&again, 0..2)?, before);
        assert_eq!(read(&heads, 1..2)?, vec![10., -10., 14., -14.]);
        Ok(())
    }

    #[test]
    fn rows_dropped_from_the_front_are_not_held_and_their_room_is_reused() -> anyhow::Result<()> {
        let dev = Device::Cpu;
        let mut c = LayerCache::new();
        c.reserve(4);
        for p in 0..12usize {
            let x = Tensor::full(p as f32, (1, 1, 2), &dev)?;
            c.drop_below((p + 1).saturating_sub(3));
            c.append(&x, &x, &[p])?;
            assert!(c.len() <= 3, "a window of 3 holds at most 3 rows");
        }
        assert_eq!(c.positions(), &[9, 10, 11]);
        assert_eq!(c.bytes_held(), 2 * 3 * 2 * 4);
        // the buffer never grew past its reservation: dropped rows made room
        assert_eq!(c.bytes_allocated(), 2 * 4 * 2 * 4);
        let (k, _) = c.kv()?.expect("non-empty");
        assert_eq!(
            k.to_vec3::<f32>()?[0],
            vec![vec![9.; 2], vec![10.; 2], vec![11.; 2]]
        );
        Ok(())
    }

    #[test]
    fn a_cache_whose_heads_keep_different_rows_splits_and_holds_each_heads_own()
    -> anyhow::Result<()> {
        let dev = Device::Cpu;
        let mut c = LayerCache::new();
        // 2 heads, 4 tokens: head 0 keeps everything, head 1 only 0 and 3
        let x = Tensor::arange(0f32, 16., &dev)?.reshape((2, 4, 2))?;
        c.append(&x, &x, &[0, 1, 2, 3])?;
        c.retain_checked(2, true, |h, p| h == 0 || p == 0 || p == 3)?;
        assert!(c.is_split());
        assert_eq!(c.head_positions(0), &[0, 1, 2, 3]);
        assert_eq!(c.head_positions(1), &[0, 3]);
        assert_eq!(c.bytes_held(), 2 * 2 * 4 * (4 + 2));
        let (k1, _) = c.group_kv(1)?.expect("non-empty");
        assert_eq!(k1.to_vec3::<f32>()?[0], vec![vec![8., 9.], vec![14., 15.]]);
        // later tokens go to the heads that keep them; checked rows stay
        let y = Tensor::arange(100f32, 104., &dev)?.reshape((2, 1, 2))?;
        c.append_by_head(&y, &y, &[4], |_, _| true)?;
        c.retain_checked(2, true, |h, p| h == 0 || p != 1)?;
        assert_eq!(c.head_positions(1), &[0, 3, 4]);
        assert_eq!(c.head_positions(0), &[0, 1, 2, 3, 4]);
        Ok(())
    }
}
