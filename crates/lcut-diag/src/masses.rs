//! Phase masses and conditional prefill entropy of one attention row.

use lcut_trace::normalised_entropy;
use ndarray::ArrayView1;

use crate::error::DiagError;

/// Where one decode query's attention goes, by token phase. The five parts
/// partition keys `0..=query_pos`, so they sum to the row's total (1 after softmax).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PhaseMasses {
    /// `a[0]`: the BoS token (always position 0).
    pub bos: f32,
    /// `Σ a[1..anchor_len]`: anchors other than BoS.
    pub anchor: f32,
    /// `Σ a[max(anchor_len, 1)..s]`: non-anchor prompt tokens before the decode start.
    pub prefill: f32,
    /// `Σ a[s..t]`: decode-phase tokens before the query.
    pub decode: f32,
    /// `a[t]`: the query itself.
    pub self_mass: f32,
}

impl PhaseMasses {
    /// Sum of the five masses.
    pub fn total(&self) -> f32 {
        self.bos + self.anchor + self.prefill + self.decode + self.self_mass
    }
}

/// Conditional entropy of the attention over prefill tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrefillEntropy {
    /// `H = -Σ p_j ln p_j` in nats, `p_j = a[j] / m_prefill`; NaN when `m_prefill` is 0.
    pub raw: f32,
    /// `H / ln(n_prefill)` in `[0, 1]`; NaN when `raw` is NaN or `n_prefill < 2`.
    pub normalised: f32,
}

fn check(
    len: usize,
    query_pos: usize,
    anchor_len: usize,
    decode_start: usize,
) -> Result<(), DiagError> {
    if query_pos >= len {
        return Err(DiagError::Row(format!(
            "query position {query_pos} is outside the row of {len} keys"
        )));
    }
    if decode_start == 0 || decode_start > query_pos {
        return Err(DiagError::Row(format!(
            "decode start {decode_start} must be in 1..={query_pos} (the query position)"
        )));
    }
    if anchor_len > decode_start {
        return Err(DiagError::Row(format!(
            "{anchor_len} anchors reach past the decode start {decode_start}"
        )));
    }
    Ok(())
}

/// Splits the post-softmax attention `row` of the decode query at `query_pos`
/// (keys `0..=query_pos`; later entries are ignored) into phase masses.
///
/// Anchors are the prefix `0..anchor_len`; position 0 is counted as BoS even
/// when `anchor_len` is 0 (anchor-free SPEED), so prefill starts at
/// `max(anchor_len, 1)`. Fails unless `1 <= decode_start <= query_pos < row.len()`
/// and `anchor_len <= decode_start`.
pub fn phase_masses(
    row: ArrayView1<f32>,
    query_pos: usize,
    anchor_len: usize,
    decode_start: usize,
) -> Result<PhaseMasses, DiagError> {
    check(row.len(), query_pos, anchor_len, decode_start)?;
    let sum = |a: usize, b: usize| row.slice(ndarray::s![a..b]).sum();
    let p0 = anchor_len.max(1);
    Ok(PhaseMasses {
        bos: row[0],
        anchor: sum(1, p0),
        prefill: sum(p0, decode_start),
        decode: sum(decode_start, query_pos),
        self_mass: row[query_pos],
    })
}

