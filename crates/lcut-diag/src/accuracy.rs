//! Suite accuracy per cutoff across shards: the 95% Wilson interval, and
//! the merge of `lcut sweep --eval-suite --shard` points (correct and n
//! summed per cutoff and anchors, accuracy and interval recomputed).

use lcut_trace::{CutoffAccuracy, SuiteSource, Sweep};

use crate::error::DiagError;

/// The 95% Wilson score interval of `k` successes in `n` trials.
pub fn wilson(k: usize, n: usize) -> [f64; 2] {
    if n == 0 {
        return [0.0, 1.0];
    }
    let z = 1.959_963_984_540_054_f64;
    let (n, p) = (n as f64, k as f64 / n as f64);
    let denom = 1.0 + z * z / n;
    let center = (p + z * z / (2.0 * n)) / denom;
    let half = z / denom * (p * (1.0 - p) / n + z * z / (4.0 * n * n)).sqrt();
    [(center - half).max(0.0), (center + half).min(1.0)]
}

/// The accuracy point of `correct` of `n` items at `l_cut` with `anchors`.
pub fn accuracy_point(l_cut: usize, anchors: &str, correct: usize, n: usize) -> CutoffAccuracy {
    CutoffAccuracy {
        l_cut,
        anchors: anchors.to_string(),
        correct,
        n,
        accuracy: correct as f32 / n.max(1) as f32,
        interval: wilson(correct, n).map(|x| x as f32),
    }
}

/// The (cutoff, anchors) keys of a shard's points, in order.
fn keys(points: &[CutoffAccuracy]) -> Vec<(usize, &str)> {
    points
        .iter()
        .map(|p| (p.l_cut, p.anchors.as_str()))
        .collect()
}

