"""Model shapes for benchmarks, random-weight checkpoints of them, and their rooflines.

A checkpoint is a real Hugging Face folder (config.json + safetensors via save_pretrained), loaded
through the engine's normal loader; a DFlash drafter's is z-lab's format. Where a workload needs
a tokenizer (a grammar's mask), :func:`write_stand_in_tokenizer` adds one of the shape's vocabulary
size: Qwen3's own is not on these machines.

Decode roofline: a step reads every weight once (the tied embedding once, as the lm_head; a
token's embedding row is negligible) plus the K and V of every cached position; at the measured
copy bandwidth that is ``bandwidth / bytes`` steps per second. Weight-only INT8 stores one byte
per weight of every Linear (the lm_head included) plus a float32 scale per output row; the INT8
KV cache one byte per value plus a float32 scale per cached vector (position x KV head, K and V).

Prefill FLOPs: ``2 x tokens x`` the parameters of the decoder layers' linears, plus the lm_head
for the last token only (the engine computes the prefill's logits with ``last_only=True``), plus
causal attention ``4 x T^2 / 2 x heads x head_dim x layers`` (QK^T and PV, half the square).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from tileinfer.model_config import ModelConfig

COMMON = dict(head_dim=128, num_key_value_heads=8, vocab_size=151936, rms_norm_eps=1e-6, rope_theta=1e6,
              max_position_embeddings=40960)
SHAPES = {
    "Qwen3-0.6B": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       tie_word_embeddings=True, **COMMON),
    "Qwen3-4B": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
                     tie_word_embeddings=True, **COMMON),
    "Qwen3-8B": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     tie_word_embeddings=False, **COMMON),
    # Not a Qwen3 model: a few-MB stand-in so that the benchmarks run on a CPU in seconds.
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, head_dim=32,
                 num_key_value_heads=2, vocab_size=512, rms_norm_eps=1e-6, rope_theta=1e6,
                 max_position_embeddings=40960, tie_word_embeddings=True),
}
GPU_SHAPES = ("Qwen3-0.6B", "Qwen3-4B")  # what a benchmark measures on a GPU unless told otherwise
CPU_SHAPES = ("tiny",)  # the shapes a run on a CPU takes: the Qwen3 shapes need a GPU (GBs of weights, hours)
CHECKPOINTS = Path("/tmp/tileinfer-checkpoints")  # where random checkpoints are written once and reused


def model_config(shape: str) -> ModelConfig:
    return ModelConfig.from_dict({**SHAPES[shape], "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]})


def default_shapes(device: torch.device) -> list[str]:
    return list(GPU_SHAPES if device.type == "cuda" else CPU_SHAPES)


def cpu_refusal(shape: str) -> str | None:
    """Why ``shape`` is not run on a CPU (one line), or None for a CPU-sized shape."""
    if shape in CPU_SHAPES:
        return None
    return (f"shape {shape} needs a CUDA GPU ({weight_bytes(model_config(shape)) / 1e9:.1f} GB of weights); "
            f"on a CPU use --shape {CPU_SHAPES[0]}")


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Held by one process at a time (an exclusive ``flock`` on the file ``path``, created)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def written_once(folder: Path, write: Callable[[Path], None]) -> Path:
    """``folder`` as ``write(into)`` fills it, once, however many processes ask at the same time
    (pytest-xdist's workers share the random checkpoints): under a lock file beside it, written into
    a sibling folder and moved in with ``config.json`` last, so that a folder with a ``config.json``
    is whole. Skipped where ``config.json`` is there."""
    folder = Path(folder)
    if (folder / "config.json").is_file():
        return folder
    with locked(folder.parent / f".{folder.name}.lock"):
        if not (folder / "config.json").is_file():
            partial = folder.parent / f".{folder.name}.partial"
            for f in partial.glob("*"):  # a writer that died
                f.unlink()
            write(partial)
            folder.mkdir(exist_ok=True)
            for f in sorted(partial.iterdir(), key=lambda f: f.name == "config.json"):
                f.replace(folder / f.name)
            partial.rmdir()
    return folder


def write_random_checkpoint(shape: str, folder: Path, *, seed: int = 0, layers: int | None = None) -> Path:
    """Random BF16 weights of a named shape (``layers`` of them where given: a draft model of the
    family's width and vocabulary), saved with save_pretrained (once: :func:`written_once`)."""
    def write(into: Path) -> None:
        from transformers import Qwen3Config, Qwen3ForCausalLM

        config = Qwen3Config(**{**SHAPES[shape], **({"num_hidden_layers": layers} if layers else {})},
                             architectures=["Qwen3ForCausalLM"])
        torch.manual_seed(seed)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        previous = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)
        try:
            with torch.device(device):
                model = Qwen3ForCausalLM(config)
        finally:
            torch.set_default_dtype(previous)
        model.save_pretrained(into)

    return written_once(folder, write)


# Qwen3's byte-level BPE entries (151,643) and our three special tokens at ids 0-2
STAND_IN_MAX_VOCAB = 151_646


def write_stand_in_tokenizer(folder: Path, vocab: int, *, max_bytes: int | None = None) -> str:
    """A stand-in for Qwen3's tokenizer in the checkpoint ``folder`` (kept if already there): the
    shipped models' byte-level BPE (Qwen3's pre-tokenizer, models/tokenizer.py) learnt, without a
    minimum frequency, from up to ``max_bytes`` (default: 2,000 a token, at most 250 MB) of the
    running Python's own sources (standard library and site-packages, a fixed shuffled order) to
    ``min(vocab, 151,646)`` entries, the size of
    Qwen3's, so that a grammar's per-token mask costs what it would there (its cost grows with the
    vocabulary; the tokens themselves differ). ~30 s on two cores at Qwen3's size. Returns what it is, for the
    records: ``"stand-in byte-level BPE, N tokens"``."""
    import random
    import sys
    import sysconfig

    from tileinfer.models.tokenizer import train_on

    folder = Path(folder)
    vocab = min(vocab, STAND_IN_MAX_VOCAB)
    max_bytes = max_bytes or min(2_000 * vocab, 250_000_000)
    if not (folder / "tokenizer.json").is_file():
        roots = {Path(sysconfig.get_paths()[k]) for k in ("stdlib", "purelib", "platlib")}
        files = sorted({f for root in roots if root.is_dir() for f in root.rglob("*.py")})
        random.Random(0).shuffle(files)

        def texts():
            total = 0
            for f in files:
                try:
                    text = f.read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError):
                    continue
                total += len(text)
                if total > max_bytes:
                    return
                yield text

        info = train_on(texts(), folder, vocab=vocab, min_frequency=0)
        print(f"stand-in tokenizer: {info['vocab_size']} tokens in {info['seconds']} s -> {folder}", file=sys.stderr,
              flush=True)
    tokens = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    size = len(tokens["model"]["vocab"]) + sum(t["id"] >= len(tokens["model"]["vocab"]) for t in tokens["added_tokens"])
    return f"stand-in byte-level BPE, {size} tokens"


