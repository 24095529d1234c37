//! From a compression ratio (the share of the prompt's K/V removed, as
//! kvpress's leaderboard means it) to each family's own knob. One table,
//! [`RATIO_FAMILIES`], holds the rule of every family that `--ratios`
//! maps; a family that takes the ratio itself (kvpress's presses, written
//! `NAME:R`) is one line there with [`press_ratio`]. Where layers slide
//! (Gemma 3) a layer holds at most its window of the prompt, so the share a
//! cut removes is counted in the rows the full model holds
//! ([`PromptRows`]), not in layers.

use lcut_policy::window::{LayerWindows, held_positions, window_of};

use super::LeaderboardError;

/// How the full model's prompt K/V spreads over its layers: the prompt
/// rows each layer holds (every one, or a sliding-window layer's window).
#[derive(Debug, Clone, PartialEq)]
pub struct PromptRows {
    rows: Vec<f64>,
    /// The prompt length the windowed rows were counted at (`None`: no
    /// layer slides, every layer holds the whole prompt).
    prompt_len: Option<usize>,
}

impl PromptRows {
    /// A model of `layers` layers that all hold the whole prompt.
    pub fn uniform(layers: usize) -> Self {
        Self {
            rows: vec![1.0; layers],
            prompt_len: None,
        }
    }

    /// A model of `layers` layers with these sliding windows, at a prompt
    /// of `prompt_len` tokens (uniform where no layer slides or the prompt
    /// fits every window).
    pub fn windowed(windows: &LayerWindows, layers: usize, prompt_len: usize) -> Self {
        let rows: Vec<f64> = (0..layers)
            .map(|l| held_positions(window_of(windows, l), prompt_len).len() as f64)
            .collect();
        match rows.iter().all(|&r| r == prompt_len as f64) {
            true => Self::uniform(layers),
            false => Self {
                rows,
                prompt_len: Some(prompt_len),
            },
        }
    }

    /// The model's layers.
    pub fn layers(&self) -> usize {
        self.rows.len()
    }

    /// The share of the prompt's K/V a cut at `cut` removes: the rows of
    /// the layers from `cut` on (`(L - C) / L` where no layer slides).
    pub fn removed_by_cut(&self, cut: usize) -> f64 {
        let total: f64 = self.rows.iter().sum();
        if total == 0.0 {
            return 0.0;
        }
        self.rows.iter().skip(cut).sum::<f64>() / total
    }

    /// The share of the prompt's K/V held by the layers that hold the
    /// whole prompt (1 where no layer slides): what a press compresses.
    pub fn unwindowed_share(&self) -> f64 {
        let (total, n): (f64, f64) = match self.prompt_len {
            Some(n) => (self.rows.iter().sum(), n as f64),
            None => return 1.0,
        };
        if total == 0.0 {
            return 1.0;
        }
        self.rows.iter().filter(|&&r| r == n).sum::<f64>() / total
    }

    /// How the rows were counted, for a knob's note: empty where no layer
    /// slides.
    fn counted(&self) -> String {
        match self.prompt_len {
            Some(n) => format!(" (sliding windows counted, at {n} prompt tokens)"),
            None => String::new(),
        }
    }
}

/// What a family's knob is at one ratio.
#[derive(Debug, Clone, PartialEq)]
pub struct RatioKnob {
    /// The policy, written out (`speed:22+bos`).
    pub policy: String,
    /// The share of the prompt's K/V the family's formula removes there.
    pub removed: f64,
    /// How the knob was chosen, in words.
    pub note: String,
}

/// A family's rule: the knob for `ratio` on a model whose prompt K/V
/// spreads over its layers as `rows` says, with `family` and its `options`
/// (`+bos`, `+block:16`: everything after the name) as written.
pub type KnobRule = fn(ratio: f64, rows: &PromptRows, family: &str, options: &str) -> RatioKnob;

/// The families `--ratios` maps, one line each (a press that takes the
/// ratio itself: `("streamingllm", press_ratio)`).
pub const RATIO_FAMILIES: &[(&str, KnobRule)] = &[
    ("speed", depth_cut),
    ("selfonly", depth_cut),
    ("swiftkv", projected_cut),
    ("pop", projected_cut),
    ("slim", slim_budget),
    ("streamingllm", press_ratio),
    ("snapkv", press_ratio),
    ("pyramidkv", press_ratio),
    ("knorm", press_ratio),
    ("tova", press_ratio),
    ("expected", press_ratio),
];

