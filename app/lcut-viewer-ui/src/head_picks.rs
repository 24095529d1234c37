//! The (layer, K/V head) pairs picked above the chosen cut: picking by a
//! query head's cell (its whole group), refusing pairs below the cut,
//! filling from a K/V budget's plan, writing the picks as a head file
//! (`[[layer, kv_head], ...]` with the model they were made for, written
//! atomically) and starting `speed:C+bos+heads:FILE` live beside the full
//! model. Plain state; drawn by [`crate::heads_view`].

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use egui_plot::PlotTransform;
use lcut_diag::HeadPlan;
use lcut_policy::{HeadFile, PolicySpec};
use lcut_trace::{ModelIdentity, write_json};

use crate::backend::{Command, LiveRequest};
use crate::head_data::HeadData;
use crate::heatmap::HeatmapCache;
use crate::loaded::LoadedReport;
use crate::settings::Tab;
use crate::state::{JobKind, ViewerState};

/// The K/V budget the budget field starts at (the 0.75 of full).
pub const DEFAULT_BUDGET: f64 = 0.75;

/// The picks, the budget field and what the last action said.
pub struct HeadPicks {
    /// The picked (layer, K/V head) pairs, ascending.
    pub picked: BTreeSet<(usize, usize)>,
    /// The K/V budget field (a share of the full model's K/V).
    pub budget: f64,
    /// The plan the budget last filled the picks from.
    pub plan: Option<HeadPlan>,
    /// Why the last click or fill was refused (shown until the next one).
    pub refused: Option<String>,
    /// The folder head files are written to (the report's run folder, else
    /// the export folder).
    pub folder: String,
    /// The head file of the last run.
    pub written: Option<PathBuf>,
    /// The report's head data (an error when its heads do not group evenly),
    /// rebuilt when `data_key` changes.
    pub data: Option<Result<HeadData, String>>,
    /// The report `data` was built for (its address, and whether it had
    /// its sweep yet).
    pub data_key: (usize, bool),
    /// The heatmap's texture.
    pub cache: HeatmapCache,
    /// Data to screen of the heatmap as last drawn (tests click through it).
    pub transform: Option<PlotTransform>,
}

impl Default for HeadPicks {
    fn default() -> Self {
        Self {
            picked: BTreeSet::new(),
            budget: DEFAULT_BUDGET,
            plan: None,
            refused: None,
            folder: String::new(),
            written: None,
            data: None,
            data_key: (0, false),
            cache: HeatmapCache::default(),
            transform: None,
        }
    }
}

/// The folder of a report that came from `source`: the folder of its file
/// when it was read from one, else `fallback`.
pub fn run_folder(source: &str, fallback: &str) -> String {
    let path = Path::new(source);
    match path.is_file() {
        true => path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map_or_else(|| ".".to_string(), |p| p.display().to_string()),
        false => fallback.to_string(),
    }
}

/// The name of the head file of `kept` pairs above `cut`.
pub fn head_file_name(cut: usize, kept: usize) -> String {
    format!("heads-c{cut}-n{kept}.json")
}

/// Why `layer` cannot be picked at `cut` of `layers`, or `None` when it can.
pub fn refusal(layer: usize, cut: usize, layers: usize) -> Option<String> {
    (layer < cut).then(|| {
        format!(
            "layer {layer} is below the cut {cut}: layers 0..{} keep the whole prompt already; \
             pick heads in layers {cut}..{}",
            cut - 1,
            layers.saturating_sub(1)
        )
    })
}

impl HeadPicks {
    /// Fresh picks for a report from `source`, head files going to its
    /// run folder (else `fallback`).
    pub fn for_report(source: &str, fallback: &str) -> Self {
        Self {
            folder: run_folder(source, fallback),
            ..Self::default()
        }
    }

    /// Builds the head data of `loaded` unless it is already built.
    pub fn refresh(&mut self, loaded: &LoadedReport) {
        let key = (
            std::sync::Arc::as_ptr(&loaded.report) as usize,
            loaded.report.sweep.is_some(),
        );
        if self.data.is_none() || self.data_key != key {
            self.data = Some(HeadData::of_report(&loaded.report));
            self.data_key = key;
        }
    }

    /// The picks as a sorted list.
    pub fn pairs(&self) -> Vec<(usize, usize)> {
        self.picked.iter().copied().collect()
    }

