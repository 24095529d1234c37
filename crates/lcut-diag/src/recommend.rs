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
//!
//! On a model where some layers store no K/V of their own (Gemma 4's shared
//! layers, Qwen3.5's linear-attention layers) several cuts hold the same
//! prompt K/V; the explanation names that range ([`same_kv_cuts`]), and says
//! so when the cut saves no K/V at all.

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

/// The cuts that hold the same prompt K/V as `cut`, lowest and highest:
/// SPEED at cut `c` keeps the prompt's K/V in the layers below `c` that
/// store their own (`stores_kv`, one per layer), so every cut between the
/// last such layer below `cut` (exclusive) and the first at or above it
/// (inclusive, as a cut) keeps the same ones. Cuts run from 1 to the depth;
/// an empty `stores_kv` means every layer stores its own (the range is `cut`
/// alone).
pub fn same_kv_cuts(stores_kv: &[bool], cut: usize) -> (usize, usize) {
    let l = stores_kv.len();
    if l == 0 {
        return (cut, cut);
    }
    let cut = cut.clamp(1, l);
    let below = stores_kv[..cut]
        .iter()
        .rposition(|&s| s)
        .map_or(1, |i| i + 1);
    let above = stores_kv[cut..]
        .iter()
        .position(|&s| s)
        .map_or(l, |j| cut + j);
    (below, above)
}

/// Layer indices in words: `layer 3`, `layers 3, 7 and 11`.
fn layer_list(layers: &[usize]) -> String {
    let names: Vec<String> = layers.iter().map(ToString::to_string).collect();
    match names.split_last() {
        None => String::new(),
        Some((last, [])) => format!("layer {last}"),
        Some((last, rest)) => format!("layers {} and {last}", rest.join(", ")),
    }
}

/// What the cut holds on a layout where some layers store no K/V of their
/// own: the cuts that hold the same prompt K/V, and whether any is saved
/// (`None` when `cut` is the only cut holding its K/V).
fn same_kv_sentence(stores_kv: &[bool], cut: usize) -> Option<String> {
    let (lo, hi) = same_kv_cuts(stores_kv, cut);
    if lo == hi {
        return None;
    }
    let l = stores_kv.len();
    let storing: Vec<usize> = (0..l).filter(|&i| stores_kv[i]).collect();
    let kept: Vec<usize> = storing.iter().copied().filter(|&i| i < cut).collect();
    let held = match kept.len() {
        0 => "none of the prompt's K/V".to_string(),
        n if n == storing.len() => format!("all of the prompt's K/V ({})", layer_list(&kept)),
        _ => format!(
            "the prompt's K/V of {} ({} of the {} layers that store K/V)",
            layer_list(&kept),
            kept.len(),
            storing.len()
        ),
    };
    let mut text = format!(
        "- K/V on this layout: {} of {l} layers store K/V of their own (the others read another \
         layer's or hold a recurrent state), so every cut from {lo} to {hi} holds {held}, as \
         L_cut {cut} does; within that range a cut changes the prompt's compute, not its memory.",
        storing.len()
    );
    if kept.len() == storing.len() && cut < l {
        text.push_str(
            " No layer from the cut up stores K/V, so this cut saves no K/V memory against the \
             full model: it saves the prompt's compute above the cut and the decode steps' \
             reading of the prompt there.",
        );
    }
    Some(text)
}

/// Recommends L_cut from aggregated curves (see the module doc for the
/// rule); `stores_kv` says which layers store K/V of their own (empty:
/// every layer), for the explanation's K/V line.
pub fn recommend(curves: &LayerCurves, th: &Thresholds, stores_kv: &[bool]) -> Recommendation {
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
    if let Some(line) = same_kv_sentence(stores_kv, l_cut) {
        let _ = writeln!(text, "{line}");
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
        let r = recommend(&c, &Thresholds::default(), &[]);
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

    /// Qwen3.5's pattern (layers 3 and 7 of 8 hold K/V) and Gemma 4 E2B's
    /// (layers 0-14 of 35 hold it, the last 20 read theirs): the cuts that
    /// keep the same layers' prompt K/V.
    #[test]
    fn cuts_between_storing_layers_hold_the_same_kv() {
        let hybrid: Vec<bool> = (0..8).map(|l| l % 4 == 3).collect();
        assert_eq!(same_kv_cuts(&hybrid, 1), (1, 3));
        assert_eq!(same_kv_cuts(&hybrid, 3), (1, 3));
        assert_eq!(same_kv_cuts(&hybrid, 4), (4, 7));
        assert_eq!(same_kv_cuts(&hybrid, 6), (4, 7));
        assert_eq!(same_kv_cuts(&hybrid, 8), (8, 8));
        let shared: Vec<bool> = (0..35).map(|l| l < 15).collect();
        assert_eq!(same_kv_cuts(&shared, 10), (10, 10));
        assert_eq!(same_kv_cuts(&shared, 15), (15, 35));
        assert_eq!(same_kv_cuts(&shared, 28), (15, 35));
        // every layer its own (or the report does not say): the cut alone
        assert_eq!(same_kv_cuts(&[true; 6], 4), (4, 4));
        assert_eq!(same_kv_cuts(&[], 4), (4, 4));
    }

    /// The explanation names the range on a hybrid layout, says that a cut
    /// above every storing layer saves no K/V, and says nothing of it where
    /// every layer stores its own.
    #[test]
    fn the_explanation_says_which_cuts_hold_the_same_kv() {
        let c = curves(
            // R = [1, .55, .25, .09, .03, 0]: the votes 4, 3, 3 as above
            vec![0.45, 0.3, 0.16, 0.06, 0.03],
            vec![0.9, 0.4, 0.5, 0.7, 0.8],
            vec![2.0, 1.8, 1.5, 1.45, 1.44, 1.445],
        );
        let th = Thresholds::default();
        let hybrid = [false, true, false, false, true];
        let r = recommend(&c, &th, &hybrid);
        assert_eq!(r.l_cut, 3);
        assert!(
            r.explanation.contains(
                "2 of 5 layers store K/V of their own (the others read another layer's or hold a \
                 recurrent state), so every cut from 2 to 4 holds the prompt's K/V of layer 1 (1 \
                 of the 2 layers that store K/V), as L_cut 3 does"
            ),
            "{}",
            r.explanation
        );
        assert!(!r.explanation.contains("saves no K/V"), "{}", r.explanation);
        let shared = [true, true, false, false, false];
        let r = recommend(&c, &th, &shared);
        assert!(
            r.explanation
                .contains("every cut from 2 to 5 holds all of the prompt's K/V (layers 0 and 1)"),
            "{}",
            r.explanation
        );
        assert!(
            r.explanation.contains("saves no K/V memory"),
            "{}",
            r.explanation
        );
        for uniform in [&[][..], &[true; 5][..]] {
            let r = recommend(&c, &th, uniform);
            assert!(
                !r.explanation.contains("K/V on this layout"),
                "{}",
                r.explanation
            );
        }
    }

    #[test]
    fn no_votes_keep_full_depth() {
        let c = curves(vec![f32::NAN; 4], vec![f32::NAN; 4], vec![f32::NAN; 5]);
        let r = recommend(&c, &Thresholds::default(), &[]);
        assert_eq!(r.l_cut, 4);
        assert!(r.explanation.contains("full depth"), "{}", r.explanation);
    }
}
