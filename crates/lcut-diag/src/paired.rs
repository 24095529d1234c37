//! Paired comparisons of a leaderboard run's configurations: at each
//! compression ratio every pair of configurations (the full model with
//! them) is compared on the items both scored, and Holm's step-down
//! decides which differences are real at the run's level.
//!
//! - Right-or-wrong items (every shared score 0 or 1): the exact McNemar
//!   test, the two-sided binomial test of the discordant items `b` (the
//!   first right, the second wrong) of `b + c` at one half
//!   ([`mcnemar_exact`]).
//! - Partial scores (RULER's string match can give 1/3 of an item): a
//!   paired bootstrap of the mean score difference ([`paired_bootstrap`]),
//!   seeded, so the same run gives the same p-values.
//! - [`holm`] adjusts the p-values of one ratio's pairs together; a pair
//!   is real when its adjusted p is at most alpha (0.05).
//!
//! Items one configuration lacks are left out of that pair's test and
//! counted ([`PairComparison::only_a`], `only_b`); a pair with no shared
//! item is said to be one. [`check_shard_items`] names an item missing
//! from, or repeated across, the shards of a run before they merge.

use std::collections::BTreeMap;

use lcut_trace::{LeaderboardConfig, LeaderboardPairs, PairComparison, PairTest, PairVerdict};

use crate::error::DiagError;

/// The family-wise level of each ratio's decisions: "real at 95%".
pub const ALPHA: f64 = 0.05;
/// Resamples of each paired bootstrap.
pub const BOOTSTRAP_RESAMPLES: usize = 10_000;
/// The paired bootstrap's seed (the issue that asked for the test).
pub const BOOTSTRAP_SEED: u64 = 53;
/// The group of the methods given with their own knob (no ratio).
pub const OWN_KNOB: &str = "own knob";

/// P(X <= k) for X ~ Binomial(n, 1/2), exactly up to rounding: the terms
/// are summed as ratios to the largest one in the sum (no term overflows
/// or cancels), and that term, C(n, m) / 2^n, is taken in log space with
/// a compensated sum, so the result keeps about 1e-13 relative precision
/// at n in the thousands (and underflows to 0 only below about 1e-308).
pub fn binomial_cdf_half(k: usize, n: usize) -> f64 {
    if k >= n {
        return 1.0;
    }
    // the terms grow up to i = n/2; the largest term summed is at m
    let m = k.min(n / 2);
    // ln C(n, m) = sum over i of ln((n - m + i) / i), each ratio >= 1,
    // summed with Neumaier's compensation (thousands of terms)
    let (mut ln_top, mut carry) = (-(n as f64) * std::f64::consts::LN_2, 0.0);
    for i in 1..=m {
        let x = ((n - m + i) as f64 / i as f64).ln();
        let t = ln_top + x;
        carry += match ln_top.abs() >= x.abs() {
            true => (ln_top - t) + x,
            false => (x - t) + ln_top,
        };
        ln_top = t;
    }
    let ln_top = ln_top + carry;
    // the terms as ratios to term m: below m going down, above m (k past
    // the mode) going up, each step a ratio of at most 1
    let mut sum = 1.0;
    let mut r = 1.0;
    for i in (1..=m).rev() {
        // C(n, i - 1) / C(n, i) = i / (n - i + 1)
        r *= i as f64 / (n - i + 1) as f64;
        if r == 0.0 {
            break;
        }
        sum += r;
    }
    let mut r = 1.0;
    for i in m..k {
        // C(n, i + 1) / C(n, i) = (n - i) / (i + 1), at most 1 past the mode
        r *= (n - i) as f64 / (i + 1) as f64;
        sum += r;
    }
    (ln_top.exp() * sum).min(1.0)
}

/// The exact McNemar test's two-sided p-value of `b` items the first
/// configuration got right and the second wrong, and `c` the reverse:
/// 2 P(X <= min(b, c)) for X ~ Binomial(b + c, 1/2), at most 1 (1 when
/// there is no discordant item). The same as statsmodels'
/// `mcnemar(exact=True)` and scipy's two-sided `binomtest(b, b + c)`.
pub fn mcnemar_exact(b: usize, c: usize) -> f64 {
    (2.0 * binomial_cdf_half(b.min(c), b + c)).min(1.0)
}

