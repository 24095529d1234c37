//! Trajectory curvature of consecutive hidden states (Hénaff et al. 2021).
//!
//! For states `x_1..x_T`, `v_t = x_{t+1} - x_t` and
//! `c_t = arccos(v_t · v_{t+1} / (|v_t| |v_{t+1}|))`; the curvature is the mean of
//! `c_t` in radians: 0 for a straight line, π for going straight back. Angles
//! whose step has zero length are skipped. Sums are kept in `f64`.

use ndarray::{ArrayView1, ArrayView2, Axis, s};

use crate::error::DiagError;

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

/// Streaming [`curvature`]: push hidden states one at a time, keeping only the
/// previous state and the previous step (O(d) memory).
#[derive(Debug, Clone, Default)]
pub struct CurvatureAccumulator {
    prev_x: Option<Vec<f64>>,
    prev_v: Option<(Vec<f64>, f64)>,
    sum: f64,
    count: usize,
}

impl CurvatureAccumulator {
    /// An empty accumulator.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the next hidden state. Fails when its width differs from earlier states.
    pub fn push(&mut self, x: ArrayView1<f32>) -> Result<(), DiagError> {
        let x: Vec<f64> = x.iter().map(|&a| f64::from(a)).collect();
        if let Some(prev) = &self.prev_x {
            if prev.len() != x.len() {
                return Err(DiagError::Width {
                    expected: prev.len(),
                    got: x.len(),
                });
            }
            let v: Vec<f64> = x.iter().zip(prev).map(|(a, b)| a - b).collect();
            let norm = v.iter().map(|a| a * a).sum::<f64>().sqrt();
            if let Some((pv, pnorm)) = &self.prev_v {
                let dot: f64 = v.iter().zip(pv).map(|(a, b)| a * b).sum();
                if let Some(c) = turning_angle(dot, *pnorm, norm) {
                    self.sum += c;
                    self.count += 1;
                }
            }
            self.prev_v = Some((v, norm));
        }
        self.prev_x = Some(x);
        Ok(())
    }

    /// Number of angles measured so far.
    pub fn angles(&self) -> usize {
        self.count
    }

    /// The mean angle so far, `None` before the first measured angle.
    pub fn mean(&self) -> Option<f32> {
        (self.count > 0).then(|| (self.sum / self.count as f64) as f32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{Array2, array};
    use std::f32::consts::{FRAC_PI_2, FRAC_PI_4, PI};

    fn streamed(x: &Array2<f32>) -> Option<f32> {
        let mut acc = CurvatureAccumulator::new();
        for row in x.rows() {
            acc.push(row).unwrap();
        }
        acc.mean()
    }

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
        assert_eq!(streamed(&x), None);
    }

    #[test]
    fn streaming_equals_batch() {
        let x = Array2::from_shape_fn((17, 9), |(t, j)| {
            ((t * 31 + j * 7) as f32).sin() * (1.0 + t as f32)
        });
        let batch = curvature(x.view()).unwrap();
        let stream = streamed(&x).unwrap();
        assert!((batch - stream).abs() < 1e-6, "{batch} vs {stream}");
        assert!(batch > 0.1, "a wiggly path must curve: {batch}");
    }

    #[test]
    fn width_change_is_an_error() {
        let mut acc = CurvatureAccumulator::new();
        acc.push(array![1.0f32, 2.0].view()).unwrap();
        assert!(acc.push(array![1.0f32].view()).is_err());
    }
}
