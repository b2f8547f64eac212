"""What the benchmark matrix runs: the variants (its rows) and the workloads (its columns), and
how one variant is measured on one workload.

Variants (``VARIANTS``): the engine's default config, and that config with one feature switched off.
Each variant is a list of config items for ``tileinfer.Engine.from_config``: the name of a shipped
config (``reference``, ``eager``: configs/<name>.yaml, layered over configs/default.yaml) or a
``KEY=VALUE`` override. A variant is config only; nothing in the engine branches on its name, and
each name says what the variant switches off. The Triton implementations' ablation knobs are typed
options under ``options.triton.<key>`` (one namespace shared by the Triton linear and attention).

``load`` merges a variant's items over the default config; ``resolve`` also resolves ``auto``
(device, dtype, implementation names) and validates the options. Both raise
tileinfer.errors.ConfigError when the variant does not load or cannot run here; the harness then
records the variant as skipped with that reason.

Workloads (``workloads()``):

- ``prefill1024``: one synchronized prefill of a 1,024-token random prompt (prompt in, first
  token out): ``engine.generate(prompt, max_new_tokens=1).stats.prefill_ms``, in ms, cold: each
  sample with a new ``cache_salt`` (``timing.cold_salt``), so that the prefix cache serves it
  nothing (a sample that reused a token is an error);
- ``prefill8192``, ``prefill32768``: the same (time to first token) for 8,192- and 32,768-token
  prompts, in chunks of ``prefill_chunk``; not in the default matrix (``NAMES``, what a run takes
  unless told otherwise; ``ALL_NAMES`` holds every name). Like every prefill row, also given as
  TFLOP/s and a fraction of the measured matmul peak (bench/shapes.py: ``2 x`` the layers'
  parameters ``x`` tokens, the lm_head for the last token, causal attention);
- ``prefill64``, ``prefill128``, ``prefill256``: the same for 64-, 128- and 256-token prompts (short
  prompts: INT8 weights' target there is BF16's time);
- ``prefill50``, ``prefill50_after4000``: time to first token of a 50-token prompt, and of a
  chat's follow-up turn: 50 new tokens after a 4,000-token history that the previous generation
  left in the KV cache (each sample first generates one token after the history, then times the
  history plus the 50 tokens: prefix reuse prefills the 50 only; FLOPs counted for those 50 after
  4,000 positions). Not in the default matrix; the peers' runners keep no cache across
  generations and record why they have no row;
- ``decode128_ctxN``: 128 greedy tokens after an ``N``-token random prompt (``N`` cached
  positions): ``engine.generate(...).stats.decode_tok_s``, tokens after the first over the time
  from the first to the last, in tok/s;
- ``decode128_json_ctx1024``: the same as ``decode128_ctx1024`` under a JSON schema
  (``DECODE_SCHEMA``, structured outputs: the grammar's mask each step, the host loop); not in the
  default matrix (``JSON_NAMES``). The target: at least 0.95x ``decode128_ctx1024``'s rate, and
  faster than that with ``proposer=ngram`` (variant ``ngram``).

Each measurement is warmed up by a run of the same prompt (8 new tokens for the engine: kernel
compilation, CUDA graph capture; the whole workload for the peers, see :func:`warm_up`), then
repeated until ``seconds`` are spent (at least once, ``timing.repeat``); the value is the median.
``short=True`` gives the CPU sizes: the same names, prompts 32x shorter and 8 new tokens. EOS is
ignored so that every run decodes the full count.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import re
import statistics
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

import tileinfer
from tileinfer.config import Config, load_config, resolve_config

from .timing import cold_salt, repeat


EAGER = ["eager"]  # configs/eager.yaml: cuda_graphs=false, pipelined=false
NO_FUSED_LINEARS = ["options.triton.fuse_epilogue=false"]  # SwiGLU and the residual add as kernels of their own
NO_FUSED_INPUTS = ["options.triton.fuse_inputs=false"]  # q/k norm, RoPE, KV write: a kernel each
PER_OP = [*NO_FUSED_LINEARS, *NO_FUSED_INPUTS]  # one Triton kernel per op
TORCH_MATMUL = ["options.triton.matmul=torch", *NO_FUSED_LINEARS]  # cuBLAS between the Triton norm/SwiGLU/add

VARIANTS: dict[str, list[str]] = {
    "default": [],  # configs/default.yaml: fused Triton kernels, CUDA graphs, pipelined
    "reference": ["reference"],  # torch ops everywhere, eager
    "eager": EAGER,  # fused Triton kernels, eager steps
    "eager-per-op": [*EAGER, *PER_OP],
    "eager-per-op-dense-attention": [*EAGER, *PER_OP, "options.triton.attend=dense"],
    "no-fused-kernels": PER_OP,
    "no-fused-kernels-no-pipelining": [*PER_OP, "pipelined=false"],
    "no-fused-linears": NO_FUSED_LINEARS,
    "no-fused-attention-inputs": NO_FUSED_INPUTS,
    "no-cuda-graphs": ["cuda_graphs=false"],
    "no-pipelining": ["pipelined=false"],
    "no-pdl": ["options.triton.pdl=false"],  # no programmatic dependent launch
    "torch-matmul": TORCH_MATMUL,
    "eager-torch-matmul": [*EAGER, *TORCH_MATMUL],
    "int8": ["quantize=int8"],  # weight-only INT8 (W8A16)
    "int8-kv": ["kv_store=paged_int8"],  # INT8 KV cache
    "int8-int8-kv": ["quantize=int8", "kv_store=paged_int8"],  # both: the INT8 KV target with INT8 weights
    "ngram": ["proposer=ngram"],  # n-gram speculative decoding
    "persistent": ["forward=persistent"],  # decode and verify steps as one persistent kernel
    "int8-persistent": ["quantize=int8", "forward=persistent"],
}
QUANTIZED = ("int8", "int8-kv", "int8-int8-kv")  # the variants the summary table lists next to the default


def split(items: Sequence[str]) -> tuple[list[str], list[str]]:
    """(sources, overrides) of a variant's items: ``KEY=VALUE`` strings are overrides."""
    return [i for i in items if "=" not in i], [i for i in items if "=" in i]


