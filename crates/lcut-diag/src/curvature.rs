//! Trajectory curvature of consecutive hidden states (Hénaff et al. 2021).
//!
//! For states `x_1..x_T`, `v_t = x_{t+1} - x_t` and
//! `c_t = arccos(v_t · v_{t+1} / (|v_t| |v_{t+1}|))`; the curvature is the mean of
//! `c_t` in radians: 0 for a straight line, π for going straight back. Angles
//! whose step has zero length are skipped. Sums are kept in `f64`. (The
//! engine computes the same streaming, on the device, with
//! [`turning_angle`].)

use ndarray::{ArrayView2, Axis, s};

/// The angle between two steps from their dot product and lengths, in
/// radians; `None` when either step has zero length (such angles are skipped).
pub fn turning_angle(dot: f64, norm_a: f64, norm_b: f64) -> Option<f64> {
    (norm_a > 0.0 && norm_b > 0.0).then(|| (dot / (norm_a * norm_b)).clamp(-1.0, 1.0).acos())
}

/// Mean turning angle of the trajectory whose rows are consecutive hidden
/// states; `None` with fewer than three rows or no step of non-zero length
/// on both sides of any angle.
pub fn curvature(x: ArrayView2<f32>) -> Option<f32> {
    if x.nrows() < 3 {
        return None;
    }
    let x = x.mapv(f64::from);
    let v = &x.slice(s![1.., ..]) - &x.slice(s![..-1, ..]);
    let norms: Vec<f64> = v.axis_iter(Axis(0)).map(|r| r.dot(&r).sqrt()).collect();
    let (sum, count) = (0..v.nrows() - 1)
        .filter_map(|t| turning_angle(v.row(t).dot(&v.row(t + 1)), norms[t], norms[t + 1]))
        .fold((0.0, 0usize), |(s, n), c| (s + c, n + 1));
    (count > 0).then(|| (sum / count as f64) as f32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{Array2, array};
    use std::f32::consts::{FRAC_PI_2, FRAC_PI_4, PI};

    #[test]
    fn straight_line_has_zero_curvature() {
        let x = Array2::from_shape_fn((6, 4), |(t, j)| (t as f32) * (j as f32 + 1.0) - 3.0);
        let c = curvature(x.view()).unwrap();
        assert!(c.abs() < 1e-3, "{c}");
        // uneven speed along the line is still straight
        let y = array![[0.0f32, 0.0], [1.0, 1.0], [3.0, 3.0], [3.5, 3.5]];
        assert!(curvature(y.view()).unwrap().abs() < 1e-3);
    }

    #[test]
    fn zig_zag_has_its_turning_angle() {
        // Steps alternate between (1, 1) and (1, -1): each turn is 90 degrees.
        let x = array![
            [0.0f32, 0.0],
            [1.0, 1.0],
            [2.0, 0.0],
            [3.0, 1.0],
            [4.0, 0.0]
        ];
        assert!((curvature(x.view()).unwrap() - FRAC_PI_2).abs() < 1e-6);
        // Steps (1, 0) then (1, 1): 45 degrees.
        let y = array![[0.0f32, 0.0], [1.0, 0.0], [2.0, 1.0]];
        assert!((curvature(y.view()).unwrap() - FRAC_PI_4).abs() < 1e-6);
        // Going straight back: pi.
        let z = array![[0.0f32], [1.0], [0.0]];
        assert!((curvature(z.view()).unwrap() - PI).abs() < 1e-6);
    }

    #[test]
    fn too_short_or_degenerate_is_none() {
        assert_eq!(curvature(array![[0.0f32], [1.0]].view()), None);
        assert_eq!(
            curvature(array![[1.0f32, 2.0], [1.0, 2.0], [1.0, 2.0]].view()),
            None
        );
    }

    #[test]
    fn zero_steps_are_skipped() {
        // (1,0) then a repeat (zero step), then (0,1): no angle touches the zero
        // step, and there is no other pair, so nothing is measured.
        let x = array![[0.0f32, 0.0], [1.0, 0.0], [1.0, 0.0], [1.0, 1.0]];
        assert_eq!(curvature(x.view()), None);
    }
}
