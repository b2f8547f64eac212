"""Engine: load a model as the config says, and generate one sequence at a time.

``Engine.stream(prompt)`` yields ``Chunk``s as tokens are committed (their text, when the model
has a tokenizer) and ends with a chunk carrying the generation's stats; ``generate`` collects a
stream into one ``Generation``. Decoding itself (prefill, plain, speculative or pipelined steps)
is ``tileinfer.decoding``.

Thread safety: an Engine runs one generation at a time. A second ``stream``/``generate`` while one
is running (from another thread, or from inside a stream's loop) raises UsageError; build one
Engine per concurrent user, or serialize the calls.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from tileinfer.config import SAMPLING_KEYS, Config, ConfigSource, load_config, resolve_config
from tileinfer.decoding import Decoder
from tileinfer.device_speculation import MAX_DRAFT, SpeculativeLoop, drafts_on_device
from tileinfer.errors import ConfigError, UsageError
from tileinfer.interfaces import KVGeometry, KVStore, Proposer, ProposerContext, SamplingParams
from tileinfer.loading import CheckpointReader, resolve_quantize
from tileinfer.memory import check_fits, tensor_bytes
from tileinfer.model import Backend, Qwen3Model
from tileinfer.model_config import ModelConfig
from tileinfer.notices import notice
from tileinfer.prompt import check_flag, check_ids, max_new_tokens_of, prompt_ids
from tileinfer.registry import Registry, build_registry
from tileinfer.sampling_step import TokenLogprob, check_logprobs
from tileinfer.threads import cpu_threads
from tileinfer.resolution import implementation_options, resolve_dtype
from tileinfer.steps import MAX_GRAPH_TOKENS, EagerSteps, GraphedSteps, cuda_graph_capture
from tileinfer.tokenizer import StreamDecoder, Tokenizer


@dataclass
class GenerationStats:
    prompt_tokens: int
    new_tokens: int
    prefill_ms: float  # prompt in, first token out (pipelined: read after step 1 was enqueued)
    decode_tok_s: float  # tokens after the first, over the time from the first to the last
    steps: int  # steps after the prefill whose tokens were committed (not one a pipelined run discards after an EOS)
    tokens_per_step: float  # new tokens after the first, per step
    drafted_tokens: int  # speculative tokens proposed (0 without a proposer)
    accepted_tokens: int  # of which the target kept
    finish_reason: str  # "eos" or "length"
    weight_bytes: int  # bytes of the loaded weights (INT8 linears: int8 rows and float32 scales)
    kv_bytes: int  # bytes of the KV pool
    kv_capacity: int  # positions the KV pool holds (kv_capacity resolved: auto sized by the model and the memory)
    decode_loop: str = ""  # sequential, pipelined, speculative-sequential or speculative-device (tileinfer.decoding)


@dataclass
class Chunk:
    """What ``Engine.stream`` yields: the tokens committed by one step and their text (None without
    a tokenizer; text held back until a character is complete). The last chunk has no tokens, the
    rest of the text, and the generation's ``stats``."""

    token_ids: list[int]
    text: str | None
    stats: GenerationStats | None = None
    logprobs: list[TokenLogprob] | None = None  # one per token, when stream(logprobs=) asked for them


@dataclass
class Generation:
    token_ids: list[int]  # the new tokens (an EOS that ended the generation included)
    text: str | None  # their text, special tokens skipped (None without a tokenizer)
    stats: GenerationStats
    logprobs: list[TokenLogprob] | None = None  # one per token, when generate(logprobs=) asked for them

    def to_dict(self) -> dict:
        out = {"token_ids": self.token_ids, "text": self.text, "stats": asdict(self.stats)}
        if self.logprobs is not None:
            out["logprobs"] = [asdict(lp) for lp in self.logprobs]
        return out


def model_folder(config: Config) -> Path:
    """The checkpoint folder the config names (the shipped model when none), checked to exist."""
    folder = Path(config.model) if config.model is not None else shipped_model()
    if folder is None:
        raise ConfigError("no model given: pass --model DIR or model=DIR (a Hugging Face Qwen3 checkpoint "
                          "folder); the shipped model models/target is not installed (models/README.md)")
    if not folder.is_dir():
        raise ConfigError(f"model folder not found: {folder}")
    return folder


