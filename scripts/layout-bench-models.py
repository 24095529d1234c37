#!/usr/bin/env python3
"""Random-weight models of the newer layouts at a width a decode step can be timed
at, and a dense model of the same widths, for `lcut bench` (docs/layouts.md).

    python scripts/layout-bench-models.py OUT_DIR

Needs torch and transformers 5.24 (the oracle environment, fixtures/oracle/README.md).
Writes OUT_DIR/gemma4-w1024 (Gemma 4, `gemma4_text`: width 1024, 8 layers, three
sliding layers then a full one twice, 8 query heads and 1 K/V head of 128 on sliding
layers, 256 on full ones, keys as values, the last 2 layers reading earlier layers'
K/V, per-layer inputs of 256, vocabulary 2048) and OUT_DIR/gemma3-w1024 (Gemma 3,
`gemma3_text`, the same widths and layer pattern, every layer with its own K/V of
128-wide heads), f32 safetensors, transformers' random initialisation, seed 0.
"""
import sys

import torch
from transformers import AutoConfig, AutoModelForCausalLM

LAYERS = ["sliding_attention"] * 3 + ["full_attention"] + ["sliding_attention"] * 3 + ["full_attention"]
COMMON = dict(vocab_size=2048, hidden_size=1024, intermediate_size=2048, num_hidden_layers=8,
              num_attention_heads=8, num_key_value_heads=1, head_dim=128, max_position_embeddings=4096,
              bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=True,
              sliding_window=512, layer_types=LAYERS)


def main():
    out = sys.argv[1]
    torch.manual_seed(0)
    models = {
        "gemma4-w1024": AutoConfig.for_model(
            "gemma4_text", **COMMON, global_head_dim=256, num_kv_shared_layers=2,
            hidden_size_per_layer_input=256, vocab_size_per_layer_input=2048, attention_k_eq_v=True,
            num_global_key_value_heads=1, final_logit_softcapping=30.0),
        "gemma3-w1024": AutoConfig.for_model("gemma3_text", **COMMON, query_pre_attn_scalar=128),
    }
    for name, cfg in models.items():
        model = AutoModelForCausalLM.from_config(cfg).float().eval()
        model.save_pretrained(f"{out}/{name}", safe_serialization=True)
        print(name, sum(p.numel() for p in model.parameters()), "parameters")


if __name__ == "__main__":
    main()
