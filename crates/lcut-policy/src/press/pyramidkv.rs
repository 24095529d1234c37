//! PyramidKV (Cai et al., arXiv 2406.02069) as kvpress's `PyramidKVPress`
//! defines it: SnapKV's scores ([`super::snapkv`]), with a budget per
//! layer that falls linearly from the lowest layer to the top (KVCache-
//! Factory's formula, always at the compression ratio): the layers keep
//! `n (1 - R)` positions per K/V head on average. Where the pyramid cannot
//! be built (a short prompt, a steep ratio) every layer keeps
//! `max(1, round(n (1 - R)))`, as kvpress falls back to SnapKV.

use super::PressParams;

/// The positions each K/V head of `layer` keeps of a prompt of `n`
/// (kvpress's `get_layer_budget`; Python's `round`, halves to even).
pub(super) fn layer_budget(p: &PressParams, layer: usize, num_layers: usize, n: usize) -> usize {
    let (q, w) = (n as f64, p.window as f64);
    let max_capacity = w + q * (1.0 - p.ratio);
    let mut min_num = (max_capacity - w) / p.beta as f64;
    let mut max_num = (max_capacity - w) * 2.0 - min_num;
    if max_num >= q - w {
        max_num = q - w;
        min_num = (max_capacity - w) * 2.0 - max_num;
    }
    if !(q >= max_num && max_num >= min_num && min_num >= w) {
        return ((q * (1.0 - p.ratio)).round_ties_even() as usize).max(1);
    }
    let steps = if num_layers > 1 {
        (max_num - min_num) / (num_layers - 1) as f64
    } else {
        0.0
    };
    (max_num - layer as f64 * steps).round_ties_even().max(0.0) as usize
}

#[cfg(test)]
mod tests {
    use super::super::PressName;
    use super::*;

    #[test]
    fn budgets_fall_from_the_bottom_layer_and_average_the_ratio() {
        let p = PressParams {
            window: 8,
            ..PressParams::new(PressName::PyramidKv, 0.5)
        };
        // 28 tokens, 6 layers: from 20 down to 8 in steps of 2.4
        let b: Vec<usize> = (0..6).map(|l| layer_budget(&p, l, 6, 28)).collect();
        assert_eq!(b, [20, 18, 15, 13, 10, 8]);
        // a prompt too short for the pyramid falls back to n (1 - R)
        let d = PressParams::new(PressName::PyramidKv, 0.5);
        assert_eq!(layer_budget(&d, 3, 6, 100), 50);
        // 4K tokens, 30 layers, R = 0.5: the pyramid's mean is the ratio's
        let b: Vec<usize> = (0..30).map(|l| layer_budget(&d, l, 30, 4096)).collect();
        let mean = b.iter().sum::<usize>() as f64 / 30.0;
        assert!((mean - 2048.0).abs() < 1.0, "{mean}");
        assert!(b.windows(2).all(|w| w[0] >= w[1]));
    }
}