/// Holm's step-down adjustment of `p` (one family of tests): sorted
/// ascending, the i-th smallest (from 0) times `m - i`, made
/// non-decreasing, capped at 1; returned in the order given. A test is
/// rejected at level alpha when its adjusted p is at most alpha, as
/// statsmodels' `multipletests(method="holm")` decides.
pub fn holm(p: &[f64]) -> Vec<f64> {
    let m = p.len();
    let mut order: Vec<usize> = (0..m).collect();
    order.sort_by(|&x, &y| p[x].total_cmp(&p[y]));
    let mut out = vec![0.0; m];
    let mut running: f64 = 0.0;
    for (rank, &i) in order.iter().enumerate() {
        running = running.max(((m - rank) as f64 * p[i]).min(1.0));
        out[i] = running;
    }
    out
}

/// SplitMix64: a small, fixed generator, so the bootstrap's draws do not
/// change with a dependency's version.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A draw in `0..n` (Lemire's multiply-shift; its bias, about n/2^64,
    /// is nothing at the sizes of a suite).
    fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next()) * n as u128) >> 64) as usize
    }
}

/// The two-sided p-value of a paired bootstrap of the mean of the paired
/// differences `diffs` (one per item: the first configuration's score
/// minus the second's): `resamples` times, `n` items are drawn with
/// replacement (each item's pair kept together) and their mean taken; the
/// p-value is the share of resampled means at least as far from the
/// observed mean as the observed mean is from 0 (the bootstrap
/// distribution shifted to the null of no difference), counting the
/// observed one: `(1 + extreme) / (1 + resamples)`. No difference at all
/// gives 1; the same `seed` gives the same p-value. With no item, 1.
pub fn paired_bootstrap(diffs: &[f64], resamples: usize, seed: u64) -> f64 {
    let n = diffs.len();
    if n == 0 || diffs.iter().all(|&d| d == 0.0) {
        return 1.0;
    }
    let mean = diffs.iter().sum::<f64>() / n as f64;
    // a resampled mean equal to the observed one up to rounding counts
    let edge = mean.abs() - 1e-12;
    let mut rng = SplitMix64(seed);
    let mut extreme = 0usize;
    for _ in 0..resamples {
        let mut sum = 0.0;
        for _ in 0..n {
            sum += diffs[rng.below(n)];
        }
        if (sum / n as f64 - mean).abs() >= edge {
            extreme += 1;
        }
    }
    (1 + extreme) as f64 / (1 + resamples) as f64
}

/// Each configuration's score of each item it holds, keyed by the item's
/// id: the paired records a comparison is made from.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PairedScores {
    scores: Vec<BTreeMap<String, f64>>,
}

impl PairedScores {
    /// No item yet, for `configs` configurations.
    pub fn new(configs: usize) -> Self {
        Self {
            scores: vec![BTreeMap::new(); configs],
        }
    }

    /// Record configuration `config`'s `score` (in [0, 1]) of item `id`; an
    /// item scored twice, a score outside [0, 1] or a configuration out of
    /// range is a named error.
    pub fn insert(&mut self, config: usize, id: &str, score: f64) -> Result<(), DiagError> {
        let configs = self.scores.len();
        let map = self.scores.get_mut(config).ok_or_else(|| {
            DiagError::Invalid(format!(
                "paired scores: configuration {config} of {configs}"
            ))
        })?;
        if !(0.0..=1.0).contains(&score) {
            return Err(DiagError::Invalid(format!(
                "paired scores: item {id:?} under configuration {config} scores {score}, \
                 outside [0, 1]"
            )));
        }
        if map.insert(id.to_string(), score).is_some() {
            return Err(DiagError::Invalid(format!(
                "paired scores: item {id:?} is scored twice under configuration {config} \
                 (an item in two shards?)"
            )));
        }
        Ok(())
    }

