//! Trajectory curvature reduced where the hidden states are.
//!
//! [`lcut_diag::curvature`] defines the measure on host rows. Here the
//! states of a span arrive chunk by chunk as device tensors; the step
//! lengths and the dot products of consecutive steps are computed there and
//! kept there, so nothing is copied to the host until the mean is asked for
//! (two numbers per token then, instead of a hidden-size row per token per
//! chunk).

use candle_core::{DType, Tensor};
use lcut_model::ModelError;

type Result<T> = std::result::Result<T, ModelError>;

/// Per-angle quantities of one chunk: `dot[t] = v_t . v_{t+1}`,
/// `before[t] = |v_t|`, `after[t] = |v_{t+1}|`, each [angles] f64.
#[derive(Debug, Clone)]
struct PendingAngles {
    dot: Tensor,
    before: Tensor,
    after: Tensor,
}

/// Streaming curvature of one span at one layer, fed device tensors.
#[derive(Debug, Clone, Default)]
pub struct DeviceCurvature {
    /// The span's last state so far, [1, d] f64.
    last_state: Option<Tensor>,
    /// The span's last step so far, [1, d] f64.
    last_step: Option<Tensor>,
    pending: Vec<PendingAngles>,
}

impl DeviceCurvature {
    /// An empty accumulator.
    pub fn new() -> Self {
        Self::default()
    }

    /// Append the next consecutive states of the span, [n, d] in any float
    /// dtype. Fails when the width differs from earlier states.
    pub fn push_rows(&mut self, states: &Tensor) -> Result<()> {
        let states = states.to_dtype(DType::F32)?.to_dtype(DType::F64)?;
        let states = match &self.last_state {
            Some(last) => Tensor::cat(&[last, &states], 0)?,
            None => states,
        };
        let rows = states.dim(0)?;
        if rows == 0 {
            return Ok(());
        }
        // a copy of the row alone, detached from the chunk's buffer (`copy`
        // would clone the whole buffer the row is a view of)
        self.last_state = Some(states.narrow(0, rows - 1, 1)?.force_contiguous()?);
        if rows < 2 {
            return Ok(());
        }
        let steps = (states.narrow(0, 1, rows - 1)? - states.narrow(0, 0, rows - 1)?)?;
        let steps = match &self.last_step {
            Some(last) => Tensor::cat(&[last, &steps], 0)?,
            None => steps,
        };
        let n = steps.dim(0)?;
        self.last_step = Some(steps.narrow(0, n - 1, 1)?.force_contiguous()?);
        if n < 2 {
            return Ok(());
        }
        let norms = steps.sqr()?.sum(1)?.sqrt()?;
        let (a, b) = (steps.narrow(0, 0, n - 1)?, steps.narrow(0, 1, n - 1)?);
        self.pending.push(PendingAngles {
            dot: (a * b)?.sum(1)?,
            before: norms.narrow(0, 0, n - 1)?,
            after: norms.narrow(0, 1, n - 1)?,
        });
        Ok(())
    }

    /// Copies the per-angle quantities out (once) and returns the mean angle
    /// in radians and the number of angles measured; `None` before the first.
    pub fn finish(&self) -> Result<(Option<f32>, usize)> {
        if self.pending.is_empty() {
            return Ok((None, 0));
        }
        let gather = |pick: fn(&PendingAngles) -> &Tensor| -> Result<Vec<f64>> {
            let parts: Vec<&Tensor> = self.pending.iter().map(pick).collect();
            Ok(Tensor::cat(&parts, 0)?.to_vec1::<f64>()?)
        };
        let (dot, before, after) = (
            gather(|p| &p.dot)?,
            gather(|p| &p.before)?,
            gather(|p| &p.after)?,
        );
        let (sum, count) = dot
            .iter()
            .zip(before.iter().zip(&after))
            .filter_map(|(&d, (&na, &nb))| lcut_diag::turning_angle(d, na, nb))
            .fold((0.0, 0usize), |(s, n), c| (s + c, n + 1));
        Ok(((count > 0).then(|| (sum / count as f64) as f32), count))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;
    use ndarray::Array2;

    /// A wandering trajectory.
    fn trajectory(rows: usize, width: usize) -> Array2<f32> {
        Array2::from_shape_fn((rows, width), |(t, j)| {
            ((t * 7 + j * 3) as f32 * 0.37).sin() + 0.1 * t as f32
        })
    }

    fn pushed_in_chunks(x: &Array2<f32>, chunks: &[usize]) -> (Option<f32>, usize) {
        let mut acc = DeviceCurvature::new();
        let mut start = 0;
        for &len in chunks.iter().cycle() {
            if start >= x.nrows() {
                break;
            }
            let len = len.min(x.nrows() - start);
            let rows: Vec<f32> = x
                .slice(ndarray::s![start..start + len, ..])
                .iter()
                .copied()
                .collect();
            let t = Tensor::from_vec(rows, (len, x.ncols()), &Device::Cpu).unwrap();
            acc.push_rows(&t).unwrap();
            start += len;
        }
        acc.finish().unwrap()
    }

    #[test]
    fn any_chunking_gives_the_host_definition() {
        let mut x = trajectory(23, 6);
        // a repeated state: the zero-length step 4 -> 5 leaves two angles out
        let copy = x.row(4).to_owned();
        x.row_mut(5).assign(&copy);
        let reference = lcut_diag::curvature(x.view()).unwrap();
        for chunks in [&[23][..], &[1], &[2], &[3, 1, 5], &[7, 2]] {
            let (mean, count) = pushed_in_chunks(&x, chunks);
            let mean = mean.unwrap();
            assert!(
                (mean - reference).abs() < 1e-6,
                "chunks {chunks:?}: {mean} vs {reference}"
            );
            // 21 angles, two of them touch the zero-length step 4 -> 5
            assert_eq!(count, 19, "chunks {chunks:?}");
        }
    }

    #[test]
    fn fewer_than_three_states_measure_nothing() {
        let x = trajectory(2, 4);
        assert_eq!(pushed_in_chunks(&x, &[1]), (None, 0));
    }

    #[test]
    fn a_width_change_is_an_error() {
        let mut acc = DeviceCurvature::new();
        acc.push_rows(&Tensor::zeros((2, 4), DType::F32, &Device::Cpu).unwrap())
            .unwrap();
        assert!(
            acc.push_rows(&Tensor::zeros((2, 5), DType::F32, &Device::Cpu).unwrap())
                .is_err()
        );
    }
}
