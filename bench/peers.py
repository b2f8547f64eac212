"""Peers: what a user would run instead, on the same machine, shapes and workloads, in the same run.

``python -m bench peers`` measures our default and every peer at the matrix's workloads (rows of
the matrix, kind ``matrix``: ``python -m bench matrix`` with these names); ``python -m bench cpu``
the CPU path on the shipped model against transformers, runs taking turns (see :func:`cpu_main`).

- ``hf-sdpa``: Hugging Face transformers' Qwen3ForCausalLM, eager, ``attn_implementation="sdpa"``,
  ``model.generate(do_sample=False, min_new_tokens=max_new_tokens)`` (dynamic cache);
- ``hf-static-compile``: the same with ``cache_implementation="static"`` (sized for the
  workload's context, as the engine's pool is) and
  ``compile_config=CompileConfig(fullgraph=True, mode="reduce-overhead")``: transformers then
  compiles the decode steps' forward (inductor, CUDA graphs); the prefill stays eager, as
  transformers does it;
- ``engine-compiled``: tileinfer's own reference model (config ``reference``, eager steps) with
  its decode steps' forward pass under ``torch.compile(mode="reduce-overhead", fullgraph=True)``; the
  model's weights and the KV pages are marked static addresses so that the CUDA graphs read them
  in place, and each step's attention is sized for the whole pool (``Step.max_context``) so that
  one graph serves every position. Prefill stays eager.

The INT8 weight-only peers (the matrix's parts 7 and 8 measure them beside our ``int8`` variant):

- ``engine-compiled-int8``: ``engine-compiled`` with ``quantize=int8`` on the reference linear,
  gpt-fast's int8 weight-only: int8 weights with one float32 scale per output channel, the
  forward converting them to the activation dtype for one matmul (float32 accumulation) and
  scaling its output (backends/reference/linear.py), compiled as above;
- ``hf-torchao-int8``: ``hf-static-compile`` with torchao's ``quantize_(model,
  Int8WeightOnlyConfig())`` applied to the model on the device (every ``nn.Linear``, the lm_head
  included: int8 weights, one scale per output channel; the embedding stays BF16). Where torchao
  does not import, building the runner raises "cannot run: ..." and the matrix records the row
  with that reason.

Timing, as the engine's stats do it: a transformers streamer notes when each new token reaches the
host; the prefill is the time from the (synchronized) call to the first token of a one-token
``generate``, decode tok/s the tokens after the first over the time from the first to the last.
The compiled engine is timed by its own stats.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from tileinfer.interfaces import ForwardPass, SamplingParams

from .timing import cold_salt
from .workloads import EngineRunner, Workload, free_memory, random_prompt

PEERS = ("hf-sdpa", "hf-static-compile", "engine-compiled", "engine-compiled-int8", "hf-torchao-int8")
INT8_PEERS = ("engine-compiled-int8", "hf-torchao-int8")  # weight-only INT8: their roofline counts INT8 bytes
PER_CONTEXT = ("hf-static-compile", "engine-compiled", *INT8_PEERS)  # built (and compiled) per context


def token_arrivals(model, ids: torch.Tensor, new: int, **kwargs) -> list[float]:
    """Seconds from the call of transformers' ``model.generate(ids, ...)`` (``[1, L]`` token ids,
    exactly ``new`` new tokens, ``kwargs`` passed on) to each new token's arrival on the host:
    transformers streams the tokens as they are ready (its first ``put`` is the prompt)."""
    from transformers.generation.streamers import BaseStreamer

    arrivals: list[float] = []

    class Clock(BaseStreamer):
        def put(self, value):
            arrivals.append(time.perf_counter())

        def end(self):
            pass

    began = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                             streamer=Clock(), **kwargs)
    if out.shape[1] != ids.shape[1] + new or len(arrivals) != new + 1:
        raise RuntimeError(f"generate gave {out.shape[1] - ids.shape[1]} tokens in {len(arrivals) - 1} "
                           f"streamed steps, not {new}")
    return [t - began for t in arrivals[1:]]


class HFRunner:
    """transformers' Qwen3ForCausalLM on the checkpoint, eager SDPA or static cache + compile."""

    full_warm_up = True  # workloads.warm_up: a whole run first (first allocations, recompiles)
    last_decode: dict = {}  # what an engine's rows report (EngineRunner's): nothing here
    notices: list[str] = []

    def __init__(self, folder: Path, device: torch.device, *, static: bool, max_cache_len: int,
                 quantize: str = "none") -> None:
        """``quantize="torchao-int8"``: torchao's int8 weight-only on every Linear (see the module doc)."""
        import transformers
        from transformers import CompileConfig, GenerationConfig, Qwen3ForCausalLM

        if quantize not in ("none", "torchao-int8"):
            raise ValueError(f"unknown quantize {quantize!r}; valid: none, torchao-int8")
        quantizer = torchao_int8() if quantize == "torchao-int8" else None  # before any weight loads
        transformers.utils.logging.disable_progress_bar()
        version = tuple(int(x) for x in transformers.__version__.split(".")[:2] if x.isdigit())
        dtype = {"dtype" if version >= (4, 56) else "torch_dtype": torch.bfloat16}
        self.device = device
        self.model = Qwen3ForCausalLM.from_pretrained(folder, attn_implementation="sdpa", **dtype)
        self.model = self.model.to(device).eval()
        self.quantize = "int8" if quantizer else "none"
        if quantizer:
            quantizer(self.model)
        # greedy with no penalty, whatever the checkpoint's generation_config.json says
        self.kwargs: dict = {"do_sample": False, "repetition_penalty": 1.0, "pad_token_id": 0}
        if static:
            self.kwargs.update(cache_implementation="static",
                               compile_config=CompileConfig(fullgraph=True, mode="reduce-overhead"))
            if hasattr(GenerationConfig(), "max_cache_len"):  # one cache size for the prefill and decode rows
                self.kwargs["max_cache_len"] = max_cache_len
        self.static = static

    def _times(self, ids: torch.Tensor, new: int) -> list[float]:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return token_arrivals(self.model, ids, new, **self.kwargs)

    def sample(self, workload: Workload) -> Callable[[], float]:
        if workload.cached:
            raise NotImplementedError("this peer's runner keeps no KV cache across generations (no prefix reuse)")
        prompt = random_prompt(workload.prompt_tokens, self.model.config.vocab_size)
        ids = torch.tensor([prompt], device=self.device)
        if workload.kind == "prefill":
            return lambda: self._times(ids, 1)[0] * 1e3
        n = workload.new_tokens

        def decode() -> float:
            times = self._times(ids, n)
            return (n - 1) / (times[-1] - times[0])

        return decode

    def layout(self) -> dict:
        return {"quantize": self.quantize}  # BF16 KV; BF16 or int8 weight-only linears

    def close(self) -> None:
        del self.model
        free_memory()
        if self.static:
            torch._dynamo.reset()


