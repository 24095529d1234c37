//! A sweep's comparison-axis points across prompt shards: every mean and
//! ratio of a [`PolicyPoint`] is pooled with what it is over
//! ([`PolicyCounts`]), giving the point of all the prompts.

use lcut_trace::{PolicyCounts, PolicyPoint};

use crate::error::DiagError;
use crate::pooled::{Pooled, merge_by_position};

/// The counts of shard `shard`'s point, or the named error of a point
/// written before they were recorded.
fn counts(p: &PolicyPoint, shard: usize) -> Result<PolicyCounts, DiagError> {
    p.counts.ok_or_else(|| DiagError::MissingCounts {
        shard,
        point: p.policy.clone(),
        what: "counts (tokens, prompts, steps, full-model costs)",
    })
}

/// Per entry, the prompt-weighted mean of per-prompt series (attention
/// recall per layer, scorer precision per cut); shards without prompts
/// have none. `what` names the series in errors.
fn pooled_series(
    parts: &[(&[f32], usize)],
    policy: &str,
    what: &str,
) -> Result<Vec<f32>, DiagError> {
    let len = parts
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(v, _)| v.len())
        .max()
        .unwrap_or(0);
    let mut sums = vec![Pooled::default(); len];
    for (i, (v, n)) in parts.iter().enumerate().filter(|(_, (_, n))| *n > 0) {
        if v.len() != len {
            return Err(DiagError::Mismatch {
                what: "policy points' series",
                detail: format!(
                    "{policy}: shard {i} has {} {what} entries, another shard {len}",
                    v.len()
                ),
            });
        }
        for (s, x) in sums.iter_mut().zip(v.iter()) {
            s.add(*x, *n as f64);
        }
    }
    Ok(sums.iter().map(Pooled::mean).collect())
}

/// One policy's point over all the prompts, from its point in each shard
/// (`(shard index, point)`, the same policy and pairing in each).
fn merge_point(parts: &[(usize, &PolicyPoint)]) -> Result<PolicyPoint, DiagError> {
    let first = parts[0].1;
    let mut c = PolicyCounts {
        tokens: 0,
        prompts: 0,
        steps: 0,
        full_kv_bytes: 0.0,
        full_prefill_flops: 0.0,
    };
    let mut pooled = [Pooled::default(); 8];
    let mut recall = Vec::new();
    let mut precision = Vec::new();
    for &(i, p) in parts {
        if (&p.policy, &p.paired_with) != (&first.policy, &first.paired_with) {
            return Err(DiagError::Mismatch {
                what: "sweep comparison axes",
                detail: format!(
                    "shard {} has {:?} (paired with {:?}) where shard {i} has {:?} (paired with {:?})",
                    parts[0].0, first.policy, first.paired_with, p.policy, p.paired_with
                ),
            });
        }
        let k = counts(p, i)?;
        let tokens = k.tokens;
        pooled[0].add_share(p.top1_agreement, tokens);
        pooled[1].add(p.mean_kl, tokens as f64);
        pooled[2].add(p.nll, tokens as f64);
        pooled[3].add(p.kv_ratio, k.full_kv_bytes);
        pooled[4].add(p.resident_ratio, k.full_kv_bytes);
        pooled[5].add(p.prefill_ratio, k.full_prefill_flops);
        pooled[6].add(p.equal_kv_cutoff, k.prompts as f64);
        pooled[7].add_share(p.swap_rate, k.steps);
        recall.push((p.attention_recall.as_slice(), k.prompts));
        precision.push((p.scorer_precision.as_slice(), k.prompts));
        c.tokens += k.tokens;
        c.prompts += k.prompts;
        c.steps += k.steps;
        c.full_kv_bytes += k.full_kv_bytes;
        c.full_prefill_flops += k.full_prefill_flops;
    }
    Ok(PolicyPoint {
        policy: first.policy.clone(),
        paired_with: first.paired_with.clone(),
        top1_agreement: pooled[0].mean(),
        mean_kl: pooled[1].mean(),
        nll: pooled[2].mean(),
        kv_ratio: pooled[3].ratio(),
        resident_ratio: pooled[4].ratio(),
        prefill_ratio: pooled[5].ratio(),
        equal_kv_cutoff: pooled[6].mean(),
        swap_rate: pooled[7].mean(),
        attention_recall: pooled_series(&recall, &first.policy, "attention recall")?,
        scorer_precision: pooled_series(&precision, &first.policy, "scorer precision")?,
        counts: Some(c),
    })
}