def variant_items(name: str) -> list[str]:
    """The config items of a variant, or of ``VARIANT+KEY=VALUE+...`` (an option tried on a variant
    without a new one: its items, then those overrides)."""
    base, *sets = name.split("+")
    return [*VARIANTS[base], *sets]


def known_variant(name: str) -> bool:
    """``name`` is a variant or ``VARIANT+KEY=VALUE+...`` of one."""
    base, *sets = name.split("+")
    return base in VARIANTS and all("=" in s for s in sets)


def engine_args(name: str, extra: Sequence[str] = ()) -> tuple[list[str], list[str]]:
    """``(sources, overrides)`` for ``Engine.from_config(*sources, overrides=overrides)``: the
    items of the variant (or ``VARIANT+KEY=VALUE+...``), then ``extra`` overrides of the harness
    (device, kv_capacity)."""
    sources, overrides = split(variant_items(name))
    return sources, [*overrides, *extra]


def load(name: str, extra: Sequence[str] = ()) -> Config:
    """The variant's config as loaded (``auto`` not resolved); ConfigError when it does not load."""
    return load_config(*engine_args(name, extra))


def resolve(name: str, extra: Sequence[str] = ()) -> Config:
    """The variant's resolved config (``auto`` resolved, options validated); ConfigError when it
    does not load or cannot run here (the message names the key)."""
    return resolve_config(load(name, extra))



@dataclass(frozen=True)
class Workload:
    name: str
    prompt_tokens: int
    new_tokens: int  # 1 for a prefill
    cached: int = 0  # prompt tokens a previous generation left in the KV cache (a chat's history)
    schema: bool = False  # decode under DECODE_SCHEMA (structured outputs: the grammar's mask each step)

    @property
    def kind(self) -> str:
        return "prefill" if self.name.startswith("prefill") else "decode"

    @property
    def unit(self) -> str:
        return "ms" if self.kind == "prefill" else "tok/s"

    def positions(self, spec_k: int = 0) -> int:
        """KV positions a run needs: prompt, new tokens and a speculative draft."""
        return self.prompt_tokens + self.new_tokens + spec_k


