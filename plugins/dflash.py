"""Plugin ``dflash``: speculation by a DFlash block drafter (z-lab's DFlashDraftModel).

``proposer=dflash`` loads a drafter in z-lab's checkpoint format (``options.dflash.model``; by
default the shipped models/dflash beside the shipped models/target; plugins/dflash_checkpoint.py
reads it) and builds it from the run's linear and attention implementations, on the target's
device and dtype, with the target's embedding and lm_head and a KV store of its own (the run's
``kv_store``, pages of ``kv_page_size``). It asks the engine for the outputs of the target layers
``target_layer_ids`` (``hidden_layers``).

As the target commits positions (each prompt chunk, then the kept positions of each verify
step, ``accept``) it caches their context (their hidden states, projected: the context step of
plugins/dflash_model.py). Each ``propose`` runs one non-causal pass over the block ``[newest
token, MASK x (B-1)]`` at the next B positions (the block step) and proposes the first
``k <= B - 1`` of its B - 1 predictions: the argmax (``options.dflash.greedy=true``, q one-hot),
or drawn from each position's distribution under the target's sampling settings
(``greedy=false``: ``Draft.probs`` is q, for the p/q rule; the positions are independent
marginals, a valid but less coherent proposal). The block's keys and values are dropped at once,
so the store holds the context of committed positions only: what the target rejects never
reaches it (the hidden states ``accept`` gets are those of the kept positions).

Prefix reuse (``Proposer.begin``): it records the ids of the positions whose context it holds (the
context of a position is the target's hidden states there, set by the ids up to it) and keeps the
positions the target kept that it holds for the same ids, the target prefilling from there; the
new chunks' context extends it.

Its block step runs through a ForwardPass over the drafter (config key ``forward``, as the
target's steps). On a GPU with ``cuda_graphs`` both steps are replayed from CUDA graphs captured
when it is built (plugins/dflash_steps.py: the block step, and the context step of each row
count a verify step can keep, 1 to ``spec_k + 1``); prompt chunks of more than 16 positions run
eagerly.

It drafts on the device (``Proposer.draft_on_device``) for the device-resident speculative loop
(``tileinfer.device_speculation``) when its block has at most 16 positions: the block step after
the sequence's last token, read from the device sequence, with its positions from the device
length; after the verify step the context step over all its ``k + 1`` rows. Nothing is truncated
there: the rows the target rejected, and the block's keys and values, lie at or after the next
block's first position, which rewrites them before any query reads them (every attention reads
keys up to its queries' positions only), so each block sees the context of exactly the committed
positions, as in sequential decoding. The loop writes from the prompt's end on: the host's record keeps the
prompt's context for a later generation.
"""

from __future__ import annotations

import dataclasses

import torch

import tileinfer
from tileinfer import hookimpl
from tileinfer.errors import ConfigError
from tileinfer.hookspecs import Implementation
from tileinfer.interfaces import DeviceSequence, Draft, ProposerContext
from tileinfer.plugins.dflash_checkpoint import DFlashConfig
from tileinfer.plugins.proposer_folders import CheckpointProposer, ProposerCheckpoint
from tileinfer.prefix_cache import common_prefix
from tileinfer.steps import MAX_GRAPH_TOKENS, build_forward, cuda_graph_capture


