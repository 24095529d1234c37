//! Head exceptions from a diagnose report: the ranking of (layer, K/V head)
//! pairs by decode-to-prefill mass that `lcut diagnose` writes beside its
//! report (`heads-ranking.json`, what `+heads:N+ranking:FILE` reads), the cut and kept
//! heads a K/V budget buys ([`HeadAdvice`]), written as a head file that
//! `speed:C+bos+heads:FILE` reads, and policies resolved against a session's
//! model (its K/V heads and config hash checked against a head file's).

use std::path::{Path, PathBuf};

use lcut_diag::{
    HeadPlan, PromptShape, expected_accuracy, head_ranking, kv_head_masses, plan_for_budgets,
};
use lcut_policy::{FileModel, HeadFile, HeadRanking, ModelDims, Policy, PolicySpec};
use lcut_trace::{ModelIdentity, Report, write_json};
use serde::Serialize;

use crate::error::{EngineError, Result};
use crate::serve_shape::BudgetShape;
use crate::session::Session;

/// The file `lcut diagnose` writes its ranking to, in its output folder.
pub const RANKING_FILE: &str = "heads-ranking.json";

/// The model a ranking or head file names.
pub fn file_model(identity: &ModelIdentity) -> FileModel {
    identity.file_model()
}

/// The per-(layer, K/V head) masses of a report.
pub(crate) fn report_masses(report: &Report) -> Result<Vec<Vec<f64>>> {
    Ok(kv_head_masses(
        &report.curves.prefill_by_head,
        report.model.num_kv_heads,
    )?)
}

/// The ranking of a report's (layer, K/V head) pairs, highest mass first.
pub fn ranking(report: &Report) -> Result<HeadRanking> {
    Ok(HeadRanking {
        model: file_model(&report.model),
        ranking: head_ranking(&report_masses(report)?),
    })
}

/// Write a report's ranking to `dir/heads-ranking.json` (atomically).
pub fn write_ranking(dir: &Path, report: &Report) -> Result<PathBuf> {
    let path = dir.join(RANKING_FILE);
    write_json(&path, &ranking(report)?, "head ranking")?;
    Ok(path)
}

/// The mean token counts of a report's prompts: anchors, prefill tokens,
/// decode-phase tokens (the generation prompt and the new tokens).
pub fn prompt_shape(report: &Report) -> PromptShape {
    PromptShape::of_report(report)
}

/// What a K/V budget buys on a report's model: the plan, the policy that
/// runs it, and the accuracy the report's calibration leads to expect.
#[derive(Debug, Clone)]
pub struct HeadAdvice {
    /// The K/V budget (share of the full model's K/V).
    pub budget: f64,
    /// The cut and kept heads.
    pub plan: HeadPlan,
    /// Accuracy expected of the plan from the report's sweep (SPEED+BoS's
    /// accuracy at the cut that keeps the same mass), when it has one.
    pub expected_accuracy: Option<f64>,
    /// Accuracy SPEED+BoS at the plan's `speed_cut` was measured at, when
    /// the sweep has that cut.
    pub speed_accuracy: Option<f64>,
    /// The prompt shape the budget was read at.
    pub at: BudgetShape,
}

/// A head file as a recommendation writes it: the pairs, and the budget
/// with the prompt shape it was read at (readers of head files ignore it).
#[derive(Serialize)]
struct PlannedHeadFile<'a> {
    #[serde(flatten)]
    file: HeadFile,
    kv_budget: f64,
    kv_share: f64,
    read_at: &'a BudgetShape,
}

impl HeadAdvice {
    /// The plan for `budget` from `report`, the budget read at the shape of
    /// the report's own prompts.
    pub fn from_report(report: &Report, budget: f64) -> Result<Self> {
        Self::from_report_at(report, budget, BudgetShape::of_report(report))
    }

    /// The plan for `budget` from `report`'s masses, the budget read at `at`.
    pub fn from_report_at(report: &Report, budget: f64, at: BudgetShape) -> Result<Self> {
        Self::from_report_within(report, budget, at, None)
    }

    /// [`HeadAdvice::from_report_at`] with the prompt held to at most
    /// `prefill_layers` layers (a prefill budget: the cut and every kept
    /// pair below it).
    pub fn from_report_within(
        report: &Report,
        budget: f64,
        at: BudgetShape,
        prefill_layers: Option<usize>,
    ) -> Result<Self> {
        if let Some(why) = report.model.kept_heads_refusal() {
            return Err(EngineError::HeadCheck(format!(
                "a K/V budget's plans keep K/V heads, and {why}"
            )));
        }
        let masses = report_masses(report)?;
        let plan = plan_for_budgets(&masses, &at.shape(), budget, prefill_layers)?;
        Self::for_plan(report, budget, plan, at)
    }

