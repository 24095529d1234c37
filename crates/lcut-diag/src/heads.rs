//! Which (layer, K/V head) pairs still read the prompt, and the cut plus
//! kept heads that keep the most of that reading within a K/V budget.
//!
//! A K/V head's decode-to-prefill mass is the mean, over the query heads
//! that read it, of the per-head prefill mass a report's curves hold
//! (`prefill_by_head`, averaged over prompts and decode steps). SPEED+BoS
//! at cut C with a set S of kept pairs above it holds, of a prompt of P
//! prefill tokens, A anchors and D decode-phase tokens on a model of L
//! layers and H K/V heads,
//!
//! ```text
//! K/V share = (H·(L·(A + D) + C·P) + |S|·P) / (H·L·(A + P + D))
//! ```
//!
//! of the full model's K/V, and keeps the mass of every pair below C and
//! of S. [`plan_for_budget`] takes, at every cut, the pairs above it with
//! the most mass that fit the budget, and returns the cut whose plan keeps
//! the most mass; zero kept pairs is SPEED itself, so a plan never keeps
//! less mass than SPEED+BoS within the same budget.

use lcut_trace::{CutoffAccuracy, PromptTrace, Report, Tensor2};

use crate::error::DiagError;

/// Decode-to-prefill mass of each K/V head, `[layer][kv_head]`: the mean
/// of its query heads' masses in `prefill_by_head` ([layers, query heads]).
pub fn kv_head_masses(
    prefill_by_head: &Tensor2,
    kv_heads: usize,
) -> Result<Vec<Vec<f64>>, DiagError> {
    let [layers, heads] = prefill_by_head.shape();
    if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
        return Err(DiagError::Invalid(format!(
            "{heads} query heads do not share {kv_heads} K/V heads evenly"
        )));
    }
    let group = heads / kv_heads;
    let view = prefill_by_head.view();
    Ok((0..layers)
        .map(|l| {
            (0..kv_heads)
                .map(|h| {
                    let sum: f64 = (h * group..(h + 1) * group)
                        .map(|q| f64::from(view[[l, q]]))
                        .filter(|m| m.is_finite())
                        .sum();
                    sum / group as f64
                })
                .collect()
        })
        .collect())
}

/// Every (layer, K/V head, mass), highest mass first (ties by layer, then head).
pub fn head_ranking(masses: &[Vec<f64>]) -> Vec<(usize, usize, f64)> {
    let mut ranking: Vec<(usize, usize, f64)> = masses
        .iter()
        .enumerate()
        .flat_map(|(l, row)| row.iter().enumerate().map(move |(h, &m)| (l, h, m)))
        .collect();
    ranking.sort_by(|a, b| b.2.total_cmp(&a.2).then(a.0.cmp(&b.0)).then(a.1.cmp(&b.1)));
    ranking
}

/// The token counts of a typical prompt the K/V share is computed for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PromptShape {
    /// Anchor tokens A (1 for SPEED+BoS).
    pub anchors: f64,
    /// Prefill tokens P.
    pub prefill: f64,
    /// Decode-phase tokens D (generation prompt and new tokens).
    pub decode: f64,
}

impl PromptShape {
    /// The mean token counts of a report's prompts, as SPEED+BoS splits
    /// them: one anchor, the prefill tokens after it, and the decode-phase
    /// tokens (the generation prompt and the new tokens).
    pub fn of_report(report: &Report) -> Self {
        let n = report.traces.len().max(1) as f64;
        let mean = |f: &dyn Fn(&PromptTrace) -> usize| {
            report.traces.iter().map(f).sum::<usize>() as f64 / n
        };
        Self {
            anchors: 1.0,
            prefill: mean(&|t| t.decode_start.saturating_sub(1)),
            decode: mean(&|t| t.prompt_len - t.decode_start + t.num_steps()),
        }
    }
}

