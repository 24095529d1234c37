//! Binning prompt positions into at most B heatmap columns.

/// Edges of the prompt-position bins: bin `k` covers positions
/// `edges[k]..edges[k + 1]`, `edges[0] == 0`, `edges.last() == prompt_len`.
///
/// A prompt of at most `max_bins` tokens gets one bin per position. A longer
/// one keeps position 0 (BoS, an attention sink) in a bin of its own and splits
/// positions `1..prompt_len` into `max_bins - 1` bins of near-equal width, so
/// there are exactly `max_bins` bins. `max_bins` below 2 is treated as 2.
/// An empty prompt gives `[0]` (no bins).
pub fn bin_edges(prompt_len: usize, max_bins: usize) -> Vec<usize> {
    let max_bins = max_bins.max(2);
    if prompt_len <= max_bins {
        return (0..=prompt_len).collect();
    }
    let rest = prompt_len - 1;
    let k = max_bins - 1;
    let mut edges = Vec::with_capacity(max_bins + 1);
    edges.push(0);
    // rest >= k, so each step is at least one position wide.
    edges.extend((0..=k).map(|i| 1 + (i as u128 * rest as u128 / k as u128) as usize));
    edges
}

/// The bin holding `pos`, or `None` when `pos` is outside the edges.
pub fn bin_of(edges: &[usize], pos: usize) -> Option<usize> {
    let last = *edges.last()?;
    if pos >= last {
        return None;
    }
    Some(edges.partition_point(|&e| e <= pos) - 1)
}

/// Sums per-position values into bins (mass per bin). Positions past the last
/// edge are ignored.
pub fn bin_sums(values: &[f32], edges: &[usize]) -> Vec<f32> {
    edges
        .windows(2)
        .map(|w| {
            let (a, b) = (w[0].min(values.len()), w[1].min(values.len()));
            values[a..b].iter().sum()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_prompts_get_one_bin_per_position() {
        assert_eq!(bin_edges(4, 8), vec![0, 1, 2, 3, 4]);
        assert_eq!(bin_edges(0, 8), vec![0]);
    }

    #[test]
    fn long_prompts_get_exactly_max_bins_with_bos_alone() {
        for (p, b) in [(9, 8), (1000, 8), (131_072, 64), (10, 2), (5, 0)] {
            let e = bin_edges(p, b);
            let b = b.max(2);
            assert_eq!(e.len(), b + 1, "p={p} b={b}");
            assert_eq!(e[0], 0);
            assert_eq!(e[1], 1);
            assert_eq!(*e.last().unwrap_or(&0), p);
            assert!(e.windows(2).all(|w| w[0] < w[1]), "{e:?}");
        }
    }

    #[test]
    fn bin_of_and_sums_agree() {
        let e = bin_edges(10, 4); // [0, 1, 4, 7, 10]
        assert_eq!(e, vec![0, 1, 4, 7, 10]);
        assert_eq!(bin_of(&e, 0), Some(0));
        assert_eq!(bin_of(&e, 3), Some(1));
        assert_eq!(bin_of(&e, 4), Some(2));
        assert_eq!(bin_of(&e, 9), Some(3));
        assert_eq!(bin_of(&e, 10), None);
        let v: Vec<f32> = (0..10).map(|i| i as f32).collect();
        assert_eq!(bin_sums(&v, &e), vec![0.0, 6.0, 15.0, 24.0]);
    }
}
