//! A report on display, with what the views derive from it: the selected
//! prompt, its grids, the prompt-position index, and the heatmap textures.
//! Derived data is built once per selection, never per frame.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use lcut_trace::{LayerCurves, PromptTrace, Report, Sweep};

use crate::grid::{PositionIndex, SelectionGrids};
use crate::heatmap::HeatmapCache;

/// The textures of the heatmap view.
#[derive(Default)]
pub struct HeatmapCaches {
    /// Layer × decode step.
    pub by_step: HeatmapCache,
    /// Layer × prompt position.
    pub by_position: HeatmapCache,
    /// Layer × head.
    pub by_head: HeatmapCache,
    /// BoS column.
    pub bos: HeatmapCache,
    /// The sink's column (a model with attention sinks).
    pub sink: HeatmapCache,
    /// Layer × expert load (a mixture-of-experts model's routing view).
    pub routing_load: HeatmapCache,
}

/// A report and the data derived for the current selection.
pub struct LoadedReport {
    /// The report.
    pub report: Arc<Report>,
    /// Where it came from.
    pub source: String,
    /// The selected prompt (index into `report.traces`); `None` = every prompt
    /// (the aggregated curves).
    pub prompt: Option<usize>,
    /// Per-layer curves of the selection (the report's own for every prompt).
    pub curves: LayerCurves,
    /// Grids of the selection.
    pub grids: SelectionGrids,
    /// Index of the prompt whose positions are shown (the selected one, or the
    /// default prompt when every prompt is selected).
    pub position_prompt: Option<usize>,
    /// Its position index.
    pub position: Option<PositionIndex>,
    /// Heatmap textures.
    pub caches: HeatmapCaches,
    /// Changes whenever the data behind the heatmaps changes.
    pub data_key: u64,
    /// The run that made this report is still measuring its sweep.
    pub sweep_pending: bool,
}

static NEXT_KEY: AtomicU64 = AtomicU64::new(1);

impl LoadedReport {
    /// Wraps `report`, selecting every prompt.
    pub fn new(report: Arc<Report>, source: String) -> Self {
        let mut me = Self {
            grids: SelectionGrids::of_curves(&report.curves),
            curves: report.curves.clone(),
            report,
            source,
            prompt: None,
            position_prompt: None,
            position: None,
            caches: HeatmapCaches::default(),
            data_key: 0,
            sweep_pending: false,
        };
        me.select(None);
        me
    }

    /// Selects a prompt (`None` = every prompt) and rebuilds the derived data.
    pub fn select(&mut self, prompt: Option<usize>) {
        let prompt = prompt.filter(|&i| i < self.report.traces.len());
        self.prompt = prompt;
        self.grids = match prompt {
            Some(i) => SelectionGrids::of_trace(&self.report.traces[i]),
            None => SelectionGrids::of_curves(&self.report.curves),
        };
        self.curves = prompt
            .and_then(|i| lcut_diag::aggregate(std::slice::from_ref(&self.report.traces[i])).ok())
            .unwrap_or_else(|| self.report.curves.clone());
        let pos = prompt.or_else(|| lcut_report::default_prompt(&self.report));
        if pos != self.position_prompt || self.position.is_none() {
            self.position_prompt = pos;
            self.position = pos.map(|i| PositionIndex::new(&self.report.traces[i]));
        }
        self.data_key = NEXT_KEY.fetch_add(1, Ordering::Relaxed);
    }

    /// Adds the sweep the run measured after this report's diagnostics;
    /// the selection and the heatmaps stay as they are.
    pub fn attach_sweep(&mut self, sweep: Sweep) {
        Arc::make_mut(&mut self.report).sweep = Some(sweep);
        self.sweep_pending = false;
    }

    /// The trace whose prompt positions are shown.
    pub fn position_trace(&self) -> Option<&PromptTrace> {
        self.position_prompt.map(|i| &self.report.traces[i])
    }

    /// The trace of the selected prompt.
    pub fn selected_trace(&self) -> Option<&PromptTrace> {
        self.prompt.map(|i| &self.report.traces[i])
    }

    /// Number of layers.
    pub fn num_layers(&self) -> usize {
        self.report.model.num_layers
    }
}