impl PromptShape {
    /// The mean shape of prompts given as `(prefill, decode)` token counts
    /// (one anchor each, as SPEED+BoS splits them); `None` without prompts.
    pub fn mean_of(prompts: impl IntoIterator<Item = (usize, usize)>) -> Option<Self> {
        let (mut n, mut prefill, mut decode) = (0usize, 0usize, 0usize);
        for (p, d) in prompts {
            n += 1;
            prefill += p;
            decode += d;
        }
        (n > 0).then(|| Self {
            anchors: 1.0,
            prefill: prefill as f64 / n as f64,
            decode: decode as f64 / n as f64,
        })
    }
}

impl std::fmt::Display for PromptShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:.0} anchor, {:.1} prefill and {:.1} decode-phase tokens",
            self.anchors, self.prefill, self.decode
        )
    }
}

/// The K/V share SPEED+BoS at `cut` with `kept` pairs above it holds of the
/// full model's, on a model of `layers` layers and `kv_heads` K/V heads.
pub fn kv_share(layers: usize, kv_heads: usize, cut: usize, kept: usize, p: &PromptShape) -> f64 {
    let (l, h) = (layers as f64, kv_heads as f64);
    let held = h * (l * (p.anchors + p.decode) + cut as f64 * p.prefill) + kept as f64 * p.prefill;
    held / (h * l * (p.anchors + p.prefill + p.decode))
}

/// A cut and the pairs kept above it.
#[derive(Debug, Clone, PartialEq)]
pub struct HeadPlan {
    /// The cut C.
    pub cut: usize,
    /// The kept (layer, K/V head) pairs, ascending.
    pub heads: Vec<(usize, usize)>,
    /// The K/V share it holds of the full model's.
    pub kv_share: f64,
    /// The share of the decode-to-prefill mass it keeps.
    pub mass_kept: f64,
    /// The largest cut of plain SPEED+BoS within the same budget, and the
    /// mass it keeps.
    pub speed_cut: usize,
    /// The share of the mass SPEED+BoS at `speed_cut` keeps.
    pub speed_mass_kept: f64,
}

/// How far below the largest cut that fits a budget an unchecked plan
/// looks, as a share of the depth (2 layers of 30). Trading more than a
/// few layers of the whole prompt for kept heads keeps more of the mass
/// but, measured on SmolLM2's task suite, loses copying and arithmetic
/// (docs/heads.md): lower cuts are taken only when a check says so.
pub const UNCHECKED_SPAN: f64 = 1.0 / 15.0;

/// How far below the largest cut that fits a budget the candidates of a
/// checked plan reach, as a share of the depth (6 layers of 30).
pub const CHECKED_SPAN: f64 = 1.0 / 5.0;

/// Layers below the largest cut that fits a budget that `share` of a
/// model of `layers` layers spans (at least 1).
pub fn span_layers(layers: usize, share: f64) -> usize {
    ((layers as f64 * share).round() as usize).max(1)
}

/// One plan for each cut from the largest that fits `budget` (in (0, 1])
/// down `span` layers: the pairs above it with the most decode-to-prefill
/// mass that fit. The first is SPEED+BoS at the largest cut with the pairs
/// its remaining share buys. An error when the budget is outside (0, 1] or
/// below what SPEED+BoS at cut 1 holds.
pub fn plan_candidates(
    masses: &[Vec<f64>],
    shape: &PromptShape,
    budget: f64,
    span: usize,
) -> Result<Vec<HeadPlan>, DiagError> {
    plan_candidates_within(masses, shape, budget, span, None)
}