/// The comparison axis over all the prompts from each prompt shard's
/// (the same policies in the same order in every shard).
pub(crate) fn merge_policy_points(
    shards: &[&[PolicyPoint]],
) -> Result<Vec<PolicyPoint>, DiagError> {
    merge_by_position(shards, ("sweep comparison axes", "policies"), merge_point)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(top1: f32, tokens: usize, prompts: usize, recall: Vec<f32>) -> PolicyPoint {
        PolicyPoint {
            policy: "slim:1@50%".into(),
            paired_with: None,
            top1_agreement: top1,
            mean_kl: top1 * 2.0,
            nll: 1.0,
            kv_ratio: 0.5,
            resident_ratio: 0.25,
            prefill_ratio: 0.75,
            equal_kv_cutoff: top1 * 4.0,
            swap_rate: 0.5,
            attention_recall: recall,
            scorer_precision: vec![top1],
            counts: Some(PolicyCounts {
                tokens,
                prompts,
                steps: tokens,
                full_kv_bytes: 100.0 * prompts as f64,
                full_prefill_flops: 1e6 * prompts as f64,
            }),
        }
    }

    #[test]
    fn axis_points_pool_with_their_counts() {
        let a = [point(0.5, 4, 1, vec![1.0, 0.5])];
        let b = [point(1.0, 12, 3, vec![1.0, 0.9])];
        let m = merge_policy_points(&[&a, &b]).unwrap();
        let m = &m[0];
        // token-weighted: (2 + 12) / 16, not the plain mean 0.75
        assert_eq!(m.top1_agreement, 14.0 / 16.0);
        assert_eq!(m.mean_kl, (1.0 * 4.0 + 2.0 * 12.0) / 16.0);
        // prompt-weighted: (0.5·1 + 0.9·3) / 4
        assert!((m.attention_recall[1] - 0.8).abs() < 1e-6);
        assert_eq!(m.equal_kv_cutoff, (2.0 + 12.0) / 4.0);
        assert_eq!(m.scorer_precision, vec![(0.5 + 3.0) / 4.0]);
        assert_eq!(
            (m.kv_ratio, m.resident_ratio, m.prefill_ratio),
            (0.5, 0.25, 0.75)
        );
        assert_eq!(m.swap_rate, 0.5);
        let c = m.counts.unwrap();
        assert_eq!((c.tokens, c.prompts, c.steps), (16, 4, 16));
        assert_eq!(c.full_kv_bytes, 400.0);
    }

    #[test]
    fn old_or_mismatched_axis_points_are_named_errors() {
        let a = [point(0.5, 4, 1, vec![1.0])];
        let mut old = point(1.0, 12, 3, vec![1.0]);
        old.counts = None;
        let err = merge_policy_points(&[&a, &[old]]).unwrap_err();
        assert!(
            matches!(err, DiagError::MissingCounts { shard: 1, .. }),
            "{err}"
        );
        let mut other = point(1.0, 12, 3, vec![1.0]);
        other.policy = "slim:2@50%".into();
        let err = merge_policy_points(&[&a, &[other]])
            .unwrap_err()
            .to_string();
        assert!(err.contains("comparison axes"), "{err}");
        let err = merge_policy_points(&[&a, &[]]).unwrap_err().to_string();
        assert!(err.contains("comparison axes"), "{err}");
        let long = point(1.0, 12, 3, vec![1.0, 1.0]);
        let err = merge_policy_points(&[&a, &[long]]).unwrap_err().to_string();
        assert!(err.contains("attention recall"), "{err}");
    }
}
