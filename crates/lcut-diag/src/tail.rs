//! Tail mass of decode-to-prefill attention over depth.

/// `R(c) = Σ_{l >= c} m(l) / Σ_l m(l)` for `c` in `0..=L`, where `m(l)` is the
/// mean prefill mass at layer `l`: the share of decode-to-prefill attention a
/// cut at `c` drops. `R(0) = 1`, `R(L) = 0`, non-increasing.
///
/// Non-finite entries count as 0. When the total is 0 (the prompt is never
/// read) every `R(c)` is 0: a cut drops nothing.
pub fn tail_mass(per_layer_prefill: &[f32]) -> Vec<f32> {
    let m: Vec<f64> = per_layer_prefill
        .iter()
        .map(|&x| {
            if x.is_finite() {
                f64::from(x.max(0.0))
            } else {
                0.0
            }
        })
        .collect();
    let total: f64 = m.iter().sum();
    let mut out = vec![0.0f32; m.len() + 1];
    if total <= 0.0 {
        return out;
    }
    let mut tail = 0.0f64;
    for c in (0..m.len()).rev() {
        tail += m[c];
        out[c] = (tail / total) as f32;
    }
    out[0] = 1.0;
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_tail() {
        let r = tail_mass(&[0.4, 0.3, 0.2, 0.1]);
        let want = [1.0, 0.6, 0.3, 0.1, 0.0];
        assert_eq!(r.len(), 5);
        for (a, b) in r.iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "{r:?}");
        }
    }

    #[test]
    fn nan_counts_as_zero_and_zero_total_drops_nothing() {
        let r = tail_mass(&[0.5, f32::NAN, 0.5]);
        assert!((r[1] - 0.5).abs() < 1e-6 && (r[2] - 0.5).abs() < 1e-6);
        assert_eq!(tail_mass(&[0.0, 0.0]), vec![0.0, 0.0, 0.0]);
        assert_eq!(tail_mass(&[]), vec![0.0]);
    }
}
