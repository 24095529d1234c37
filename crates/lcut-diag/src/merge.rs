//! Building a report from traces, and merging shard reports.
//!
//! A report is a pure function of (tool version, model, settings, traces
//! sorted by prompt index, sweep): [`build_report`] recomputes every aggregate
//! from the traces. [`merge`] therefore gives exactly the report the unsharded
//! run would have written (sweeps of prompt shards pooled with the counts
//! each of their means is over).

use lcut_trace::{
    ModelIdentity, PromptTrace, Report, RunSettings, SCHEMA_VERSION, Sweep, Thresholds, made_by,
};

use crate::accuracy::merge_suite_accuracy;
use crate::aggregate::aggregate;
use crate::error::DiagError;
use crate::recommend::recommend;
use crate::sweep_merge::merge_teacher_forced;

/// Sorts the traces by prompt index, aggregates them, recommends L_cut with
/// `settings.thresholds`, and checks the result.
pub fn build_report(
    tool_version: &str,
    model: ModelIdentity,
    settings: RunSettings,
    mut traces: Vec<PromptTrace>,
    sweep: Option<Sweep>,
) -> Result<Report, DiagError> {
    traces.sort_by_key(|t| t.index);
    if let Some(w) = traces.windows(2).find(|w| w[0].index == w[1].index) {
        return Err(DiagError::DuplicatePrompt {
            index: w[0].index,
            first: w[0].id.clone(),
            second: w[1].id.clone(),
        });
    }
    if let Some(t) = traces
        .iter()
        .find(|t| (t.num_layers, t.num_heads) != (model.num_layers, model.num_heads))
    {
        return Err(DiagError::Mismatch {
            what: "trace and model shapes",
            detail: format!(
                "prompt {:?} has {} layers × {} heads, the model {} × {}",
                t.id, t.num_layers, t.num_heads, model.num_layers, model.num_heads
            ),
        });
    }
    let curves = aggregate(&traces)?;
    let recommendation = recommend(&curves, &settings.thresholds, &model.stores_kv());
    let report = Report {
        schema_version: SCHEMA_VERSION,
        tool_version: tool_version.to_string(),
        model,
        settings,
        traces,
        curves,
        recommendation,
        sweep,
        made_by: Vec::new(),
    };
    report.validate("built report")?;
    Ok(report)
}

fn same<T: PartialEq + std::fmt::Debug>(
    what: &'static str,
    a: &T,
    b: &T,
    i: usize,
) -> Result<(), DiagError> {
    if a == b {
        Ok(())
    } else {
        Err(DiagError::Mismatch {
            what,
            detail: format!("shard 0 has {a:?}, shard {i} has {b:?}"),
        })
    }
}

fn check_shard_specs(shards: &[Report]) -> Result<(), DiagError> {
    let specs: Vec<(usize, usize)> = shards.iter().filter_map(|r| r.settings.shard).collect();
    for (k, &(i, n)) in specs.iter().enumerate() {
        if i >= n || specs[..k].iter().any(|&(j, m)| j == i || m != n) {
            return Err(DiagError::Mismatch {
                what: "shard numbers",
                detail: format!(
                    "shards must be distinct (i, n) with i < n and one n for all; got {specs:?}"
                ),
            });
        }
    }
    Ok(())
}

/// The shards' sweep: the teacher-forced part pooled over prompt shards
/// (or the one sweep of all the prompts, [`merge_teacher_forced`]) with
/// its knee recomputed with `th`, and the suite accuracy summed over
/// suite shards ([`merge_suite_accuracy`]).
fn merge_sweeps(shards: &[Report], th: &Thresholds) -> Result<Option<Sweep>, DiagError> {
    let sweeps: Vec<&Sweep> = shards.iter().filter_map(|r| r.sweep.as_ref()).collect();
    if sweeps.is_empty() {
        return Ok(None);
    }
    let base = merge_teacher_forced(&sweeps, th)?;
    let (suite, accuracy) = merge_suite_accuracy(&sweeps)?;
    Ok(Some(Sweep {
        accuracy,
        suite,
        ..base
    }))
}