    /// The configurations recorded for.
    pub fn configs(&self) -> usize {
        self.scores.len()
    }

    /// Configuration `config`'s scores by item id.
    pub fn of(&self, config: usize) -> Option<&BTreeMap<String, f64>> {
        self.scores.get(config)
    }
}

/// How the pairs are compared.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PairSettings {
    /// The family-wise level of each group's decisions.
    pub alpha: f64,
    /// Resamples of each paired bootstrap.
    pub resamples: usize,
    /// The paired bootstrap's seed.
    pub seed: u64,
}

impl Default for PairSettings {
    /// [`ALPHA`], [`BOOTSTRAP_RESAMPLES`], [`BOOTSTRAP_SEED`].
    fn default() -> Self {
        Self {
            alpha: ALPHA,
            resamples: BOOTSTRAP_RESAMPLES,
            seed: BOOTSTRAP_SEED,
        }
    }
}

/// The comparison of two configurations' scores on the items both hold,
/// before the correction (`p_holm` absent, the verdict decided on the
/// unadjusted p-value; [`compare_configs`] adjusts both).
pub fn compare_scores(
    a: &BTreeMap<String, f64>,
    b: &BTreeMap<String, f64>,
    settings: &PairSettings,
) -> PairComparison {
    let shared: Vec<(f64, f64)> = a
        .iter()
        .filter_map(|(id, &x)| b.get(id).map(|&y| (x, y)))
        .collect();
    let n = shared.len();
    let mean = |f: fn(&(f64, f64)) -> f64| match n {
        0 => 0.0,
        _ => shared.iter().map(f).sum::<f64>() / n as f64,
    };
    let (score_a, score_b) = (mean(|s| s.0), mean(|s| s.1));
    let better = shared.iter().filter(|(x, y)| x > y).count();
    let worse = shared.iter().filter(|(x, y)| x < y).count();
    let binary = |x: f64| x == 0.0 || x == 1.0;
    let (test, p) = if n == 0 {
        (PairTest::None, None)
    } else if shared.iter().all(|&(x, y)| binary(x) && binary(y)) {
        (PairTest::McnemarExact, Some(mcnemar_exact(better, worse)))
    } else {
        let diffs: Vec<f64> = shared.iter().map(|(x, y)| x - y).collect();
        let p = paired_bootstrap(&diffs, settings.resamples, settings.seed);
        (PairTest::PairedBootstrap, Some(p))
    };
    let mut pair = PairComparison {
        group: String::new(),
        ratio: None,
        config_a: 0,
        config_b: 0,
        method_a: String::new(),
        method_b: String::new(),
        n,
        only_a: a.len() - n,
        only_b: b.len() - n,
        score_a,
        score_b,
        b: better,
        c: worse,
        test,
        p,
        p_holm: None,
        verdict: PairVerdict::NoSharedItems,
    };
    pair.verdict = verdict(&pair, p, settings.alpha);
    pair
}

/// The verdict of `pair` at `alpha` on the p-value `p` (adjusted or not):
/// the higher mean score wins when `p` is at most alpha.
fn verdict(pair: &PairComparison, p: Option<f64>, alpha: f64) -> PairVerdict {
    match p {
        None => PairVerdict::NoSharedItems,
        Some(p) if p <= alpha && pair.score_a > pair.score_b => PairVerdict::ABeatsB,
        Some(p) if p <= alpha && pair.score_b > pair.score_a => PairVerdict::BBeatsA,
        Some(_) => PairVerdict::Tied,
    }
}

