//! Means recombined from shards' means and what each one is over: the
//! token-weighted (or prompt-, step-, byte-weighted) mean of the parts is
//! the mean of the whole.

use crate::error::DiagError;

/// Shards' lists merged position by position: `merge` gets the k-th entry
/// of every shard (with the shard's index) and gives the merged entry.
/// Every shard must hold as many entries as the first; else an error of
/// `what`, counting the entries as `noun`.
pub(crate) fn merge_by_position<T, U>(
    shards: &[&[T]],
    (what, noun): (&'static str, &str),
    merge: impl Fn(&[(usize, &T)]) -> Result<U, DiagError>,
) -> Result<Vec<U>, DiagError> {
    let Some(first) = shards.first() else {
        return Ok(Vec::new());
    };
    if let Some((i, s)) = shards
        .iter()
        .enumerate()
        .find(|(_, s)| s.len() != first.len())
    {
        return Err(DiagError::mismatch(
            what,
            format!("shard 0 has {} {noun}, shard {i} {}", first.len(), s.len()),
        ));
    }
    (0..first.len())
        .map(|k| {
            let parts: Vec<(usize, &T)> =
                shards.iter().enumerate().map(|(i, s)| (i, &s[k])).collect();
            merge(&parts)
        })
        .collect()
}

/// Running sums of `mean × weight` and of the weights over shards.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Pooled {
    sum: f64,
    weight: f64,
}

impl Pooled {
    /// Adds a shard's `mean` over `weight` (tokens, prompts, bytes...); a
    /// shard with no weight adds nothing, whatever its mean.
    pub(crate) fn add(&mut self, mean: f32, weight: f64) {
        if weight > 0.0 {
            self.sum += f64::from(mean) * weight;
            self.weight += weight;
        }
    }

    /// Adds a shard's share of `n` events (agreeing tokens, swapping
    /// steps): the count is an integer, so it is rounded back exactly
    /// (for fewer than 2^23 events per shard).
    pub(crate) fn add_share(&mut self, share: f32, n: usize) {
        if n > 0 {
            self.sum += (f64::from(share) * n as f64).round();
            self.weight += n as f64;
        }
    }

    /// The pooled mean over a count (0 when nothing was counted), as the
    /// sweep divides: by the count, at least 1.
    pub(crate) fn mean(&self) -> f32 {
        (self.sum / self.weight.max(1.0)) as f32
    }

    /// The pooled ratio of sums (`Σ part / Σ whole`), as the sweep divides.
    pub(crate) fn ratio(&self) -> f32 {
        (self.sum / self.weight.max(f64::MIN_POSITIVE)) as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pooled_mean_weights_each_shard_by_its_count() {
        // 1 of 2 tokens agree, then 9 of 10: 10/12, not the plain (0.5 + 0.9)/2
        let mut p = Pooled::default();
        p.add_share(0.5, 2);
        p.add_share(0.9, 10);
        assert_eq!(p.mean(), (10.0f64 / 12.0) as f32);
        assert_ne!(p.mean(), 0.7);
        let mut q = Pooled::default();
        q.add(1.0, 3.0);
        q.add(3.0, 1.0);
        assert_eq!(q.mean(), 1.5);
        // an empty shard's mean (even NaN) does not count
        q.add(f32::NAN, 0.0);
        assert_eq!(q.mean(), 1.5);
        assert_eq!(Pooled::default().mean(), 0.0);
        let mut r = Pooled::default();
        r.add(0.5, 100.0);
        r.add(0.25, 300.0);
        assert_eq!(r.ratio(), 0.3125);
    }
}