def write_random_drafter(shape: str, layers: int, block: int, folder: Path, *, seed: int = 0) -> Path:
    """A random z-lab-format DFlash drafter for a target of ``shape``, of the target's width as
    z-lab's drafters are, target layer ids by z-lab's default rule (once: :func:`written_once`)."""
    return written_once(folder, lambda into: _write_drafter(shape, layers, block, into, seed))


def _write_drafter(shape: str, layers: int, block: int, folder: Path, seed: int) -> None:
    from safetensors.torch import save_file

    from tileinfer.plugins.dflash_checkpoint import DFlashConfig, default_target_layer_ids

    target = SHAPES[shape]
    n_target = target["num_hidden_layers"]
    ids = list(default_target_layer_ids(n_target, layers))
    if not all(0 <= i < n_target for i in ids):  # a target too shallow for the rule (the CPU's tiny shape)
        ids = list(range(min(layers, n_target)))
    vocab = target["vocab_size"]
    config = {**target, "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "num_hidden_layers": layers,
              "tie_word_embeddings": False, "block_size": block, "num_target_layers": n_target,
              "dflash_config": {"mask_token_id": 151669 if vocab > 151669 else vocab - 1, "target_layer_ids": ids}}
    sizes = DFlashConfig.from_dict(config, str(folder / "config.json")).tensor_shapes()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device).manual_seed(seed)
    tensors = {}
    for name, size in sizes.items():
        if len(size) == 1:  # norms
            tensors[name] = torch.ones(size, dtype=torch.bfloat16)
        else:
            w = torch.randn(size, generator=g, device=device, dtype=torch.float32) * 0.02
            tensors[name] = w.to(torch.bfloat16).cpu()
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def layer_linear_shapes(mc: ModelConfig) -> list[tuple[int, int]]:
    """(out, in) of one decoder layer's linears, as the engine fuses them: qkv, o, gate_up, down."""
    h, d, i = mc.hidden_size, mc.head_dim, mc.intermediate_size
    return [((mc.num_heads + 2 * mc.num_kv_heads) * d, h), (h, mc.num_heads * d), (2 * i, h), (h, i)]


def weight_bytes(mc: ModelConfig, quantize: str = "none", dtype_bytes: int = 2) -> int:
    """Bytes of weights one decode step reads: every layer's linears and the lm_head."""
    linears = [*layer_linear_shapes(mc)] * mc.num_layers + [(mc.vocab_size, mc.hidden_size)]
    if quantize == "int8":
        return sum(o * i + 4 * o for o, i in linears)
    return sum(o * i for o, i in linears) * dtype_bytes


def kv_bytes_per_position(mc: ModelConfig, storage: str = "dtype", dtype_bytes: int = 2) -> int:
    """Bytes of K and V one cached position holds over all layers (``storage`` as KVStore.storage)."""
    vectors = 2 * mc.num_layers * mc.num_kv_heads
    return vectors * (mc.head_dim + 4 if storage == "int8" else mc.head_dim * dtype_bytes)


def decode_step_bytes(mc: ModelConfig, context: float, *, quantize: str = "none", storage: str = "dtype",
                      dtype_bytes: int = 2) -> float:
    """Bytes one decode step reads after ``context`` cached positions."""
    return weight_bytes(mc, quantize, dtype_bytes) + kv_bytes_per_position(mc, storage, dtype_bytes) * context


def decode_roofline_tok_s(mc: ModelConfig, prompt: int, new: int, bandwidth: float, **layout) -> float:
    """Tokens per second at the copy bandwidth (bytes/s) for ``new`` tokens after ``prompt``
    positions, one token per step: the context averaged over the run (``prompt + new / 2``)."""
    return bandwidth / decode_step_bytes(mc, prompt + new / 2, **layout)


def prefill_flops(mc: ModelConfig, tokens: int, start: int = 0) -> dict[str, float]:
    """FLOPs of a causal prefill of ``tokens`` after ``start`` cached positions: ``gemm``,
    ``attention``, ``total``."""
    layer = sum(o * i for o, i in layer_linear_shapes(mc))
    gemm = 2.0 * tokens * layer * mc.num_layers + 2.0 * mc.vocab_size * mc.hidden_size  # lm_head: last token
    attention = 4.0 * tokens * (start + tokens / 2) * mc.num_heads * mc.head_dim * mc.num_layers
    return {"gemm": gemm, "attention": attention, "total": gemm + attention}
