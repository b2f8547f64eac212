"""Plugin ``dflash``: speculation by a DFlash block drafter (z-lab's DFlashDraftModel).

``proposer=dflash`` loads a drafter in z-lab's checkpoint format (``options.dflash.model``; by
default the shipped models/dflash beside the shipped models/target; plugins/dflash_checkpoint.py
reads it) and builds it from the run's linear and attention implementations, on the target's
device and dtype, with the target's embedding and lm_head and a KV store of its own (the run's
``kv_store``, pages of ``kv_page_size``). It asks the engine for the outputs of the target layers
``target_layer_ids`` (``hidden_layers``).

Each step (plugins/dflash_model.py) it caches the context of the positions the target committed
since the last step (their hidden states, projected), then runs one non-causal pass over the block
``[newest token, MASK x (B-1)]`` at the next B positions and proposes the first ``k <= B - 1`` of
its B - 1 predictions: the argmax (``options.dflash.greedy=true``, q one-hot), or drawn from each
position's distribution under the target's sampling settings (``greedy=false``: ``Draft.probs`` is
q, for the p/q rule; the positions are independent marginals, a valid but less coherent
proposal). The block's keys and values are dropped at once, so the store holds the context of
committed positions only: what the target rejects never reaches it (the hidden states ``accept``
gets are those of the kept positions).

Its passes run eagerly; replaying them from CUDA graphs is future work.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from tileinfer import hookimpl
from tileinfer.errors import ConfigError
from tileinfer.hookspecs import Implementation
from tileinfer.interfaces import Draft, KVGeometry, Proposer, ProposerContext, RunSpec
from tileinfer.options import Option
from tileinfer.plugins.dflash_checkpoint import DFlashConfig
from tileinfer.plugins.proposer_folders import folder_problems, proposer_folder


def dflash_folder(model: str, config) -> Path:
    """The drafter folder: ``model``, or the shipped drafter when ``model`` is empty and the target
    is the shipped model; a one-line ConfigError otherwise."""
    return proposer_folder(model, config, proposer="dflash", noun="DFlash drafter",
                           needs="a z-lab DFlash drafter of the target",
                           missing="the shipped drafter models/dflash is not installed "
                                   "(models/train_dflash.py makes it)")


class DFlashProposer(Proposer):
    """Drafts up to B - 1 tokens a step with one non-causal pass of a DFlash drafter (see the module)."""

    declared_options = (
        Option("model", str, "", "DFlash drafter folder in z-lab's format, trained for the target (empty: the "
               "shipped models/dflash, when the target is the shipped model)"),
        Option("greedy", bool, True, "propose the argmax of each block position; false: sample each position "
               "with the target's sampling settings (verified by the p/q rule)"),
    )

    @classmethod
    def incompatibilities(cls, run: RunSpec) -> list[str]:
        """What can be checked without the target: the drafter folder, when named, holds a DFlash config."""
        return folder_problems(run.options["model"], proposer="dflash", noun="DFlash drafter",
                               read=DFlashConfig.from_folder)

    def __init__(self, context: ProposerContext) -> None:
        super().__init__(context)
        from tileinfer.loading import CheckpointReader
        from tileinfer.memory import check_fits
        from tileinfer.model import Backend
        from tileinfer.plugins.dflash_model import DFlashDrafter
        from tileinfer.resolution import implementation_options

        config, registry, target = context.config, context.registry, context.target
        self.folder = folder = dflash_folder(self.options["model"], config)
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
        num_pages = -(-self.capacity // page)
        kv_class = registry.get("kv_store", config.kv_store)
        h = dc.model.hidden_size
        check_fits(dataclasses.replace(dc.model, vocab_size=len(dc.target_layer_ids) * h, tie_word_embeddings=True),
                   device=target.device, dtype=target.dtype, quantize=config.quantize, positions=num_pages * page,
                   storage=kv_class.storage)  # fc [H, K*H] in the embedding's place
        backend = Backend(registry.get("linear", config.linear), registry.get("attention", config.attention),
                          config.quantize, implementation_options(config, "linear", registry),
                          implementation_options(config, "attention", registry))
        head = target.embed if target.config.tie_word_embeddings else self._target_head()
        reader = CheckpointReader(folder, dc, target.device, target.dtype)
        self.model = DFlashDrafter.build(dc, reader.tensor, backend, embed=target.embed, head_weight=head,
                                         positions=num_pages * page)
        reader.close()
        m = dc.model
        geometry = KVGeometry(m.num_layers, m.num_kv_heads, m.head_dim, page, num_pages, target.dtype)
        self.kv = kv_class(geometry, target.device, key_norm_weights=self.model.key_norm_weights(),
                           options=implementation_options(config, "kv_store", registry))
        self._absorbed = 0  # positions whose context the KV store holds
        self._pending: list[torch.Tensor] = []  # projected hidden states of the positions after them
        self._pending_rows = 0

    def _target_head(self) -> torch.Tensor:
        """An untied target's lm_head weight, read again from its checkpoint (a Linear may keep its
        weight repacked or quantized; this costs one more [V, H] tensor)."""
        from tileinfer.engine import model_folder
        from tileinfer.loading import CheckpointReader

        target = self.context.target
        reader = CheckpointReader(model_folder(self.context.config), target.config, target.device, target.dtype)
        try:
            return reader.tensor("lm_head.weight")
        finally:
            reader.close()

    # -- the Proposer interface -----------------------------------------------------------------

    @torch.inference_mode()
    def prompt_chunk(self, tokens: list[int], start: int, hidden: dict[int, torch.Tensor]) -> None:
        """A chunk of the prompt: its hidden states are context to cache (``start == 0``: a new generation)."""
        if start == 0:
            self.kv.reset()
            self._absorbed, self._pending, self._pending_rows = 0, [], 0
        self._take(hidden)

    @torch.inference_mode()
    def start(self, tokens: list[int], hidden: dict[int, torch.Tensor] | None = None) -> None:
        """The prompt is prefilled: its context waits for the first pass (``propose``). ``hidden``
        (the whole prompt's hidden states, from a decoder that does not call ``prompt_chunk``)
        starts a new generation with them."""
        if hidden is not None:
            self.prompt_chunk(tokens[:-1], 0, hidden)

    @torch.inference_mode()
    def propose(self, tokens: list[int], k: int) -> Draft:
        s = len(tokens) - 1  # the newest token is committed, not yet run by the target
        k = min(k, self.block_size - 1)
        if k < 1 or self._absorbed + self._pending_rows != s or s + self.block_size > self.capacity:
            return Draft([])  # past the drafter's context (or a sequence it was not started on)
        embed = self.model.embed
        context = torch.cat(self._pending) if self._pending else embed.new_zeros(0, embed.shape[1])
        block = torch.tensor([tokens[-1]] + [self.mask_token_id] * (self.block_size - 1), dtype=torch.int64,
                             device=self.model.device)
        logits = self.model.forward(context, block, self._absorbed, self.kv)[:k]
        self.kv.truncate(s)  # the block's keys and values go; the context stays
        self._absorbed, self._pending, self._pending_rows = s, [], 0
        sampler = self.context.sampler
        if self.options["greedy"] or sampler.greedy:
            return Draft(logits.argmax(-1).tolist())
        q = sampler.probs(logits)
        return Draft(sampler.draw(q).tolist(), q)

    @torch.inference_mode()
    def accept(self, tokens: list[int], num_accepted: int, hidden: dict[int, torch.Tensor]) -> None:
        """The kept positions' hidden states become context for the next pass."""
        self._take(hidden)

    def _take(self, hidden: dict[int, torch.Tensor]) -> None:
        rows = next(iter(hidden.values())).shape[0] if hidden else 0
        if rows:
            self._pending.append(self.model.project(hidden))
            self._pending_rows += rows


@hookimpl
def tileinfer_implementations() -> list[Implementation]:
    return [Implementation("proposer", "dflash", DFlashProposer,
                           "a DFlash block drafter on the target's hidden states (options.dflash.model, z-lab format)")]
