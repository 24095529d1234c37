//! Sliding-window layers: a layer with window `w` lets a query at `q` read
//! only the keys at `q - w + 1 ..= q` (Gemma 2 and 3, Mistral, Qwen2 with
//! `use_sliding_window`), so once `len` tokens have run it holds only the
//! rows the next query (at `len`) reads: at most `w - 1` of them, whatever
//! the policy keeps. Every count of K/V held or read and of attention work
//! asks here, so that a windowed model's costs are the rows it really
//! holds and reads.

use std::ops::Range;

/// Each layer's sliding window, `None` where the layer reads every earlier
/// key; an empty slice (or a layer past its end) slides nowhere.
pub type LayerWindows = [Option<usize>];

/// The window of `layer` (`None` past the end of `windows`).
pub fn window_of(windows: &LayerWindows, layer: usize) -> Option<usize> {
    windows.get(layer).copied().flatten()
}

/// Whether a query at `q` may read the key at `k` (`k <= q`) under
/// `window`: `k + w > q`. With `q = len`, whether a layer still holds the
/// row at `k` once `len` tokens have run.
pub fn in_window(window: Option<usize>, q: usize, k: usize) -> bool {
    window.is_none_or(|w| k + w > q)
}

/// The positions of `0..=q` a query at `q` may read under `window`.
pub fn readable_keys(window: Option<usize>, q: usize) -> Range<usize> {
    let first = window.map_or(0, |w| (q + 1).saturating_sub(w));
    first..q + 1
}

/// The first position a query at `q` reads under window `w`: rows below
/// it are read by no query at `q` or later, so a cache may drop them.
pub fn first_readable(w: usize, q: usize) -> usize {
    readable_keys(Some(w), q).start
}

/// The positions of `0..len` a layer under `window` still holds once `len`
/// tokens have run (those the query at `len` reads, itself aside).
pub fn held_positions(window: Option<usize>, len: usize) -> Range<usize> {
    let first = window.map_or(0, |w| (len + 1).saturating_sub(w));
    first.min(len)..len
}

/// Query-key pairs of a causal prefill of `n` tokens that all read every
/// earlier key they may, under `window`: `Σ_{q<n} min(q + 1, w)`, or
/// `n(n + 1)/2` without a window.
pub fn causal_pairs(window: Option<usize>, n: usize) -> f64 {
    let n = n as f64;
    match window {
        Some(w) if (w as f64) < n => {
            let w = w as f64;
            w * (w + 1.0) / 2.0 + (n - w) * w
        }
        _ => n * (n + 1.0) / 2.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ranges_are_what_in_window_allows() {
        for window in [None, Some(1), Some(3), Some(8)] {
            for q in 0..12 {
                let by_rule: Vec<usize> = (0..=q).filter(|&k| in_window(window, q, k)).collect();
                assert_eq!(readable_keys(window, q).collect::<Vec<_>>(), by_rule);
                let held: Vec<usize> = (0..q).filter(|&k| in_window(window, q, k)).collect();
                assert_eq!(held_positions(window, q).collect::<Vec<_>>(), held);
            }
        }
        // a window of 4 after 10 tokens: rows 7, 8, 9 (the next query, at 10,
        // reads 7..=10)
        assert_eq!(held_positions(Some(4), 10), 7..10);
        assert_eq!(first_readable(4, 10), 7);
        assert_eq!(first_readable(4, 2), 0);
        assert_eq!(window_of(&[None, Some(4)], 1), Some(4));
        assert_eq!(window_of(&[None, Some(4)], 5), None);
    }

    #[test]
    fn causal_pairs_count_every_readable_pair() {
        for window in [None, Some(1), Some(5), Some(30)] {
            for n in 0..40 {
                let counted: usize = (0..n).map(|q| readable_keys(window, q).len()).sum();
                assert_eq!(causal_pairs(window, n), counted as f64, "{window:?} {n}");
            }
        }
    }
}