/// The groups of a leaderboard run's configurations: each ratio asked for
/// (as written, in order of first appearance) with the full model and the
/// methods at that ratio; then, when there are any, the methods given with
/// their own knob, with the full model ([`OWN_KNOB`]).
pub fn ratio_groups(configs: &[LeaderboardConfig]) -> Vec<(String, Option<f64>, Vec<usize>)> {
    let full: Vec<usize> = (0..configs.len())
        .filter(|&c| configs[c].family == "full" && configs[c].ratio.is_none())
        .collect();
    let mut groups: Vec<(String, Option<f64>, Vec<usize>)> = Vec::new();
    let mut own = Vec::new();
    for (c, cfg) in configs.iter().enumerate() {
        match cfg.ratio {
            Some(r) => match groups.iter_mut().find(|g| g.1 == Some(r)) {
                Some(g) => g.2.push(c),
                None => {
                    let mut members = full.clone();
                    members.push(c);
                    groups.push((format!("{r}"), Some(r), members));
                }
            },
            None if !full.contains(&c) => own.push(c),
            None => {}
        }
    }
    if !own.is_empty() {
        let mut members = full;
        members.extend(own);
        groups.push((OWN_KNOB.to_string(), None, members));
    }
    groups
}

/// Every pair of each group of `configs` ([`ratio_groups`]) compared on
/// the items both scored, the p-values of each group adjusted together by
/// Holm's step-down (the pairs without shared items left out of the
/// family), and each verdict decided on the adjusted p-value at
/// `settings.alpha`.
pub fn compare_configs(
    configs: &[LeaderboardConfig],
    scores: &PairedScores,
    settings: &PairSettings,
) -> Result<LeaderboardPairs, DiagError> {
    if scores.configs() != configs.len() {
        return Err(DiagError::mismatch(
            "configurations of the paired scores",
            format!("{} scored, the run has {}", scores.configs(), configs.len()),
        ));
    }
    let mut pairs = Vec::new();
    for (group, ratio, members) in ratio_groups(configs) {
        let mut of_group = Vec::new();
        for (k, &x) in members.iter().enumerate() {
            for &y in &members[k + 1..] {
                let (Some(a), Some(b)) = (scores.of(x), scores.of(y)) else {
                    continue;
                };
                let mut pair = compare_scores(a, b, settings);
                pair.group.clone_from(&group);
                pair.ratio = ratio;
                (pair.config_a, pair.config_b) = (x, y);
                pair.method_a.clone_from(&configs[x].method);
                pair.method_b.clone_from(&configs[y].method);
                of_group.push(pair);
            }
        }
        let tested: Vec<usize> = (0..of_group.len())
            .filter(|&i| of_group[i].p.is_some())
            .collect();
        let raw: Vec<f64> = tested.iter().filter_map(|&i| of_group[i].p).collect();
        for (&i, adjusted) in tested.iter().zip(holm(&raw)) {
            of_group[i].p_holm = Some(adjusted);
        }
        for pair in &mut of_group {
            pair.verdict = verdict(pair, pair.p_holm, settings.alpha);
        }
        pairs.extend(of_group);
    }
    Ok(LeaderboardPairs {
        alpha: settings.alpha,
        bootstrap_resamples: settings.resamples,
        bootstrap_seed: settings.seed,
        pairs,
    })
}

/// One shard's items: how the shard was named (its folder, as given) and
/// each item's suite index and id.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardItems {
    /// The shard as the user named it.
    pub shard: String,
    /// Each item's position in the suite and its id.
    pub items: Vec<(usize, String)>,
}

