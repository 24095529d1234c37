//! Which model a trace or report was made with.

use serde::{Deserialize, Serialize};

/// The model a run used: where it was loaded from, a hash of its config, and
/// the shape numbers the diagnostics and cost models need.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelIdentity {
    /// The model folder as given by the user (not compared when merging shards,
    /// since machines mount models at different paths).
    pub path: String,
    /// [`hash_bytes`] of the bytes of `config.json`.
    pub config_hash: String,
    /// Architecture name (for example `llama`, `qwen2`).
    pub arch: String,
    /// Dtype the model ran in (for example `f32`, `bf16`).
    pub dtype: String,
    /// Number of decoder layers L.
    pub num_layers: usize,
    /// Number of query heads.
    pub num_heads: usize,
    /// Number of key/value heads.
    pub num_kv_heads: usize,
    /// Width of one attention head.
    pub head_dim: usize,
    /// Width of the residual stream d.
    pub hidden_size: usize,
    /// Width of the MLP's hidden layer (0 when unknown).
    #[serde(default)]
    pub intermediate_size: usize,
    /// Vocabulary size (0 when unknown).
    #[serde(default)]
    pub vocab_size: usize,
    /// Each layer's sliding window, `None` for a layer that reads every
    /// earlier key (empty when no layer slides, or unknown).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sliding_window: Vec<Option<usize>>,
    /// Each layer's FLOP-model coefficients where the layers differ from
    /// one another or from the uniform shape the fields above give (empty:
    /// they do not, or unknown); one per layer otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layer_flops: Vec<LayerFlops>,
    /// The LoRA adapter put into the model, when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adapter: Option<AdapterIdentity>,
}

/// One layer's coefficients in the prefill FLOP model (`lcut_diag`'s
/// `flops`), for models whose layers differ (sliding and full layers of
/// other head widths, linear-attention layers, experts, shared K/V). One
/// multiply-add is 2 FLOPs; every coefficient is a whole number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerFlops {
    /// One token through the layer's projections, MLP or experts (the ones
    /// it runs) and recurrence: what the layer costs per token present.
    pub token: u64,
    /// One query reading one key: scores and the weighted sum of values
    /// (0 on a linear-attention layer, which reads a state instead).
    pub per_key: u64,
    /// Projecting one token's K and V (0 on a layer that stores none).
    pub kv_projection: u64,
}

/// A LoRA adapter a run put into its model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdapterIdentity {
    /// The adapter folder as given (not compared, like the model's path).
    pub path: String,
    /// [`hash_bytes`] of `adapter_config.json` followed by `adapter_model.safetensors`.
    pub hash: String,
    /// The policy it was trained for (`lcut_policy`), if recorded.
    pub policy: Option<String>,
    /// Its rank r.
    pub rank: usize,
    /// How it was put in: `merge` or `fly`.
    pub mode: String,
}

impl ModelIdentity {
    /// Why kept (layer, K/V head) plans have no meaning on this model, if
    /// they have none: a layer that stores no K/V of its own (Gemma 4's
    /// shared layers read another layer's; Qwen3.5's linear-attention layers
    /// hold a recurrent state), as [`ModelIdentity::layer_flops`] records it.
    pub fn kept_heads_refusal(&self) -> Option<String> {
        let l = self.stores_kv().iter().position(|&stores| !stores)?;
        Some(format!(
            "layer {l} stores no K/V of its own (it reads another layer's, as Gemma 4's shared \
             layers do, or holds a recurrent state, as Qwen3.5's linear-attention layers do), \
             so the model has no K/V heads there to keep"
        ))
    }

    /// Whether each layer stores K/V of its own, from
    /// [`ModelIdentity::layer_flops`] (a layer that projects none reads
    /// another layer's or holds a recurrent state); empty when the report
    /// does not say, which is when every layer is of one uniform shape and
    /// stores its own.
    pub fn stores_kv(&self) -> Vec<bool> {
        self.layer_flops
            .iter()
            .map(|f| f.kv_projection > 0)
            .collect()
    }

