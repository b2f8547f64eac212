"""Plugin ``draft``: speculation by a smaller Qwen3 checkpoint with the target's vocabulary.

``proposer=draft`` loads a second checkpoint (``options.draft.model``; by default the shipped
models/draft beside the shipped models/target) with ``tileinfer.load_model``, built from the same
linear and attention implementations as the target (with their options), on the target's device
and dtype, with a KV store of its own (the run's ``kv_store``, pages of ``kv_page_size``).

It prefills its own cache on the prompt chunk by chunk as the target prefills it (``prompt_chunk``:
one step of at most ``prefill_chunk`` tokens each), and on the first sampled token at ``start``.
Each step it catches up on the tokens the target committed that it has not cached yet (the
target's correction or bonus token, and a last draft it had not fed), then drafts ``k`` tokens one
at a time: greedily (``options.draft.greedy=true``, q one-hot; each argmax fed to the next step on
the device, the host reading the draft once), or drawn from its own distribution
under the target's sampling settings (``greedy=false``: ``Draft.probs`` is q, for the p/q rule).
After the verify step it forgets the drafts the target rejected (``KVStore.truncate``): its cache
always holds a prefix of the committed sequence.

Prefix reuse (``Proposer.begin``): it keeps the positions the target kept that its cache holds for
the same ids (it may lag the target by the tokens it had not caught up on, or stop at its own
context), the target prefilling from there; its prefill continues from there too.

Every step runs through its own ForwardPass (config key ``forward``, as the target's). On a GPU
with ``cuda_graphs`` its steps of up to 16 tokens (the catch-up and each drafted token) are
replayed from CUDA graphs captured when it is built, as the target's are
(``tileinfer.steps.StepRunner``); otherwise, and for its prefill chunks, they run eagerly.

In the device loop (``tileinfer.device_speculation``, greedy generations) it drafts inside the
loop's step with no host state: a catch-up step of 2 tokens, the sequence's last two (positions
``L - 2`` and ``L - 1``: after any step its cache holds the committed sequence up to at least
``L - 3``, and rewriting ``L - 2`` with its own token is harmless), then ``k - 1`` steps of one
token, each argmax fed to the next on the device; its ForwardPass called directly with the
positions on the device (``Step.max_context``), inside the loop's graph. Its KV store is reserved for the
whole generation when the loop starts; the drafts the target rejects lie past the next catch-up.
The loop's steps write from position ``L - 2 >= prompt - 1`` on: the host keeps the record of the
prompt less its last token as the cache a later generation may reuse.
"""

from __future__ import annotations

import torch

import tileinfer
from tileinfer import hookimpl
from tileinfer.errors import ConfigError, TileinferError
from tileinfer.hookspecs import Implementation
from tileinfer.interfaces import DeviceSequence, Draft, ProposerContext, Step
from tileinfer.plugins.proposer_folders import CheckpointProposer, ProposerCheckpoint
from tileinfer.prefix_cache import common_prefix
from tileinfer.steps import MAX_GRAPH_TOKENS, StepRunner, build_forward, cuda_graph_capture


def _same_tokenizer(draft: "tileinfer.Checkpoint", target: "tileinfer.Checkpoint") -> bool:
    """Whether two checkpoints' tokenizers map the same strings to the same ids (true when either
    has none); an unreadable draft tokenizer is a mismatch."""
    try:
        mine = draft.tokenizer
    except TileinferError:
        return False
    theirs = target.tokenizer
    return mine is None or theirs is None or mine.vocab() == theirs.vocab()


