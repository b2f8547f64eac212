"""Engine: load a model as the config says, and generate one sequence at a time.

``Engine.generate(prompts, params)`` answers a prompt (or a list of them, one after the other)
with a ``Generation``; ``Engine.chat(messages, params)`` renders a conversation with the
checkpoint's chat template first; ``Engine.stream`` yields ``Chunk``s as tokens are committed (their
text, when the model has a tokenizer) and ends with a chunk carrying the generation's stats;
``Engine.stream_async`` is that stream for an event loop. ``params`` is a
``tileinfer.SamplingParams`` (``tileinfer.sampling_params``); where a generation stops and the text
it shows is ``tileinfer.stops``; decoding itself (prefill, plain, speculative or pipelined steps)
is ``tileinfer.decoding``.

Thread safety: an Engine runs one generation at a time. A second ``stream``/``generate`` while one
is running (from another thread, or from inside a stream's loop) raises UsageError; build one
Engine per concurrent user, or serialize the calls.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence

import numpy as np
import torch

from tileinfer.async_stream import async_chunks
from tileinfer.chat import Messages, check_messages, check_template_kwargs, check_tools, is_conversation_batch
from tileinfer.chat_output import read_reply, render_chat
from tileinfer.config import SAMPLING_KEYS, Config, ConfigSource
from tileinfer.cpu_defaults import load_for_device
from tileinfer.decode_plan import DecodePlan
from tileinfer.decoding import Decoder, build_decoder
from tileinfer.errors import UsageError
from tileinfer.generation import Chunk, Generation, GenerationStats
from tileinfer.interfaces import Proposer, ProposerContext
from tileinfer.logit_bias import LogitBias
from tileinfer.memory import tensor_bytes
from tileinfer.model_loader import Implementations, load_model
from tileinfer.prompt import check_flag, check_ids, max_new_tokens_of, prompt_ids
from tileinfer.registry import Registry
from tileinfer.resolution import ResolvedConfig, implementation_options, resolve_dtype
from tileinfer.sampling_params import NEUTRAL, SamplingParams
from tileinfer.sampling_step import TokenLogprob, check_logprobs
from tileinfer.steps import build_forward
from tileinfer.stops import Completion, StopTokenBan
from tileinfer.structured import GrammarCompiler, StructuredOutput
from tileinfer.threads import cpu_threads

Prompt = str | Sequence[int] | torch.Tensor | np.ndarray  # text, or token ids


def is_batch(prompts: object) -> bool:
    """Whether ``prompts`` is a list of prompts (each a str or a sequence of token ids) rather than
    one prompt (a str, or a flat sequence of ints)."""
    return isinstance(prompts, (list, tuple)) and bool(prompts) and all(
        isinstance(p, (str, list, tuple, np.ndarray, torch.Tensor)) for p in prompts)


class Engine:
    """A loaded model with its KV store, sampler, (optional) proposer and decoder.

    >>> engine = Engine.from_config(model="path/to/Qwen3-0.6B")
    >>> engine.generate("def fib(n):", SamplingParams(max_tokens=32, stop=["\\n\\n"])).text

    ``progress``: when stderr is a terminal, a bar while the layers load and a line while a prompt
    of more than ``prefill_chunk`` tokens is prefilled (``tileinfer.prefill``); False: neither.

    ``config``: a ``Config``, resolved here against ``registry`` (default: the built-in and
    installed plugins), or a ``ResolvedConfig`` (``tileinfer.ResolvedConfig.of``), built from as it
    is: its checkpoint's files are not read again, and its tokenizer is the engine's.
    """

    def __init__(self, config: Config | ResolvedConfig, registry: Registry | None = None, *,
                 progress: bool = True) -> None:
        # Everything a user can get wrong is checked before the weights are read.
        if not isinstance(config, (Config, ResolvedConfig)):
            raise UsageError(f"Engine takes a tileinfer.Config (tileinfer.load_config(...)) or a ResolvedConfig, got "
                             f"{type(config).__name__}: to load a model folder, use Engine.from_config(model=...)")
        if registry is not None and not isinstance(registry, Registry):
            raise UsageError(f"registry must be a tileinfer.registry.Registry or None, got {type(registry).__name__}")
        check_flag("progress", progress)
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
        self.logit_bias = LogitBias(self.sampler)  # a generation's logit_bias, added before the sampler's stages
        self.stop_ban = StopTokenBan(self.logit_bias)  # the decoder's sampler: min_tokens bans the stop tokens early
        self.decoder = self._build_decoder()
        self.grammars: GrammarCompiler | None = None  # structured outputs' compiler, built at first use
        self._busy = threading.Lock()

    def _build_decoder(self) -> Decoder:
        """The decoder of the config's plan (``tileinfer.decode_plan.DecodePlan``: the strategy and
        the host-sync policy, from ``pipelined``, ``cuda_graphs``, the proposer and the device; a
        notice for each setting that cannot apply) over the target's ForwardPass (config key
        ``forward``)."""
        config = self.config
        plan = DecodePlan.from_config(config, self.proposer, self.device)
        entry = self.registry.entry("sampler", config.sampler)
        return build_decoder(plan, build_forward(self.model, config, self.registry), self.kv, self.stop_ban,
                             who=f"sampler={config.sampler} ({entry.origin})", prefill_chunk=config.prefill_chunk,
                             progress=self.progress, prefix_cache=config.prefix_cache)

    @classmethod
    def from_config(cls, *sources: ConfigSource, overrides: Sequence[str] = (), registry: Registry | None = None,
                    progress: bool = True, **keys) -> "Engine":
        """Build from default.yaml + ``sources`` (YAML paths or mappings) + ``overrides``
        (``"KEY=VALUE"``) + ``keys`` (e.g. ``model="..."``, ``device="cuda"``); on a CPU the GPU-only
        settings are off unless these set them (``tileinfer.cpu_defaults``)."""
        config = load_for_device([*sources, keys] if keys else sources, overrides)
        return cls(config, registry, progress=progress)

    # -- input ---------------------------------------------------------------------------------

    def encode_prompt(self, prompt: str, *, chat: bool = False) -> list[int]:
        """The token ids of a text prompt (``chat``: wrapped in the chat template)."""
        if not isinstance(prompt, str):
            raise UsageError(f"encode_prompt takes text (a str), got {type(prompt).__name__}")
        return prompt_ids(prompt, chat, self.tokenizer, self.folder)

    # -- generation ----------------------------------------------------------------------------

    def stream(self, prompt: Prompt, params: SamplingParams | None = None, *, chat: bool = False,
               max_new_tokens: int | None = None, ignore_eos: bool = False,
               sampling: SamplingParams | None = None, logprobs: int | None = None) -> Iterator[Chunk]:
        """Generate from one prompt (text; ``chat``: wrapped in the chat template; or token ids),
        yielding a ``Chunk`` per decoding step as its tokens are committed, then a last chunk with
        the rest of the text and the stats. The prompt and params are checked when this is called;
        decoding starts at the first ``next()``. Closing the iterator ends the generation.

        ``params`` (``tileinfer.SamplingParams``; None: the engine's defaults): sampling, length,
        stops and logprobs. The generation ends at the first EOS of generation_config.json (unless
        ``ignore_eos``), token of ``stop_token_ids`` or stop string, or after ``max_tokens``. Logprobs
        are of the model's raw logits (before penalties and temperature, as vLLM returns them by
        default); asking for them decodes sequentially (no pipelining). ``params.prompt_logprobs``:
        the first chunk carries the prompt's (``Chunk.prompt_logprobs``, None for the first prompt
        token), computed in the prefill, which then runs the whole prompt (no prefix reuse).

        The keywords ``max_new_tokens``, ``ignore_eos``, ``logprobs`` and ``sampling`` (a
        ``SamplingParams`` of sampling fields only, those left None at ``NEUTRAL``'s off values, not
        the engine's defaults) are shorthands for fields of ``params``, to be given without it.
        """
        params = self._params(params, max_new_tokens, ignore_eos, sampling, logprobs)
        return self._stream(self._prompt_ids(prompt, chat, params), params)

    def generate(self, prompts: Prompt | Sequence[Prompt], params: SamplingParams | None = None, *,
                 chat: bool = False, max_new_tokens: int | None = None, ignore_eos: bool = False,
                 sampling: SamplingParams | None = None,
                 logprobs: int | None = None) -> Generation | list[Generation]:
        """``stream`` collected: the new tokens, their text and stats (and each token's
        ``TokenLogprob`` when ``params.logprobs`` asks for them).

        A str or a flat sequence of ints is one prompt, answered with one ``Generation``; a list of
        prompts (strs or token-id lists) is answered with a list, one per prompt in order,
        generated one after the other. Every prompt of a list is checked before the first runs."""
        params = self._params(params, max_new_tokens, ignore_eos, sampling, logprobs)
        if not is_batch(prompts):
            return self._collect(self._stream(self._prompt_ids(prompts, chat, params), params))
        batch = [self._prompt_ids(prompt, chat, params) for prompt in prompts]
        return [self._collect(self._stream(ids, params)) for ids in batch]

    def chat(self, messages: Messages | Sequence[Messages], params: SamplingParams | None = None, *,
             tools: Sequence[Mapping] | None = None,
             chat_template_kwargs: Mapping[str, object] | None = None) -> Generation | list[Generation]:
        """The assistant's reply to ``messages`` (``[{"role": "system" | "user" | "assistant" |
        "tool", "content": str}, ...]``), rendered with the checkpoint's chat template (``tools``,
        OpenAI's function tools, and ``chat_template_kwargs``, e.g. ``{"enable_thinking": False}``,
        passed to it); a list of conversations is answered with a list of replies, in order. Each
        reply's ``reasoning``, ``content`` and (with tools) ``tool_calls`` are read from its text as
        the server reads them (``tileinfer.chat_output``)."""
        params = self._params(params, None, False, None, None)
        if self.tokenizer is None:
            raise UsageError(f"chat needs a tokenizer ({self.folder} has no tokenizer.json)")
        kwargs = check_template_kwargs(chat_template_kwargs)
        tools = check_tools(tools)
        batch = is_conversation_batch(messages)
        prompts = [render_chat(self.tokenizer, check_messages(m), tools=tools, **kwargs)
                   for m in (messages if batch else [messages])]
        ids = [self._prompt_ids(self.tokenizer.encode(text, add_special_tokens=False), False, params)
               for text, _ in prompts]
        replies = [read_reply(self._collect(self._stream(one, params)), form) for one, (_, form) in zip(ids, prompts)]
        return replies if batch else replies[0]

    def stream_async(self, prompt: Prompt, params: SamplingParams | None = None, *,
                     chat: bool = False) -> AsyncIterator[Chunk]:
        """``stream`` for an event loop: ``async for chunk in engine.stream_async(...)``. The
        generation runs in a worker thread, so the loop is never blocked; checks raise here. Closing
        the iterator (``contextlib.aclosing``, or cancelling the task reading it) stops the generation
        at its next step and frees the engine."""
        return async_chunks(self.stream(prompt, params, chat=chat))

    # -- internals ------------------------------------------------------------------------------

    def _params(self, params: SamplingParams | None, max_new_tokens: object, ignore_eos: object,
                sampling: object, logprobs: object) -> SamplingParams:
        """``params``, or the one the shorthand keywords make (UsageError when both are given)."""
        check_flag("ignore_eos", ignore_eos)
        shorthand: dict = {"ignore_eos": True} if ignore_eos else {}
        if max_new_tokens is not None:
            shorthand["max_tokens"] = max_new_tokens_of(max_new_tokens, self.config.max_new_tokens)
        if logprobs is not None:
            shorthand["logprobs"] = check_logprobs(logprobs)
        if sampling is not None:
            if not isinstance(sampling, SamplingParams):
                raise UsageError(f"sampling must be a tileinfer.SamplingParams, got {type(sampling).__name__}")
            if dataclasses.replace(sampling, **dict.fromkeys(SAMPLING_KEYS)) != SamplingParams():
                raise UsageError("sampling takes the sampling fields only (temperature, top_p, ...): give the others "
                                 "in params")
            shorthand.update(sampling.resolved(NEUTRAL).sampling)
        if params is None:
            return SamplingParams(**shorthand)
        if not isinstance(params, SamplingParams):
            raise UsageError(f"params must be a tileinfer.SamplingParams, got {type(params).__name__}")
        if shorthand:
            raise UsageError("give max_new_tokens, ignore_eos, logprobs and sampling as fields of params "
                             "(max_tokens, ...), not beside it")
        return params

    def _prompt_ids(self, prompt: Prompt, chat: bool, params: SamplingParams) -> list[int]:
        """The prompt's token ids, checked with ``params`` against the vocabulary and the context."""
        ids = prompt_ids(prompt, chat, self.tokenizer, self.folder)
        mc = self.model_config
        check_ids(ids, params.max_tokens or self.config.max_new_tokens, vocab=mc.vocab_size, capacity=self.capacity,
                  draft=self.config.spec_k if self.proposer else 0, max_positions=mc.max_positions)
        outside = [t for t in params.stop_token_ids if t >= mc.vocab_size]
        if outside:
            raise UsageError(f"stop_token_ids: {outside[0]} is outside the vocabulary [0, {mc.vocab_size})")
        outside = [t for t in params.logit_bias or () if t >= mc.vocab_size]
        if outside:
            raise UsageError(f"logit_bias: {outside[0]} is outside the vocabulary [0, {mc.vocab_size})")
        if params.stop and self.tokenizer is None:
            raise UsageError(f"stop strings need a tokenizer ({self.folder} has no tokenizer.json): use stop_token_ids")
        if params.structured is not None:
            self.compile_structured(params.structured)  # a constraint the engine cannot compile fails here
        return ids

    def compile_structured(self, structured: StructuredOutput) -> None:
        """Compile ``structured`` for this checkpoint's tokenizer now (cached: a generation that asks
        for it later does not compile it again); ``StructuredOutputError`` naming the field when the
        grammar engine refuses it, UsageError without a tokenizer or without xgrammar."""
        self._grammars().compile(structured)

    def _grammars(self) -> GrammarCompiler:
        """The compiler of structured outputs for this checkpoint's tokenizer (built at first use)."""
        if self.grammars is None:
            if self.tokenizer is None:
                raise UsageError(f"structured outputs need a tokenizer ({self.folder} has no tokenizer.json)")
            self.grammars = GrammarCompiler(self.tokenizer, self.model_config.vocab_size,
                                            self.model_config.eos_token_ids)
        return self.grammars

    def _stream(self, ids: list[int], params: SamplingParams) -> Iterator[Chunk]:
        if not self._busy.acquire(blocking=False):
            raise UsageError("this Engine is already generating (it runs one sequence at a time): finish or close "
                             "the other stream first, or use one Engine per thread")
        try:
            self.sampler.params = params.resolved(self.default_sampling)
            completion = Completion(params, self.model_config.eos_token_ids, self.tokenizer)
            self.stop_ban.ban(completion.stop_tokens, params.min_tokens)
            self.logit_bias.set(params.logit_bias)
            grammar = self._grammars().matcher(params.structured, completion.stop_tokens) if params.structured \
                else None
            out: list[int] = []
            start = time.perf_counter()
            run = self.decoder.run(ids, params.max_tokens or self.config.max_new_tokens, completion.stop_tokens,
                                   params.logprobs, params.prompt_logprobs, logit_bias=self.logit_bias.active,
                                   grammar=grammar, cache_salt=params.cache_salt)
            try:
                for tokens in run:
                    kept, text, done = completion.take(tokens)
                    out += kept
                    yield Chunk(kept, text, logprobs=self.decoder.logprobs[:len(kept)]
                                if params.logprobs is not None else None,
                                prompt_logprobs=None if len(out) > len(kept) else self.decoder.prompt_logprobs)
                    if done:
                        break
            finally:
                run.close()
            end = time.perf_counter()
            if self.decoder.counters.grammar_end and completion.finish_reason is None:
                completion.finish_reason = "grammar"
            rest = completion.finish()
            yield Chunk([], rest, self._stats(len(ids), out, start, end, completion))
        finally:
            self._busy.release()

    def _stats(self, prompt_tokens: int, out: list[int], start: float, end: float,
               completion: Completion) -> GenerationStats:
        counters = self.decoder.counters
        decode_s = end - counters.first_token_time
        return GenerationStats(
            prompt_tokens=prompt_tokens,
            new_tokens=len(out),
            prefill_ms=(counters.first_token_time - start) * 1e3,
            decode_tok_s=(len(out) - 1) / decode_s if len(out) > 1 and decode_s > 0 else 0.0,
            steps=counters.steps,
            tokens_per_step=(len(out) - 1) / counters.steps if counters.steps else 0.0,
            drafted_tokens=counters.drafted,
            accepted_tokens=counters.accepted,
            finish_reason=completion.finish_reason,
            weight_bytes=self.weight_bytes,
            kv_bytes=self.kv_bytes,
            kv_capacity=self.capacity,
            decode_loop=counters.loop,
            stop_reason=completion.stop_reason,
            cached_tokens=counters.cached,
        )

    @staticmethod
    def _collect(stream: Iterator[Chunk]) -> Generation:
        out: list[int] = []
        pieces: list[str] = []
        stats = None
        lps: list[TokenLogprob] | None = None
        prompt_lps = None
        for chunk in stream:
            prompt_lps = prompt_lps or chunk.prompt_logprobs
            out += chunk.token_ids
            stats = chunk.stats or stats
            if chunk.text is not None:
                pieces.append(chunk.text)
            if chunk.logprobs is not None:
                lps = (lps or []) + chunk.logprobs
        return Generation(out, "".join(pieces) if pieces else None, stats, lps, prompt_lps)
