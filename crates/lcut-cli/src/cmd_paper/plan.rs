//! What a `lcut paper` run does, decided before any model runs: its
//! settings (a quick or full preset with the user's overrides), the
//! policies each part compares (data: one table of families and anchors),
//! the cuts of Figure 4, the prompt lengths of Figure 2, the suite items
//! each part reads and the note of a part the suite cannot feed.

use anyhow::{Result, bail};
use lcut_policy::{Anchors, CutSpec, PolicyKind, PolicySpec, ProjectedName};
use lcut_trace::PaperPart;
use serde::{Deserialize, Serialize};

/// The policy families the paper compares at the run's cut C, each
/// anchor-free and with BoS (full is always first). One entry per family:
/// a family added here appears in the table, Figure 2 and the loops.
pub const COMPARED: &[PolicyKind] = &[
    PolicyKind::Speed,
    PolicyKind::SelfOnly,
    // the paper's POP-24 and SwiftKV-24 baselines: one rule, projected
    // prompt K/V above the cut (`pop:C` is its alias)
    PolicyKind::Projected(ProjectedName::SwiftKv),
];

/// The anchors each compared family runs with: the paper's baselines have
/// none, SPEED+BoS keeps BoS.
pub const ANCHORS: [Anchors; 2] = [Anchors::None, Anchors::Bos];

/// The kind of suite item the retrieval figure reads.
pub const RETRIEVAL_KIND: &str = "retrieval";

/// A policy at a cut of `layers` for the paper's lists.
fn at_cut(kind: PolicyKind, cut: usize, anchors: Anchors) -> PolicySpec {
    PolicySpec::at_cut(kind, CutSpec::Layers(cut), anchors)
}

/// SPEED+BoS at `cut`: Figure 1's policy beside full.
pub fn speed_bos(cut: usize) -> PolicySpec {
    at_cut(PolicyKind::Speed, cut, Anchors::Bos)
}

/// Full, then every compared family at `cut`, anchor-free then +BoS: the
/// rows of the table, the series of Figure 2 and the loops' policies.
pub fn compared_policies(cut: usize) -> Vec<PolicySpec> {
    let mut out = vec![PolicySpec::full()];
    for &kind in COMPARED {
        out.extend(ANCHORS.iter().map(|&a| at_cut(kind, cut, a)));
    }
    out
}

/// Each policy resolved against a model of `layers` layers, so that a cut
/// out of range is refused naming the policy before any work.
pub fn check_policies(policies: &[PolicySpec], layers: usize) -> Result<()> {
    for p in policies {
        if let Err(e) = p.resolve(layers) {
            bail!("policy {p}: {e}");
        }
    }
    Ok(())
}

/// The cut when `--cut` is not given: lcut's recommendation, or three
/// quarters of the depth (the paper's 24 of 32) when it recommends no cut.
pub fn default_cut(recommended: usize, layers: usize) -> (usize, String) {
    if recommended < layers {
        (
            recommended,
            "lcut's recommendation on the diagnosed items".to_string(),
        )
    } else {
        let c = ((layers as f64 * 0.75).round() as usize).clamp(1, layers);
        (
            c,
            format!(
                "3/4 of the depth (the paper's 24 of 32): lcut recommends {recommended} of {layers}, no cut"
            ),
        )
    }
}

/// Figure 4's cuts: C and two below it, an eighth and a quarter of the
/// depth lower (at least 1, each once), deepest first.
pub fn retrieval_cuts(cut: usize, layers: usize) -> Vec<usize> {
    let step = |f: f64| (layers as f64 * f).round().max(1.0) as usize;
    let mut cuts = vec![cut];
    for below in [step(0.125), step(0.25)] {
        let c = cut.saturating_sub(below).max(1);
        if !cuts.contains(&c) {
            cuts.push(c);
        }
    }
    cuts
}

/// Figure 2's prompt lengths for runs of at most `max_len` tokens with
/// `new_tokens` new ones: 1K, 2K, 4K, ... below the longest prompt that
/// fits, then that one; for a context under 4K, a quarter, a half and
/// all of it.
pub fn timing_lengths(max_len: usize, new_tokens: usize) -> Vec<usize> {
    let top = max_len.saturating_sub(new_tokens);
    if top == 0 {
        return vec![];
    }
    if top < 4096 {
        let mut v: Vec<usize> = [top / 4, top / 2, top]
            .into_iter()
            .filter(|&n| n > 0)
            .collect();
        v.dedup();
        return v;
    }
    let mut v: Vec<usize> = std::iter::successors(Some(1024usize), |n| Some(n * 2))
        .take_while(|&n| n < top)
        .collect();
    v.push(top);
    v
}

/// `per_kind` items of each kind, spread evenly over the kind's items in
/// suite order (so that lengths and depths vary), as suite indices in
/// suite order.
pub fn spread_by_kind(kinds: &[&str], per_kind: usize) -> Vec<usize> {
    let mut order: Vec<&str> = Vec::new();
    for k in kinds {
        if !order.contains(k) {
            order.push(k);
        }
    }
    let mut out = Vec::new();
    for kind in order {
        let of: Vec<usize> = (0..kinds.len()).filter(|&i| kinds[i] == kind).collect();
        let take = per_kind.min(of.len());
        out.extend((0..take).map(|j| of[j * of.len() / take]));
    }
    out.sort_unstable();
    out
}

