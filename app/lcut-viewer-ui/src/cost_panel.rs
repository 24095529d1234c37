//! The cost panel: for the chosen L_cut and a context length, the K/V bytes
//! SPEED keeps, the prefill FLOPs it spends, and their ratios to the full
//! model (cost model of `lcut-policy`, FLOP model of `lcut-diag`), with a
//! sliding-window layer counted at the window it really holds and reads.

use egui::{DragValue, Grid, Ui};
use lcut_diag::{FlopShape, PromptSplit, policy_prefill_flops};
use lcut_policy::{Anchors, KvCost, KvShape, Policy, PolicyKind, TokenPhases};
use lcut_trace::ModelIdentity;

use crate::settings::CostSettings;
use crate::theme::{human_bytes, human_flops};

/// K/V bytes and prefill FLOPs, SPEED against full.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostNumbers {
    /// K/V bytes SPEED keeps.
    pub kv_speed: u64,
    /// K/V bytes the full model keeps.
    pub kv_full: u64,
    /// Prefill FLOPs under SPEED.
    pub flops_speed: f64,
    /// Prefill FLOPs of the full model.
    pub flops_full: f64,
}

impl CostNumbers {
    /// `kv_speed / kv_full`.
    pub fn kv_ratio(&self) -> f64 {
        self.kv_speed as f64 / (self.kv_full.max(1)) as f64
    }
    /// `flops_speed / flops_full`.
    pub fn flops_ratio(&self) -> f64 {
        self.flops_speed / self.flops_full.max(1.0)
    }
}

/// The cost of SPEED at `l_cut` for `model` under `s` (`l_cut` clamped to `1..=L`).
pub fn cost_numbers(model: &ModelIdentity, l_cut: usize, s: &CostSettings) -> CostNumbers {
    let (kv_speed, kv_full) = kv_bytes(model, l_cut, s);
    let (speed, full) = policies(model, l_cut, s);
    let flop_shape = FlopShape::from(model);
    let len = s.context_len.max(1);
    let anchors = PromptSplit::raw(len, usize::from(s.keep_bos)).anchors;
    let phases = TokenPhases::raw_prompt(len, anchors).unwrap_or(TokenPhases::all_decode());
    let flops = |p: &Policy| policy_prefill_flops(&flop_shape, p.visibility(phases).as_ref(), len);
    CostNumbers {
        kv_speed,
        kv_full,
        flops_speed: flops(&speed),
        flops_full: flops(&full),
    }
}

/// SPEED at `l_cut` (clamped to `1..=L`) with the anchors `s` asks for, and
/// the full model.
fn policies(model: &ModelIdentity, l_cut: usize, s: &CostSettings) -> (Policy, Policy) {
    let layers = model.num_layers.max(1);
    let anchors = if s.keep_bos {
        Anchors::Bos
    } else {
        Anchors::None
    };
    let full = Policy::full(layers);
    let speed =
        Policy::new(PolicyKind::Speed, l_cut.clamp(1, layers), layers, anchors).unwrap_or(full);
    (speed, full)
}

/// The K/V bytes SPEED at `l_cut` keeps under `s`, and the full model's.
pub fn kv_bytes(model: &ModelIdentity, l_cut: usize, s: &CostSettings) -> (u64, u64) {
    let split = PromptSplit::raw(s.context_len.max(1), usize::from(s.keep_bos));
    let kv = KvCost {
        anchors: split.anchors,
        prefill: split.prefill,
        decode: split.decode + s.new_tokens,
    };
    let shape = KvShape {
        num_layers: model.num_layers.max(1),
        num_kv_heads: model.num_kv_heads,
        head_dim: model.head_dim,
        dtype_bytes: s.dtype_bytes,
    };
    let (speed, full) = policies(model, l_cut, s);
    let windows = &model.sliding_window;
    (
        kv.bytes(&speed, &shape, windows),
        kv.bytes(&full, &shape, windows),
    )
}

/// The panel's inputs, the key its numbers are kept under from one frame
/// to the next: the prefill FLOPs walk every prompt position of every
/// layer, too much to redo each frame at a 128K context.
#[derive(Clone, Copy)]
struct CostKey<'a> {
    model: &'a ModelIdentity,
    l_cut: usize,
    settings: CostSettings,
}

impl std::hash::Hash for CostKey<'_> {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        let m = self.model;
        (m.num_layers, m.num_heads, m.num_kv_heads, m.head_dim).hash(h);
        (m.hidden_size, m.intermediate_size, m.vocab_size).hash(h);
        m.sliding_window.hash(h);
        self.l_cut.hash(h);
        let s = self.settings;
        (s.context_len, s.new_tokens, s.dtype_bytes, s.keep_bos).hash(h);
    }
}

/// Computes [`cost_numbers`] for egui's frame cache.
#[derive(Default)]
struct CostComputer;