/// The knob of `method` (a family and its options, `speed+bos`) at
/// `ratio`; a ratio outside (0, 1) or a family without a rule is a named
/// error.
pub fn map_ratio(
    method: &str,
    ratio: f64,
    rows: &PromptRows,
) -> Result<RatioKnob, LeaderboardError> {
    check_ratio(ratio)?;
    let (family, options) = split_method(method);
    let rule = RATIO_FAMILIES
        .iter()
        .find(|(name, _)| *name == family)
        .map(|(_, rule)| *rule)
        .ok_or_else(|| LeaderboardError::UnknownFamily {
            method: method.to_string(),
            known: RATIO_FAMILIES
                .iter()
                .map(|(n, _)| *n)
                .collect::<Vec<_>>()
                .join(", "),
        })?;
    Ok(rule(ratio, rows, family, options))
}

/// A ratio must be in (0, 1): the share of the prompt's K/V removed.
pub fn check_ratio(ratio: f64) -> Result<(), LeaderboardError> {
    if ratio > 0.0 && ratio < 1.0 {
        Ok(())
    } else {
        Err(LeaderboardError::RatioOutOfRange { ratio })
    }
}

/// `speed+bos` -> (`speed`, `+bos`).
pub fn split_method(method: &str) -> (&str, &str) {
    let method = method.trim();
    match method.find('+') {
        Some(i) => (&method[..i], &method[i..]),
        None => (method, ""),
    }
}

/// The cut whose share of the prompt's K/V removed
/// ([`PromptRows::removed_by_cut`]: `(L - C) / L` where no layer slides) is
/// closest to `ratio`; a tie goes to the shallower cut, which removes at
/// least the ratio.
pub fn closest_cut(ratio: f64, rows: &PromptRows) -> usize {
    let layers = rows.layers();
    let removed = |c: usize| rows.removed_by_cut(c);
    (1..=layers)
        .min_by(|&a, &b| {
            let (da, db) = ((removed(a) - ratio).abs(), (removed(b) - ratio).abs());
            // 1e-12: (L - C) / L - r ties exactly only up to rounding
            if (da - db).abs() < 1e-12 {
                a.cmp(&b)
            } else {
                da.total_cmp(&db)
            }
        })
        .unwrap_or(layers)
}

/// SPEED (and SelfOnly): the prompt keeps K/V in the lower `C` layers, so
/// `(L - C) / L` of it is removed (less the anchors, which stay at every
/// layer); the cut closest to the ratio.
pub fn depth_cut(ratio: f64, rows: &PromptRows, family: &str, options: &str) -> RatioKnob {
    let (layers, cut) = (rows.layers(), closest_cut(ratio, rows));
    let removed = rows.removed_by_cut(cut);
    RatioKnob {
        policy: format!("{family}:{cut}{options}"),
        removed,
        note: format!(
            "cut {cut} of {layers}: the prompt's K/V in the lower {cut} layers, \
             {removed:.3} of it removed{} (the closest cut to {ratio}; anchors stay at every layer)",
            rows.counted()
        ),
    }
}

/// SwiftKV and POP: above the cut the prompt's K/V is projected, not
/// removed, so no ratio of K/V is reachable; the ratio sets the cut as
/// for SPEED (the share of the prompt's layers skipped).
pub fn projected_cut(ratio: f64, rows: &PromptRows, family: &str, options: &str) -> RatioKnob {
    let (layers, cut) = (rows.layers(), closest_cut(ratio, rows));
    RatioKnob {
        policy: format!("{family}:{cut}{options}"),
        removed: 0.0,
        note: format!(
            "cut {cut} of {layers}, as SPEED's at {ratio}: the prompt skips {:.3} of the layers \
             but every layer keeps its K/V (projected above the cut), so none is removed",
            (layers - cut) as f64 / layers as f64
        ),
    }
}

