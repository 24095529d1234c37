//! How a run was made: generation settings and the recommender's thresholds.

use serde::{Deserialize, Serialize};

/// Thresholds of the L_cut recommender and of the sweep's knee.
///
/// The defaults live in [`Thresholds::default`]; a settings file may give any
/// subset of the fields, the others take their defaults.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Thresholds {
    /// Tail-mass vote: the smallest cut whose dropped prefill mass share
    /// R(c) is at most this. Default 0.05.
    #[serde(with = "crate::floats::finite")]
    pub tail_mass_max: f32,
    /// Selective-reading band: normalised head-mean prefill entropy at most
    /// this. Default 0.6.
    #[serde(with = "crate::floats::finite")]
    pub entropy_max: f32,
    /// Selective-reading band: mean prefill mass at least this. Default 0.05.
    #[serde(with = "crate::floats::finite")]
    pub mass_min: f32,
    /// Curvature plateau: consecutive per-layer curvatures differ by less than
    /// this many radians from here up. Default 0.02.
    #[serde(with = "crate::floats::finite")]
    pub plateau_eps: f32,
    /// Sweep knee: largest drop of top-1 agreement below the full model's that
    /// still counts as no loss. Default 0.02.
    #[serde(with = "crate::floats::finite")]
    pub agreement_drop_max: f32,
}

impl Default for Thresholds {
    fn default() -> Self {
        Self {
            tail_mass_max: 0.05,
            entropy_max: 0.6,
            mass_min: 0.05,
            plateau_eps: 0.02,
            agreement_drop_max: 0.02,
        }
    }
}

/// The settings of one diagnostic run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSettings {
    /// Greedy tokens generated per prompt (at most; EOS may stop earlier).
    pub max_new_tokens: usize,
    /// The prompts file, when prompts came from one.
    pub prompts_file: Option<String>,
    /// `(i, n)`: this run handled shard `i` of `n` (0-based); `None` when unsharded.
    pub shard: Option<(usize, usize)>,
    /// The recommender's thresholds.
    pub thresholds: Thresholds,
    /// Whether prompts were wrapped in the model's chat template.
    pub chat_template_used: bool,
    /// Most columns of the layer × prompt-position heatmap (see [`crate::bin_edges`]).
    pub max_prompt_bins: usize,
    /// The policy the greedy runs were made under, resolved; absent for the
    /// full model (the diagnostics' usual run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// The policy whose routing a mixture-of-experts run compared with the
    /// full model's on its own tokens, resolved; absent when none was (a
    /// dense model, or a run that named none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing_policy: Option<String>,
}

impl RunSettings {
    /// The settings with `shard` cleared: what must agree between shards.
    pub fn without_shard(&self) -> Self {
        Self {
            shard: None,
            ..self.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_thresholds_take_defaults() {
        let t: Thresholds = serde_json::from_str(r#"{"entropy_max": 0.5}"#).unwrap();
        assert_eq!(t.entropy_max, 0.5);
        assert_eq!(t.tail_mass_max, Thresholds::default().tail_mass_max);
        assert_eq!(t.plateau_eps, 0.02);
    }
}