    /// A click on query head `q` of `layer` at `cut`: toggles its K/V
    /// head's group; a layer below the cut is refused with the reason.
    /// Returns whether the pair is picked now.
    pub fn click(
        &mut self,
        data: &HeadData,
        cut: usize,
        layer: usize,
        q: usize,
    ) -> Result<bool, String> {
        let refused = match (layer >= data.layers, q >= data.heads) {
            (true, _) => Some(format!("layer {layer} is past the last layer")),
            (_, true) => Some(format!("query head {q} is past the last head")),
            _ => refusal(layer, cut, data.layers),
        };
        self.refused.clone_from(&refused);
        if let Some(r) = refused {
            return Err(r);
        }
        let pair = (layer, data.kv_of(q));
        let now = !self.picked.remove(&pair);
        if now {
            self.picked.insert(pair);
        }
        Ok(now)
    }

    /// Drops the picks below `cut` (the cut moved up past them); how many.
    pub fn drop_below(&mut self, cut: usize) -> usize {
        let before = self.picked.len();
        self.picked.retain(|&(l, _)| l >= cut);
        before - self.picked.len()
    }

    /// Replaces the picks with the plan of the budget field; returns the
    /// plan's cut, which the caller makes the chosen one.
    pub fn fill_from_budget(&mut self, data: &HeadData) -> Result<usize, String> {
        match data.plan(self.budget) {
            Ok(plan) => {
                self.picked = plan.heads.iter().copied().collect();
                self.refused = None;
                let cut = plan.cut;
                self.plan = Some(plan);
                Ok(cut)
            }
            Err(e) => {
                self.refused = Some(e.clone());
                Err(e)
            }
        }
    }

    /// No picks.
    pub fn clear(&mut self) {
        self.picked.clear();
        self.plan = None;
        self.refused = None;
    }

    /// The head file of the picks at `cut`, naming `model`.
    pub fn head_file(&self, model: &ModelIdentity, cut: usize) -> HeadFile {
        HeadFile {
            model: model.file_model(),
            cut: Some(cut),
            heads: self.pairs(),
        }
    }

    /// Writes the head file of the picks at `cut` into the folder
    /// (atomically: a temporary file renamed onto it); its path, absolute.
    pub fn write(&mut self, model: &ModelIdentity, cut: usize) -> Result<PathBuf, String> {
        let folder = PathBuf::from(self.folder.trim());
        std::fs::create_dir_all(&folder)
            .map_err(|e| format!("creating the folder {}: {e}", folder.display()))?;
        let folder = std::path::absolute(&folder)
            .map_err(|e| format!("the folder {}: {e}", folder.display()))?;
        let path = folder.join(head_file_name(cut, self.picked.len()));
        write_json(&path, &self.head_file(model, cut), "head file")
            .map_err(|e| format!("writing the head file {}: {e}", path.display()))?;
        self.written = Some(path.clone());
        Ok(path)
    }
}

/// `speed:C+bos+heads:FILE`, read back by the policy parser; a path the
/// parser cannot hold (a `+` in it) is a named error.
pub fn heads_policy(cut: usize, file: &Path) -> Result<PolicySpec, String> {
    let path = file.display().to_string();
    if path.contains('+') || path.trim() != path {
        return Err(format!(
            "the head file's path {path:?} has a `+` or surrounding spaces, which a policy \
             cannot hold: choose another folder"
        ));
    }
    format!("speed:{cut}+bos+heads:{path}")
        .parse()
        .map_err(|e: lcut_policy::PolicyError| e.to_string())
}

impl ViewerState {
    /// Fills the picks from the budget field's plan and makes the plan's
    /// cut the chosen one (what *Fill from budget* does); the plan, or why
    /// there is none.
    pub fn fill_heads_from_budget(&mut self) -> Result<HeadPlan, String> {
        let Some(loaded) = self.loaded.as_ref() else {
            return Err("open or run a report first".into());
        };
        self.heads.refresh(loaded);
        let data = match &self.heads.data {
            Some(Ok(d)) => d.clone(),
            Some(Err(e)) => return Err(e.clone()),
            None => return Err("the report has no head data".into()),
        };
        self.view.l_cut = self.heads.fill_from_budget(&data)?;
        self.heads
            .plan
            .clone()
            .ok_or_else(|| "the budget gave no plan".to_string())
    }