/// SlimInfer: the prompt runs whole up to the first cut `C`, and from
/// there a share `k` of it; `(1 - C/L)(1 - k)` is removed. `C` is the
/// paper's first cut (5/16 of the depth), lowered where the ratio needs it
/// so that the layers running the whole prompt hold at most half of the
/// K/V kept: `C <= L(1 - r)/2`; then `k = 1 - r L / (L - C)`. Counted in
/// layers, windows or not (which of a sliding layer's rows SlimInfer keeps
/// depends on the blocks it picks; the run measures what it removed).
pub fn slim_budget(ratio: f64, rows: &PromptRows, family: &str, options: &str) -> RatioKnob {
    let layers = rows.layers();
    let paper = ((5 * layers) as f64 / 16.0).round() as usize;
    let room = (layers as f64 * (1.0 - ratio) / 2.0).floor() as usize;
    let cut = paper.min(room).clamp(1, layers.saturating_sub(1).max(1));
    // at least 1% kept: a ratio the depth cannot reach is noted, not refused
    let kept = (1.0 - ratio * layers as f64 / (layers - cut).max(1) as f64).clamp(0.01, 1.0);
    let removed = (1.0 - cut as f64 / layers as f64) * (1.0 - kept);
    let lowered = if cut < paper {
        format!(" (the paper's {paper} lowered: at most half the kept K/V below it)")
    } else {
        String::new()
    };
    RatioKnob {
        policy: format!("{family}:{cut}@{:.2}%{options}", kept * 100.0),
        removed,
        note: format!(
            "first cut {cut} of {layers}{lowered}, {:.2}% of the prompt kept from there: \
             {removed:.3} removed",
            kept * 100.0
        ),
    }
}

