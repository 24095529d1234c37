//! The numbers behind picking heads: a report's decode-to-prefill mass per
//! (layer, K/V head), its prompt shape, and what a set of kept pairs above
//! a cut costs and keeps (`lcut_diag`'s K/V share formula and masses, the
//! same that `lcut recommend` plans with). Built once per report; nothing
//! here draws.

use lcut_diag::{HeadPlan, PromptShape, kv_head_masses, kv_share, plan_for_budget};
use lcut_trace::{CutoffAccuracy, Report};

use crate::grid::Grid;

/// Tolerance of K/V share comparisons (a share computed two ways).
const SHARE_EPS: f64 = 1e-9;

/// A report's per-head masses and prompt shape, for picking heads.
#[derive(Debug, Clone, PartialEq)]
pub struct HeadData {
    /// Layers.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// K/V heads.
    pub kv_heads: usize,
    /// Decode-to-prefill mass by layer × query head (mean over prompts and
    /// steps), as the heatmap draws it.
    pub grid: Grid,
    /// Decode-to-prefill mass of each K/V head, `[layer][kv_head]`: the
    /// mean of its group's query heads.
    pub masses: Vec<Vec<f64>>,
    /// The report's mean prompt: one anchor, prefill and decode-phase tokens.
    pub shape: PromptShape,
    /// The sweep's suite accuracy per cut (for the expected accuracy).
    pub calibration: Vec<CutoffAccuracy>,
}

/// What a set of kept pairs above a cut costs and keeps, against SPEED+BoS.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PickCost {
    /// Kept pairs.
    pub kept: usize,
    /// K/V share of SPEED+BoS at the cut with the kept pairs.
    pub kv_share: f64,
    /// K/V share of SPEED+BoS at the cut alone.
    pub speed_share: f64,
    /// Share of the decode-to-prefill mass kept with the pairs.
    pub mass_kept: f64,
    /// Share SPEED+BoS at the cut keeps.
    pub speed_mass_kept: f64,
    /// The largest SPEED+BoS cut holding at most `kv_share`.
    pub equal_cut: usize,
    /// Share of the mass SPEED+BoS at `equal_cut` keeps.
    pub equal_mass_kept: f64,
}

impl HeadData {
    /// The head data of `report`; an error when its query heads do not
    /// share its K/V heads evenly.
    pub fn of_report(report: &Report) -> Result<Self, String> {
        let by_head = &report.curves.prefill_by_head;
        let masses =
            kv_head_masses(by_head, report.model.num_kv_heads).map_err(|e| e.to_string())?;
        let [layers, heads] = by_head.shape();
        Ok(Self {
            layers,
            heads,
            kv_heads: report.model.num_kv_heads,
            grid: Grid::from_tensor(by_head),
            masses,
            shape: PromptShape::of_report(report),
            calibration: report
                .sweep
                .as_ref()
                .map(|s| s.accuracy.clone())
                .unwrap_or_default(),
        })
    }

    /// Query heads per K/V head.
    pub fn group(&self) -> usize {
        (self.heads / self.kv_heads.max(1)).max(1)
    }

    /// The K/V head that query head `q` reads.
    pub fn kv_of(&self, q: usize) -> usize {
        q / self.group()
    }

    /// The query heads of K/V head `kv`.
    pub fn query_heads(&self, kv: usize) -> std::ops::Range<usize> {
        kv * self.group()..(kv + 1) * self.group()
    }

    fn total(&self) -> f64 {
        self.masses.iter().flatten().sum()
    }

    /// Share of the mass held by every layer below `cut` and by `pairs`.
    pub fn mass_kept(&self, cut: usize, pairs: &[(usize, usize)]) -> f64 {
        let total = self.total();
        if total <= 0.0 {
            return 0.0;
        }
        let below: f64 = self.masses[..cut.min(self.layers)].iter().flatten().sum();
        let picked: f64 = pairs
            .iter()
            .filter(|&&(l, _)| l >= cut)
            .filter_map(|&(l, h)| self.masses.get(l).and_then(|r| r.get(h)))
            .sum();
        (below + picked) / total
    }

    /// K/V share of SPEED+BoS at `cut` with `kept` pairs above it.
    pub fn share(&self, cut: usize, kept: usize) -> f64 {
        kv_share(self.layers, self.kv_heads, cut, kept, &self.shape)
    }