/// [`plan_candidates`] under a prefill budget as well: with
/// `prefill_layers` T the prompt runs at most T layers (its TTFT about T
/// of L layers' prefill), so the cut is at most T and every kept pair lies
/// below layer T. An error when T is outside 1..=L.
pub fn plan_candidates_within(
    masses: &[Vec<f64>],
    shape: &PromptShape,
    budget: f64,
    span: usize,
    prefill_layers: Option<usize>,
) -> Result<Vec<HeadPlan>, DiagError> {
    if let Some(t) = prefill_layers
        && !(1..=masses.len()).contains(&t)
    {
        return Err(DiagError::Invalid(format!(
            "a prefill budget of {t} layers is outside 1..={} (the layers the prompt may run)",
            masses.len()
        )));
    }
    if !(budget > 0.0 && budget <= 1.0) {
        return Err(DiagError::Invalid(format!(
            "a K/V budget of {budget} is outside (0, 1]: it is the share of the full model's K/V to keep"
        )));
    }
    let layers = masses.len();
    let kv_heads = masses.first().map_or(0, Vec::len);
    if layers == 0 || kv_heads == 0 {
        return Err(DiagError::Invalid("no per-head masses to plan from".into()));
    }
    let fits =
        |cut: usize, kept: usize| kv_share(layers, kv_heads, cut, kept, shape) <= budget + 1e-12;
    let deepest = prefill_layers.unwrap_or(layers);
    let Some(top) = (1..=deepest).rev().find(|&c| fits(c, 0)) else {
        return Err(DiagError::Invalid(format!(
            "a K/V budget of {budget} is below what SPEED+BoS at cut 1 holds ({:.3} of full)",
            kv_share(layers, kv_heads, 1, 0, shape)
        )));
    };
    let total: f64 = masses.iter().flatten().sum();
    let share_of = |m: f64| if total > 0.0 { m / total } else { 0.0 };
    let below = |cut: usize| -> f64 { masses[..cut].iter().flatten().sum() };
    let ranking: Vec<(usize, usize, f64)> = head_ranking(masses)
        .into_iter()
        .filter(|(l, _, _)| *l < deepest)
        .collect();
    let speed_mass_kept = share_of(below(top));
    Ok((top.saturating_sub(span).max(1)..=top)
        .rev()
        .map(|cut| {
            let mut kept = 0;
            while kept < (deepest - cut) * kv_heads && fits(cut, kept + 1) {
                kept += 1;
            }
            let mut heads: Vec<(usize, usize)> = ranking
                .iter()
                .filter(|(l, _, _)| *l >= cut)
                .take(kept)
                .map(|&(l, h, _)| (l, h))
                .collect();
            heads.sort_unstable();
            let mass = below(cut) + heads.iter().map(|&(l, h)| masses[l][h]).sum::<f64>();
            HeadPlan {
                kv_share: kv_share(layers, kv_heads, cut, heads.len(), shape),
                cut,
                heads,
                mass_kept: share_of(mass),
                speed_cut: top,
                speed_mass_kept,
            }
        })
        .collect())
}

/// The plan for `budget` without a check: of the candidates within
/// [`UNCHECKED_SPAN`] of the largest cut that fits, the one that keeps the
/// most decode-to-prefill mass (ties to the larger cut).
pub fn plan_for_budget(
    masses: &[Vec<f64>],
    shape: &PromptShape,
    budget: f64,
) -> Result<HeadPlan, DiagError> {
    plan_for_budgets(masses, shape, budget, None)
}

/// [`plan_for_budget`] under a prefill budget as well (the prompt runs at
/// most `prefill_layers` layers; see [`plan_candidates_within`]).
pub fn plan_for_budgets(
    masses: &[Vec<f64>],
    shape: &PromptShape,
    budget: f64,
    prefill_layers: Option<usize>,
) -> Result<HeadPlan, DiagError> {
    let span = span_layers(masses.len(), UNCHECKED_SPAN);
    let candidates = plan_candidates_within(masses, shape, budget, span, prefill_layers)?;
    let mut best = candidates[0].clone();
    for c in candidates.into_iter().skip(1) {
        if c.mass_kept > best.mass_kept + 1e-12 {
            best = c;
        }
    }
    Ok(best)
}