/// A press's own knob: the ratio itself, `FAMILY:R` (kvpress's
/// `compression_ratio`), which it removes at the layers that hold the
/// whole prompt; where layers slide the press leaves them whole (kvpress's
/// rule for Gemma 3), so it removes that share of those layers' rows only.
pub fn press_ratio(ratio: f64, rows: &PromptRows, family: &str, options: &str) -> RatioKnob {
    let share = rows.unwindowed_share();
    let note = match share < 1.0 {
        true => format!(
            "the press's own compression ratio, at the layers without a sliding window: \
             about {:.3} of the prompt's K/V{}",
            ratio * share,
            rows.counted()
        ),
        false => "the press's own compression ratio".into(),
    };
    RatioKnob {
        policy: format!("{family}:{ratio}{options}"),
        removed: ratio * share,
        note,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lcut_policy::PolicySpec;

    /// The policy `method` maps `ratio` to on `layers` layers that all
    /// hold the whole prompt.
    fn policy_at(method: &str, ratio: f64, layers: usize) -> String {
        map_ratio(method, ratio, &PromptRows::uniform(layers))
            .unwrap()
            .policy
    }

    #[test]
    fn every_press_takes_the_ratio_itself_as_a_policy_lcut_reads() {
        for press in [
            "streamingllm",
            "snapkv",
            "pyramidkv",
            "knorm",
            "tova",
            "expected",
        ] {
            let k = map_ratio(press, 0.75, &PromptRows::uniform(30)).unwrap();
            assert_eq!(k.policy, format!("{press}:0.75"));
            assert_eq!(k.removed, 0.75);
            k.policy
                .parse::<PolicySpec>()
                .unwrap_or_else(|e| panic!("{press}: {e}"));
        }
        let k = map_ratio("streamingllm+sink:8", 0.5, &PromptRows::uniform(30)).unwrap();
        assert_eq!(k.policy, "streamingllm:0.5+sink:8");
        k.policy.parse::<PolicySpec>().unwrap();
    }

    #[test]
    fn speed_takes_the_closest_cut_and_ties_remove_at_least_the_ratio() {
        // 30 layers: 0.25 lies between cuts 22 (0.267) and 23 (0.233)
        let k = map_ratio("speed+bos", 0.25, &PromptRows::uniform(30)).unwrap();
        assert_eq!(k.policy, "speed:22+bos");
        assert!((k.removed - 8.0 / 30.0).abs() < 1e-12);
        assert!(k.note.contains("cut 22 of 30"), "{}", k.note);
        assert_eq!(policy_at("speed", 0.5, 30), "speed:15");
        assert_eq!(policy_at("speed", 0.75, 30), "speed:7");
        // 0.875 of 30: cut 3.75 -> 4 (0.867) beats 3 (0.9)
        assert_eq!(policy_at("speed", 0.875, 30), "speed:4");
        assert_eq!(policy_at("speed", 0.875, 4), "speed:1");
        assert_eq!(closest_cut(0.01, &PromptRows::uniform(30)), 30);
        for layers in [4, 30, 32] {
            for r in [0.1, 0.25, 0.5, 0.75, 0.875] {
                let c = closest_cut(r, &PromptRows::uniform(layers));
                let best = (1..=layers)
                    .map(|x| ((layers - x) as f64 / layers as f64 - r).abs())
                    .fold(f64::INFINITY, f64::min);
                assert!(((layers - c) as f64 / layers as f64 - r).abs() <= best + 1e-12);
            }
        }
    }

    #[test]
    fn where_layers_slide_the_cut_is_counted_in_the_rows_they_hold() {
        // Gemma 3 270M: five sliding layers (window 512) then a global one,
        // three times; a prompt of 3,950 tokens: the global layers hold
        // 3,950 rows each, the sliding ones 511
        let windows: Vec<Option<usize>> = (0..18)
            .map(|l| if l % 6 == 5 { None } else { Some(512) })
            .collect();
        let rows = PromptRows::windowed(&windows, 18, 3950);
        let total = 3.0 * 3950.0 + 15.0 * 511.0;
        // cut 15 removes the global layer 17 and the sliding 15, 16
        assert!((rows.removed_by_cut(15) - (3950.0 + 2.0 * 511.0) / total).abs() < 1e-12);
        for (r, cut) in [(0.25, 15), (0.5, 11), (0.75, 6), (0.875, 5)] {
            let k = map_ratio("speed+bos", r, &rows).unwrap();
            assert_eq!(k.policy, format!("speed:{cut}+bos"), "{r}");
            assert_eq!(k.removed, rows.removed_by_cut(cut));
            assert!(k.note.contains("at 3950 prompt tokens"), "{}", k.note);
            assert_eq!(
                map_ratio("swiftkv", r, &rows).unwrap().policy,
                format!("swiftkv:{cut}")
            );
        }
        // a press removes the ratio of the global layers' rows only
        let k = map_ratio("snapkv", 0.5, &rows).unwrap();
        let global = 3.0 * 3950.0 / total;
        assert_eq!(k.policy, "snapkv:0.5");
        assert!((k.removed - 0.5 * global).abs() < 1e-12, "{}", k.removed);
        assert!(k.note.contains("without a sliding window"), "{}", k.note);
        // a count by layers would have taken 13, 9, 4 and 2
        assert_eq!(policy_at("speed", 0.5, 18), "speed:9");
        // a prompt within every window, or no window: every layer alike
        assert_eq!(
            PromptRows::windowed(&windows, 18, 300),
            PromptRows::uniform(18)
        );
        assert_eq!(PromptRows::windowed(&[], 18, 3950), PromptRows::uniform(18));
    }

    #[test]
    fn projected_families_take_speed_s_cut_and_remove_nothing() {
        let k = map_ratio("swiftkv+bos", 0.5, &PromptRows::uniform(30)).unwrap();
        assert_eq!((k.policy.as_str(), k.removed), ("swiftkv:15+bos", 0.0));
        assert_eq!(policy_at("pop", 0.25, 30), "pop:22");
    }

    #[test]
    fn slim_keeps_the_share_that_removes_the_ratio() {
        for (r, cut) in [(0.25, 9), (0.5, 7), (0.75, 3), (0.875, 1)] {
            let k = map_ratio("slim+block:16", r, &PromptRows::uniform(30)).unwrap();
            assert!(
                k.policy.starts_with(&format!("slim:{cut}@")),
                "{}",
                k.policy
            );
            assert!(k.policy.ends_with("%+block:16"), "{}", k.policy);
            assert!((k.removed - r).abs() < 1e-4, "{r}: {}", k.removed);
        }
        assert!(
            map_ratio("slim", 0.875, &PromptRows::uniform(30))
                .unwrap()
                .note
                .contains("lowered")
        );
    }

    #[test]
    fn every_mapped_knob_is_a_policy_of_the_model() {
        for (family, _) in RATIO_FAMILIES {
            for layers in [4, 30] {
                for r in [0.25, 0.5, 0.75, 0.875] {
                    let k = map_ratio(family, r, &PromptRows::uniform(layers)).unwrap();
                    let spec: PolicySpec = k.policy.parse().unwrap();
                    spec.resolve(layers).unwrap();
                }
            }
        }
        let k = press_ratio(0.5, &PromptRows::uniform(30), "streamingllm", "");
        assert_eq!((k.policy.as_str(), k.removed), ("streamingllm:0.5", 0.5));
    }

    #[test]
    fn bad_ratios_and_families_are_named() {
        for r in [0.0, 1.0, -0.5, 1.5, f64::NAN] {
            let e = map_ratio("speed", r, &PromptRows::uniform(30)).unwrap_err();
            assert!(matches!(e, LeaderboardError::RatioOutOfRange { .. }), "{e}");
            assert!(e.to_string().contains("(0, 1)"), "{e}");
        }
        let e = map_ratio("h2o", 0.5, &PromptRows::uniform(30))
            .unwrap_err()
            .to_string();
        assert!(e.contains("h2o") && e.contains("speed, selfonly"), "{e}");
    }
}