    /// Why "Run beside full" cannot start now, or `None` when it can.
    pub fn heads_run_blocked(&self) -> Option<&'static str> {
        match &self.model {
            None => Some("open a model to run the picks"),
            Some(m) if !m.has_tokenizer => Some("the model has no tokenizer"),
            Some(_) if self.busy() => Some("a job is running"),
            Some(_) if self.heads.picked.is_empty() => {
                Some("no heads picked: that is SPEED itself (Generate in the Live view)")
            }
            Some(_) => None,
        }
    }

    /// Writes the picks as a head file and runs `speed:C+bos+heads:FILE`
    /// live beside the full model, with SPEED+BoS at the cut holding as
    /// much K/V as the third column; the live view shows it. False (and an
    /// error) when it cannot start.
    pub fn run_heads(&mut self) -> bool {
        if let Some(why) = self.heads_run_blocked() {
            self.fail(why.to_string());
            return false;
        }
        let Some(loaded) = self.loaded.as_ref() else {
            self.fail("open or run a report first".into());
            return false;
        };
        let model = loaded.report.model.clone();
        self.heads.refresh(loaded);
        let cut = self.view.l_cut.clamp(1, model.num_layers.max(1));
        self.heads.drop_below(cut);
        let equal_cut = match self.heads.data.as_ref() {
            Some(Ok(d)) => d.cost(cut, &self.heads.pairs()).equal_cut,
            _ => cut,
        };
        let spec = self
            .heads
            .write(&model, cut)
            .and_then(|path| heads_policy(cut, &path).map(|spec| (path, spec)));
        let (path, policy) = match spec {
            Ok(p) => p,
            Err(e) => {
                self.fail(e);
                return false;
            }
        };
        self.note(format!("wrote {}", path.display()));
        let extra: PolicySpec = match format!("speed:{equal_cut}+bos").parse() {
            Ok(s) => s,
            Err(e) => {
                self.fail(format!("{e}"));
                return false;
            }
        };
        let (prompt, max_new_tokens) = (self.live.prompt.clone(), self.live.max_new_tokens);
        let use_chat_template = self.inputs.use_chat_template;
        let ok = self.start(JobKind::Generate, |job| {
            Command::RunGenerate(LiveRequest {
                job,
                prompt,
                policy: Box::new(policy),
                max_new_tokens,
                use_chat_template,
                extra: Some(Box::new(extra)),
            })
        });
        if ok {
            self.live.begin(cut);
            self.view.tab = Tab::Live;
        }
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data() -> HeadData {
        let report = lcut_diag::synthetic::synthetic_report(2, 16, 8, false).unwrap();
        HeadData::of_report(&report).unwrap()
    }

    #[test]
    fn a_click_toggles_the_group_and_refuses_below_the_cut() {
        let d = data();
        let mut p = HeadPicks::default();
        assert_eq!(p.click(&d, 10, 12, 3), Ok(true));
        assert_eq!(p.pairs(), vec![(12, 1)]);
        // the other query head of the same group takes it back
        assert_eq!(p.click(&d, 10, 12, 2), Ok(false));
        assert!(p.picked.is_empty());
        let e = p.click(&d, 10, 3, 0).unwrap_err();
        assert!(e.contains("layer 3 is below the cut 10"), "{e}");
        assert!(e.contains("layers 10..15"), "{e}");
        assert_eq!(p.refused.as_deref(), Some(e.as_str()));
        assert!(p.picked.is_empty());
        assert!(p.click(&d, 10, 16, 0).is_err() && p.click(&d, 10, 12, 8).is_err());
        // moving the cut up drops what is now below it
        p.click(&d, 10, 11, 0).unwrap();
        p.click(&d, 10, 14, 7).unwrap();
        assert_eq!(p.drop_below(12), 1);
        assert_eq!(p.pairs(), vec![(14, 3)]);
    }

    #[test]
    fn the_head_file_holds_the_picks_and_names_the_model() {
        let report = lcut_diag::synthetic::synthetic_report(2, 16, 8, false).unwrap();
        let d = HeadData::of_report(&report).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut p = HeadPicks {
            folder: dir.path().join("sub").display().to_string(),
            ..HeadPicks::default()
        };
        p.click(&d, 10, 12, 3).unwrap();
        p.click(&d, 10, 15, 0).unwrap();
        let path = p.write(&report.model, 10).unwrap();
        assert!(path.is_absolute() && path.ends_with("sub/heads-c10-n2.json"));
        let back = lcut_policy::read_head_file(&path.display().to_string()).unwrap();
        assert_eq!(back.heads, vec![(12, 1), (15, 0)]);
        assert_eq!(back.cut, Some(10));
        assert_eq!(back.model, report.model.file_model());
        // the policy reads it back, checked against the model
        let spec = heads_policy(10, &path).unwrap();
        let policy = spec.resolve(16).unwrap();
        assert_eq!(policy.heads().unwrap().set.pairs(), &[(12, 1), (15, 0)]);
        assert!(heads_policy(10, Path::new("/a+b/h.json")).is_err());
    }

    #[test]
    fn a_run_folder_is_the_report_files_folder() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("report.json");
        std::fs::write(&file, "{}").unwrap();
        let source = file.display().to_string();
        assert_eq!(run_folder(&source, "x"), dir.path().display().to_string());
        assert_eq!(run_folder("run on models/m", "lcut-export"), "lcut-export");
    }
}