/// Why `part` cannot run on a suite of these kinds, if it cannot.
pub fn missing_for(part: PaperPart, kinds: &[&str]) -> Option<String> {
    match part {
        PaperPart::Retrieval if !kinds.contains(&RETRIEVAL_KIND) => Some(format!(
            "skipped: the suite has no `{RETRIEVAL_KIND}` items (its kinds: {}); \
             exact match by prompt length reads the retrieval items and their length classes",
            kinds_list(kinds)
        )),
        _ if kinds.is_empty() => Some("skipped: the suite has no items".into()),
        _ => None,
    }
}

/// The distinct kinds, comma-separated.
fn kinds_list(kinds: &[&str]) -> String {
    let mut seen: Vec<&str> = Vec::new();
    for k in kinds {
        if !seen.contains(k) {
            seen.push(k);
        }
    }
    seen.join(", ")
}

/// The sizes of a run: the `--quick` or the full preset, each overridable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sizes {
    /// Items of each kind diagnosed (Figures 1 and 3) and generated at
    /// length (the loops).
    pub items_per_kind: usize,
    /// Greedy tokens of each diagnosed prompt.
    pub diag_new_tokens: usize,
    /// Most new tokens of each scored answer (Figure 4, the table).
    pub answer_tokens: usize,
    /// New tokens of each loop generation.
    pub loop_tokens: usize,
    /// New tokens of each timed run (Figure 2; the paper's 128).
    pub timing_new_tokens: usize,
    /// Timed runs per policy and length (the median is kept).
    pub repeats: usize,
    /// Most columns of a trace's prompt-position map.
    pub max_prompt_bins: usize,
}

impl Sizes {
    /// The preset: `quick` fits CI on the bundled model in minutes.
    pub fn preset(quick: bool) -> Self {
        if quick {
            Self {
                items_per_kind: 2,
                diag_new_tokens: 6,
                answer_tokens: 12,
                loop_tokens: 24,
                timing_new_tokens: 8,
                repeats: 1,
                max_prompt_bins: 16,
            }
        } else {
            Self {
                items_per_kind: 8,
                diag_new_tokens: 16,
                answer_tokens: 24,
                loop_tokens: 96,
                timing_new_tokens: 128,
                repeats: 1,
                max_prompt_bins: 32,
            }
        }
    }

    /// The longest run `--quick` times by default, tokens.
    pub const QUICK_MAX_LEN: usize = 1024;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compared_policies_are_full_then_each_family_without_and_with_bos() {
        let names: Vec<String> = compared_policies(22)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            names,
            [
                "full",
                "speed:22",
                "speed:22+bos",
                "selfonly:22",
                "selfonly:22+bos",
                "swiftkv:22",
                "swiftkv:22+bos"
            ]
        );
        assert_eq!(speed_bos(3).to_string(), "speed:3+bos");
    }

    #[test]
    fn a_cut_out_of_range_names_the_policy() {
        let e = check_policies(&compared_policies(31), 30)
            .unwrap_err()
            .to_string();
        assert!(e.contains("policy speed:31") && e.contains("31"), "{e}");
        assert!(check_policies(&compared_policies(0), 30).is_err());
        assert!(check_policies(&compared_policies(30), 30).is_ok());
    }

    #[test]
    fn the_default_cut_is_the_recommendation_unless_it_is_no_cut() {
        assert_eq!(default_cut(22, 30).0, 22);
        let (c, why) = default_cut(4, 4);
        assert_eq!(c, 3);
        assert!(why.contains("no cut"), "{why}");
        assert_eq!(default_cut(30, 30).0, 23);
    }

    #[test]
    fn retrieval_cuts_are_c_and_two_below() {
        assert_eq!(retrieval_cuts(22, 30), vec![22, 18, 14]);
        assert_eq!(retrieval_cuts(3, 4), vec![3, 2]);
        assert_eq!(retrieval_cuts(1, 4), vec![1]);
    }

    #[test]
    fn timing_lengths_double_from_1k_to_the_longest_prompt_that_fits() {
        assert_eq!(timing_lengths(8192, 128), vec![1024, 2048, 4096, 8064]);
        assert_eq!(timing_lengths(512, 16), vec![124, 248, 496]);
        assert_eq!(timing_lengths(4224, 128), vec![1024, 2048, 4096]);
        assert!(timing_lengths(100, 128).is_empty());
    }

    #[test]
    fn spread_takes_evenly_from_each_kind() {
        let kinds = ["a", "a", "a", "a", "b", "b", "a", "a"];
        // a: 0 1 2 3 6 7 -> three spread: 0, 2, 6; b: 4 5 -> 4, 5
        assert_eq!(spread_by_kind(&kinds, 3), vec![0, 2, 4, 5, 6]);
        assert_eq!(spread_by_kind(&kinds, 0), Vec::<usize>::new());
        assert_eq!(spread_by_kind(&kinds, 9).len(), 8);
    }

    #[test]
    fn a_suite_without_retrieval_skips_figure_4_only() {
        let kinds = ["copy", "lookup"];
        let note = missing_for(PaperPart::Retrieval, &kinds).unwrap();
        assert!(
            note.contains("retrieval") && note.contains("copy, lookup"),
            "{note}"
        );
        for part in PaperPart::ALL {
            if part != PaperPart::Retrieval {
                assert_eq!(missing_for(part, &kinds), None, "{part}");
            }
        }
        assert!(missing_for(PaperPart::Retrieval, &["retrieval", "copy"]).is_none());
    }
}
