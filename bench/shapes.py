"""Model shapes for benchmarks, and random-weight checkpoints of them written by transformers.

The checkpoint is a real Hugging Face folder (config.json + safetensors via save_pretrained),
loaded through the engine's normal loader.
"""

from __future__ import annotations

from pathlib import Path

import torch

COMMON = dict(head_dim=128, num_key_value_heads=8, vocab_size=151936, rms_norm_eps=1e-6, rope_theta=1e6,
              max_position_embeddings=40960)
SHAPES = {
    "Qwen3-0.6B": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       tie_word_embeddings=True, **COMMON),
    "Qwen3-4B": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
                     tie_word_embeddings=True, **COMMON),
    "Qwen3-8B": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     tie_word_embeddings=False, **COMMON),
    # Not a Qwen3 model: a few-MB stand-in so that the benchmark suite runs on a CPU in seconds.
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, head_dim=32,
                 num_key_value_heads=2, vocab_size=512, rms_norm_eps=1e-6, rope_theta=1e6,
                 max_position_embeddings=40960, tie_word_embeddings=True),
}


CPU_SHAPES = ("tiny",)  # the shapes a run on a CPU takes: the Qwen3 shapes need a GPU (GBs of weights, hours)


def cpu_refusal(shape: str) -> str | None:
    """Why ``shape`` is not run on a CPU (one line), or None for a CPU-sized shape."""
    if shape in CPU_SHAPES:
        return None
    return (f"shape {shape} needs a CUDA GPU ({weight_bytes(shape) / 1e9:.1f} GB of weights); "
            f"on a CPU use --shape {CPU_SHAPES[0]}")


def write_random_checkpoint(shape: str, folder: Path, *, seed: int = 0) -> Path:
    """Random BF16 weights of a named shape, saved with save_pretrained (skipped if already there)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    folder = Path(folder)
    if (folder / "config.json").is_file():
        return folder
    config = Qwen3Config(**SHAPES[shape], architectures=["Qwen3ForCausalLM"])
    torch.manual_seed(seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = Qwen3ForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    model.save_pretrained(folder)
    del model
    return folder


def weight_bytes(shape: str, bytes_per_weight: float = 2.0) -> int:
    """Bytes of weights a decode step reads (the tied embedding once, as the lm_head)."""
    s = SHAPES[shape]
    h, d, i = s["hidden_size"], s["head_dim"], s["intermediate_size"]
    layer = h * (s["num_attention_heads"] + 2 * s["num_key_value_heads"]) * d + s["num_attention_heads"] * d * h + 3 * h * i
    return int((s["num_hidden_layers"] * layer + s["vocab_size"] * h) * bytes_per_weight)


def kv_bytes_per_position(shape: str, bytes_per_value: float = 2.0) -> int:
    """Bytes of keys and values one cached position holds, over all layers."""
    s = SHAPES[shape]
    return int(2 * s["num_hidden_layers"] * s["num_key_value_heads"] * s["head_dim"] * bytes_per_value)