def torchao_int8() -> Callable[[torch.nn.Module], None]:
    """torchao's int8 weight-only as a function that quantizes a model in place: every
    ``nn.Linear`` (``quantize_(model, Int8WeightOnlyConfig())``, one scale per output channel).
    RuntimeError "cannot run: ..." where torchao does not import."""
    try:
        import torchao
        from torchao.quantization import Int8WeightOnlyConfig, quantize_
    except Exception as exc:  # noqa: BLE001 - any import failure: the row records why
        raise RuntimeError(f"cannot run: torchao does not import ({type(exc).__name__}: {exc})") from None
    print(f"hf-torchao-int8: torchao {torchao.__version__}, quantize_(model, Int8WeightOnlyConfig())", flush=True)
    return lambda model: quantize_(model, Int8WeightOnlyConfig())


def _tensors(obj, depth: int = 5) -> Iterator[torch.Tensor]:
    """Every tensor reachable from ``obj`` through lists, dicts and tileinfer objects' attributes."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth and isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _tensors(item, depth - 1)
    elif depth and isinstance(obj, dict):
        for item in obj.values():
            yield from _tensors(item, depth - 1)
    elif depth and type(obj).__module__.startswith("tileinfer") and hasattr(obj, "__dict__"):
        for item in vars(obj).values():
            yield from _tensors(item, depth - 1)


class CompiledForward(ForwardPass):
    """``eager``'s decode steps under ``torch.compile(mode="reduce-overhead", fullgraph=True)``, each
    step's attention sized for ``capacity`` positions (``Step.max_context``) so that one graph serves
    every position; the prefill (``last_only``), captured hidden states and selected rows stay eager."""

    def __init__(self, eager: ForwardPass, capacity: int) -> None:
        super().__init__(eager.model)
        self.eager, self.capacity = eager, capacity
        self.compiled = torch.compile(eager.__call__, mode="reduce-overhead", fullgraph=True)

    def __call__(self, token_ids, step, kv, *, capture=(), rows=None, last_only=False, logits=True):
        if last_only or capture or rows is not None or not logits:
            return self.eager(token_ids, step, kv, capture=capture, rows=rows, last_only=last_only, logits=logits)
        return self.compiled(token_ids, dataclasses.replace(step, max_context=self.capacity), kv)


class CompiledEngineRunner(EngineRunner):
    """The engine's reference model with its decode steps' forward pass compiled (see the module doc)."""

    full_warm_up = True

    def __init__(self, folder: Path, overrides: list[str], kv_capacity: int) -> None:
        # configs/reference.yaml: eager steps; torch.compile captures the graphs.
        super().__init__(folder, ["reference"], overrides, kv_capacity)
        steps, kv = self.engine.decoder.steps, self.engine.kv
        for tensor in [*_tensors(self.engine.model), *_tensors(kv)]:
            torch._dynamo.mark_static_address(tensor, guard=False)
        steps.forward_pass = CompiledForward(steps.forward_pass, kv.capacity)  # this engine's steps only

    def close(self) -> None:
        super().close()
        torch._dynamo.reset()


def runner(peer: str, folder: Path, device: torch.device, *, kv_capacity: int, device_override: list[str]):
    """A runner for ``peer`` sized for ``kv_capacity`` positions (the static cache for Hugging Face)."""
    if peer == "hf-sdpa":
        return HFRunner(folder, device, static=False, max_cache_len=kv_capacity)
    if peer == "hf-static-compile":
        return HFRunner(folder, device, static=True, max_cache_len=kv_capacity)
    if peer == "engine-compiled":
        return CompiledEngineRunner(folder, device_override, kv_capacity)
    if peer == "engine-compiled-int8":
        return CompiledEngineRunner(folder, [*device_override, "quantize=int8"], kv_capacity)
    if peer == "hf-torchao-int8":
        return HFRunner(folder, device, static=True, max_cache_len=kv_capacity, quantize="torchao-int8")
    raise ValueError(f"unknown peer {peer!r}; valid: {', '.join(PEERS)}")


# -- python -m bench peers ------------------------------------------------------------------------

def arguments(p) -> None:
    from . import matrix

    matrix.arguments(p, names=f"default: default, int8 and every peer ({', '.join(PEERS)})")


def main(args) -> int:
    from . import matrix

    args.variant = args.variant or ["default", "int8", *PEERS]
    return matrix.main(args)


# -- python -m bench cpu: the CPU path on the shipped model against transformers ------------------

class TileinferCPU:
    name = "tileinfer"

    def __init__(self, model: Path) -> None:
        import tileinfer

        self.engine = tileinfer.Engine.from_config(model=str(model), device="cpu", temperature=0.0,
                                                   repetition_penalty=1.0, progress=False)  # plain greedy

    def prefill_ms(self, ids: list[int]) -> float:
        """A cold prefill (a new cache_salt: the prefix cache serves it nothing)."""
        params = SamplingParams(max_tokens=1, ignore_eos=True, cache_salt=cold_salt())
        return self.engine.generate(ids, params).stats.prefill_ms

    def decode_tok_s(self, ids: list[int], new: int) -> float:
        return self.engine.generate(ids, max_new_tokens=new, ignore_eos=True).stats.decode_tok_s


class TransformersCPU:
    name = "transformers-sdpa"

    def __init__(self, model: Path) -> None:
        import transformers
        from transformers import Qwen3ForCausalLM

        transformers.utils.logging.disable_progress_bar()
        self.model = Qwen3ForCausalLM.from_pretrained(model, attn_implementation="sdpa", dtype=torch.float32).eval()

    def _times(self, ids: list[int], new: int) -> list[float]:
        return token_arrivals(self.model, torch.tensor([ids]), new, do_sample=False, repetition_penalty=1.0,
                              pad_token_id=0)

    def prefill_ms(self, ids: list[int]) -> float:
        return self._times(ids, 1)[0] * 1e3

    def decode_tok_s(self, ids: list[int], new: int) -> float:
        times = self._times(ids, new)
        return (new - 1) / (times[-1] - times[0])


def interleaved(runners: list, fn, repeats: int) -> list[float]:
    """Median of ``repeats`` calls of ``fn(runner)`` for each runner, after one warm-up each; the
    runners take turns, so that a load that comes and goes on the machine falls on both alike."""
    samples: list[list[float]] = [[] for _ in runners]
    for _ in range(repeats + 1):
        for i, runner in enumerate(runners):
            samples[i].append(fn(runner))
    return [statistics.median(s[1:]) for s in samples]


def cpu_arguments(p) -> None:
    from . import records

    p.description = ("The CPU path: prefill of a long held-out prompt and decode tok/s after a short and a long "
                     "context, tileinfer's default config on a CPU against transformers' Qwen3ForCausalLM (sdpa, "
                     "float32) on the same model, tokens and thread count, runs taking turns; each figure the "
                     "median of --repeats after a warm-up, wall clock. Records: kind cpu_peer, one per "
                     "implementation.")
    p.add_argument("--model", type=Path, help="checkpoint folder (default: the shipped models/target)")
    p.add_argument("--long", type=int, default=1900, help="prompt tokens of the prefill and the long context")
    p.add_argument("--short", type=int, default=8, help="prompt tokens of the short context")
    p.add_argument("--new", type=int, default=65, help="tokens generated per decode run")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per figure, after one warm-up")
    p.add_argument("--label", default="", help="a name for the run in its records (e.g. before, after)")
    records.arguments(p)


def cpu_main(args) -> int:
    import os

    from tileinfer.models import prompts
    from tileinfer.tokenizer import Tokenizer

    from . import records

    model = args.model or Path(prompts.__file__).parent / "target"
    tok = Tokenizer.from_folder(model)
    text = "\n\n".join(p.read_text() for p in sorted(prompts.HELDOUT_DIR.glob("*.py.txt")))
    ids = tok.encode(text, add_special_tokens=False)
    if len(ids) < args.long:
        print(f"error: the held-out files hold {len(ids)} tokens, fewer than --long {args.long}")
        return 2
    ids = ids[:args.long]
    run = records.Run("cpu", commit=args.commit, path=args.records)
    load_before = os.getloadavg()[0]
    runners = [TileinferCPU(model), TransformersCPU(model)]
    figures = {"prefill_ms": lambda r: r.prefill_ms(ids),
               "decode_tok_s_short": lambda r: r.decode_tok_s(ids[:args.short], args.new),
               "decode_tok_s_long": lambda r: r.decode_tok_s(ids, args.new)}
    values = {key: interleaved(runners, fn, args.repeats) for key, fn in figures.items()}
    for i, runner in enumerate(runners):
        rec = run.add("cpu_peer", impl=runner.name, label=args.label, model=model.name, threads=torch.get_num_threads(),
                      prompt_tokens=args.long, short_context=args.short, new_tokens=args.new, repeats=args.repeats,
                      load_average=[load_before, os.getloadavg()[0]], **{k: v[i] for k, v in values.items()})
        print(f"{runner.name:18} prefill {rec['prefill_ms']:8.1f} ms, decode after {args.short}: "
              f"{rec['decode_tok_s_short']:.1f} tok/s, after {args.long}: {rec['decode_tok_s_long']:.1f} tok/s")
    print(f"appended to {run.path}")
    return 0


def cpu_table(rows: list[dict]) -> str:
    from .report import markdown

    first = rows[0]
    body = [[r["label"] or "-", r["impl"], f"{r['prefill_ms']:.1f}", f"{r['decode_tok_s_short']:.1f}",
             f"{r['decode_tok_s_long']:.1f}"] for r in sorted(rows, key=lambda r: (r["date"], r["label"], r["impl"]))]
    notes = sorted({f"{r['label']}: {r['note']}" for r in rows if r.get("note")})
    return (f"Model {first['model']}, {first['threads']} threads, a {first['prompt_tokens']}-token held-out prompt, "
            f"{first['new_tokens']} new tokens, medians of {first['repeats']}, runs taking turns.\n\n"
            + markdown(["run", "implementation", f"prefill {first['prompt_tokens']} (ms)",
                        f"decode after {first['short_context']} (tok/s)",
                        f"decode after {first['prompt_tokens']} (tok/s)"], body)
            + "".join(f"\n\n{note}" for note in notes))


def tables() -> list:
    from .report import Table

    return [Table("cpu_peer", "the CPU path against transformers, {group}", cpu_table, group=lambda r: r["model"])]
