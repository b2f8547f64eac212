"""Decoding: the prompt's prefill and every step after it, in one loop.

``Decoder.run(ids, max_new, eos)`` yields the tokens of one generation as they are committed (a
list per step) and stops exactly at the first EOS or at ``max_new`` tokens. Its ``counters`` hold
the step and speculation counts, the time the first token reached the host and which loop ran
(``tileinfer.decode_plan.LOOPS``). The engine builds one Decoder (``build_decoder``) and streams
from it.

The loop runs the strategy the plan chooses for the generation (``tileinfer.strategies``: plain,
host drafting, the device loop) under its host-sync policy: each step leaves a record
``[committed, drafted, tokens...]`` (``tileinfer.host_records``), read by the host either before
the next step is enqueued (eager) or after it (one step behind: the device never waits for the
host). A step enqueued after the one that stops the generation (at an EOS) is discarded: its
record is never read, its tokens never emitted. At the stop (or when the stream is closed) the KV
store is cut to the prompt and the emitted tokens that were fed to a step, and those ids are kept
(``tileinfer.prefix_cache``): the next prompt that starts with them prefills only the rest. A
generation that drafts is first offered those positions by ``Proposer.begin``, which keeps as many
as its own state of the prompt serves (none for a proposer that does not know about reuse): the
target prefills from there and ``prompt_chunk`` gets the chunks from there.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass

import torch

from tileinfer.decode_plan import Choice, DecodePlan
from tileinfer.device_speculation import SpeculativeLoop
from tileinfer.errors import NumericsError, PluginError
from tileinfer.grammar_mask import Matcher
from tileinfer.graph_capture import cuda_graph_capture
from tileinfer.host_records import HostRecords
from tileinfer.interfaces import ForwardPass, KVStore, Sample, Sampler
from tileinfer.prefill import ChunkCallback
from tileinfer.prefix_cache import PrefixCache
from tileinfer.prompt_logprobs import PromptScores
from tileinfer.sampling_step import SamplingStep, TokenLogprob
from tileinfer.speculative import DraftLength, finite_or
from tileinfer.steps import MAX_GRAPH_TOKENS, StepRunner
from tileinfer.strategies import HostDrafting, PlainDecoding, Strategy


@dataclass
class DecodeCounters:
    """One generation's counts: steps after the prefill whose tokens were committed (a step
    discarded after a stop is not counted), tokens drafted and accepted, the host time
    (``time.perf_counter``) the first token was out, the loop that ran (``LOOPS``' names) and the
    prompt tokens whose keys and values the previous generation left (not prefilled);
    ``grammar_end``: the grammar rejected a committed token (a dead end), which ended it there."""

    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    first_token_time: float = 0.0
    loop: str = ""
    cached: int = 0
    grammar_end: bool = False


def checked_sample(sampler: Sampler, logits: torch.Tensor, who: str) -> Sample:
    """``sampler.sample(logits)``, with a PluginError naming ``who`` when a plugin's sampler does not
    return a ``Sample`` of ``[T]`` int64 tokens (checked at the prefill, once per generation)."""
    result = sampler.sample(logits)
    tokens = getattr(result, "tokens", None)
    if not isinstance(result, Sample) or not isinstance(tokens, torch.Tensor) or tokens.shape != logits.shape[:1]:
        raise PluginError(f"{who}: sample() returned {result!r}, not a tileinfer.interfaces.Sample with one "
                          f"int64 token per row of the logits")
    return result


@torch.inference_mode()
def prefill(steps: StepRunner, sampler: Sampler, ids: Sequence[int], capture: Collection[int] = (),
            who: str = "sampler", *, chunk: int | None = None, on_chunk: ChunkCallback | None = None,
            progress: bool = False, start: int = 0, scores: PromptScores | None = None) -> torch.Tensor:
    """Run the prompt ``ids`` from position ``start`` (the KV store holding ``ids[:start]``) in
    steps of at most ``chunk`` tokens (None: one step) and sample the token after it
    (``StepRunner.prefill``: ``on_chunk`` gets each chunk's ids, start and hidden states of the
    layers in ``capture``; ``progress`` shows a progress line on a terminal; ``scores`` receive the
    prompt's logprobs). Returns that token as a ``[1]`` int64 tensor on the device, not read by the
    host (-1 if the logits are not finite)."""
    logits = steps.prefill(ids, chunk=chunk or max(len(ids), 1), capture=capture, on_chunk=on_chunk,
                           progress=progress, start=start, scores=scores)
    return finite_or(checked_sample(sampler, logits, who).tokens, logits)


class Decoder:
    """One generation at a time over ``steps`` (the target's step runner and its KV store) and
    ``sampler``, as ``plan`` says (``tileinfer.decode_plan``); ``loop``: the device-resident
    speculative loop, built when the plan's strategy is ``device``. ``who`` names the sampler's
    plugin in errors. The prompt is prefilled in steps of at most ``prefill_chunk`` tokens (None:
    one step), the proposer fed each chunk; ``progress`` shows a long prefill's progress on a
    terminal. ``prefix_cache`` (the engine passes its config key; off by default here): a prompt that
    starts with the ids the last generation left in the store prefills only the rest
    (``tileinfer.prefix_cache``).
    """

    def __init__(self, steps: StepRunner, sampler: Sampler, plan: DecodePlan, *, loop: SpeculativeLoop | None = None,
                 who: str = "sampler", prefill_chunk: int | None = None, progress: bool = False,
                 prefix_cache: bool = False) -> None:
        assert (loop is not None) == (plan.strategy == "device"), "the device loop is built for the device strategy"
        assert loop is None or loop.proposer is plan.proposer, "the loop drafts with the plan's proposer"
        self.steps, self.kv, self.sampler, self.plan, self.loop = steps, steps.kv, sampler, plan, loop
        self.proposer, self.who = plan.proposer, who
        self.prefill_chunk, self.progress = prefill_chunk, progress
        self.strategies: dict[str, Strategy] = {"plain": PlainDecoding(steps)}
        if plan.proposer is not None:
            self.strategies["host"] = HostDrafting(steps, plan.proposer)
        if loop is not None:
            self.strategies["device"] = loop
        self.records = HostRecords(steps.device, max(plan.spec_k, loop.k_max if loop else 0) + 3)
        self.draft_length = DraftLength(plan.spec_k, plan.adaptive)
        self.counters = DecodeCounters()
        self.prefix = PrefixCache(steps.kv, prefix_cache)
        self.choice = Choice(plan.strategy, plan.ahead)
        self.sampling = SamplingStep(sampler, [], 0)
        self.logprobs: list[TokenLogprob] = []  # of the tokens yielded last, when asked for
        self.prompt_logprobs: list[TokenLogprob | None] | None = None  # the prompt's, once prefilled, when asked for
        self._scores: PromptScores | None = None

    def run(self, ids: Sequence[int], max_new: int, eos: Collection[int],
            logprobs: int | None = None, prompt_logprobs: int | None = None, *,
            logit_bias: bool = False, grammar: Matcher | None = None,
            cache_salt: str | None = None) -> Iterator[list[int]]:
        """Prefill ``ids`` and decode after them; yields each step's committed tokens, the last
        list ending at the first token in ``eos`` or at the ``max_new``-th token. ``logprobs`` (top
        tokens per position): after each yield, ``self.logprobs`` holds the yielded tokens'
        (``sampling_step.TokenLogprob``); the host then reads each step before the next.
        ``prompt_logprobs`` (top tokens per position): from the first yield on,
        ``self.prompt_logprobs`` holds the prompt's (``tileinfer.prompt_logprobs``: None for the
        first token); the whole prompt is then prefilled, none of it reused from the prefix cache.
        ``logit_bias``: the sampler adds a bias to the logits (``tileinfer.logit_bias``), which the
        device loop does not. ``grammar`` (``tileinfer.grammar_mask.Matcher``): each step's tokens
        are masked by it and it is advanced by the committed ones (the host reads each step before
        it samples the next); the first token it rejects ends the generation before it (``grammar_end``).
        ``cache_salt``: the prefix cache serves this prompt only what a generation with the same
        salt left (``tileinfer.prefix_cache``)."""
        assert max_new >= 1
        self.counters = DecodeCounters()
        self.draft_length.reset()
        self.sampler.generator.manual_seed(self.sampler.params.seed)
        self.sampling = SamplingStep(self.sampler, ids, len(ids) + max_new + self.plan.spec_k + 2, logprobs,
                                     grammar)
        self.logprobs = []
        self.choice = self.plan.choose(self.sampler, len(ids), max_new, logprobs, self.kv.capacity,
                                       logit_bias=logit_bias, grammar=grammar is not None)
        self.counters.loop = self.choice.loop
        strategy = self.strategies[self.choice.strategy]
        self.prompt_logprobs = None
        self._scores = None if prompt_logprobs is None else PromptScores(ids, prompt_logprobs, self.steps.device)
        self.counters.cached = self._begin(strategy, ids, reuse=self._scores is None, salt=cache_salt)
        return self._decode(list(ids), max_new, frozenset(eos), strategy, 2 if self.choice.ahead else 1)

    def _begin(self, strategy: Strategy, ids: Sequence[int], reuse: bool = True, salt: str | None = None) -> int:
        """Cut the store to the prompt positions this generation keeps and return their number: the
        prefix cache's (``PrefixCache.start``; none without ``reuse``), as many of them as the
        strategy's proposer keeps (``Proposer.begin``)."""
        cached = self.prefix.start(ids, reuse, salt)
        proposer = strategy.proposer
        if proposer is None:
            return cached
        kept = proposer.begin(list(ids), cached)
        if not isinstance(kept, int) or not 0 <= kept <= cached:
            raise PluginError(f"{type(proposer).__name__}.begin(ids, {cached}) returned {kept!r}, not a number of "
                              f"kept positions from 0 to {cached}")
        if kept < cached:
            self.kv.truncate(kept)
        return kept

    def _decode(self, ids: list[int], max_new: int, eos: frozenset[int], strategy: Strategy,
                depth: int) -> Iterator[list[int]]:
        """Record 0 is the prefill's token; record ``r >= 1`` step ``r``'s. While fewer than
        ``depth`` records are in flight and the tokens known plus the steps in flight (one token
        each at least) stay below ``max_new``, the host enqueues the next step (drafting the
        current ``draft_length.k``, set from the records read so far); then it reads the oldest
        record. Split (a grammar's plain steps, ``Choice.split``): the next step's forward pass is
        enqueued before the oldest record is read, its sampling after the grammar has taken that
        record's token, so that the mask follows it while the device runs the forward pass."""
        records, counters = self.records, self.counters
        records.reset()
        proposer = strategy.proposer
        first = prefill(self.steps, self.sampling, ids, proposer.hidden_layers if proposer else (), self.who,
                        chunk=self.prefill_chunk, on_chunk=proposer.prompt_chunk if proposer else None,
                        progress=self.progress, start=counters.cached, scores=self._scores)
        if self._scores is not None:
            self.prompt_logprobs, self._scores = self._scores.results(), None
        records.send(strategy.begin(ids, first, max_new, self.sampling))
        emitted, committed, done = 0, 0, False  # new tokens yielded; committed by the records read
        sequence, ended = list(ids), False  # the prompt and the tokens yielded; whether the loop ended in order
        split = self.choice.split
        try:
            while not done:
                if split:  # one record in flight: the step after it is fed now, sampled below
                    if committed + records.in_flight < max_new:
                        strategy.feed()
                elif records.in_flight < depth and committed + records.in_flight < max_new:
                    records.send(strategy.step(self.draft_length.k))
                new, drafted = records.receive()
                _finite(min(new), len(ids) + committed)
                strategy.took(new)
                committed += len(new)
                if records.received == 1:
                    counters.first_token_time = time.perf_counter()
                else:
                    counters.steps += 1
                    counters.drafted += drafted
                    counters.accepted += len(new) - 1
                    self.draft_length.update(drafted, len(new) - 1)
                keep, done = _until_stop(new, eos, max_new - emitted)
                allowed = self.sampling.advance(keep)
                if allowed < len(keep):
                    keep, done, counters.grammar_end = keep[:allowed], True, True
                if split and strategy.pending is not None and not done:
                    records.send(strategy.sample())
                emitted += len(keep)
                sequence += keep
                self.logprobs = self.sampling.logprobs_of(keep)
                if done:
                    self._cut(len(ids), emitted, committed)
                yield keep
            ended = True
        except GeneratorExit:  # the stream was closed: what was fed is valid
            ended = True
            raise
        finally:
            if ended:
                self.prefix.keep(sequence[:self._cut(len(ids), emitted, committed)])
            else:
                self.prefix.forget()

    @property
    def _fed_ahead(self) -> bool:
        """A split step's forward pass fed the last committed token and was not sampled from."""
        return self.choice.split and self.strategies["plain"].pending is not None

    def _cut(self, prompt: int, emitted: int, committed: int) -> int:
        """Cut the store to its valid keys and values (the prompt and the committed tokens, the last
        one once a step fed it; at most the ``emitted`` ones) and return its length."""
        fed = committed - (0 if self.records.in_flight or self._fed_ahead else 1)
        self.kv.truncate(prompt + min(emitted, fed))
        return self.kv.length


def build_decoder(plan: DecodePlan, forward: ForwardPass, kv: KVStore, sampler: Sampler, *,
                  capture: Callable = cuda_graph_capture, who: str = "sampler", prefill_chunk: int | None = None,
                  progress: bool = False, prefix_cache: bool = False) -> Decoder:
    """The Decoder of ``plan`` over the target's ``forward`` pass and ``kv``: the step runner, the
    device loop when the plan's strategy is ``device``, their graphs captured now with ``capture``
    when ``plan.graphs`` (every token count a step can have: 1, and 2 .. 1 + spec_k with a
    proposer; the loop's step per draft length)."""
    graphs = capture if plan.graphs else None
    proposer = plan.proposer
    loop = SpeculativeLoop(forward, kv, proposer, plan.k_values, capture=graphs) if plan.strategy == "device" else None
    steps = StepRunner(forward, kv, proposer.hidden_layers if proposer else (), capture=graphs)
    with torch.inference_mode():
        steps.capture(range(1, min(plan.spec_k + 1, MAX_GRAPH_TOKENS) + 1) if proposer else [1])
    return Decoder(steps, sampler, plan, loop=loop, who=who, prefill_chunk=prefill_chunk, progress=progress,
                   prefix_cache=prefix_cache)


def _finite(token: int, position: int) -> int:
    """``token``, or NumericsError when the step found its logits not finite (token -1)."""
    if token < 0:
        raise NumericsError(f"the logits for position {position} are not finite (NaN or inf): the model's "
                            "weights or activations overflow; nothing was sampled from them")
    return token


def _until_stop(tokens: list[int], eos: frozenset[int], remaining: int) -> tuple[list[int], bool]:
    """The tokens to commit (up to the first EOS and at most ``remaining``) and whether the
    generation is over."""
    for i, token in enumerate(tokens[:remaining]):
        if token in eos:
            return tokens[:i + 1], True
    keep = tokens[:remaining]
    return keep, len(keep) == remaining


__all__ = ["DecodeCounters", "Decoder", "build_decoder", "checked_sample", "prefill"]