/// Merges shard reports of one run (same schema, tool version, model apart from
/// its path, and settings apart from `shard`) into the unsharded report,
/// made by every build and level that made one of the shards.
/// Sweeps of prompt shards are pooled point by point (their knee
/// recomputed), a sweep of all the prompts must be the same in every
/// shard that has one, and suite accuracy is summed over suite shards.
pub fn merge(shards: Vec<Report>) -> Result<Report, DiagError> {
    let first = shards
        .first()
        .ok_or(DiagError::Empty("merging shard reports"))?;
    for (i, r) in shards.iter().enumerate().skip(1) {
        same(
            "schema versions",
            &first.schema_version,
            &r.schema_version,
            i,
        )?;
        same("tool versions", &first.tool_version, &r.tool_version, i)?;
        if !first.model.same_model(&r.model) {
            return Err(DiagError::Mismatch {
                what: "model identities",
                detail: format!("shard 0 has {:?}, shard {i} has {:?}", first.model, r.model),
            });
        }
        same(
            "settings",
            &first.settings.without_shard(),
            &r.settings.without_shard(),
            i,
        )?;
    }
    check_shard_specs(&shards)?;
    let sweep = merge_sweeps(&shards, &first.settings.thresholds)?;
    let tool_version = first.tool_version.clone();
    let model = first.model.clone();
    let settings = first.settings.without_shard();
    let made_by = made_by::union(shards.iter().map(|r| r.made_by.as_slice()));
    let traces = shards.into_iter().flat_map(|r| r.traces).collect();
    Ok(Report {
        made_by,
        ..build_report(&tool_version, model, settings, traces, sweep)?
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synthetic::{synthetic_model, synthetic_settings, synthetic_trace};

    fn traces(n: usize) -> Vec<PromptTrace> {
        (0..n)
            .map(|i| synthetic_trace(i, 6, 3, 2 + i % 4, 20 + 7 * i))
            .collect()
    }

    fn shard_reports(all: &[PromptTrace], n: usize) -> Vec<Report> {
        (0..n)
            .map(|i| {
                let mut settings = synthetic_settings();
                settings.shard = Some((i, n));
                let mine = all.iter().filter(|t| t.index % n == i).cloned().collect();
                build_report("t", synthetic_model(6, 3), settings, mine, None).unwrap()
            })
            .collect()
    }

    #[test]
    fn merging_shards_equals_the_unsharded_report() {
        let all = traces(11);
        let whole = build_report(
            "t",
            synthetic_model(6, 3),
            synthetic_settings(),
            all.clone(),
            None,
        )
        .unwrap();
        for n in [1, 2, 3, 5] {
            let mut shards = shard_reports(&all, n);
            shards.reverse(); // order of the shard files must not matter
            let merged = merge(shards).unwrap();
            assert_eq!(merged, whole, "{n} shards");
        }
        // A shard alone does not equal the whole (the test can fail).
        assert_ne!(shard_reports(&all, 2)[0].curves, whole.curves);
    }

    #[test]
    fn a_merge_names_each_shard_s_build_once() {
        let by = |isa: &str| lcut_trace::MadeBy {
            build: "lcut 0.1.0 0123456789abcdef".into(),
            isa: isa.into(),
        };
        let all = traces(6);
        let mut shards = shard_reports(&all, 3);
        shards[0].made_by = vec![by("avx512")];
        shards[1].made_by = vec![by("avx2")];
        shards[2].made_by = vec![by("avx512")];
        let merged = merge(shards).unwrap();
        assert_eq!(merged.made_by, vec![by("avx2"), by("avx512")]);
        let unnamed = merge(shard_reports(&all, 3)).unwrap();
        assert!(unnamed.made_by.is_empty(), "shards written before it was");
        assert_eq!(
            Report {
                made_by: Vec::new(),
                ..merged
            },
            unnamed,
            "the builds change nothing else"
        );
    }

    #[test]
    fn overlapping_shards_are_rejected() {
        let all = traces(4);
        let mut shards = shard_reports(&all, 2);
        let dup = shards[0].traces[0].clone();
        shards[1].traces.push(dup);
        shards[1].settings.shard = Some((1, 2));
        let err = merge(shards).unwrap_err();
        assert!(
            matches!(err, DiagError::DuplicatePrompt { index: 0, .. }),
            "{err}"
        );
    }

    #[test]
    fn different_models_or_settings_are_rejected() {
        let all = traces(4);
        let mut shards = shard_reports(&all, 2);
        shards[1].model.config_hash = "other".into();
        assert!(
            merge(shards)
                .unwrap_err()
                .to_string()
                .contains("model identities")
        );

        let mut shards = shard_reports(&all, 2);
        shards[1].model.path = "/elsewhere".into();
        assert!(
            merge(shards).is_ok(),
            "the model path may differ between machines"
        );

        let mut shards = shard_reports(&all, 2);
        shards[1].settings.max_new_tokens += 1;
        assert!(merge(shards).unwrap_err().to_string().contains("settings"));

        let mut shards = shard_reports(&all, 2);
        shards[1].settings.shard = Some((0, 2));
        assert!(
            merge(shards)
                .unwrap_err()
                .to_string()
                .contains("shard numbers")
        );

        assert!(matches!(merge(vec![]), Err(DiagError::Empty(_))));
    }
}
