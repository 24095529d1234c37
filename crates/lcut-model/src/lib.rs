//! The lcut decoder: loads Hugging Face model folders and GGUF files (Llama,
//! Mistral, Qwen2, Qwen3, Gemma-2, Gemma 3, Phi-3) and runs them with probes
//! and a layer-asymmetric KV cache on candle.

mod cache;
pub mod config;
mod decoder;
mod error;
mod files;
pub mod gguf;
mod grad_ops;
mod layers;
pub mod lens;
mod lens_stats;
mod linear;
mod linear_attention;
pub mod lora;
pub mod mapped;
pub mod memory;
pub mod probe;
pub mod probes;
mod rope;
mod sequence;
pub mod shape;
pub mod store;
mod weights;

pub use cache::LayerCache;
pub use config::{
    Activation, Arch, LayerAttention, LinearAttentionConfig, ModelConfig, PerLayerInput,
    RopeConfig, RopeScaling,
};
pub use decoder::{
    BatchSoftmax, ChunkOutput, Decoder, FUSED_ATTENTION_VAR, FusedAttentionCheck, LogitRows,
    TrainKv, Unfused, WeightMode, argmax_rows, check_fused_attention,
    default_attention_block_elems, fused_attention_refusal, fused_attention_runs,
};
pub use error::{ModelError, Result, ShapeError};
pub use files::{FolderFiles, ModelFiles};
pub use layers::{Routing, STACKED_EXPERTS_VAR};
pub use lens::{LensProbe, LensRecord};
pub use linear::{Embedding, Linear};
pub use linear_attention::{LinearSplit, RecurrentState};
pub use probe::{AttentionView, Probe, ResidualSite, RoutingView};
pub use rope::{Rope, inverse_frequencies};
pub use sequence::Sequence;
pub use shape::{Layout, LlamaShape, SpecialTokens};
pub use store::{ModelFormat, ResolvedModel, StoreError, StoreRoots};
pub use weights::{WeightFiles, WeightSource};

pub use candle_core::{DType, Device, Tensor};
