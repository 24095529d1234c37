//! What every part runner shares: the run it belongs to, the shard of a
//! unit list, and running a part's units with progress and resumption.

use std::path::Path;

use anyhow::Result;
use lcut_engine::diagnose::shard_indices;
use lcut_trace::PaperPart;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use lcut_policy::PolicySpec;

use super::plan::{compared_policies, missing_for, spread_by_kind};
use super::progress::PartProgress;
use super::setup::Setup;
use super::store::{PartFile, PartPlan, run_part};

/// A run's setup, its folder and its cut C.
pub struct Ctx<'a> {
    /// Model, adapters, suite and settings.
    pub setup: &'a Setup,
    /// The run's folder.
    pub dir: &'a Path,
    /// The cut the policies are compared at.
    pub cut: usize,
}

impl Ctx<'_> {
    /// This run's shard of `units` (all of them unsharded).
    pub fn shard_of(&self, units: &[usize]) -> Result<Vec<usize>> {
        Ok(shard_indices(units.len(), self.setup.shard)?
            .into_iter()
            .map(|k| units[k])
            .collect())
    }

    /// The suite items diagnosed and generated at length: the preset's
    /// number of each kind, spread over the kind (this shard's of them).
    pub fn spread_items(&self) -> Result<Vec<usize>> {
        let per_kind = self.setup.settings.sizes.items_per_kind;
        self.shard_of(&spread_by_kind(&self.setup.kinds(), per_kind))
    }

    /// The compared policies at the cut ([`compared_policies`]) that the
    /// model's layout runs, and those it leaves out with the reason (SwiftKV
    /// projects K/V into layers that, on Gemma 4, store none and, on
    /// Qwen3.5, hold a recurrent state).
    pub fn compared(&self) -> (Vec<PolicySpec>, Vec<(PolicySpec, String)>) {
        let model = &self.setup.session.model;
        let layers = model.config().num_layers;
        let (mut kept, mut left_out) = (vec![], vec![]);
        for spec in compared_policies(self.cut) {
            // a cut out of range was refused at setup, naming the policy
            match spec.resolve(layers).map(|p| model.check_layout(&p)) {
                Ok(Err(e)) => left_out.push((spec, e.to_string())),
                _ => kept.push(spec),
            }
        }
        (kept, left_out)
    }

    /// The compared policies the model runs, as written.
    pub fn compared_names(&self) -> Vec<String> {
        self.compared().0.iter().map(ToString::to_string).collect()
    }

    /// Why `part` is skipped on this suite, if it is.
    pub fn skip_note(&self, part: PaperPart) -> Option<String> {
        missing_for(part, &self.setup.kinds())
    }

    /// Run `part`'s `units` (none, with `note`, when the part is skipped)
    /// with a progress bar; `work(unit, progress)` makes one unit and
    /// `label(unit)` names it in the log.
    pub fn run_units<T: Serialize + DeserializeOwned>(
        &self,
        (part, settings): (PaperPart, Value),
        units: Vec<usize>,
        label: &dyn Fn(usize) -> String,
        work: &mut dyn FnMut(usize, &PartProgress) -> Result<T>,
    ) -> Result<PartFile<T>> {
        let note = self.skip_note(part);
        let units = if note.is_some() { Vec::new() } else { units };
        let progress = PartProgress::new(part);
        let plan = PartPlan {
            dir: self.dir,
            part,
            settings,
            units,
            note,
        };
        let file = run_part(
            plan,
            &mut |todo, total| progress.start(todo, total),
            &mut |u| {
                let result = work(u, &progress)?;
                progress.unit_done(&label(u));
                Ok(result)
            },
        )?;
        progress.finish();
        Ok(file)
    }

    /// The id of suite item `index` (a unit's name in the log).
    pub fn item_id(&self, index: usize) -> String {
        self.setup
            .items
            .get(index)
            .map_or_else(|| index.to_string(), |i| i.id.clone())
    }
}
