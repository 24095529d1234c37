//! The viewer's settings, as plain data: the visible tab, the colour scale,
//! the chosen cut, the sweep's cost axis, the run's inputs, the cost panel's
//! and the export's settings. No drawing; the panels read and edit them.

use std::path::PathBuf;

use lcut_report::Format;

/// The views of the central area.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Tab {
    /// Layer × step, layer × position, layer × head, BoS apart.
    #[default]
    Heatmaps,
    /// Per-layer curves with the cut lines.
    Curves,
    /// The votes and the explanation.
    Recommendation,
    /// Quality against cost across cuts.
    Sweep,
    /// Picking the (layer, K/V head) pairs kept above the cut.
    Heads,
    /// Full and SPEED generating side by side.
    Live,
    /// Accuracy against K/V held, one line per family, from eval results.
    Frontier,
    /// How a mixture-of-experts model routes: expert load, router entropy
    /// and a policy's overlap with the full model (offered only for a
    /// report whose model routes).
    Routing,
}

impl Tab {
    /// Every tab, in display order.
    pub const ALL: [Tab; 8] = [
        Tab::Heatmaps,
        Tab::Curves,
        Tab::Recommendation,
        Tab::Sweep,
        Tab::Routing,
        Tab::Heads,
        Tab::Live,
        Tab::Frontier,
    ];

    /// The tab's label.
    pub fn label(self) -> &'static str {
        match self {
            Tab::Heatmaps => "Heatmaps",
            Tab::Curves => "Curves",
            Tab::Recommendation => "Recommendation",
            Tab::Sweep => "Sweep",
            Tab::Heads => "Heads",
            Tab::Live => "Live",
            Tab::Frontier => "Frontier",
            Tab::Routing => "Routing",
        }
    }
}

/// Where the prompts of the next run come from, as chosen in the UI.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PromptChoice {
    /// The bundled prompt set.
    #[default]
    Bundled,
    /// A JSONL file.
    File,
    /// The typed prompt.
    Typed,
}

/// The inputs of a diagnostic run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunInputs {
    /// The model as typed or picked: a model folder or a `.gguf` file.
    pub model_path: String,
    /// The bundled model's folder.
    pub bundled_model: PathBuf,
    /// Prompt source.
    pub prompts: PromptChoice,
    /// Prompt file path.
    pub prompts_file: String,
    /// Typed prompt.
    pub typed_prompt: String,
    /// Greedy tokens per prompt.
    pub max_new_tokens: usize,
    /// Use the chat template when the model has one.
    pub use_chat_template: bool,
    /// Also run the sweep (quality against cost for every cut).
    pub with_sweep: bool,
}

impl Default for RunInputs {
    fn default() -> Self {
        Self {
            model_path: String::new(),
            bundled_model: PathBuf::from("fixtures/models/copy-full"),
            prompts: PromptChoice::Bundled,
            prompts_file: String::new(),
            typed_prompt: "Copy this: the quick brown fox jumps over the lazy dog.".into(),
            max_new_tokens: 16,
            use_chat_template: true,
            with_sweep: true,
        }
    }
}

/// Settings of the views that do not depend on the report.
#[derive(Debug, Clone, PartialEq)]
pub struct ViewSettings {
    /// The visible tab.
    pub tab: Tab,
    /// Heatmap colour scale.
    pub scale: ColorScale,
    /// The chosen cutoff (clamped to `1..=L` when a report is loaded).
    pub l_cut: usize,
    /// The sweep plot's cost axis.
    pub sweep_axis: SweepAxis,
    /// Shade what the live SlimInfer run prunes over the prompt-position
    /// heatmap (when it ran on the prompt shown).
    pub slim_overlay: bool,
}

impl Default for ViewSettings {
    fn default() -> Self {
        Self {
            tab: Tab::Heatmaps,
            scale: ColorScale::Log,
            l_cut: 1,
            sweep_axis: SweepAxis::default(),
            slim_overlay: true,
        }
    }
}

/// Where and how to export.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportSettings {
    /// The folder.
    pub dir: String,
    /// The format.
    pub format: Format,
    /// The last file written.
    pub last: Option<PathBuf>,
}

impl Default for ExportSettings {
    fn default() -> Self {
        Self {
            dir: "lcut-export".into(),
            format: Format::Html,
            last: None,
        }
    }
}

/// How values map to colour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ColorScale {
    /// Linear from the range's low end to its high end.
    #[default]
    Linear,
    /// Logarithmic, so small masses stay visible next to attention sinks.
    Log,
}

impl ColorScale {
    /// The label shown in the UI.
    pub fn label(self) -> &'static str {
        match self {
            ColorScale::Linear => "Linear",
            ColorScale::Log => "Log",
        }
    }
}

/// What the cost is computed for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostSettings {
    /// Prompt tokens (a raw prompt: the last token starts the decode phase);
    /// the open model's context length once one is open, 128K before.
    pub context_len: usize,
    /// Tokens generated after the prompt.
    pub new_tokens: usize,
    /// Bytes of one cached element (2 for bf16/f16, 4 for f32).
    pub dtype_bytes: usize,
    /// Keep BoS as an anchor (SPEED+BoS).
    pub keep_bos: bool,
}

impl CostSettings {
    /// A model was opened: cost its own context length,
    /// `max_position_embeddings` (8,192 for SmolLM2), not a length it
    /// cannot take.
    pub fn start_from_model(&mut self, max_positions: usize) {
        self.context_len = max_positions.max(2);
    }
}

impl Default for CostSettings {
    fn default() -> Self {
        Self {
            context_len: 131_072,
            new_tokens: 128,
            dtype_bytes: 2,
            keep_bos: true,
        }
    }
}

/// Which cost the x axis shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SweepAxis {
    /// K/V bytes over the full model's.
    #[default]
    KvRatio,
    /// Prefill FLOPs over the full model's.
    PrefillRatio,
}

impl SweepAxis {
    /// The cost of `p` on this axis.
    pub fn x(self, p: &lcut_trace::SweepPoint) -> f64 {
        match self {
            SweepAxis::KvRatio => f64::from(p.kv_ratio),
            SweepAxis::PrefillRatio => f64::from(p.prefill_ratio),
        }
    }

    /// The axis label.
    pub fn label(self) -> &'static str {
        match self {
            SweepAxis::KvRatio => "KV bytes / full",
            SweepAxis::PrefillRatio => "prefill FLOPs / full",
        }
    }
}