class DFlashProposer(CheckpointProposer):
    """Drafts up to B - 1 tokens a step with one non-causal pass of a DFlash drafter (see the module)."""

    checkpoint = ProposerCheckpoint("dflash", "DFlash drafter", "a drafter in z-lab's format trained for the target",
                                    missing="the shipped drafter models/dflash is not installed "
                                            "(models/train_dflash.py makes it)",
                                    read=DFlashConfig.from_folder)
    declared_options = checkpoint.options(greedy="propose the argmax of each block position; false: sample each "
                                          "position with the target's sampling settings (verified by the p/q rule)")

    def __init__(self, context: ProposerContext) -> None:
        super().__init__(context)
        from tileinfer.plugins.dflash_model import DFlashDrafter

        config, target, folder = context.config, context.target, self.folder
        dc = DFlashConfig.from_folder(folder)
        dc.check_target(target.config, folder)
        self.block_size = block = dc.block_size
        if config.spec_k > block - 1:
            raise ConfigError(f"spec_k={config.spec_k} is more than the DFlash drafter {folder} proposes: its block of "
                              f"{block} positions proposes at most {block - 1} tokens (set spec_k <= {block - 1})")
        self.mask_token_id = dc.mask_token_id
        self.hidden_layers = dc.target_layer_ids
        # The context of every committed position the target holds, and a block after it.
        page = config.kv_page_size
        target_positions = min(config.kv_capacity, target.config.max_positions)
        self.capacity = min(-(-(target_positions + block) // page) * page, dc.model.max_positions)
        if self.capacity < target_positions:  # (within the target's last block: a few drafts fewer, no notice)
            from tileinfer.notices import notice

            notice(f"the DFlash drafter's context ({dc.model.max_positions} positions) is shorter than the target's "
                   f"({target_positions}): no drafts past position {self.capacity - block}")
        implementations = tileinfer.Implementations.of(config, context.registry)
        positions = implementations.pool_positions(self.capacity)
        h = dc.model.hidden_size
        implementations.check_fits(  # fc [H, K*H] in the embedding's place
            dataclasses.replace(dc.model, vocab_size=len(dc.target_layer_ids) * h, tie_word_embeddings=True),
            device=target.device, dtype=target.dtype, positions=positions)
        head = target.embed if target.config.tie_word_embeddings else self._target_head()
        with tileinfer.open_weights(folder, dc, device=target.device, dtype=target.dtype) as weights:
            self.model = DFlashDrafter.build(dc, weights.tensor, implementations.backend(), embed=target.embed,
                                             head_weight=head, positions=positions)
        self.kv = implementations.kv(dc.model, device=target.device, dtype=target.dtype, positions=positions,
                                     key_norm_weights=self.model.key_norm_weights())
        from tileinfer.plugins.dflash_steps import DFlashSteps

        graphs = target.device.type == "cuda" and config.cuda_graphs
        self.steps = DFlashSteps(self.model, self.kv, block, self.mask_token_id,
                                 forward=build_forward(self.model, config, context.registry),
                                 capture=cuda_graph_capture if graphs else None)
        with torch.inference_mode():
            self.steps.capture_graphs(range(1, config.spec_k + 2))
        self._ids: list[int] = []  # the ids of the positions whose context the KV store holds

    def _target_head(self) -> torch.Tensor:
        """An untied target's lm_head weight, read again from its checkpoint (a Linear may keep its
        weight repacked or quantized; this costs one more [V, H] tensor)."""
        target, context = self.context.target, self.context
        checkpoint = context.checkpoint or tileinfer.read_checkpoint(tileinfer.model_folder(context.config))
        with checkpoint.tensors(target.device, target.dtype) as weights:
            return weights.tensor("lm_head.weight")

    # -- the Proposer interface -----------------------------------------------------------------

    @property
    def _absorbed(self) -> int:
        """The positions whose context the KV store holds."""
        return len(self._ids)

    def begin(self, ids: list[int], cached: int) -> int:
        """Keep the cached positions whose context it holds for the same ids (its store cut to them)."""
        keep = common_prefix(self._ids, ids[:cached])
        self.kv.truncate(min(keep, self.kv.length))
        del self._ids[keep:]
        return keep

    @torch.inference_mode()
    def prompt_chunk(self, tokens: list[int], start: int, hidden: dict[int, torch.Tensor]) -> None:
        """A chunk of the prompt: its hidden states are context to cache (``start == 0``: a new generation)."""
        if start == 0:
            self.kv.reset()
            self._ids = []
        self._take(tokens, start, hidden)

    @torch.inference_mode()
    def start(self, tokens: list[int], hidden: dict[int, torch.Tensor] | None = None) -> None:
        """The prompt is prefilled (its context cached, chunk by chunk). ``hidden`` (the whole
        prompt's hidden states, from a decoder that does not call ``prompt_chunk``) starts a new
        generation with them."""
        if hidden is not None:
            self.prompt_chunk(tokens[:-1], 0, hidden)

    @torch.inference_mode()
    def propose(self, tokens: list[int], k: int) -> Draft:
        s = len(tokens) - 1  # the newest token is committed, not yet run by the target
        k = min(k, self.block_size - 1)
        if k < 1 or self._absorbed != s or s + self.block_size > self.capacity:
            return Draft([])  # past the drafter's context (or a sequence it was not started on)
        self.kv.reserve(s + self.block_size)
        logits, picks = self.steps.block(tokens[-1], s)
        self.kv.truncate(s)  # the block's keys and values go; the context stays
        sampler = self.context.sampler
        if self.options["greedy"] or sampler.greedy:
            return Draft(picks[:k].tolist())
        q = sampler.probs(logits[:k])
        return Draft(sampler.draw(q).tolist(), q)

    @torch.inference_mode()
    def accept(self, tokens: list[int], num_accepted: int, hidden: dict[int, torch.Tensor]) -> None:
        """The kept positions' hidden states become context for the next pass."""
        rows = next(iter(hidden.values())).shape[0] if hidden else 0
        start = len(tokens) - 1 - rows
        self._take(tokens[start:start + rows], start, hidden)

    def _take(self, ids: list[int], start: int, hidden: dict[int, torch.Tensor]) -> None:
        """Cache the context of positions ``start ..`` (``ids`` there; ``hidden``: their hidden
        states) if they follow the cached ones and a block still fits after them."""
        rows = next(iter(hidden.values())).shape[0] if hidden else 0
        if rows and start == self._absorbed and start + rows + self.block_size <= self.capacity:
            self.kv.reserve(start + rows)
            self.steps.context(hidden, start)
            self._ids += ids[:rows]

    # -- device drafting (the device-resident speculative loop) ----------------------------------

    def device_drafting(self, positions: int) -> bool:
        """A block of at most 16 positions (the attention's small-step path, which reads positions
        from the device) and room for a block after the sequence's last position."""
        return self.block_size <= MAX_GRAPH_TOKENS and positions + self.block_size <= self.capacity

    def start_on_device(self, seq: DeviceSequence, positions: int) -> None:
        """The prompt's context is cached (``prompt_chunk``); reserve the pages of every position
        the loop's blocks can reach. The loop writes from the prompt's end on: the host's record
        keeps the prompt's positions only."""
        del self._ids[seq.prompt_len:]
        self.kv.reserve(min(positions + self.block_size, self.capacity))

    def draft_on_device(self, seq: DeviceSequence, k: int) -> torch.Tensor:
        """The block step at ``length - 1`` after ``tokens[length - 1]``, its first ``k`` argmax
        rows. Its keys and values stay in the store: the next context step rewrites the kept
        positions, the next block step the others, before any query reads them."""
        start = seq.length - 1
        self.steps.set_block(seq.tokens.index_select(0, start).clamp(min=0), start)
        _, picks = self.steps.step_block(0, replayed=True)
        return picks[:k]

    def accept_on_device(self, seq: DeviceSequence, committed: torch.Tensor,
                         hidden: dict[int, torch.Tensor]) -> None:
        """The context step over all ``k + 1`` rows of the verify step at its positions (from
        ``length - committed - 1``): the kept rows become context; the others lie at or after the
        next block's first position, which rewrites them before any query reads them."""
        n = self.steps.set_context(hidden, seq.length - committed - 1)
        self.steps.step_context(n, 0, replayed=True)


@hookimpl
def tileinfer_implementations() -> list[Implementation]:
    return [Implementation("proposer", "dflash", DFlashProposer,
                           "a DFlash block drafter on the target's hidden states (options.dflash.model, z-lab format)")]