impl egui::cache::ComputerMut<CostKey<'_>, CostNumbers> for CostComputer {
    fn compute(&mut self, key: CostKey<'_>) -> CostNumbers {
        COMPUTED.with(|n| n.set(n.get() + 1));
        cost_numbers(key.model, key.l_cut, &key.settings)
    }
}

thread_local! {
    /// The panel's computations on this thread (the UI's).
    static COMPUTED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How many times the panel has computed its numbers on this thread (the
/// UI's): once per change of its inputs, not once per frame.
pub fn cost_computations() -> usize {
    COMPUTED.with(std::cell::Cell::get)
}

/// [`cost_numbers`], computed again only when an input changed since the
/// last frame.
fn cached_cost_numbers(
    ctx: &egui::Context,
    model: &ModelIdentity,
    l_cut: usize,
    s: &CostSettings,
) -> CostNumbers {
    let key = CostKey {
        model,
        l_cut,
        settings: *s,
    };
    ctx.memory_mut(|m| {
        *m.caches
            .cache::<egui::cache::FrameCache<CostNumbers, CostComputer>>()
            .get(key)
    })
}

/// Longest context the cost panel offers for a model whose own limit is
/// unknown (a report opened without its model).
pub const UNKNOWN_MODEL_MAX_CONTEXT: usize = 10_000_000;

/// The cost inputs and numbers for `l_cut`; the context length goes up to
/// `max_context`, the model's own limit when it is known.
pub fn show_cost_panel(
    ui: &mut Ui,
    model: &ModelIdentity,
    l_cut: usize,
    max_context: Option<usize>,
    s: &mut CostSettings,
) {
    ui.heading("Cost");
    let max_context = max_context.unwrap_or(UNKNOWN_MODEL_MAX_CONTEXT).max(2);
    s.context_len = s.context_len.clamp(2, max_context);
    Grid::new("cost_inputs").num_columns(2).show(ui, |ui| {
        let l = ui.label("Context length");
        ui.add(
            DragValue::new(&mut s.context_len)
                .range(2..=max_context)
                .speed(256.0),
        )
        .labelled_by(l.id);
        ui.end_row();
        let l = ui.label("New tokens");
        ui.add(DragValue::new(&mut s.new_tokens).range(0..=1_000_000))
            .labelled_by(l.id);
        ui.end_row();
        ui.label("KV dtype");
        ui.horizontal(|ui| {
            ui.radio_value(&mut s.dtype_bytes, 2, "bf16");
            ui.radio_value(&mut s.dtype_bytes, 4, "f32");
        });
        ui.end_row();
        ui.label("Anchors");
        ui.checkbox(&mut s.keep_bos, "keep BoS");
        ui.end_row();
    });
    let c = cached_cost_numbers(ui.ctx(), model, l_cut, s);
    ui.separator();
    ui.label(format!(
        "SPEED at L_cut {} of {}:",
        l_cut.clamp(1, model.num_layers.max(1)),
        model.num_layers
    ));
    ui.label(format!("KV bytes (SPEED): {}", human_bytes(c.kv_speed)));
    ui.label(format!("KV bytes (full): {}", human_bytes(c.kv_full)));
    ui.label(format!("KV ratio: {:.4}", c.kv_ratio()));
    ui.label(format!(
        "Prefill FLOPs (SPEED): {}",
        human_flops(c.flops_speed)
    ));
    ui.label(format!(
        "Prefill FLOPs (full): {}",
        human_flops(c.flops_full)
    ));
    ui.label(format!("Prefill ratio: {:.4}", c.flops_ratio()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paper_setting_saves_a_quarter_of_kv() {
        // Llama-3.1-8B shape, L_cut 24 of 32, 128K prompt, 128 new tokens, bf16.
        let model = ModelIdentity {
            path: "x".into(),
            config_hash: "0".into(),
            arch: "llama".into(),
            dtype: "bf16".into(),
            num_layers: 32,
            num_heads: 32,
            num_kv_heads: 8,
            head_dim: 128,
            hidden_size: 4096,
            intermediate_size: 14336,
            vocab_size: 128_256,
            sliding_window: Vec::new(),
            layer_flops: Vec::new(),
            adapter: None,
        };
        let c = cost_numbers(&model, 24, &CostSettings::default());
        assert!((c.kv_ratio() - 0.75).abs() < 0.01, "{}", c.kv_ratio());
        assert!(c.flops_ratio() < 0.8 && c.flops_ratio() > 0.7);
        let full = cost_numbers(&model, 32, &CostSettings::default());
        assert_eq!(full.kv_speed, full.kv_full);
        assert_eq!(human_bytes(1536), "1.500 KiB");
        assert_eq!(human_flops(2.5e12), "2.500 TFLOP");
    }
}
