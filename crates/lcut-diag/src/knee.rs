//! The knee of quality against cost over an empirical sweep.
//!
//! Rule (threshold, not Kneedle): among the points with the given anchors, the
//! reference is the point with the largest `l_cut` (the full model when it was
//! swept). The knee is the smallest `l_cut` such that it and every larger swept
//! cut have top-1 agreement `>= reference - agreement_drop_max`: the cheapest
//! cut from which quality stays within the allowed drop.

use lcut_policy::Anchors;
use lcut_trace::{Sweep, SweepPoint, Thresholds};

/// The knee over the cutoff points (SPEED or SelfOnly at a layer count)
/// with `anchors` (see the module doc); `None` when there are no such points
/// with a finite agreement.
pub fn knee(points: &[SweepPoint], anchors: Anchors, agreement_drop_max: f32) -> Option<usize> {
    let mut pts: Vec<(usize, f32)> = points
        .iter()
        .filter(|p| p.anchors() == anchors && p.top1_agreement.is_finite())
        .filter_map(|p| Some((p.l_cut()?, p.top1_agreement)))
        .collect();
    pts.sort_by_key(|p| std::cmp::Reverse(p.0));
    let reference = pts.first()?.1;
    let floor = reference - agreement_drop_max;
    pts.iter()
        .take_while(|(_, agreement)| *agreement >= floor)
        .last()
        .map(|(cut, _)| *cut)
}

/// A [`Sweep`] with its knee: computed on the `"bos"` points when there are any,
/// otherwise on the `"none"` points.
pub fn finish_sweep(context_len: usize, points: Vec<SweepPoint>, th: &Thresholds) -> Sweep {
    let anchors = if points.iter().any(SweepPoint::keeps_bos) {
        Anchors::Bos
    } else {
        Anchors::None
    };
    let knee = knee(&points, anchors, th.agreement_drop_max);
    Sweep {
        context_len,
        points,
        knee,
        policies: Vec::new(),
        accuracy: Vec::new(),
        suite: None,
        prompt_shard: None,
        made_by: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lcut_trace::speed_policy;

    fn point(l_cut: usize, anchors: Anchors, top1: f32) -> SweepPoint {
        SweepPoint {
            policy: speed_policy(l_cut, anchors),
            top1_agreement: top1,
            mean_kl: 0.0,
            nll: 0.0,
            kv_bytes: l_cut as u64,
            kv_ratio: l_cut as f32 / 8.0,
            prefill_flops: l_cut as f64,
            prefill_ratio: l_cut as f32 / 8.0,
            tokens: Some(16),
            routing_overlap: None,
        }
    }

    #[test]
    fn knee_is_cheapest_cut_from_which_quality_holds() {
        let pts: Vec<_> = [
            (2, 0.5),
            (4, 0.97),
            (5, 0.90),
            (6, 0.985),
            (7, 0.99),
            (8, 1.0),
        ]
        .iter()
        .map(|&(c, a)| point(c, Anchors::Bos, a))
        .collect();
        // 5 dips below 0.98, so 4 (good on its own) does not count.
        assert_eq!(knee(&pts, Anchors::Bos, 0.02), Some(6));
        assert_eq!(knee(&pts, Anchors::Bos, 0.11), Some(4));
        assert_eq!(knee(&pts, Anchors::Bos, 0.0), Some(8));
        assert_eq!(knee(&pts, Anchors::None, 0.02), None);
    }

    #[test]
    fn finish_sweep_prefers_bos_points() {
        let pts = vec![
            point(2, Anchors::None, 1.0),
            point(4, Anchors::None, 1.0),
            point(2, Anchors::Bos, 0.1),
            point(4, Anchors::Bos, 1.0),
        ];
        let s = finish_sweep(1024, pts.clone(), &Thresholds::default());
        assert_eq!(s.knee, Some(4));
        let only_none: Vec<_> = pts
            .into_iter()
            .filter(|p| p.anchors() == Anchors::None)
            .collect();
        assert_eq!(
            finish_sweep(1024, only_none, &Thresholds::default()).knee,
            Some(2)
        );
    }
}
