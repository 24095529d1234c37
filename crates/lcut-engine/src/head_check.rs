//! A K/V budget's plan checked on the model: the candidate plans from the
//! largest SPEED+BoS cut that fits the budget down a fifth of the depth
//! ([`CHECKED_SPAN`]), and SPEED+BoS itself at that cut, teacher-forced on
//! the full model's greedy continuations of a prompt set; the candidate
//! with the highest top-1 agreement with the full model is chosen (ties to
//! the lower KL, then to SPEED+BoS). SPEED+BoS is always a candidate, so a
//! checked plan never agrees less with the full model than SPEED+BoS within
//! the same budget on the prompts it was checked on.

use std::path::{Path, PathBuf};

use lcut_diag::{CHECKED_SPAN, HeadPlan, PromptShape, kv_share, plan_candidates, span_layers};
use lcut_trace::{Report, Thresholds, write_json};
use serde::Serialize;

use crate::diagnose::{AxisPolicy, DiagnoseEvent, LabelledPrompt, SweepOptions, sweep};
use crate::error::{EngineError, Result};
use crate::heads::{HeadAdvice, report_masses};
use crate::serve_shape::BudgetShape;
use crate::session::Session;

/// One candidate of a check and what it measured.
#[derive(Debug, Clone, Serialize)]
pub struct CheckedCandidate {
    /// The policy as written (its head file under the check's folder).
    pub policy: String,
    /// The cut.
    pub cut: usize,
    /// Kept (layer, K/V head) pairs above the cut.
    pub kept_pairs: usize,
    /// K/V held of the full model's, at the prompt shape the budget was read at.
    pub kv_share: f64,
    /// Share of the decode-to-prefill mass it keeps.
    pub mass_kept: f64,
    /// Teacher-forced top-1 agreement with the full model.
    pub top1_agreement: f64,
    /// Mean KL(full ‖ candidate), nats.
    pub mean_kl: f64,
}

/// A checked recommendation: every candidate, and the one chosen.
#[derive(Debug, Clone)]
pub struct CheckedAdvice {
    /// The chosen plan, as [`HeadAdvice::from_report`] gives a plan.
    pub advice: HeadAdvice,
    /// The candidates in the order checked (SPEED+BoS first).
    pub candidates: Vec<CheckedCandidate>,
    /// Index of the chosen candidate.
    pub chosen: usize,
}

/// What a check writes beside the head file: its candidates' figures.
#[derive(Debug, Serialize)]
struct CheckRecord<'a> {
    budget: f64,
    read_at: &'a BudgetShape,
    prompts: usize,
    max_new_tokens: usize,
    chosen: usize,
    candidates: &'a [CheckedCandidate],
}

/// The candidates of `budget` read at `shape`, from per-(layer, K/V head)
/// masses: SPEED+BoS at the largest cut that fits, then the plan of each
/// cut from that one down [`CHECKED_SPAN`] of the depth (repeats dropped).
fn candidate_plans(masses: &[Vec<f64>], shape: &PromptShape, budget: f64) -> Result<Vec<HeadPlan>> {
    let span = span_layers(masses.len(), CHECKED_SPAN);
    let plans = plan_candidates(masses, shape, budget, span)?;
    let top = plans[0].speed_cut;
    let kv_heads = masses.first().map_or(0, Vec::len);
    let speed = HeadPlan {
        cut: top,
        heads: Vec::new(),
        kv_share: kv_share(masses.len(), kv_heads, top, 0, shape),
        mass_kept: plans[0].speed_mass_kept,
        speed_cut: top,
        speed_mass_kept: plans[0].speed_mass_kept,
    };
    let mut out = vec![speed];
    for p in plans {
        if !out.iter().any(|q| q.cut == p.cut && q.heads == p.heads) {
            out.push(p);
        }
    }
    Ok(out)
}

/// The index of the best candidate: highest agreement, then lowest KL,
/// then the earliest (SPEED+BoS first).
fn choose(candidates: &[CheckedCandidate]) -> usize {
    let mut best = 0;
    for (i, c) in candidates.iter().enumerate().skip(1) {
        let b = &candidates[best];
        let better = c.top1_agreement > b.top1_agreement + 1e-9
            || ((c.top1_agreement - b.top1_agreement).abs() <= 1e-9 && c.mean_kl < b.mean_kl);
        if better {
            best = i;
        }
    }
    best
}

