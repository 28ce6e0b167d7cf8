"""Model shapes the GPU benchmarks build with random weights (no download), kept in one place
so bench_inference.py and bench_trainer.py measure the same model as the anchors file."""

from __future__ import annotations

# Qwen/Qwen2.5-3B-Instruct's config.json, the fields that set the cost of a step.
QWEN25_3B = {
    "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
    "num_attention_heads": 16, "num_key_value_heads": 2, "vocab_size": 151936,
    "tie_word_embeddings": True, "max_position_embeddings": 32768, "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
}  # fmt: skip