/// The accuracy to expect of a plan that keeps `mass_kept` of the mass,
/// read off SPEED+BoS's calibration points (accuracy at each cut) by the
/// mass each cut keeps, linearly between the two points around it; `None`
/// without points or outside their range.
pub fn expected_accuracy(
    masses: &[Vec<f64>],
    calibration: &[CutoffAccuracy],
    mass_kept: f64,
) -> Option<f64> {
    let total: f64 = masses.iter().flatten().sum();
    if total <= 0.0 {
        return None;
    }
    let mut points: Vec<(f64, f64)> = calibration
        .iter()
        .filter(|p| p.keeps_bos() && p.l_cut <= masses.len())
        .map(|p| {
            let kept: f64 = masses[..p.l_cut].iter().flatten().sum();
            (kept / total, f64::from(p.accuracy))
        })
        .collect();
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (first, last) = (points.first()?, points.last()?);
    if mass_kept < first.0 - 1e-9 || mass_kept > last.0 + 1e-9 {
        return None;
    }
    points
        .windows(2)
        .find_map(|w| {
            let ((m0, a0), (m1, a1)) = (w[0], w[1]);
            (mass_kept >= m0 - 1e-9 && mass_kept <= m1 + 1e-9).then(|| match m1 - m0 {
                d if d <= 1e-12 => a1.max(a0),
                d => a0 + (a1 - a0) * (mass_kept - m0) / d,
            })
        })
        .or_else(|| (points.len() == 1).then_some(first.1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn masses() -> Vec<Vec<f64>> {
        // 6 layers, 2 K/V heads: the prompt is read low, and by head 1 at layer 4
        vec![
            vec![0.5, 0.5],
            vec![0.4, 0.4],
            vec![0.3, 0.3],
            vec![0.05, 0.05],
            vec![0.01, 0.30],
            vec![0.01, 0.02],
        ]
    }

    const SHAPE: PromptShape = PromptShape {
        anchors: 1.0,
        prefill: 1000.0,
        decode: 0.0,
    };

    #[test]
    fn kv_heads_average_their_query_heads() {
        let t = Tensor2::new([1, 4], vec![0.2, 0.4, 0.1, 0.3]).unwrap();
        let m = kv_head_masses(&t, 2).unwrap();
        assert_eq!((m.len(), m[0].len()), (1, 2));
        assert!((m[0][0] - 0.3).abs() < 1e-6 && (m[0][1] - 0.2).abs() < 1e-6);
        assert!(kv_head_masses(&t, 3).is_err());
        let r = head_ranking(&masses());
        assert_eq!((r[0].0, r[0].1), (0, 0));
        assert_eq!(r.iter().position(|x| (x.0, x.1) == (4, 1)), Some(6));
    }

    #[test]
    fn the_share_is_the_formula() {
        // SPEED at the full depth holds everything; each kept pair P/(H L)
        assert!((kv_share(6, 2, 6, 0, &SHAPE) - 1.0).abs() < 1e-12);
        let one = kv_share(6, 2, 3, 1, &SHAPE) - kv_share(6, 2, 3, 0, &SHAPE);
        assert!((one - 1000.0 / (2.0 * 6.0 * 1001.0)).abs() < 1e-12);
    }

    #[test]
    fn a_budget_buys_the_head_that_still_reads_the_prompt() {
        // 0.6 of the K/V: SPEED at 3 (0.5 + anchors) plus one pair (1/12)
        let plan = plan_for_budget(&masses(), &SHAPE, 0.6).unwrap();
        assert_eq!((plan.cut, plan.heads.clone()), (3, vec![(4, 1)]));
        assert!(plan.kv_share <= 0.6);
        assert_eq!(plan.speed_cut, 3);
        assert!(plan.mass_kept > plan.speed_mass_kept);
        // a whole budget keeps everything at full depth
        let full = plan_for_budget(&masses(), &SHAPE, 1.0).unwrap();
        assert!((full.mass_kept - 1.0).abs() < 1e-12);
    }

    #[test]
    fn candidates_run_from_the_largest_cut_that_fits_down_the_span() {
        let c = plan_candidates(&masses(), &SHAPE, 0.6, 2).unwrap();
        let cuts: Vec<usize> = c.iter().map(|p| p.cut).collect();
        assert_eq!(cuts, vec![3, 2, 1]);
        // each fills the budget with the pairs above its cut
        assert!(
            c.iter()
                .all(|p| p.kv_share <= 0.6 && p.heads.iter().all(|h| h.0 >= p.cut))
        );
        assert_eq!(
            c.iter().map(|p| p.heads.len()).collect::<Vec<_>>(),
            vec![1, 3, 5]
        );
        assert_eq!(span_layers(30, UNCHECKED_SPAN), 2);
        assert_eq!(span_layers(30, CHECKED_SPAN), 6);
    }

    #[test]
    fn a_budget_at_speeds_share_of_the_serving_shape_has_speed_as_its_first_candidate() {
        // prompts served are longer than the ones the masses came from: at
        // their shape SPEED+BoS at cut 4 holds less than at the short shape
        let short = PromptShape {
            anchors: 1.0,
            prefill: 20.0,
            decode: 10.0,
        };
        let served = PromptShape::mean_of([(900, 30), (1100, 50)]).unwrap();
        assert_eq!(served.prefill, 1000.0);
        assert_eq!(served.decode, 40.0);
        let at_served = kv_share(6, 2, 4, 0, &served);
        assert!(at_served < kv_share(6, 2, 4, 0, &short));
        // exactly at that share, cut 4 fits at the serving shape only
        let c = plan_candidates(&masses(), &served, at_served, 2).unwrap();
        assert_eq!((c[0].cut, c[0].speed_cut), (4, 4));
        assert!(c[0].heads.is_empty() && c[0].kv_share <= at_served);
        let c = plan_candidates(&masses(), &short, at_served, 2).unwrap();
        assert_eq!(c[0].speed_cut, 3);
        assert_eq!(PromptShape::mean_of([]), None);
    }

    #[test]
    fn a_prefill_budget_keeps_the_cut_and_the_pairs_below_it() {
        // without it, 0.6 buys (4, 1) above cut 3: the prompt runs 5 layers
        let free = plan_for_budget(&masses(), &SHAPE, 0.6).unwrap();
        assert_eq!(free.heads, vec![(4, 1)]);
        // the prompt may run 4 layers: the pair comes from layer 3
        let plan = plan_for_budgets(&masses(), &SHAPE, 0.6, Some(4)).unwrap();
        assert!(
            plan.cut <= 4 && plan.heads.iter().all(|&(l, _)| l < 4),
            "{plan:?}"
        );
        assert!(!plan.heads.is_empty() && plan.kv_share <= 0.6);
        assert!(plan.mass_kept < free.mass_kept);
        // 3 layers: the cut itself is held to 3 and nothing above it is kept
        let three = plan_for_budgets(&masses(), &SHAPE, 1.0, Some(3)).unwrap();
        assert_eq!((three.cut, three.heads.len(), three.speed_cut), (3, 0, 3));
        for bad in [0, 7] {
            let err = plan_for_budgets(&masses(), &SHAPE, 0.6, Some(bad))
                .unwrap_err()
                .to_string();
            assert!(err.contains("prefill budget"), "{bad}: {err}");
        }
    }

    #[test]
    fn budgets_outside_the_range_are_named() {
        for bad in [0.0, -0.5, 1.5, f64::NAN] {
            let err = plan_for_budget(&masses(), &SHAPE, bad)
                .unwrap_err()
                .to_string();
            assert!(err.contains("outside (0, 1]"), "{bad}: {err}");
        }
        let err = plan_for_budget(&masses(), &SHAPE, 0.1)
            .unwrap_err()
            .to_string();
        assert!(err.contains("below what SPEED+BoS at cut 1 holds"), "{err}");
    }

    #[test]
    fn expected_accuracy_reads_the_speed_points_by_mass() {
        let point = |l_cut, accuracy| CutoffAccuracy {
            l_cut,
            anchors: "bos".into(),
            correct: 0,
            n: 10,
            accuracy,
            interval: [0.0, 1.0],
        };
        let calibration = vec![point(3, 0.2), point(6, 0.8)];
        let m = masses();
        let total: f64 = m.iter().flatten().sum();
        let at3: f64 = m[..3].iter().flatten().sum::<f64>() / total;
        let a = expected_accuracy(&m, &calibration, at3).unwrap();
        assert!((a - 0.2).abs() < 1e-6);
        let mid = expected_accuracy(&m, &calibration, (at3 + 1.0) / 2.0).unwrap();
        assert!((mid - 0.5).abs() < 1e-6);
        assert_eq!(expected_accuracy(&m, &calibration, at3 / 2.0), None);
    }
}