    /// `plan` for `budget` (read at `at`), with what `report`'s calibration
    /// says of it.
    pub fn for_plan(report: &Report, budget: f64, plan: HeadPlan, at: BudgetShape) -> Result<Self> {
        let masses = report_masses(report)?;
        let calibration = report
            .sweep
            .as_ref()
            .map(|s| s.accuracy.as_slice())
            .unwrap_or_default();
        let speed_accuracy = calibration
            .iter()
            .find(|p| p.keeps_bos() && p.l_cut == plan.speed_cut)
            .map(|p| f64::from(p.accuracy));
        Ok(Self {
            budget,
            expected_accuracy: expected_accuracy(&masses, calibration, plan.mass_kept),
            speed_accuracy,
            plan,
            at,
        })
    }

    /// The head file of the plan, naming the model.
    pub fn head_file(&self, identity: &ModelIdentity) -> HeadFile {
        HeadFile {
            model: file_model(identity),
            cut: Some(self.plan.cut),
            heads: self.plan.heads.clone(),
        }
    }

    /// The policy that runs the plan with its head file at `file`.
    pub fn policy_text(&self, file: &Path) -> String {
        match self.plan.heads.is_empty() {
            true => format!("speed:{}+bos", self.plan.cut),
            false => format!("speed:{}+bos+heads:{}", self.plan.cut, file.display()),
        }
    }

    /// Plain lines for a terminal.
    pub fn summary(&self, file: &Path) -> String {
        let p = &self.plan;
        let mut out = format!(
            "K/V budget read at {} ({})\n",
            self.at.read_at,
            self.at.shape()
        );
        out.push_str(&format!(
            "K/V budget {:.3}: cut {} with {} kept (layer, K/V head) pairs holds {:.3} of full's K/V \
             and keeps {:.3} of the decode-to-prefill mass (SPEED+BoS within the budget: cut {}, {:.3})\n\
             policy: {}",
            self.budget,
            p.cut,
            p.heads.len(),
            p.kv_share,
            p.mass_kept,
            p.speed_cut,
            p.speed_mass_kept,
            self.policy_text(file)
        ));
        match (self.expected_accuracy, self.speed_accuracy) {
            (Some(a), Some(s)) => out.push_str(&format!(
                "\nexpected accuracy from the sweep's calibration {a:.3} (SPEED+BoS at {} measured {s:.3})",
                p.speed_cut
            )),
            (Some(a), None) => out.push_str(&format!(
                "\nexpected accuracy from the sweep's calibration {a:.3}"
            )),
            _ => out.push_str(
                "\nno expected accuracy: the report has no suite sweep (lcut sweep --eval-suite) covering this mass",
            ),
        }
        out
    }
}

/// Write the head file of `advice` (atomically), with the budget, the
/// share the plan holds and the prompt shape the budget was read at.
pub fn write_head_file(path: &Path, advice: &HeadAdvice, identity: &ModelIdentity) -> Result<()> {
    let planned = PlannedHeadFile {
        file: advice.head_file(identity),
        kv_budget: advice.budget,
        kv_share: advice.plan.kv_share,
        read_at: &advice.at,
    };
    write_json(path, &planned, "head file")?;
    Ok(())
}

/// `spec` resolved for a model of `num_layers` layers and `kv_heads` K/V
/// heads whose config hashes to `config_hash` (when known): a head file or
/// ranking made for another model is refused. The files a policy reads are
/// the ones it names (`+heads:FILE`, `+ranking:FILE`); nothing is read from
/// the working directory, so `+heads:N` without `+ranking:FILE` is refused
/// by name.
pub fn resolve_spec(
    spec: &PolicySpec,
    num_layers: usize,
    kv_heads: usize,
    config_hash: Option<&str>,
) -> Result<Policy> {
    let dims = ModelDims {
        num_layers,
        kv_heads: Some(kv_heads),
        config_hash,
    };
    Ok(spec.resolve_for(&dims, None)?)
}

impl Session {
    /// `spec` resolved for this session's model ([`resolve_spec`] with its
    /// depth, K/V heads and config hash).
    pub fn resolve_policy(&self, spec: &PolicySpec) -> Result<Policy> {
        let cfg = self.model.config();
        resolve_spec(
            spec,
            cfg.num_layers,
            cfg.num_kv_heads,
            Some(self.config_hash()),
        )
    }
}