/// Check that `shards` hold each item once: an item in two shards (or
/// twice in one) is named with both shards; with `suite_items` (a whole
/// run, not a partial one), the items of the suite no shard holds are
/// named by their positions.
pub fn check_shard_items(
    shards: &[ShardItems],
    suite_items: Option<usize>,
) -> Result<(), DiagError> {
    let mut seen: BTreeMap<usize, (&str, &str)> = BTreeMap::new();
    for s in shards {
        for (index, id) in &s.items {
            if let Some((first, _)) = seen.insert(*index, (&s.shard, id)) {
                return Err(DiagError::DuplicateItem {
                    index: *index,
                    id: id.clone(),
                    first: first.to_string(),
                    second: s.shard.clone(),
                });
            }
        }
    }
    let Some(total) = suite_items else {
        return Ok(());
    };
    if let Some((&index, (shard, id))) = seen.range(total..).next() {
        return Err(DiagError::Invalid(format!(
            "{shard} holds item {index} ({id}), past the suite's {total} items"
        )));
    }
    let missing: Vec<usize> = (0..total).filter(|i| !seen.contains_key(i)).collect();
    if !missing.is_empty() {
        return Err(DiagError::MissingItems {
            count: missing.len(),
            suite_items: total,
            first: missing
                .iter()
                .take(10)
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// P(X <= k) summed term by term in f64 (fine at small n).
    fn cdf_naive(k: usize, n: usize) -> f64 {
        let mut c = 1.0f64;
        let mut sum = 0.0;
        for i in 0..=k.min(n) {
            if i > 0 {
                c = c * (n - i + 1) as f64 / i as f64;
            }
            sum += c;
        }
        sum / 2f64.powi(n as i32)
    }

    #[test]
    fn the_binomial_tail_matches_the_sum_of_its_terms() {
        for n in 0..=60 {
            for k in 0..=n + 1 {
                let (got, want) = (binomial_cdf_half(k, n), cdf_naive(k, n).min(1.0));
                assert!(
                    (got - want).abs() <= 1e-12 * want.max(1e-300),
                    "n {n} k {k}: {got} vs {want}"
                );
            }
        }
        // symmetric: P(X <= k) + P(X <= n - k - 1) = 1
        for (k, n) in [(300, 650), (10, 650), (3000, 6500)] {
            let s = binomial_cdf_half(k, n) + binomial_cdf_half(n - k - 1, n);
            assert!((s - 1.0).abs() < 1e-12, "{k} {n}: {s}");
        }
    }

    #[test]
    fn mcnemar_edges() {
        assert_eq!(mcnemar_exact(0, 0), 1.0);
        assert_eq!(mcnemar_exact(1, 0), 1.0);
        assert_eq!(mcnemar_exact(7, 7), 1.0);
        assert_eq!(mcnemar_exact(0, 5), 2.0 / 32.0);
        assert_eq!(mcnemar_exact(5, 0), mcnemar_exact(0, 5));
    }

    #[test]
    fn holm_is_monotone_and_capped() {
        let adj = holm(&[0.01, 0.04, 0.03, 0.5]);
        assert_eq!(adj, [0.04, 0.09, 0.09, 0.5]);
        assert_eq!(holm(&[0.9, 0.8]), [1.0, 1.0]);
        assert!(holm(&[]).is_empty());
    }

    #[test]
    fn the_bootstrap_is_seeded_and_finds_what_is_there() {
        // identical methods: no difference, p = 1
        assert_eq!(paired_bootstrap(&[0.0; 650], 10_000, 1), 1.0);
        // a clear difference on 650 items: 0.13 better on average
        let diffs: Vec<f64> = (0..650)
            .map(|i| match i % 10 {
                0..=2 => 1.0 / 3.0,
                3 => -1.0 / 3.0,
                4 => 2.0 / 3.0,
                _ => 0.0,
            })
            .collect();
        let p = paired_bootstrap(&diffs, 2_000, 7);
        assert_eq!(p, 1.0 / 2_001.0);
        assert_eq!(p, paired_bootstrap(&diffs, 2_000, 7));
        // no difference on average: p near 1, not small
        let balanced: Vec<f64> = (0..40)
            .map(|i| if i % 2 == 0 { 0.5 } else { -0.5 })
            .collect();
        assert!(paired_bootstrap(&balanced, 2_000, 7) > 0.9);
        // a small difference on few items is not found
        let few = [1.0 / 3.0, 0.0, 0.0, -1.0 / 3.0, 1.0 / 3.0];
        let p = paired_bootstrap(&few, 2_000, 3);
        assert!(p > 0.3, "{p}");
        // another seed, another p, close to it
        let q = paired_bootstrap(&few, 2_000, 4);
        assert!(p != q && (p - q).abs() < 0.05, "{p} {q}");
    }

    fn config(method: &str, family: &str, ratio: Option<f64>) -> LeaderboardConfig {
        LeaderboardConfig {
            method: method.into(),
            family: family.into(),
            ratio,
            policy: method.into(),
            formula_removed: 0.0,
            note: String::new(),
        }
    }

    /// full, then `good`, `same` and `bad` at 0.25 and `good` at 0.5.
    fn configs() -> Vec<LeaderboardConfig> {
        vec![
            config("full", "full", None),
            config("good", "good", Some(0.25)),
            config("same", "same", Some(0.25)),
            config("bad", "bad", Some(0.25)),
            config("good", "good", Some(0.5)),
            config("speed:20", "speed", None),
        ]
    }

    /// 650 right-or-wrong items: full and `good` right on 60%, `same` on
    /// the very same items, `bad` on 10%.
    fn scores(items: usize) -> PairedScores {
        let mut s = PairedScores::new(6);
        for i in 0..items {
            let id = format!("item-{i:04}");
            let right = f64::from(u8::from(i % 10 < 6));
            let bad = f64::from(u8::from(i % 10 == 0));
            for (c, score) in [right, right, right, bad, right, right]
                .into_iter()
                .enumerate()
            {
                s.insert(c, &id, score).unwrap();
            }
        }
        s
    }

    #[test]
    fn a_clear_winner_is_named_and_identical_methods_are_tied() {
        let pairs = compare_configs(&configs(), &scores(650), &PairSettings::default()).unwrap();
        assert_eq!(pairs.groups(), ["0.25", "0.5", OWN_KNOB]);
        assert_eq!(pairs.members("0.25"), [0, 1, 2, 3]);
        assert_eq!(pairs.members("0.5"), [0, 4]);
        assert_eq!(pairs.members(OWN_KNOB), [0, 5]);
        // six pairs at 0.25, one at 0.5, one of the own knob
        assert_eq!(pairs.pairs.len(), 6 + 1 + 1);
        let good_bad = pairs.pair("0.25", 3, 1).unwrap();
        assert_eq!((good_bad.config_a, good_bad.config_b), (1, 3));
        assert_eq!(good_bad.test, PairTest::McnemarExact);
        assert_eq!((good_bad.n, good_bad.b, good_bad.c), (650, 325, 0));
        assert_eq!(good_bad.verdict, PairVerdict::ABeatsB);
        assert!(good_bad.p_holm.unwrap() < 1e-90);
        assert_eq!(pairs.beats("0.25", 1), [3]);
        assert_eq!(pairs.beats("0.25", 0), [3]);
        assert_eq!(pairs.beaten_by("0.25", 3), [0, 1, 2]);
        assert_eq!(pairs.tied_with("0.25", 1), [0, 2]);
        let same = pairs.pair("0.25", 1, 2).unwrap();
        assert_eq!(
            (same.b, same.c, same.p, same.verdict),
            (0, 0, Some(1.0), PairVerdict::Tied)
        );
        // Holm over the six pairs at 0.25: the raw p times 6 for the smallest
        let raw: Vec<f64> = pairs.pairs[..6].iter().map(|p| p.p.unwrap()).collect();
        let adjusted: Vec<f64> = pairs.pairs[..6].iter().map(|p| p.p_holm.unwrap()).collect();
        assert_eq!(adjusted, holm(&raw));
    }

    #[test]
    fn a_difference_the_items_do_not_carry_is_tied() {
        // the same as above on 8 items: bad loses 5 of 8, p = 2/32 even before
        // the correction
        let pairs = compare_configs(&configs(), &scores(8), &PairSettings::default()).unwrap();
        let good_bad = pairs.pair("0.25", 1, 3).unwrap();
        assert_eq!((good_bad.b, good_bad.c), (5, 0));
        assert_eq!(good_bad.p, Some(0.0625));
        assert_eq!(good_bad.verdict, PairVerdict::Tied);
        assert!(pairs.beats("0.25", 1).is_empty());
    }

    #[test]
    fn partial_scores_take_the_bootstrap() {
        let mut s = scores(650);
        // one partial score makes every pair with `bad` a bootstrap
        let mut partial = PairedScores::new(6);
        for c in 0..6 {
            for (id, &x) in s.of(c).unwrap() {
                let x = if c == 3 && id == "item-0001" {
                    1.0 / 3.0
                } else {
                    x
                };
                partial.insert(c, id, x).unwrap();
            }
        }
        s = partial;
        let settings = PairSettings {
            resamples: 2_000,
            ..PairSettings::default()
        };
        let pairs = compare_configs(&configs(), &s, &settings).unwrap();
        let good_bad = pairs.pair("0.25", 1, 3).unwrap();
        assert_eq!(good_bad.test, PairTest::PairedBootstrap);
        assert_eq!(good_bad.p, Some(1.0 / 2_001.0));
        assert_eq!(good_bad.verdict, PairVerdict::ABeatsB);
        assert_eq!(
            pairs.pair("0.25", 1, 2).unwrap().test,
            PairTest::McnemarExact
        );
        // the same seed, the same p-values
        assert_eq!(compare_configs(&configs(), &s, &settings).unwrap(), pairs);
    }

    #[test]
    fn items_one_method_lacks_are_counted_not_dropped_silently() {
        let mut s = PairedScores::new(6);
        for i in 0..40 {
            let id = format!("i{i}");
            for c in 0..6 {
                // `bad` lacks the last ten items, `good` at 0.5 has none
                if (c == 3 && i >= 30) || c == 4 {
                    continue;
                }
                s.insert(c, &id, f64::from(u8::from(i % 2 == 0))).unwrap();
            }
        }
        let pairs = compare_configs(&configs(), &s, &PairSettings::default()).unwrap();
        let p = pairs.pair("0.25", 1, 3).unwrap();
        assert_eq!((p.n, p.only_a, p.only_b), (30, 10, 0));
        let none = pairs.pair("0.5", 0, 4).unwrap();
        assert_eq!((none.n, none.only_a, none.test), (0, 40, PairTest::None));
        assert_eq!(
            (none.p, none.p_holm, none.verdict),
            (None, None, PairVerdict::NoSharedItems)
        );
        assert!(pairs.tied_with("0.5", 0).is_empty());
    }

    #[test]
    fn bad_records_are_named() {
        let mut s = PairedScores::new(2);
        s.insert(0, "a", 1.0).unwrap();
        let e = s.insert(0, "a", 0.0).unwrap_err().to_string();
        assert!(e.contains("\"a\" is scored twice"), "{e}");
        assert!(
            s.insert(1, "a", 1.5)
                .unwrap_err()
                .to_string()
                .contains("outside [0, 1]")
        );
        assert!(s.insert(2, "a", 1.0).is_err());
        let e = compare_configs(&configs(), &s, &PairSettings::default()).unwrap_err();
        assert!(e.to_string().contains("2 scored, the run has 6"), "{e}");
    }

    #[test]
    fn shards_must_hold_each_item_once() {
        let shard = |name: &str, items: &[usize]| ShardItems {
            shard: name.into(),
            items: items.iter().map(|&i| (i, format!("id-{i}"))).collect(),
        };
        let (s0, s1) = (shard("runs/s0", &[0, 2, 4]), shard("runs/s1", &[1, 3]));
        check_shard_items(&[s0.clone(), s1.clone()], Some(5)).unwrap();
        let e = check_shard_items(&[s0.clone(), s1.clone(), s0.clone()], Some(5)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "item 0 (id-0) is in both runs/s0 and runs/s0: each item must be in one shard \
             (a shard given twice?)"
        );
        let e = check_shard_items(std::slice::from_ref(&s0), Some(5)).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("2 of the suite's 5 items are in no shard (positions 1, 3)"),
            "{e}"
        );
        // a partial merge may miss items, never repeat one
        check_shard_items(std::slice::from_ref(&s0), None).unwrap();
        assert!(check_shard_items(&[s0.clone(), s0], None).is_err());
        let e = check_shard_items(&[s1], Some(3)).unwrap_err().to_string();
        assert!(e.contains("past the suite's 3 items"), "{e}");
        let many = shard("s", &[0]);
        let e = check_shard_items(&[many], Some(30))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("positions 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, ...)"),
            "{e}"
        );
    }
}
