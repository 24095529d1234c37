//! GGUF model files (llama.cpp's format, versions 2 and 3): header,
//! configuration from metadata, and tensors under Hugging Face names.

mod config;
pub mod header;
mod weights;

pub use config::{architecture, model_config};
pub use header::{GgufHeader, MetaValue, TensorEntry};
pub use weights::{GgufFile, GgufWeights, gguf_name, is_gguf_path};
pub(crate) use weights::{map_file, release_mapped};
