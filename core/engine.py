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

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass

import torch

from tileinfer.config import SAMPLING_KEYS, Config, ConfigSource, load_config
from tileinfer.decode_plan import DecodePlan
from tileinfer.decoding import Decoder, build_decoder
from tileinfer.errors import UsageError
from tileinfer.interfaces import Proposer, ProposerContext, SamplingParams
from tileinfer.memory import tensor_bytes
from tileinfer.model_loader import Implementations, load_model
from tileinfer.prompt import check_flag, check_ids, max_new_tokens_of, prompt_ids
from tileinfer.registry import Registry
from tileinfer.sampling_step import TokenLogprob, check_logprobs
from tileinfer.threads import cpu_threads
from tileinfer.resolution import ResolvedConfig, implementation_options, resolve_dtype
from tileinfer.steps import build_forward
from tileinfer.tokenizer import StreamDecoder


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
    decode_loop: str = ""  # sequential, pipelined, speculative-sequential or speculative-device (decode_plan.LOOPS)


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


class Engine:
    """A loaded model with its KV store, sampler, (optional) proposer and decoder.

    >>> engine = Engine.from_config(model="path/to/Qwen3-0.6B")
    >>> engine.generate("def fib(n):", max_new_tokens=32).text

    ``progress``: when stderr is a terminal, a bar while the layers load and a line while a prompt
    of more than ``prefill_chunk`` tokens is prefilled (``tileinfer.prefill``); False: neither.

    ``config``: a ``Config``, resolved here against ``registry`` (default: the built-in and
    installed plugins), or a ``ResolvedConfig`` (``tileinfer.ResolvedConfig.of``), built from as it
    is: its checkpoint's files are not read again, and its tokenizer is the engine's.
    """

    def __init__(self, config: Config | ResolvedConfig, registry: Registry | None = None, *,
                 progress: bool = True) -> None:
        # Everything a user can get wrong is checked before the weights are read.
        if isinstance(config, ResolvedConfig):
            if registry is not None and registry is not config.registry:
                raise UsageError("a ResolvedConfig is built with the registry it was resolved with: pass no registry")
            resolved = config
        else:
            resolved = ResolvedConfig.of(config, registry)
        self.registry, self.config, self.checkpoint = resolved.registry, resolved.config, resolved.checkpoint
        self.progress = progress  # the loading bar, and a long prefill's progress line, on a terminal
        config = self.config
        self.folder, self.model_config = self.checkpoint.folder, self.checkpoint.config
        self.device = torch.device(config.device)
        if self.device.type == "cpu":
            torch.set_num_threads(cpu_threads(config.threads))
        self.dtype = resolve_dtype(config.dtype, self.device)
        self.tokenizer = self.checkpoint.tokenizer  # built (and checked) before any weight loads
        self.capacity = min(config.kv_capacity, self.model_config.max_positions)
        self.implementations = Implementations.of(config, self.registry)
        bundle = load_model(self.checkpoint, self.implementations, device=self.device, dtype=self.dtype,
                            positions=self.capacity, progress=progress)
        self.model, self.kv = bundle.model, bundle.kv
        self.weight_bytes = tensor_bytes(self.model.embed, self.model.layers, self.model.lm_head,
                                         exclude=(self.model.rope,))
        self.kv_bytes = tensor_bytes(self.kv)
        self.default_sampling = SamplingParams(**{key: getattr(config, key) for key in SAMPLING_KEYS})
        self.sampler = self.registry.get("sampler", config.sampler)(
            self.default_sampling, self.device, options=implementation_options(config, "sampler", self.registry))
        self.proposer: Proposer | None = None
        if config.proposer != "none":
            context = ProposerContext(self.model, self.sampler, config, self.registry,
                                      implementation_options(config, "proposer", self.registry), self.checkpoint)
            self.proposer = self.registry.get("proposer", config.proposer)(context)
        self.decoder = self._build_decoder()
        self._busy = threading.Lock()

    def _build_decoder(self) -> Decoder:
        """The decoder of the config's plan (``tileinfer.decode_plan.DecodePlan``: the strategy and
        the host-sync policy, from ``pipelined``, ``cuda_graphs``, the proposer and the device; a
        notice for each setting that cannot apply) over the target's ForwardPass (config key
        ``forward``)."""
        config = self.config
        plan = DecodePlan.from_config(config, self.proposer, self.device)
        entry = self.registry.entry("sampler", config.sampler)
        return build_decoder(plan, build_forward(self.model, config, self.registry), self.kv, self.sampler,
                             who=f"sampler={config.sampler} ({entry.origin})", prefill_chunk=config.prefill_chunk,
                             progress=self.progress)

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