def shipped_model() -> Path | None:
    """The small model trained for tileinfer (``tileinfer.models``: models/target in the
    repository, installed with the package), if present."""
    try:
        folder = Path(str(importlib.resources.files("tileinfer.models") / "target"))
    except ModuleNotFoundError:  # installed without its models
        return None
    return folder if (folder / "config.json").is_file() else None


class Engine:
    """A loaded model with its KV store, sampler, (optional) proposer and decoder.

    >>> engine = Engine.from_config(model="path/to/Qwen3-0.6B")
    >>> engine.generate("def fib(n):", max_new_tokens=32).text

    ``progress``: when stderr is a terminal, a bar while the layers load and a line while a prompt
    of more than ``prefill_chunk`` tokens is prefilled (``tileinfer.prefill``); False: neither.
    """

    def __init__(self, config: Config, registry: Registry | None = None, *, progress: bool = True) -> None:
        # Everything a user can get wrong is checked before the weights are read.
        self.registry = registry or build_registry()
        self.progress = progress  # the loading bar, and a long prefill's progress line, on a terminal
        config = resolve_config(config, self.registry)
        self.config = config
        self.folder = folder = model_folder(config)
        self.device = torch.device(config.device)
        if self.device.type == "cpu":
            torch.set_num_threads(cpu_threads(config.threads))
        self.dtype = resolve_dtype(config.dtype, self.device)
        self.model_config = ModelConfig.from_folder(folder)
        quantize = resolve_quantize(config.quantize, folder)  # an INT8 checkpoint: int8
        config = self.config = dataclasses.replace(config, quantize=quantize)
        options = {kind: implementation_options(config, kind, self.registry)
                   for kind in ("linear", "attention", "kv_store", "sampler")}
        backend = Backend(self.registry.get("linear", config.linear), self.registry.get("attention", config.attention),
                          config.quantize, options["linear"], options["attention"])
        self._size_pool()
        self.tokenizer = Tokenizer.from_folder(folder) if (folder / "tokenizer.json").is_file() else None
        reader = CheckpointReader(folder, self.model_config, self.device, self.dtype)
        self.model = Qwen3Model.build(self.model_config, reader.tensor, backend, progress=progress,
                                      positions=self.num_pages * config.kv_page_size)
        reader.close()
        self.kv = self._build_kv(options["kv_store"])
        self.weight_bytes = tensor_bytes(self.model.embed, self.model.layers, self.model.lm_head,
                                         exclude=(self.model.rope,))
        self.kv_bytes = tensor_bytes(self.kv)
        self.default_sampling = SamplingParams(**{key: getattr(config, key) for key in SAMPLING_KEYS})
        self.sampler = self.registry.get("sampler", config.sampler)(self.default_sampling, self.device,
                                                                    options=options["sampler"])
        self.proposer: Proposer | None = None
        if config.proposer != "none":
            context = ProposerContext(self.model, self.sampler, config, self.registry,
                                      implementation_options(config, "proposer", self.registry))
            self.proposer = self.registry.get("proposer", config.proposer)(context)
        self.decoder = self._build_decoder()
        self._busy = threading.Lock()

    def _size_pool(self) -> None:
        """The pool's positions: ``kv_capacity``, at most the model's context, in whole pages; a
        ConfigError before anything is allocated when a page is larger than that or the weights and
        the pool do not fit in the free memory."""
        mc, config = self.model_config, self.config
        self.capacity = min(config.kv_capacity, mc.max_positions)
        if config.kv_page_size > self.capacity:
            raise ConfigError(f"kv_page_size ({config.kv_page_size}) is larger than the KV capacity ({self.capacity} "
                              "positions): lower kv_page_size")
        self.num_pages = -(-self.capacity // config.kv_page_size)
        storage = self.registry.get("kv_store", config.kv_store).storage
        check_fits(mc, device=self.device, dtype=self.dtype, quantize=config.quantize,
                   positions=self.num_pages * config.kv_page_size, storage=storage)

    def _build_kv(self, options: dict) -> KVStore:
        mc, config = self.model_config, self.config
        geometry = KVGeometry(mc.num_layers, mc.num_kv_heads, mc.head_dim, config.kv_page_size, self.num_pages,
                              self.dtype)
        key_norms = [layer.attention.k_norm_weight for layer in self.model.layers]
        return self.registry.get("kv_store", config.kv_store)(geometry, self.device, key_norm_weights=key_norms,
                                                              options=options)

    def _build_decoder(self) -> Decoder:
        """Eager or graphed steps (``cuda_graphs``), sequential or pipelined (``pipelined``): both
        need a CUDA device. With a proposer, ``pipelined`` is the device-resident speculative loop
        (``tileinfer.device_speculation``; its steps captured per draft length with
        ``cuda_graphs``) when the proposer drafts on the device; the decoder takes it for greedy
        generations without history-using penalties, the others decode sequentially. Each setting
        that cannot apply says so in one line."""
        config, cuda = self.config, self.device.type == "cuda"
        gpu_only = [key for key in ("cuda_graphs", "pipelined") if getattr(config, key)]
        if gpu_only and not cuda:
            verb = "has" if len(gpu_only) == 1 else "have"
            notice(f"{' and '.join(gpu_only)} {verb} no effect on device {self.device.type} (CUDA graphs and "
                   "host/GPU overlap need a GPU)")
        pipelined = config.pipelined and cuda
        graphs = config.cuda_graphs and cuda
        loop = None
        if pipelined and self.proposer:
            if not drafts_on_device(self.proposer):
                notice(f"pipelined does not apply with proposer={config.proposer} (it drafts on the host only, "
                       "which needs each verify result before it drafts); decoding sequentially")
            elif config.spec_k > MAX_DRAFT:
                notice(f"pipelined does not apply with spec_k={config.spec_k} (the device-resident loop verifies at "
                       f"most {MAX_DRAFT + 1} tokens a step); decoding sequentially")
            else:
                k_values = range(1, config.spec_k + 1) if config.spec_adaptive else [config.spec_k]
                loop = SpeculativeLoop(self.model, self.kv, self.proposer, k_values,
                                       capture=cuda_graph_capture if graphs else None)
        capture = self.proposer.hidden_layers if self.proposer else ()
        if graphs:
            steps = GraphedSteps(self.model, self.kv, capture)
            with torch.inference_mode():
                steps.capture(range(1, min(config.spec_k + 1, MAX_GRAPH_TOKENS) + 1) if self.proposer else [1])
        else:
            steps = EagerSteps(self.model, self.kv, capture)
        entry = self.registry.entry("sampler", config.sampler)
        return Decoder(self.model, self.kv, self.sampler, steps, proposer=self.proposer, spec_k=config.spec_k,
                       spec_adaptive=config.spec_adaptive, pipelined=pipelined, loop=loop,
                       who=f"sampler={config.sampler} ({entry.origin})",
                       prefill_chunk=config.prefill_chunk, progress=self.progress)

    @classmethod
    def from_config(cls, *sources: ConfigSource, overrides: Sequence[str] = (), registry: Registry | None = None,
                    progress: bool = True, **keys) -> "Engine":
        """Build from default.yaml + ``sources`` (YAML paths or mappings) + ``overrides``
        (``"KEY=VALUE"``) + ``keys`` (e.g. ``model="..."``, ``device="cuda"``)."""
        config = load_config([*sources, keys] if keys else sources, overrides)
        return cls(config, registry, progress=progress)

    # -- input ---------------------------------------------------------------------------------

    def encode_prompt(self, prompt: str, *, chat: bool = False) -> list[int]:
        """The token ids of a text prompt (``chat``: wrapped in the chat template)."""
        if not isinstance(prompt, str):
            raise UsageError(f"encode_prompt takes text (a str), got {type(prompt).__name__}")
        return prompt_ids(prompt, chat, self.tokenizer, self.folder)

    # -- generation ----------------------------------------------------------------------------

    def stream(self, prompt: str | Sequence[int], *, max_new_tokens: int | None = None, chat: bool = False,
               ignore_eos: bool = False, sampling: SamplingParams | None = None,
               logprobs: int | None = None) -> Iterator[Chunk]:
        """Generate from a text prompt (``chat`` wraps it in the chat template) or from token ids,
        yielding a ``Chunk`` per decoding step as its tokens are committed, then a last chunk with
        the stats. The prompt is checked when this is called; decoding starts at the first
        ``next()``.

        Stops at an EOS token of generation_config.json (unless ``ignore_eos``, as benchmarks do)
        or after ``max_new_tokens`` (default: the config's). ``sampling``: this generation's
        temperature, top-k, top-p, min-p, seed and penalties (default: the config's). ``logprobs``:
        each chunk also carries its tokens' ``TokenLogprob`` (the log-softmax of the model's raw
        logits, before penalties and temperature, as vLLM returns by default) with the ``logprobs``
        most likely tokens of each position (0 to 20); decoding is then sequential (no pipelining).
        """
        check_flag("ignore_eos", ignore_eos)
        logprobs = check_logprobs(logprobs)
        if sampling is not None and not isinstance(sampling, SamplingParams):
            raise UsageError(f"sampling must be a tileinfer.interfaces.SamplingParams, got {type(sampling).__name__}")
        ids = prompt_ids(prompt, chat, self.tokenizer, self.folder)
        max_new = max_new_tokens_of(max_new_tokens, self.config.max_new_tokens)
        mc = self.model_config
        check_ids(ids, max_new, vocab=mc.vocab_size, capacity=self.capacity,
                  draft=self.config.spec_k if self.proposer else 0, max_positions=mc.max_positions)
        return self._stream(ids, max_new, () if ignore_eos else mc.eos_token_ids, sampling or self.default_sampling,
                            logprobs)

    def _stream(self, ids: list[int], max_new: int, eos: tuple[int, ...], sampling: SamplingParams,
                logprobs: int | None = None) -> Iterator[Chunk]:
        if not self._busy.acquire(blocking=False):
            raise UsageError("this Engine is already generating (it runs one sequence at a time): finish or close "
                             "the other stream first, or use one Engine per thread")
        try:
            self.sampler.params = sampling
            text = StreamDecoder(self.tokenizer) if self.tokenizer else None
            out: list[int] = []
            start = time.perf_counter()
            for tokens in self.decoder.run(ids, max_new, eos, logprobs):
                out += tokens
                yield Chunk(tokens, "".join(text.push(t) for t in tokens) if text else None,
                            logprobs=self.decoder.logprobs if logprobs is not None else None)
            end = time.perf_counter()
            counters = self.decoder.counters
            decode_s = end - counters.first_token_time
            stats = GenerationStats(
                prompt_tokens=len(ids),
                new_tokens=len(out),
                prefill_ms=(counters.first_token_time - start) * 1e3,
                decode_tok_s=(len(out) - 1) / decode_s if len(out) > 1 and decode_s > 0 else 0.0,
                steps=counters.steps,
                tokens_per_step=(len(out) - 1) / counters.steps if counters.steps else 0.0,
                drafted_tokens=counters.drafted,
                accepted_tokens=counters.accepted,
                finish_reason="eos" if out[-1] in eos else "length",
                weight_bytes=self.weight_bytes,
                kv_bytes=self.kv_bytes,
                kv_capacity=self.capacity,
                decode_loop=counters.loop,
            )
            yield Chunk([], text.flush() if text else None, stats)
        finally:
            self._busy.release()

    def generate(self, prompt: str | Sequence[int], *, max_new_tokens: int | None = None, chat: bool = False,
                 ignore_eos: bool = False, sampling: SamplingParams | None = None,
                 logprobs: int | None = None) -> Generation:
        """``stream`` collected: the new tokens, their text (special tokens skipped), the stats, and
        with ``logprobs`` each token's ``TokenLogprob``."""
        out: list[int] = []
        stats = None
        lps: list[TokenLogprob] | None = [] if logprobs is not None else None
        for chunk in self.stream(prompt, max_new_tokens=max_new_tokens, chat=chat, ignore_eos=ignore_eos,
                                 sampling=sampling, logprobs=logprobs):
            out += chunk.token_ids
            stats = chunk.stats or stats
            if lps is not None and chunk.logprobs:
                lps += chunk.logprobs
        text = self.tokenizer.decode(out) if self.tokenizer else None
        return Generation(out, text, stats, lps)