/// Checks that `sources` are shards of one suite that together cover it
/// once: the same hash and size, one shard count, every index once.
fn check_suite_shards(sources: &[&SuiteSource]) -> Result<(), DiagError> {
    let first = sources[0];
    for (i, s) in sources.iter().enumerate().skip(1) {
        if (&s.hash, s.items) != (&first.hash, first.items) {
            return Err(DiagError::mismatch(
                "suites of the accuracy points",
                format!(
                    "shard 0 scored {} ({} items, hash {}), shard {i} {} ({} items, hash {})",
                    first.path, first.items, first.hash, s.path, s.items, s.hash
                ),
            ));
        }
    }
    let specs: Vec<Option<[usize; 2]>> = sources.iter().map(|s| s.shard).collect();
    let n = sources.len();
    let mut seen = vec![false; n];
    for spec in &specs {
        match spec {
            Some([i, m]) if *m == n && *i < n && !seen[*i] => seen[*i] = true,
            _ => {
                return Err(DiagError::mismatch(
                    "suite shards",
                    format!(
                        "the sweeps must score suite shards 0/{n} .. {}/{n} once each; got {specs:?}",
                        n - 1
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The suite accuracy of the sweeps of shard reports: nothing when none
/// has any; the one list when the suite was not sharded (all must agree);
/// otherwise `correct` and `n` summed per (cutoff, anchors) over shards
/// that together cover the suite once, accuracy and interval recomputed.
pub fn merge_suite_accuracy(
    sweeps: &[&Sweep],
) -> Result<(Option<SuiteSource>, Vec<CutoffAccuracy>), DiagError> {
    let Some(first) = sweeps.first() else {
        return Ok((None, Vec::new()));
    };
    let unsharded = sweeps
        .iter()
        .all(|s| s.suite.as_ref().is_none_or(|x| x.shard.is_none()));
    if unsharded {
        // reports without a recorded suite, or shards of the prompts that
        // each scored the whole suite: the points must be the same
        if let Some((i, _)) = sweeps
            .iter()
            .enumerate()
            .find(|(_, s)| (&s.suite, &s.accuracy) != (&first.suite, &first.accuracy))
        {
            return Err(DiagError::mismatch(
                "suite accuracy",
                format!("shard 0 and shard {i} scored the whole suite differently"),
            ));
        }
        return Ok((first.suite.clone(), first.accuracy.clone()));
    }
    let sources = sweeps
        .iter()
        .enumerate()
        .map(|(i, s)| {
            s.suite.as_ref().ok_or_else(|| {
                DiagError::mismatch(
                    "suite shards",
                    format!("shard {i} has accuracy points without a recorded suite"),
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    check_suite_shards(&sources)?;
    let want = keys(&first.accuracy);
    let mut sums: Vec<(usize, usize)> = vec![(0, 0); want.len()];
    for (i, s) in sweeps.iter().enumerate() {
        if keys(&s.accuracy) != want {
            return Err(DiagError::mismatch(
                "accuracy points (cutoffs and anchors)",
                format!(
                    "shard 0 has {want:?}, shard {i} has {:?}",
                    keys(&s.accuracy)
                ),
            ));
        }
        for (sum, p) in sums.iter_mut().zip(&s.accuracy) {
            *sum = (sum.0 + p.correct, sum.1 + p.n);
        }
    }
    let items = sources[0].items;
    if let Some(((l_cut, anchors), (_, n))) = want.iter().zip(&sums).find(|(_, s)| s.1 != items) {
        return Err(DiagError::mismatch(
            "suite sizes",
            format!(
                "the shards scored {n} items at L_cut {l_cut} ({anchors}), the suite has {items}"
            ),
        ));
    }
    let points = want
        .iter()
        .zip(sums)
        .map(|((l_cut, anchors), (correct, n))| accuracy_point(*l_cut, anchors, correct, n))
        .collect();
    let mut suite = sources[0].clone();
    suite.shard = None;
    Ok((Some(suite), points))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sweep(shard: Option<[usize; 2]>, points: &[(usize, &str, usize, usize)]) -> Sweep {
        Sweep {
            context_len: 100,
            points: Vec::new(),
            knee: None,
            policies: Vec::new(),
            accuracy: points
                .iter()
                .map(|&(c, a, k, n)| accuracy_point(c, a, k, n))
                .collect(),
            suite: Some(SuiteSource {
                path: "s.jsonl".into(),
                hash: "h".into(),
                items: 5,
                shard,
            }),
            prompt_shard: None,
            made_by: Vec::new(),
        }
    }

    #[test]
    fn shards_sum_correct_and_n_and_recompute_the_interval() {
        let a = sweep(
            Some([0, 2]),
            &[(2, "bos", 1, 3), (4, "bos", 3, 3), (2, "none", 0, 3)],
        );
        let b = sweep(
            Some([1, 2]),
            &[(2, "bos", 2, 2), (4, "bos", 1, 2), (2, "none", 1, 2)],
        );
        let (suite, points) = merge_suite_accuracy(&[&b, &a]).unwrap();
        let suite = suite.unwrap();
        assert_eq!((suite.items, suite.shard), (5, None));
        let want = [(2, "bos", 3), (4, "bos", 4), (2, "none", 1)];
        for (p, (c, a, k)) in points.iter().zip(want) {
            assert_eq!((p.l_cut, p.anchors.as_str(), p.correct, p.n), (c, a, k, 5));
            assert_eq!(p.accuracy, k as f32 / 5.0);
            assert_eq!(p.interval, wilson(k, 5).map(|x| x as f32));
        }
        assert_eq!(points.len(), 3);
    }

    #[test]
    fn mismatched_shards_are_named_errors() {
        let a = sweep(Some([0, 2]), &[(2, "bos", 1, 3), (4, "bos", 3, 3)]);
        let err = |b: &Sweep| merge_suite_accuracy(&[&a, b]).unwrap_err().to_string();
        let b = sweep(Some([1, 2]), &[(2, "bos", 2, 2), (3, "bos", 1, 2)]);
        assert!(err(&b).contains("cutoffs and anchors"), "{}", err(&b));
        let b = sweep(Some([1, 2]), &[(2, "bos", 2, 2), (4, "none", 1, 2)]);
        assert!(err(&b).contains("cutoffs and anchors"), "{}", err(&b));
        let mut b = sweep(Some([1, 2]), &[(2, "bos", 2, 2), (4, "bos", 1, 2)]);
        b.suite.as_mut().unwrap().hash = "other".into();
        assert!(
            err(&b).contains("suites of the accuracy points"),
            "{}",
            err(&b)
        );
        let b = sweep(Some([0, 2]), &[(2, "bos", 2, 2), (4, "bos", 1, 2)]);
        assert!(err(&b).contains("suite shards"), "{}", err(&b));
        let b = sweep(None, &[(2, "bos", 2, 5), (4, "bos", 1, 5)]);
        assert!(err(&b).contains("suite shards"), "{}", err(&b));
        let b = sweep(Some([1, 2]), &[(2, "bos", 2, 3), (4, "bos", 1, 3)]);
        assert!(err(&b).contains("suite sizes"), "{}", err(&b));
        // one shard of two alone does not cover the suite
        let e = merge_suite_accuracy(&[&a]).unwrap_err().to_string();
        assert!(e.contains("suite shards"), "{e}");
    }

    #[test]
    fn unsharded_suites_must_agree_and_are_kept() {
        let a = sweep(None, &[(2, "bos", 1, 5)]);
        let (_, points) = merge_suite_accuracy(&[&a, &a.clone()]).unwrap();
        assert_eq!(points, a.accuracy);
        let b = sweep(None, &[(2, "bos", 2, 5)]);
        assert!(merge_suite_accuracy(&[&a, &b]).is_err());
        assert_eq!(merge_suite_accuracy(&[]).unwrap(), (None, Vec::new()));
    }
}
