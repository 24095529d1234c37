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
    let layers = model.num_layers.max(1);
    let l_cut = l_cut.clamp(1, layers);
    let anchors = usize::from(s.keep_bos);
    let split = PromptSplit::raw(s.context_len.max(1), anchors);
    let kv = KvCost {
        anchors: split.anchors,
        prefill: split.prefill,
        decode: split.decode + s.new_tokens,
    };
    let shape = KvShape {
        num_layers: layers,
        num_kv_heads: model.num_kv_heads,
        head_dim: model.head_dim,
        dtype_bytes: s.dtype_bytes,
    };
    let anchors_kind = if s.keep_bos {
        Anchors::Bos
    } else {
        Anchors::None
    };
    let full = Policy::full(layers);
    let speed = Policy::new(PolicyKind::Speed, l_cut, layers, anchors_kind).unwrap_or(full);
    let flop_shape = FlopShape::from(model);
    let windows = &model.sliding_window;
    let len = s.context_len.max(1);
    let phases = TokenPhases::raw_prompt(len, split.anchors).unwrap_or(TokenPhases::all_decode());
    let flops = |p: &Policy| policy_prefill_flops(&flop_shape, p.visibility(phases).as_ref(), len);
    CostNumbers {
        kv_speed: kv.bytes(&speed, &shape, windows),
        kv_full: kv.bytes(&full, &shape, windows),
        flops_speed: flops(&speed),
        flops_full: flops(&full),
    }
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
    let c = cost_numbers(model, l_cut, s);
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
