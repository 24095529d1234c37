//! The L_cut recommendation: three signals vote, the median wins.
//!
//! - **Tail mass**: the smallest `c` in `1..=L` with `R(c) <= tail_mass_max`.
//! - **Selective band**: the last layer `l` whose normalised head-mean prefill
//!   entropy is `<= entropy_max` while its mean prefill mass is `>= mass_min`;
//!   votes `l + 1`, so that layer is kept.
//! - **Curvature plateau**: on the prompt-span curvature `C_0..C_L` (the
//!   generated span when the prompt's has gaps), the smallest `p` such that
//!   `|C_{i+1} - C_i| < plateau_eps` for every `i >= p`; votes `max(p, 1)`.
//!
//! The chosen L_cut is the **median** of the votes (the larger of two): most
//! signals say the prompt is no longer read above the cut. With no votes at
//! all it is `L` (the full model). Calibrated on SmolLM2-135M-Instruct: the
//! task suite's accuracy is within 2 points of full from L_cut 26 of 30; the
//! votes there are 28, 24 and 30, and the maximum (30, the earlier rule) was
//! 4 layers too deep while the median (28) is within 2. One signal that keeps
//! voting for full depth (the curvature plateau there) no longer decides.

use lcut_trace::{LayerCurves, Recommendation, Thresholds, Votes};
use std::fmt::Write;

use crate::tail::tail_mass;

/// The tail-mass vote: smallest `c` in `1..=L` with `R(c) <= max`; `None` when
/// no layer has a finite prefill mass.
pub fn vote_tail_mass(prefill: &[f32], max: f32) -> Option<usize> {
    if !prefill.iter().any(|x| x.is_finite()) {
        return None;
    }
    let r = tail_mass(prefill);
    (1..=prefill.len()).find(|&c| r[c] <= max)
}

/// The selective-band vote: `l + 1` for the last layer `l` with
/// `entropy[l] <= entropy_max` and `prefill[l] >= mass_min`.
pub fn vote_selective_band(entropy: &[f32], prefill: &[f32], th: &Thresholds) -> Option<usize> {
    entropy
        .iter()
        .zip(prefill)
        .rposition(|(&h, &m)| h <= th.entropy_max && m >= th.mass_min)
        .map(|l| l + 1)
}

/// The curvature-plateau vote on `C_0..C_L`: `max(p, 1)` for the smallest `p`
/// from which consecutive values differ by less than `eps`; `None` when the
/// curve has a NaN or fewer than two entries.
pub fn vote_curvature_plateau(curvature: &[f32], eps: f32) -> Option<usize> {
    if curvature.len() < 2 || curvature.iter().any(|c| !c.is_finite()) {
        return None;
    }
    let last = curvature.len() - 1;
    let p = (0..last)
        .rev()
        .take_while(|&i| (curvature[i + 1] - curvature[i]).abs() < eps)
        .last()
        .unwrap_or(last);
    Some(p.max(1))
}

fn describe(vote: Option<usize>, none: &str) -> String {
    vote.map_or_else(|| format!("no vote ({none})"), |v| format!("votes {v}"))
}

/// The median of the votes cast (the larger middle one of an even count).
fn median_vote(votes: &[Option<usize>]) -> Option<usize> {
    let mut cast: Vec<usize> = votes.iter().flatten().copied().collect();
    cast.sort_unstable();
    cast.get(cast.len() / 2).copied()
}

