//! The teacher-forced sweep across prompt shards (`lcut sweep --shard`):
//! each point's agreement, KL and NLL are pooled over the shards' scored
//! tokens (a mixture-of-experts model's routing overlap too), its costs
//! (prompt-free, at the context length) must agree, the
//! comparison axis is pooled by [`merge_policy_points`], and the knee is
//! recomputed from the merged points by [`finish_sweep`], as the
//! unsharded sweep computes it. The merged sweep names every build and
//! instruction-set level that made one of its shards (`made_by`): shards
//! need not share one, but only shards that do give the unsharded sweep's
//! bits.

use lcut_trace::floats::same_float;
use lcut_trace::{Sweep, SweepPoint, Thresholds, made_by};

use crate::error::DiagError;
use crate::knee::finish_sweep;
use crate::policy_merge::merge_policy_points;
use crate::pooled::{Pooled, merge_by_position};

/// The sweep without its suite accuracy and the builds that made it: what
/// unsharded sweeps must share.
pub(crate) fn teacher_forced(s: &Sweep) -> Sweep {
    Sweep {
        accuracy: Vec::new(),
        suite: None,
        made_by: Vec::new(),
        ..s.clone()
    }
}

/// Checks that the sweeps measured prompt shards 0/n .. n-1/n once each,
/// n being the shard count they record.
fn check_prompt_shards(sweeps: &[&Sweep]) -> Result<(), DiagError> {
    let specs: Vec<Option<[usize; 2]>> = sweeps.iter().map(|s| s.prompt_shard).collect();
    let n = specs.iter().flatten().map(|s| s[1]).next().unwrap_or(0);
    let mut seen = vec![false; n];
    let covered = specs.len() == n
        && specs.iter().all(|spec| match spec {
            Some([i, m]) if *m == n && *i < n && !seen[*i] => {
                seen[*i] = true;
                true
            }
            _ => false,
        });
    if covered {
        return Ok(());
    }
    Err(DiagError::mismatch(
        "sweep prompt shards",
        format!(
            "the sweeps must measure prompt shards 0/{n} .. {}/{n} once each (a shard without a sweep, or a sweep of all the prompts, cannot be merged with sharded ones); got {specs:?}",
            n.saturating_sub(1)
        ),
    ))
}

/// Whether two points cost the same (costs do not depend on the prompts).
fn same_costs(a: &SweepPoint, b: &SweepPoint) -> bool {
    a.kv_bytes == b.kv_bytes
        && a.prefill_flops.to_bits() == b.prefill_flops.to_bits()
        && same_float(a.kv_ratio, b.kv_ratio)
        && same_float(a.prefill_ratio, b.prefill_ratio)
}

/// One point over all the prompts from its point in each shard.
fn merge_point(parts: &[(usize, &SweepPoint)]) -> Result<SweepPoint, DiagError> {
    let first = parts[0].1;
    let (mut agree, mut kl, mut nll, mut tokens) =
        (Pooled::default(), Pooled::default(), Pooled::default(), 0);
    // a shard without an overlap (a dense model, or no token scored) adds none
    let (mut overlap, mut routed) = (Pooled::default(), false);
    for &(i, p) in parts {
        if p.policy != first.policy {
            return Err(DiagError::mismatch(
                "sweep points",
                format!(
                    "shard 0 has {} where shard {i} has {}",
                    first.policy, p.policy
                ),
            ));
        }
        if !same_costs(first, p) {
            return Err(DiagError::mismatch(
                "sweep point costs",
                format!(
                    "{}: shard 0 has {} KV bytes and {:e} FLOPs, shard {i} {} and {:e} (is the context length or the model the same?)",
                    p.policy, first.kv_bytes, first.prefill_flops, p.kv_bytes, p.prefill_flops
                ),
            ));
        }
        let n = p.tokens.ok_or_else(|| DiagError::MissingCounts {
            shard: i,
            point: p.policy.to_string(),
            what: "scored-token count",
        })?;
        agree.add_share(p.top1_agreement, n);
        kl.add(p.mean_kl, n as f64);
        nll.add(p.nll, n as f64);
        if let Some(o) = p.routing_overlap {
            // every scored token is routed at every sparse layer: tokens weigh it
            overlap.add(o, n as f64);
            routed = true;
        }
        tokens += n;
    }
    Ok(SweepPoint {
        top1_agreement: agree.mean(),
        mean_kl: kl.mean(),
        nll: nll.mean(),
        tokens: Some(tokens),
        routing_overlap: routed.then(|| overlap.mean()).filter(|o| o.is_finite()),
        ..first.clone()
    })
}

/// The teacher-forced points over all the prompts from each prompt shard's
/// (the same policies in the same order in every shard).
pub fn merge_sweep_points(shards: &[&[SweepPoint]]) -> Result<Vec<SweepPoint>, DiagError> {
    merge_by_position(shards, ("sweep points", "points"), merge_point)
}