/// The entropy of the attention over prefill positions `max(anchor_len, 1)..s`,
/// renormalised to a distribution (same row conventions as [`phase_masses`]).
/// A uniform prefill row gives normalised 1, a one-hot row 0.
pub fn prefill_entropy(
    row: ArrayView1<f32>,
    query_pos: usize,
    anchor_len: usize,
    decode_start: usize,
) -> Result<PrefillEntropy, DiagError> {
    check(row.len(), query_pos, anchor_len, decode_start)?;
    let prefill = row.slice(ndarray::s![anchor_len.max(1)..decode_start]);
    let mass: f64 = prefill.iter().map(|&a| f64::from(a)).sum();
    let raw = if mass > 0.0 {
        let h: f64 = prefill
            .iter()
            .map(|&a| f64::from(a) / mass)
            .filter(|&p| p > 0.0)
            .map(|p| -p * p.ln())
            .sum();
        h as f32
    } else {
        f32::NAN
    };
    Ok(PrefillEntropy {
        raw,
        normalised: normalised_entropy(raw, prefill.len()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{Array1, array};

    #[test]
    fn masses_partition_the_row() {
        // BoS, 2 more anchors, 3 prefill, 2 decode before the query, query at 8.
        let a = array![0.30f32, 0.05, 0.05, 0.10, 0.10, 0.10, 0.08, 0.07, 0.15, 0.9];
        let m = phase_masses(a.view(), 8, 3, 6).unwrap();
        assert_eq!(m.bos, 0.30);
        assert!((m.anchor - 0.10).abs() < 1e-6);
        assert!((m.prefill - 0.30).abs() < 1e-6);
        assert!((m.decode - 0.15).abs() < 1e-6);
        assert_eq!(m.self_mass, 0.15);
        assert!((m.total() - 1.0).abs() < 1e-6, "{}", m.total());
    }

    #[test]
    fn masses_sum_to_one_for_any_split() {
        let t = 12;
        let raw: Array1<f32> = (0..=t).map(|i| ((i * 7 % 5) + 1) as f32).collect();
        let row = &raw / raw.sum();
        for s in 1..=t {
            for anchors in 0..=s {
                let m = phase_masses(row.view(), t, anchors, s).unwrap();
                assert!((m.total() - 1.0).abs() < 1e-5, "s={s} a={anchors}");
            }
        }
    }

    #[test]
    fn anchor_free_still_counts_position_zero_as_bos() {
        let a = array![0.5f32, 0.25, 0.25];
        let m = phase_masses(a.view(), 2, 0, 2).unwrap();
        assert_eq!((m.bos, m.anchor, m.prefill), (0.5, 0.0, 0.25));
    }

    #[test]
    fn bad_positions_are_errors() {
        let a = array![0.5f32, 0.5];
        assert!(phase_masses(a.view(), 2, 1, 1).is_err());
        assert!(phase_masses(a.view(), 1, 1, 0).is_err());
        assert!(phase_masses(a.view(), 1, 2, 1).is_err());
        assert!(prefill_entropy(a.view(), 0, 0, 1).is_err());
    }

    #[test]
    fn entropy_uniform_is_one_and_one_hot_is_zero() {
        // prefill = positions 1..5 (4 tokens), decode start 5, query 6
        let uniform = array![0.2f32, 0.1, 0.1, 0.1, 0.1, 0.2, 0.2];
        let e = prefill_entropy(uniform.view(), 6, 1, 5).unwrap();
        assert!((e.raw - 4f32.ln()).abs() < 1e-6);
        assert!((e.normalised - 1.0).abs() < 1e-6);
        let one_hot = array![0.5f32, 0.0, 0.3, 0.0, 0.0, 0.1, 0.1];
        let e = prefill_entropy(one_hot.view(), 6, 1, 5).unwrap();
        assert_eq!(e.raw, 0.0);
        assert_eq!(e.normalised, 0.0);
    }

    #[test]
    fn entropy_of_two_to_one_split() {
        // p = (2/3, 1/3, 0, 0): H = ln 3 - (2/3) ln 2.
        let a = array![0.0f32, 0.2, 0.1, 0.0, 0.0, 0.7];
        let e = prefill_entropy(a.view(), 5, 1, 5).unwrap();
        let h = 3f32.ln() - 2.0 / 3.0 * 2f32.ln();
        assert!((e.raw - h).abs() < 1e-6);
        assert!((e.normalised - h / 4f32.ln()).abs() < 1e-6);
    }

    #[test]
    fn entropy_without_prefill_mass_is_nan() {
        let a = array![0.9f32, 0.0, 0.0, 0.1];
        let e = prefill_entropy(a.view(), 3, 1, 3).unwrap();
        assert!(e.raw.is_nan() && e.normalised.is_nan());
    }
}