/// Recommends L_cut from aggregated curves (see the module doc for the rule).
pub fn recommend(curves: &LayerCurves, th: &Thresholds) -> Recommendation {
    let l = curves.num_layers;
    let tail = tail_mass(&curves.prefill);
    let (plateau_curve, span) = if curves.curvature_prompt.iter().all(|c| c.is_finite()) {
        (&curves.curvature_prompt, "prompt")
    } else {
        (&curves.curvature_generated, "generated")
    };
    let votes = Votes {
        tail_mass: vote_tail_mass(&curves.prefill, th.tail_mass_max),
        selective_band: vote_selective_band(&curves.entropy_head_mean, &curves.prefill, th),
        curvature_plateau: vote_curvature_plateau(plateau_curve, th.plateau_eps),
    };
    let cast = [
        votes.tail_mass,
        votes.selective_band,
        votes.curvature_plateau,
    ];
    let l_cut = median_vote(&cast).unwrap_or(l).clamp(1, l.max(1));
    let dropped = tail.get(l_cut).copied().unwrap_or(f32::NAN);

    let mut text = format!(
        "Recommended L_cut = {l_cut} of {l} layers: the median of the votes below (the larger \
         of two), so most signals say the prompt is no longer read above the cut. At this cut \
         SPEED drops {:.1}% of the decode-to-prefill attention mass.\n",
        100.0 * dropped
    );
    let tail_at = |v: Option<usize>| {
        v.and_then(|c| tail.get(c))
            .map_or(String::new(), |r| format!(" (R = {r:.3})"))
    };
    // Writing into a String cannot fail.
    let _ = writeln!(
        text,
        "- Tail mass: smallest cut whose dropped share of prefill mass R(c) <= {:.3}: {}{}.",
        th.tail_mass_max,
        describe(votes.tail_mass, "no prefill mass was measured"),
        tail_at(votes.tail_mass)
    );
    let _ = writeln!(
        text,
        "- Selective reading: last layer with normalised head-mean prefill entropy <= {:.2} \
         and mean prefill mass >= {:.3}, plus one: {}.",
        th.entropy_max,
        th.mass_min,
        describe(
            votes.selective_band,
            "no layer reads the prompt selectively"
        )
    );
    let _ = writeln!(
        text,
        "- Curvature plateau ({span} span): first layer from which the curvature changes by \
         less than {:.3} rad per layer: {}.",
        th.plateau_eps,
        describe(votes.curvature_plateau, "the curvature curve has gaps")
    );
    if !curves.state_split_layers.is_empty() {
        let _ = writeln!(
            text,
            "- {} of {l} layers have no attention rows (linear attention): their prefill mass is \
             the prompt's share of the layer's output (the state split), and they have no entropy.",
            curves.state_split_layers.len()
        );
    }
    if cast.iter().all(Option::is_none) {
        text.push_str("No signal voted, so the full depth is kept.\n");
    }
    Recommendation {
        l_cut,
        num_layers: l,
        votes,
        tail_mass_dropped: dropped,
        explanation: text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lcut_trace::{Series, Tensor2};

    fn curves(prefill: Vec<f32>, entropy: Vec<f32>, curvature: Vec<f32>) -> LayerCurves {
        let l = prefill.len();
        let s = |v: Vec<f32>| Series(v);
        LayerCurves {
            num_layers: l,
            num_heads: 1,
            bos: Series::nan(l),
            anchor: Series::nan(l),
            tail_mass: s(tail_mass(&prefill)),
            prefill: s(prefill),
            decode: Series::nan(l),
            self_mass: Series::nan(l),
            sink: Series::default(),
            entropy_head_mean: s(entropy.clone()),
            entropy_weighted: s(entropy),
            curvature_prompt: s(curvature.clone()),
            curvature_generated: s(curvature.clone()),
            straightening_prompt: s(curvature.clone()),
            straightening_generated: s(curvature),
            lens_prob: Series::default(),
            lens_top1: Series::default(),
            lens_formed: Series::default(),
            lens_kl: Series::default(),
            lens_log_rank: Series::default(),
            knockout_kl: Series::default(),
            knockout_top1: Series::default(),
            prefill_by_head: Tensor2::zeros([l, 1]),
            prefill_by_step: Tensor2::zeros([l, 0]),
            routing: None,
            state_split_layers: Vec::new(),
        }
    }

    #[test]
    fn tail_vote_is_smallest_cut_under_the_threshold() {
        // R = [1, .5, .2, .04, .01, 0]
        let m = [0.5, 0.3, 0.16, 0.03, 0.01];
        assert_eq!(vote_tail_mass(&m, 0.05), Some(3));
        assert_eq!(vote_tail_mass(&m, 0.21), Some(2));
        assert_eq!(vote_tail_mass(&m, 0.0), Some(5));
        assert_eq!(vote_tail_mass(&[f32::NAN; 3], 0.05), None);
    }

    #[test]
    fn selective_band_vote_is_one_past_the_last_selective_layer() {
        let th = Thresholds::default(); // entropy <= 0.6, mass >= 0.05
        let h = [0.9, 0.4, 0.5, 0.3, 0.8];
        let m = [0.3, 0.2, 0.1, 0.01, 0.2];
        // layer 3 has low entropy but too little mass; layer 2 is the last.
        assert_eq!(vote_selective_band(&h, &m, &th), Some(3));
        assert_eq!(vote_selective_band(&[0.9; 5], &m, &th), None);
        assert_eq!(vote_selective_band(&[f32::NAN; 5], &m, &th), None);
    }

    #[test]
    fn plateau_vote_finds_where_curvature_stops_changing() {
        let c = [2.0, 1.8, 1.5, 1.45, 1.44, 1.445];
        assert_eq!(vote_curvature_plateau(&c, 0.02), Some(3));
        assert_eq!(vote_curvature_plateau(&c, 0.1), Some(2));
        // changes at the very top: no plateau before L
        assert_eq!(vote_curvature_plateau(&[1.0, 1.0, 1.0, 2.0], 0.02), Some(3));
        // flat from the start: the cut is at least 1
        assert_eq!(vote_curvature_plateau(&[1.0, 1.0, 1.0], 0.02), Some(1));
        assert_eq!(vote_curvature_plateau(&[1.0, f32::NAN, 1.0], 0.02), None);
    }

    #[test]
    fn chosen_cut_is_the_median_vote_and_explained() {
        let c = curves(
            // R = [1, .55, .25, .09, .03, 0]
            vec![0.45, 0.3, 0.16, 0.06, 0.03],
            vec![0.9, 0.4, 0.5, 0.7, 0.8],
            vec![2.0, 1.8, 1.5, 1.45, 1.44, 1.445],
        );
        let r = recommend(&c, &Thresholds::default());
        assert_eq!(
            r.votes,
            Votes {
                tail_mass: Some(4),
                selective_band: Some(3),
                curvature_plateau: Some(3)
            }
        );
        // votes 4, 3, 3: the median is 3 (the maximum would be 4)
        assert_eq!(r.l_cut, 3);
        assert!((r.tail_mass_dropped - 0.09).abs() < 1e-6);
        for needle in [
            "L_cut = 3 of 5",
            "median",
            "votes 3",
            "votes 4",
            "<= 0.050",
            "<= 0.60",
            "0.020 rad",
            "prompt span",
        ] {
            assert!(
                r.explanation.contains(needle),
                "missing {needle:?} in\n{}",
                r.explanation
            );
        }
    }

    #[test]
    fn the_median_rule_on_the_calibration_votes() {
        // SmolLM2's votes (tail 28, selective 24, curvature 30): the median
        // is 28, within 2 of the accuracy-based cut 26; the maximum was 30
        assert_eq!(median_vote(&[Some(28), Some(24), Some(30)]), Some(28));
        assert_eq!(median_vote(&[Some(4), Some(4), Some(3)]), Some(4));
        assert_eq!(median_vote(&[None, Some(2), Some(5)]), Some(5));
        assert_eq!(median_vote(&[None, Some(2), None]), Some(2));
        assert_eq!(median_vote(&[None, None, None]), None);
    }

    #[test]
    fn no_votes_keep_full_depth() {
        let c = curves(vec![f32::NAN; 4], vec![f32::NAN; 4], vec![f32::NAN; 5]);
        let r = recommend(&c, &Thresholds::default());
        assert_eq!(r.l_cut, 4);
        assert!(r.explanation.contains("full depth"), "{}", r.explanation);
    }
}