class DraftModelProposer(CheckpointProposer):
    """Drafts with a separate, smaller Qwen3 model that has its own KV cache (see the module)."""

    checkpoint = ProposerCheckpoint("draft", "draft model", "a Qwen3 checkpoint with the target's vocabulary",
                                    missing="the shipped draft models/draft is not installed",
                                    read=tileinfer.read_checkpoint)
    declared_options = checkpoint.options(greedy="draft the argmax; false: sample from the draft's distribution "
                                          "with the target's sampling settings (verified by the p/q rule)")

    def __init__(self, context: ProposerContext) -> None:
        super().__init__(context)
        config, target = context.config, context.target
        checkpoint = tileinfer.read_checkpoint(self.folder)
        mc = checkpoint.config
        self._check_matches_target(checkpoint)
        # The draft caches what the target does (prompt, committed tokens, drafts), up to its own context.
        page = config.kv_page_size
        target_positions = min(config.kv_capacity, target.config.max_positions)
        self.capacity = min(-(-target_positions // page) * page, mc.max_positions)
        if config.spec_k + 1 > self.capacity:
            raise ConfigError(f"spec_k={config.spec_k} needs {config.spec_k + 1} positions of the draft's context, "
                              f"but {self.folder} holds {self.capacity} (its context is {mc.max_positions}): "
                              f"lower spec_k")
        if self.capacity < target_positions:
            from tileinfer.notices import notice

            notice(f"the draft model's context ({mc.max_positions} positions) is shorter than the target's "
                   f"({target_positions}): no drafts past position {self.capacity}")
        bundle = tileinfer.load_model(checkpoint, tileinfer.Implementations.of(config, context.registry),
                                      device=target.device, dtype=target.dtype, positions=self.capacity)
        self.model, self.kv = bundle.model, bundle.kv  # an INT8 draft checkpoint runs INT8
        graphs = target.device.type == "cuda" and config.cuda_graphs
        self.forward = build_forward(self.model, config, context.registry)
        self.steps = StepRunner(self.forward, self.kv, capture=cuda_graph_capture if graphs else None, prefill=False)
        with torch.inference_mode():  # the catch-up (1-2 tokens, more after a rollback) and the drafts' steps
            self.steps.capture(range(1, min(config.spec_k + 1, MAX_GRAPH_TOKENS) + 1))
        self._cached: list[int] = []  # the tokens whose keys and values the draft's KV store holds
        self._committed = 0  # how many of them the target has committed
        self._next: torch.Tensor | None = None  # logits [V] after the last cached token, if computed

    def _check_matches_target(self, checkpoint: "tileinfer.Checkpoint") -> None:
        mc, folder, target = checkpoint.config, checkpoint.folder, self.context.target.config
        if mc.vocab_size != target.vocab_size:
            raise ConfigError(f"the draft model {folder} has vocab_size {mc.vocab_size}, the target "
                              f"{target.vocab_size}: a draft model needs the target's vocabulary")
        theirs = self.context.checkpoint or tileinfer.read_checkpoint(tileinfer.model_folder(self.context.config))
        if not _same_tokenizer(checkpoint, theirs):
            raise ConfigError(f"the draft model {folder} has another tokenizer than the target (tokenizer.json "
                              "differs): a draft model needs the target's vocabulary")

    # -- the Proposer interface -----------------------------------------------------------------

    def begin(self, ids: list[int], cached: int) -> int:
        """Keep the cached positions whose ids the draft's cache holds too (its cache cut to them)."""
        keep = common_prefix(self._cached, ids[:cached])
        self.kv.truncate(keep)
        self._cached, self._committed, self._next = self._cached[:keep], 0, None
        return keep

    @torch.inference_mode()
    def prompt_chunk(self, tokens: list[int], start: int, hidden: dict[int, torch.Tensor]) -> None:
        """Prefill the draft on the target's chunk of the prompt, as one step of its own (while its
        context holds it): the draft's activations are bounded by the target's prefill chunk."""
        if start == 0:
            self._forget()
        if len(self._cached) != start or start + len(tokens) > self.capacity:
            return  # past the draft's context: start() finds the prompt too long and drafts nothing
        self.kv.reserve(start + len(tokens))
        ids = torch.tensor(tokens, dtype=torch.int64, device=self.model.device)
        self.forward(ids, Step.at(start, len(tokens), self.model.device), self.kv, last_only=True)
        self._cached += tokens

    @torch.inference_mode()
    def start(self, tokens: list[int]) -> None:
        """Feed the first token after the prompt (if the draft's context holds them both)."""
        if len(tokens) <= self.capacity and self._cached == tokens[:-1]:
            self._feed(tokens[-1:])
            self._committed = len(tokens)
        else:
            self._forget()

    def _forget(self) -> None:
        self.kv.reset()
        self._cached, self._committed, self._next = [], 0, None

    @torch.inference_mode()
    def propose(self, tokens: list[int], k: int) -> Draft:
        k = min(k, self.capacity + 1 - len(tokens))  # the drafts fed back must fit the draft's context
        if k < 1 or self._cached != tokens[:len(self._cached)]:
            return Draft([])  # past the draft's context (or a sequence it was not started on)
        if len(self._cached) < len(tokens) or self._next is None:
            self._feed(tokens[len(self._cached):] or tokens[-1:], rewind=not tokens[len(self._cached):])
        self._committed = len(tokens)
        sampler = self.context.sampler
        if self.options["greedy"] or sampler.greedy:
            return Draft(self._draft_greedy(k))
        drafts, probs = [], []
        for i in range(k):
            q = sampler.probs(self._next[None])
            drafts.append(int(sampler.draw(q)[0]))
            probs.append(q[0])
            if i < k - 1:
                self._feed(drafts[-1:])
        return Draft(drafts, torch.stack(probs))

    def _draft_greedy(self, k: int) -> list[int]:
        """``k`` argmax drafts, each fed back to the next step on the device: the host reads the
        whole draft once, after its last step is enqueued."""
        start, picks = len(self._cached), []
        for i in range(k):
            picks.append(self._next.argmax(-1, keepdim=True))  # [1] int64, before the next step overwrites _next
            if i < k - 1:
                self.kv.reserve(start + i + 1)
                logits, _ = self.steps.forward(picks[-1], start + i)
                self._next = logits[-1]
        drafts = torch.cat(picks).tolist()
        self._cached += drafts[:k - 1]
        return drafts

    def accept(self, tokens: list[int], num_accepted: int, hidden: dict[int, torch.Tensor]) -> None:
        """Keep the cached drafts the target accepted, forget the rest."""
        n, cached = self._committed, self._cached
        while n < len(cached) and n < len(tokens) and cached[n] == tokens[n]:
            n += 1
        if n < len(cached):
            del cached[n:]
            self.kv.truncate(n)
            self._next = None
        self._committed = n

    # -- device drafting ------------------------------------------------------------------------

    def device_drafting(self, positions: int) -> bool:
        return positions <= self.capacity

    def start_on_device(self, seq: DeviceSequence, positions: int) -> None:
        """The prompt is cached (``prompt_chunk``; nothing else is needed). The host-side record of
        the cache keeps the prompt less its last token only (the loop's steps write from there on
        and do not keep it)."""
        self._cached, self._committed, self._next = self._cached[:max(seq.prompt_len - 1, 0)], 0, None
        self.kv.reserve(positions)

    def draft_on_device(self, seq: DeviceSequence, k: int) -> torch.Tensor:
        device, capacity = self.model.device, self.kv.capacity
        positions = seq.length - 2 + torch.arange(2, dtype=torch.int64, device=device)
        ids = seq.tokens.index_select(0, positions).clamp(min=0)
        logits, _ = self.forward(ids, Step(0, 2, positions, max_context=capacity), self.kv, last_only=True)
        picks = [logits[-1].argmax(-1, keepdim=True)]
        for i in range(1, k):  # draft i + 1 after draft i, fed at position L - 1 + i
            step = Step(0, 1, seq.length - 1 + i, max_context=capacity)
            logits, _ = self.forward(picks[-1], step, self.kv)
            picks.append(logits[-1].argmax(-1, keepdim=True))
        return torch.cat(picks)

    # -- steps ----------------------------------------------------------------------------------

    def _feed(self, tokens: list[int], rewind: bool = False) -> None:
        """Run ``tokens`` after the cached ones; keep the logits after the last. ``rewind``: the
        last cached token again (its logits were dropped), overwriting its keys and values."""
        if rewind:
            self.kv.truncate(len(self._cached) - 1)
            del self._cached[-1]
        start = len(self._cached)
        self.kv.reserve(start + len(tokens))
        ids = torch.tensor(tokens, dtype=torch.int64, device=self.model.device)
        if start == 0 or len(tokens) > MAX_GRAPH_TOKENS:  # a prefill: only the last row of logits is needed
            step = Step.at(start, len(tokens), self.model.device)
            logits, _ = self.forward(ids, step, self.kv, last_only=True)
        else:  # the logits may be a graph's static output: read before the next step of as many tokens
            logits, _ = self.steps.forward(ids, start)
        self._cached += tokens
        self._next = logits[-1]


@hookimpl
def tileinfer_implementations() -> list[Implementation]:
    return [Implementation("proposer", "draft", DraftModelProposer,
                           "a smaller Qwen3 draft model with its own KV cache (options.draft.model)")]