    /// The model as a head file or a ranking names it (its config hash,
    /// depth and K/V heads), so that a file made for another model is refused.
    pub fn file_model(&self) -> lcut_policy::FileModel {
        lcut_policy::FileModel {
            config_hash: Some(self.config_hash.clone()),
            num_layers: Some(self.num_layers),
            num_kv_heads: Some(self.num_kv_heads),
        }
    }

    /// True when `other` is the same model: every field equal except the
    /// model's and the adapter's paths.
    pub fn same_model(&self, other: &Self) -> bool {
        let mut other = other.clone();
        other.path.clone_from(&self.path);
        if let (Some(mine), Some(theirs)) = (&self.adapter, &mut other.adapter) {
            theirs.path.clone_from(&mine.path);
        }
        *self == other
    }
}

/// FNV-1a 64-bit hash of `bytes`, as 16 lowercase hex digits.
///
/// Not cryptographic: it tells configs apart, nothing more.
pub fn hash_bytes(bytes: &[u8]) -> String {
    hash_parts(&[bytes])
}

/// [`hash_bytes`] of `parts` one after the other, without joining them.
pub fn hash_parts(parts: &[&[u8]]) -> String {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let h = parts
        .iter()
        .flat_map(|p| p.iter())
        .fold(OFFSET, |h, &b| (h ^ u64::from(b)).wrapping_mul(PRIME));
    format!("{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_known_vectors() {
        // Reference values of FNV-1a 64.
        assert_eq!(hash_bytes(b""), "cbf29ce484222325");
        assert_eq!(hash_bytes(b"a"), "af63dc4c8601ec8c");
        assert_eq!(hash_bytes(b"foobar"), "85944171f73967e8");
    }

    #[test]
    fn parts_hash_as_their_concatenation() {
        assert_eq!(hash_parts(&[b"foo", b"", b"bar"]), hash_bytes(b"foobar"));
        assert_eq!(hash_parts(&[]), hash_bytes(b""));
    }

    /// A small Llama at "/a", with `adapter`.
    fn identity(adapter: Option<AdapterIdentity>) -> ModelIdentity {
        ModelIdentity {
            path: "/a".into(),
            config_hash: "00".into(),
            arch: "llama".into(),
            dtype: "f32".into(),
            num_layers: 2,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 8,
            hidden_size: 32,
            intermediate_size: 64,
            vocab_size: 100,
            sliding_window: Vec::new(),
            layer_flops: Vec::new(),
            adapter,
        }
    }

    #[test]
    fn same_model_ignores_only_the_path() {
        let a = identity(None);
        let mut b = a.clone();
        b.path = "/b".into();
        assert!(a.same_model(&b));
        b.num_layers = 3;
        assert!(!a.same_model(&b));
    }

    #[test]
    fn an_adapter_makes_another_model_wherever_it_lies() {
        let adapter = AdapterIdentity {
            path: "/runs/a".into(),
            hash: "11".into(),
            policy: Some("speed:22+bos".into()),
            rank: 8,
            mode: "merge".into(),
        };
        let base = identity(Some(adapter));
        let mut moved = base.clone();
        if let Some(a) = &mut moved.adapter {
            a.path = "/elsewhere/a".into();
        }
        assert!(base.same_model(&moved));
        let mut other = base.clone();
        if let Some(a) = &mut other.adapter {
            a.hash = "22".into();
        }
        assert!(!base.same_model(&other));
        let without = ModelIdentity {
            adapter: None,
            ..base.clone()
        };
        assert!(!base.same_model(&without));
    }

    /// Kept heads are refused where a layer stores no K/V of its own, named
    /// by its index, and allowed where every layer does (or the report does
    /// not say: uniform layers).
    #[test]
    fn a_layer_without_its_own_kv_refuses_kept_heads() {
        let layer = |kv_projection| LayerFlops {
            token: 10,
            per_key: 4,
            kv_projection,
        };
        let mut m = identity(None);
        assert_eq!(m.kept_heads_refusal(), None);
        m.layer_flops = vec![layer(6), layer(6)];
        assert_eq!(m.kept_heads_refusal(), None);
        m.layer_flops = vec![layer(6), layer(0)];
        let why = m.kept_heads_refusal().expect("layer 1 stores none");
        assert!(why.starts_with("layer 1 stores no K/V of its own"), "{why}");
    }
}