/// The teacher-forced sweep of shard reports' sweeps, without suite
/// accuracy, made by each build and level that made one of them (sorted,
/// each once). Sweeps that record no prompt shard must be the same apart
/// from their builds (one sweep of all the prompts, or older reports) and
/// are kept; sweeps of prompt shards must cover them once and are pooled
/// point by point, with the knee recomputed from the merged points with
/// `th`.
pub fn merge_teacher_forced(sweeps: &[&Sweep], th: &Thresholds) -> Result<Sweep, DiagError> {
    let merged = pool_teacher_forced(sweeps, th)?;
    Ok(Sweep {
        made_by: made_by::union(sweeps.iter().map(|s| s.made_by.as_slice())),
        ..merged
    })
}

/// [`merge_teacher_forced`] but for the builds that made the sweeps.
fn pool_teacher_forced(sweeps: &[&Sweep], th: &Thresholds) -> Result<Sweep, DiagError> {
    let first = sweeps.first().ok_or(DiagError::Empty("merging sweeps"))?;
    if sweeps.iter().all(|s| s.prompt_shard.is_none()) {
        let base = teacher_forced(first);
        if let Some(i) = sweeps.iter().position(|s| teacher_forced(s) != base) {
            return Err(DiagError::mismatch(
                "sweeps",
                format!(
                    "shards 0 and {i} carry different teacher-forced sweeps and record no prompt shard (reports written before sweeps recorded their shard and scored-token counts cannot be recombined); rerun the sweeps with `lcut sweep --shard`"
                ),
            ));
        }
        return Ok(base);
    }
    check_prompt_shards(sweeps)?;
    if let Some((i, s)) = sweeps
        .iter()
        .enumerate()
        .find(|(_, s)| s.context_len != first.context_len)
    {
        return Err(DiagError::mismatch(
            "sweep context lengths",
            format!(
                "shard 0 costs at {}, shard {i} at {}",
                first.context_len, s.context_len
            ),
        ));
    }
    let points: Vec<&[SweepPoint]> = sweeps.iter().map(|s| s.points.as_slice()).collect();
    let policies: Vec<&[lcut_trace::PolicyPoint]> =
        sweeps.iter().map(|s| s.policies.as_slice()).collect();
    let mut merged = finish_sweep(first.context_len, merge_sweep_points(&points)?, th);
    merged.policies = merge_policy_points(&policies)?;
    Ok(merged)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lcut_policy::Anchors;
    use lcut_trace::speed_policy;

    fn point(l_cut: usize, top1: f32, kl: f32, tokens: Option<usize>) -> SweepPoint {
        SweepPoint {
            policy: speed_policy(l_cut, Anchors::Bos),
            top1_agreement: top1,
            mean_kl: kl,
            nll: 2.0 * kl,
            kv_bytes: 10 * l_cut as u64,
            kv_ratio: l_cut as f32 / 4.0,
            prefill_flops: 1e9 * l_cut as f64,
            prefill_ratio: l_cut as f32 / 4.0,
            tokens,
            routing_overlap: None,
        }
    }

    fn sweep(shard: Option<[usize; 2]>, points: Vec<SweepPoint>) -> Sweep {
        let mut s = finish_sweep(1024, points, &Thresholds::default());
        s.prompt_shard = shard;
        s
    }

    #[test]
    fn points_are_token_weighted_and_the_knee_is_recomputed() {
        // shard 0: 2 tokens, 1 agrees at cut 2; shard 1: 10 tokens, all agree
        let a = sweep(
            Some([0, 2]),
            vec![point(2, 0.5, 1.0, Some(2)), point(4, 1.0, 0.0, Some(2))],
        );
        let b = sweep(
            Some([1, 2]),
            vec![point(2, 1.0, 0.1, Some(10)), point(4, 1.0, 0.0, Some(10))],
        );
        // alone, shard 0 puts the knee at 4, shard 1 at 2
        assert_eq!((a.knee, b.knee), (Some(4), Some(2)));
        let th = Thresholds {
            agreement_drop_max: 0.1,
            ..Thresholds::default()
        };
        let m = merge_teacher_forced(&[&b, &a], &th).unwrap();
        let p = &m.points[0];
        assert_eq!(
            p.top1_agreement,
            (11.0f64 / 12.0) as f32,
            "not the plain 0.75"
        );
        assert!((p.mean_kl - (2.0 + 1.0) / 12.0).abs() < 1e-7);
        assert!((p.nll - 2.0 * (2.0 + 1.0) / 12.0).abs() < 1e-7);
        assert_eq!(p.tokens, Some(12));
        assert_eq!((p.kv_bytes, p.kv_ratio), (20, 0.5));
        assert_eq!(m.prompt_shard, None);
        // 11/12 is within 0.1 of 1: the merged knee is 2
        assert_eq!(m.knee, Some(2));
        let strict = merge_teacher_forced(&[&a, &b], &Thresholds::default()).unwrap();
        assert_eq!(strict.knee, Some(4));
    }

    #[test]
    fn shards_of_other_builds_merge_and_name_each_once() {
        let by = |isa: &str| lcut_trace::MadeBy {
            build: "lcut 0.1.0 0123456789abcdef".into(),
            isa: isa.into(),
        };
        let th = Thresholds::default();
        let mut a = sweep(Some([0, 2]), vec![point(2, 0.5, 1.0, Some(2))]);
        let mut b = sweep(Some([1, 2]), vec![point(2, 1.0, 0.1, Some(10))]);
        let unnamed = merge_teacher_forced(&[&a, &b], &th).unwrap();
        assert!(unnamed.made_by.is_empty(), "shards written before it was");
        a.made_by = vec![by("avx512")];
        b.made_by = vec![by("avx2")];
        let m = merge_teacher_forced(&[&a, &b], &th).unwrap();
        assert_eq!(m.made_by, vec![by("avx2"), by("avx512")]);
        let points_alike = Sweep {
            made_by: Vec::new(),
            ..m.clone()
        };
        assert_eq!(points_alike, unnamed, "the builds change nothing else");
        b.made_by = vec![by("avx512"), by("avx2")];
        let again = merge_teacher_forced(&[&b, &a], &th).unwrap();
        assert_eq!(again.made_by, m.made_by, "each once, sorted");
        // sweeps of all the prompts alike but for their builds are one sweep
        let mut o1 = sweep(None, vec![point(2, 0.5, 1.0, None)]);
        let mut o2 = o1.clone();
        o1.made_by = vec![by("avx2")];
        o2.made_by = vec![by("portable")];
        let kept = merge_teacher_forced(&[&o2, &o1], &th).unwrap();
        assert_eq!(kept.made_by, vec![by("avx2"), by("portable")]);
        assert_eq!((kept.points, kept.knee), (o1.points, o1.knee));
    }

    #[test]
    fn routing_overlap_is_token_weighted_too() {
        let routed = |shard, o, tokens| {
            let mut p = point(2, 1.0, 0.0, Some(tokens));
            p.routing_overlap = Some(o);
            sweep(Some(shard), vec![p])
        };
        let (a, b) = (routed([0, 2], 0.5, 2), routed([1, 2], 1.0, 6));
        let m = merge_teacher_forced(&[&a, &b], &Thresholds::default()).unwrap();
        assert_eq!(m.points[0].routing_overlap, Some(0.875));
        let dense = sweep(Some([1, 2]), vec![point(2, 1.0, 0.0, Some(6))]);
        let m = merge_teacher_forced(&[&dense, &dense.clone()], &Thresholds::default());
        assert!(m.is_err(), "the same shard twice");
        let d0 = sweep(Some([0, 2]), vec![point(2, 1.0, 0.0, Some(6))]);
        let m = merge_teacher_forced(&[&d0, &dense], &Thresholds::default()).unwrap();
        assert_eq!(m.points[0].routing_overlap, None, "dense shards have none");
    }

    #[test]
    fn old_uncovered_or_costlier_shards_are_named_errors() {
        let a = sweep(Some([0, 2]), vec![point(2, 0.5, 1.0, Some(2))]);
        let th = Thresholds::default();
        let err = |b: &Sweep| merge_teacher_forced(&[&a, b], &th).unwrap_err();
        let old = sweep(Some([1, 2]), vec![point(2, 1.0, 1.0, None)]);
        assert!(
            matches!(err(&old), DiagError::MissingCounts { shard: 1, .. }),
            "{}",
            err(&old)
        );
        let unsharded = sweep(None, vec![point(2, 1.0, 1.0, Some(4))]);
        assert!(err(&unsharded).to_string().contains("prompt shards"));
        let again = sweep(Some([0, 2]), vec![point(2, 1.0, 1.0, Some(4))]);
        assert!(err(&again).to_string().contains("prompt shards"));
        let alone = merge_teacher_forced(&[&a], &th).unwrap_err().to_string();
        assert!(alone.contains("prompt shards"), "{alone}");
        let mut dear = point(2, 1.0, 1.0, Some(4));
        dear.kv_bytes += 1;
        let dear = sweep(Some([1, 2]), vec![dear]);
        assert!(err(&dear).to_string().contains("costs"), "{}", err(&dear));
        let other = sweep(Some([1, 2]), vec![point(3, 1.0, 1.0, Some(4))]);
        assert!(err(&other).to_string().contains("sweep points"));
        let mut far = sweep(Some([1, 2]), vec![point(2, 1.0, 1.0, Some(4))]);
        far.context_len = 2048;
        assert!(err(&far).to_string().contains("context lengths"));
        // old reports without shards: equal sweeps are kept, others refused
        let o1 = sweep(None, vec![point(2, 0.5, 1.0, None)]);
        let o2 = sweep(None, vec![point(2, 0.7, 1.0, None)]);
        assert_eq!(merge_teacher_forced(&[&o1, &o1], &th).unwrap(), o1);
        let e = merge_teacher_forced(&[&o1, &o2], &th)
            .unwrap_err()
            .to_string();
        assert!(e.contains("record no prompt shard"), "{e}");
    }
}