WARMUP_TOKENS = 8
NAMES = ("prefill1024", "decode128_ctx1024", "decode128_ctx8192", "decode128_ctx32768")  # the default matrix
# time to first token, when asked for: long prompts, a short one and a follow-up turn after a history
TTFT_NAMES = ("prefill8192", "prefill32768", "prefill50", "prefill64", "prefill128", "prefill256",
              "prefill50_after4000")
# decoding under a JSON schema, beside decode128_ctx1024 (the target: >= 0.95x its rate; with proposer=ngram, faster)
JSON_NAMES = ("decode128_json_ctx1024",)
ALL_NAMES = NAMES + TTFT_NAMES + JSON_NAMES
# at least 64 integers: a run cannot complete the JSON (and end) before its 128 tokens
DECODE_SCHEMA = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 999}, "minItems": 64}


def workloads(short: bool = False) -> dict[str, Workload]:
    """Every workload by name, at full size or (``short``) at the CPU smoke sizes."""
    full = {"prefill1024": (1024, 1), "decode128_ctx1024": (1024, 128), "decode128_ctx8192": (8192, 128),
            "decode128_ctx32768": (32768, 128), "prefill8192": (8192, 1), "prefill32768": (32768, 1),
            "prefill50": (50, 1), "prefill64": (64, 1), "prefill128": (128, 1), "prefill256": (256, 1)}
    out = {name: Workload(name, p // 32 if short else p, min(n, 8) if short else n) for name, (p, n) in full.items()}
    history = 4000 // 32 if short else 4000
    out["prefill50_after4000"] = Workload("prefill50_after4000", history + 50, 1, cached=history)
    out["decode128_json_ctx1024"] = Workload("decode128_json_ctx1024", 1024 // 32 if short else 1024,
                                             8 if short else 128, schema=True)
    return out


def groups(chosen: list[Workload], spec_k: int, per_context: bool = True) -> list[tuple[int, list[Workload]]]:
    """Workloads that share one runner, and the KV capacity it is built with: one runner per
    prompt length, sized to that context (``per_context``), or one for all, sized to the longest."""
    if not per_context:
        return [(max(w.positions(spec_k) for w in chosen), list(chosen))]
    lengths = sorted({w.prompt_tokens for w in chosen})
    return [(max(w.positions(spec_k) for w in chosen if w.prompt_tokens == n),
             [w for w in chosen if w.prompt_tokens == n]) for n in lengths]


def random_prompt(length: int, vocab: int, seed: int = 0) -> list[int]:
    return torch.randint(0, vocab, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


@dataclass
class Measurement:
    value: float  # median of the samples
    unit: str
    samples: list[float]


def warm_up(runner, workload: Workload) -> None:
    """One run of the workload before the samples, so that they time no compilation, graph capture
    or first allocation: short (its prompt, at most WARMUP_TOKENS new tokens) for the engine, whose
    KV pool and step buffers are allocated up front; the whole workload for a runner that sets
    ``full_warm_up`` (the peers: transformers' dynamic cache grows by a concatenation per token, and
    its first run of a length allocates each size anew; measured on the H200, Qwen3-0.6B after 1,024
    tokens: 8.3 s for the first whole run, 3.4 s for the second)."""
    new = workload.new_tokens if getattr(runner, "full_warm_up", False) else min(WARMUP_TOKENS, workload.new_tokens)
    runner.sample(dataclasses.replace(workload, new_tokens=new))()


def measure(runner, workload: Workload, seconds: float) -> Measurement:
    """Warm up, then sample until ``seconds`` are spent; the median. ``runner`` has
    ``sample(workload) -> (() -> float)``."""
    warm_up(runner, workload)
    samples = repeat(runner.sample(workload), seconds)
    return Measurement(statistics.median(samples), workload.unit, samples)


class EngineRunner:
    """One variant's engine on one checkpoint, sized for one KV capacity; ``notices``: the engine's
    notices (the ``tileinfer`` logger's warnings) from its build to :meth:`close`, once each, which
    the records carry (a fallback, say, such as a forward pass that ran the per-op step instead).

    ``kv_capacity`` is set per workload (prompt + new tokens + spec_k), rounded up to whole pages
    (the pool holds whole pages): a decode step replayed from a CUDA graph sizes its attention for
    the whole pool, so a pool much larger than the context would slow the short-context rows down.
    """

    def __init__(self, folder: Path, sources: list[str], overrides: list[str], kv_capacity: int) -> None:
        page = tileinfer.load_config(sources, overrides).kv_page_size
        self.kv_capacity = -(-kv_capacity // page) * page
        self.last_decode: dict = {}  # the last decode sample's loop and tokens per step
        self._notices = NoticeLog()
        self.notices = self._notices.messages
        logging.getLogger("tileinfer").addHandler(self._notices)
        try:
            self.engine = tileinfer.Engine.from_config(
                *sources, model=str(folder), progress=False,  # plain greedy unless the variant says otherwise
                overrides=["temperature=0", "repetition_penalty=1.0", *overrides, f"kv_capacity={self.kv_capacity}"])
        except BaseException:
            logging.getLogger("tileinfer").removeHandler(self._notices)
            raise

    def sample(self, workload: Workload) -> Callable[[], float]:
        engine = self.engine
        prompt = random_prompt(workload.prompt_tokens, engine.model_config.vocab_size)
        if workload.cached:
            history = prompt[:workload.cached]

            def follow_up() -> float:
                engine.generate(history, max_new_tokens=1, ignore_eos=True)
                stats = engine.generate(prompt, max_new_tokens=1, ignore_eos=True).stats
                if stats.cached_tokens != workload.cached:
                    raise RuntimeError(f"the follow-up reused {stats.cached_tokens} of {workload.cached} cached tokens")
                return stats.prefill_ms

            return follow_up
        if workload.kind == "prefill":
            def cold() -> float:
                stats = engine.generate(prompt, tileinfer.SamplingParams(max_tokens=1, ignore_eos=True,
                                                                         cache_salt=cold_salt())).stats
                if stats.cached_tokens:
                    raise RuntimeError(f"a cold prefill reused {stats.cached_tokens} cached tokens")
                return stats.prefill_ms

            return cold
        # Benchmarks decode the full count: a random prompt on a real model may reach an EOS early.
        if workload.schema:
            params = tileinfer.SamplingParams(max_tokens=workload.new_tokens, ignore_eos=True,
                                              structured=tileinfer.StructuredOutput(json=DECODE_SCHEMA))
        else:
            params = tileinfer.SamplingParams(max_tokens=workload.new_tokens, ignore_eos=True)

        def decode() -> float:
            stats = engine.generate(prompt, params).stats
            self.last_decode = {"decode_loop": stats.decode_loop, "tokens_per_step": stats.tokens_per_step}
            return stats.decode_tok_s

        return decode

    def layout(self) -> dict:
        """What sets the roofline's bytes: weight quantization, KV page format, dtype size (from
        the engine's resolved config)."""
        config = self.engine.config
        return {"quantize": config.quantize, "storage": self.engine.kv.storage,
                "dtype_bytes": getattr(torch, config.dtype).itemsize}

    def close(self) -> None:
        logging.getLogger("tileinfer").removeHandler(self._notices)
        del self.engine
        free_memory()


class NoticeLog(logging.Handler):
    """The warnings logged while it is a handler, each message once, in order (``messages``)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message not in self.messages:
            self.messages.append(message)


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def failure(exc: BaseException) -> str:
    """One line: the exception's type and first line (for out of memory, the size asked for), and
    the deepest line of tileinfer or bench/ it was raised through (else the deepest line)."""
    frames = traceback.extract_tb(exc.__traceback__) if exc.__traceback__ else []
    root = Path(__file__).resolve().parents[1]
    ours = [f for f in frames if Path(f.filename).is_relative_to(root) or "/tileinfer/" in f.filename]
    where = (ours or frames or [None])[-1]
    place = f" (at {Path(where.filename).name}:{where.lineno})" if where else ""
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    if isinstance(exc, torch.OutOfMemoryError):
        size = re.search(r"Tried to allocate ([\d.]+ [KMGT]?i?B)", str(exc))
        return "out of memory" + (f", tried to allocate {size.group(1)}" if size else "") + place
    return f"{type(exc).__name__}: {first}{place}"