    /// The largest SPEED+BoS cut whose K/V share is at most `share` (1 when
    /// even cut 1 holds more).
    pub fn speed_cut_within(&self, share: f64) -> usize {
        (1..=self.layers)
            .rev()
            .find(|&c| self.share(c, 0) <= share + SHARE_EPS)
            .unwrap_or(1)
    }

    /// What keeping `pairs` above `cut` costs and keeps (pairs below the
    /// cut are not counted: the layers there keep the prompt anyway).
    pub fn cost(&self, cut: usize, pairs: &[(usize, usize)]) -> PickCost {
        let cut = cut.clamp(1, self.layers.max(1));
        let kept = pairs.iter().filter(|&&(l, _)| l >= cut).count();
        let kv_share = self.share(cut, kept);
        let equal_cut = self.speed_cut_within(kv_share);
        PickCost {
            kept,
            kv_share,
            speed_share: self.share(cut, 0),
            mass_kept: self.mass_kept(cut, pairs),
            speed_mass_kept: self.mass_kept(cut, &[]),
            equal_cut,
            equal_mass_kept: self.mass_kept(equal_cut, &[]),
        }
    }

    /// The cut and pairs that keep the most mass within `budget` (the
    /// recommendation `lcut recommend` makes); its named error otherwise.
    pub fn plan(&self, budget: f64) -> Result<HeadPlan, String> {
        plan_for_budget(&self.masses, &self.shape, budget).map_err(|e| e.to_string())
    }

    /// The accuracy the sweep's suite calibration leads to expect of a set
    /// keeping `mass_kept` of the mass (`None` without one covering it).
    pub fn expected_accuracy(&self, mass_kept: f64) -> Option<f64> {
        lcut_diag::expected_accuracy(&self.masses, &self.calibration, mass_kept)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data() -> HeadData {
        let report = lcut_diag::synthetic::synthetic_report(3, 16, 8, false).unwrap();
        HeadData::of_report(&report).unwrap()
    }

    #[test]
    fn query_heads_map_to_their_group() {
        let d = data();
        assert_eq!((d.layers, d.heads, d.kv_heads, d.group()), (16, 8, 4, 2));
        assert_eq!(
            (d.kv_of(0), d.kv_of(1), d.kv_of(2), d.kv_of(7)),
            (0, 0, 1, 3)
        );
        assert_eq!(d.query_heads(2), 4..6);
        // a K/V head's mass is its group's mean
        let q = |l: usize, h: usize| f64::from(d.grid.get(l, h));
        assert!((d.masses[5][2] - (q(5, 4) + q(5, 5)) / 2.0).abs() < 1e-6);
    }

    #[test]
    fn the_cost_is_the_formula_and_pairs_below_the_cut_do_not_count() {
        let d = data();
        let c = d.cost(10, &[(12, 1), (15, 3), (4, 0)]);
        assert_eq!(c.kept, 2);
        assert!((c.kv_share - kv_share(16, 4, 10, 2, &d.shape)).abs() < 1e-15);
        assert!((c.speed_share - kv_share(16, 4, 10, 0, &d.shape)).abs() < 1e-15);
        assert!(c.kv_share > c.speed_share && c.mass_kept > c.speed_mass_kept);
        // a whole layer's worth of pairs holds what SPEED one layer deeper holds
        let layer = d.cost(10, &[(11, 0), (12, 1), (13, 2), (14, 3)]);
        assert!((layer.kv_share - d.share(11, 0)).abs() < 1e-12);
        assert_eq!(layer.equal_cut, 11);
        assert_eq!(c.equal_cut, 10);
        let full = d.cost(16, &[]);
        assert!((full.kv_share - 1.0).abs() < 1e-12 && (full.mass_kept - 1.0).abs() < 1e-12);
    }

    #[test]
    fn the_plan_stays_within_its_budget() {
        let d = data();
        let plan = d.plan(0.7).unwrap();
        let c = d.cost(plan.cut, &plan.heads);
        assert!(c.kv_share <= 0.7 + 1e-12);
        assert!((c.mass_kept - plan.mass_kept).abs() < 1e-9);
        assert!(d.plan(1.5).unwrap_err().contains("outside (0, 1]"));
    }
}
