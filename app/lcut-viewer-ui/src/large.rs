//! A large synthetic report for performance checks and demos: one prompt of
//! many positions with one heatmap bin per position, so the viewer must bin
//! to the screen itself (32 layers × 32 heads × 128 steps × 128K positions is
//! 4M prompt-position cells).
//!
//! The attention pattern is made up but shaped like real ones: a recency ramp
//! toward the end of the prompt, a few "needle" positions that middle layers
//! read strongly, and noise; each layer's prompt mass equals its synthetic
//! prefill mass.

use lcut_diag::DiagError;
use lcut_diag::synthetic::{synthetic_model, synthetic_settings, synthetic_trace};
use lcut_trace::{PromptTrace, Report, Tensor2};

use crate::grid::mean_per_layer;

/// Sizes of the large trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LargeSpec {
    /// Layers.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Decode steps.
    pub steps: usize,
    /// Prompt positions.
    pub prompt_len: usize,
}

impl Default for LargeSpec {
    /// 32 layers × 32 heads × 128 steps, 128K (131 072) prompt positions.
    fn default() -> Self {
        Self {
            layers: 32,
            heads: 32,
            steps: 128,
            prompt_len: 131_072,
        }
    }
}

/// Cheap deterministic noise in `[0, 1)`.
fn hash01(a: usize, b: usize) -> f32 {
    let mut x = (a as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (b as u64).wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    x ^= x >> 29;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 32;
    (x >> 40) as f32 / (1u64 << 24) as f32
}

/// Replaces the trace's prompt map by a per-position one (one bin per token).
fn per_position_map(tr: &mut PromptTrace) -> Result<(), DiagError> {
    let (l, p) = (tr.num_layers, tr.prompt_len);
    let s = tr.decode_start;
    let needles: Vec<usize> = (1..=8).map(|i| i * s / 9).collect();
    let mut data = vec![0.0f32; l * p];
    let (bos_l, prefill_l) = (mean_per_layer(&tr.bos), mean_per_layer(&tr.prefill));
    let (decode_l, self_l) = (mean_per_layer(&tr.decode), mean_per_layer(&tr.self_mass));
    for layer in 0..l {
        let (bos, prefill) = (bos_l[layer], prefill_l[layer]);
        let tail = decode_l[layer] + self_l[layer];
        let depth = layer as f32 / (l.max(2) - 1) as f32;
        let needle_gain = 400.0 * (-((depth - 0.4) / 0.15).powi(2)).exp();
        let row = &mut data[layer * p..(layer + 1) * p];
        let mut total = 0.0f32;
        for (j, v) in row.iter_mut().enumerate().take(s).skip(1) {
            let recency = (-((s - j) as f32) / (64.0 + 4000.0 * depth)).exp();
            let w = 0.2 + 0.8 * hash01(layer, j) + 50.0 * recency;
            *v = w;
            total += w;
        }
        for &n in &needles {
            if (1..s).contains(&n) {
                for v in &mut row[n.saturating_sub(2)..(n + 3).min(s)] {
                    *v += needle_gain;
                    total += needle_gain;
                }
            }
        }
        let scale = if total > 0.0 { prefill / total } else { 0.0 };
        row[1..s].iter_mut().for_each(|v| *v *= scale);
        row[0] = bos;
        row[s] = tail;
        for v in &mut row[s + 1..] {
            *v = 0.0;
        }
    }
    tr.prompt_attention = Tensor2::new([l, p], data)?;
    tr.bin_edges = (0..=p).collect();
    Ok(())
}

/// Words for the synthetic prompt's token strings.
const WORDS: [&str; 12] = [
    "The",
    " report",
    " of",
    " the",
    " committee",
    " was",
    " read",
    " aloud",
    ",",
    " and",
    " then",
    ".",
];

/// A valid report with one large trace (see the module doc).
pub fn large_report(spec: LargeSpec) -> Result<Report, DiagError> {
    let mut tr = synthetic_trace(0, spec.layers, spec.heads, spec.steps, spec.prompt_len);
    let p = tr.prompt_len;
    tr.id = format!("synthetic-{}k", p / 1024);
    tr.prompt_tokens = (0..tr.prompt_len)
        .map(|j| {
            if j == 0 {
                "<s>".to_string()
            } else {
                WORDS[j % WORDS.len()].to_string()
            }
        })
        .collect();
    per_position_map(&mut tr)?;
    let model = synthetic_model(spec.layers, spec.heads);
    let mut settings = synthetic_settings();
    settings.max_new_tokens = spec.steps;
    settings.max_prompt_bins = spec.prompt_len;
    settings.prompts_file = None;
    lcut_diag::build_report("synthetic-large", model, settings, vec![tr], None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_large_report_is_valid_with_one_bin_per_position() {
        let r = large_report(LargeSpec {
            layers: 4,
            heads: 2,
            steps: 5,
            prompt_len: 300,
        })
        .unwrap();
        r.validate("large").unwrap();
        let t = &r.traces[0];
        assert_eq!(t.num_bins(), 300);
        // Each layer's prompt map sums to its masses: bos + prefill + decode + self.
        for l in 0..4 {
            let sum: f32 = t.prompt_attention.view().row(l).sum();
            assert!((sum - 1.0).abs() < 1e-3, "layer {l}: {sum}");
        }
    }
}