/// Check the candidate plans of `budget` (read at the prompt shape `at`)
/// from `report` on `prompts` (teacher-forced on `max_new_tokens` greedy
/// tokens of the full model),
/// writing each candidate's head file and the figures into `dir`
/// (`dir/candidates.json`, `dir/c<CUT>.json`); `on_event` returns false to
/// cancel.
pub fn check_budget(
    session: &Session,
    report: &Report,
    prompts: &[LabelledPrompt],
    (budget, at): (f64, &BudgetShape),
    max_new_tokens: usize,
    dir: &Path,
    on_event: &mut dyn FnMut(&DiagnoseEvent) -> bool,
) -> Result<CheckedAdvice> {
    if prompts.is_empty() {
        return Err(EngineError::HeadCheck(
            "there are no prompts to check it on".into(),
        ));
    }
    let plans = candidate_plans(&report_masses(report)?, &at.shape(), budget)?;
    std::fs::create_dir_all(dir).map_err(|source| lcut_trace::TraceError::Io {
        action: "creating",
        path: dir.to_path_buf(),
        source,
    })?;
    let mut advice: Vec<HeadAdvice> = Vec::new();
    let mut files: Vec<PathBuf> = Vec::new();
    let mut axis = Vec::new();
    for plan in plans {
        let a = HeadAdvice::for_plan(report, budget, plan, at.clone())?;
        let file = dir.join(format!("c{}.json", a.plan.cut));
        if !a.plan.heads.is_empty() {
            write_json(&file, &a.head_file(&report.model), "head file")?;
            axis.push(AxisPolicy {
                spec: a.policy_text(&file).parse()?,
                paired_with: None,
            });
        }
        files.push(file);
        advice.push(a);
    }
    let opts = SweepOptions {
        cuts: Some(vec![advice[0].plan.cut]),
        max_new_tokens,
        axis,
        ..SweepOptions::default()
    };
    let result = sweep(session, prompts, &opts, &Thresholds::default(), on_event)?;
    let speed = result
        .points
        .first()
        .ok_or_else(|| EngineError::HeadCheck("the sweep measured no SPEED+BoS point".into()))?;
    let mut measured = vec![(speed.top1_agreement, speed.mean_kl)];
    measured.extend(
        result
            .policies
            .iter()
            .map(|p| (p.top1_agreement, p.mean_kl)),
    );
    let candidates: Vec<CheckedCandidate> = advice
        .iter()
        .zip(&files)
        .zip(&measured)
        .map(|((a, file), &(agreement, kl))| CheckedCandidate {
            policy: a.policy_text(file),
            cut: a.plan.cut,
            kept_pairs: a.plan.heads.len(),
            kv_share: a.plan.kv_share,
            mass_kept: a.plan.mass_kept,
            top1_agreement: f64::from(agreement),
            mean_kl: f64::from(kl),
        })
        .collect();
    let chosen = choose(&candidates);
    let record = CheckRecord {
        budget,
        read_at: at,
        prompts: prompts.len(),
        max_new_tokens,
        chosen,
        candidates: &candidates,
    };
    write_json(&dir.join("candidates.json"), &record, "checked candidates")?;
    Ok(CheckedAdvice {
        advice: advice.swap_remove(chosen),
        candidates,
        chosen,
    })
}

impl CheckedAdvice {
    /// Plain lines for a terminal: each candidate's figures, the chosen one
    /// marked.
    pub fn table(&self) -> String {
        let mut out =
            String::from("  cut  kept pairs  K/V of full  mass kept  top-1 agreement  mean KL\n");
        for (i, c) in self.candidates.iter().enumerate() {
            out.push_str(&format!(
                "{} {:>3}  {:>10}  {:>11.3}  {:>9.3}  {:>15.3}  {:>7.3}{}\n",
                if i == self.chosen { "*" } else { " " },
                c.cut,
                c.kept_pairs,
                c.kv_share,
                c.mass_kept,
                c.top1_agreement,
                c.mean_kl,
                if c.kept_pairs == 0 {
                    "  (SPEED+BoS)"
                } else {
                    ""
                }
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(agreement: f64, kl: f64) -> CheckedCandidate {
        CheckedCandidate {
            policy: String::new(),
            cut: 0,
            kept_pairs: 0,
            kv_share: 0.0,
            mass_kept: 0.0,
            top1_agreement: agreement,
            mean_kl: kl,
        }
    }

    #[test]
    fn the_best_agreement_wins_then_the_lower_kl_then_speed() {
        assert_eq!(
            choose(&[cand(0.8, 0.3), cand(0.9, 0.5), cand(0.85, 0.1)]),
            1
        );
        assert_eq!(choose(&[cand(0.9, 0.3), cand(0.9, 0.2)]), 1);
        // an exact tie keeps SPEED+BoS, the first
        assert_eq!(choose(&[cand(0.9, 0.2), cand(0.9, 0.2)]), 0);
    }

    #[test]
    fn speed_at_the_largest_cut_that_fits_the_serving_shape_is_the_first_candidate() {
        // 6 layers, 2 K/V heads, the prompt read low and by (4, 1)
        let masses = vec![
            vec![0.5, 0.5],
            vec![0.4, 0.4],
            vec![0.3, 0.3],
            vec![0.05, 0.05],
            vec![0.01, 0.30],
            vec![0.01, 0.02],
        ];
        let served = PromptShape {
            anchors: 1.0,
            prefill: 1000.0,
            decode: 40.0,
        };
        for cut in 2..=5 {
            // a budget exactly at SPEED+BoS `cut`'s share of the served shape
            let budget = kv_share(6, 2, cut, 0, &served);
            let plans = candidate_plans(&masses, &served, budget).unwrap();
            assert_eq!((plans[0].cut, plans[0].heads.len()), (cut, 0), "cut {cut}");
            assert!(plans[0].kv_share <= budget);
            // the plans below it spend the budget on kept pairs
            assert!(
                plans[1..]
                    .iter()
                    .all(|p| p.cut < cut && !p.heads.is_empty())
            );
            assert!(plans.iter().all(|p| p.kv_share <= budget + 1e-12));
        }
    }
}
