//! Named model shapes a random model can take.

use lcut_model::LlamaShape;

/// 8 layers, hidden 512, 8 heads, 2 KV heads, vocab 32000 (about 57M parameters).
pub fn small() -> LlamaShape {
    LlamaShape {
        vocab_size: 32000,
        hidden_size: 512,
        intermediate_size: 1408,
        num_layers: 8,
        num_heads: 8,
        num_kv_heads: 2,
        rope_theta: 10000.0,
        rms_norm_eps: 1e-5,
        max_position_embeddings: 8192,
    }
}
