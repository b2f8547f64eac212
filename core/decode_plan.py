"""Which decoding strategy runs, under which host-sync policy: the one place that decides.

Strategies (``tileinfer.strategies``): ``plain`` (one sampled token a step), ``host`` (speculative,
drafts made on the host by the proposer, verified in one step), ``device`` (speculative, drafted,
verified and accepted on the device: ``tileinfer.device_speculation``). Policies: eager (the host
reads each step's record before it enqueues the next step) or one step behind (``ahead``: the next
step is enqueued before the last one's record is read, so that the device never waits for the
host; the step enqueued after a stop is discarded). Under a grammar plain decoding may run split
(``split``): the next step's forward pass is enqueued before the last token is read, its mask
(which follows that token) and sampling after, so that the device runs the forward pass while the
host advances the grammar and computes the mask.

``DecodePlan.from_config`` reads the resolved config once, when the engine is built: ``pipelined``
on a CUDA device puts the host one step behind, for plain decoding and, with a proposer that
drafts on the device (``Proposer.draft_on_device``) and ``spec_k`` of at most 15, for the device
loop; a proposer that drafts on the host only is verified eagerly. Each key that cannot apply says
why in one notice. ``DecodePlan.choose`` then answers per generation, from its own settings: a
generation that asks for logprobs is read eagerly (the host reads each step's logits), one with a
grammar runs plain decoding split, or host drafting (the grammar cuts the drafts); the device loop takes
greedy generations without history-using penalties, logprobs, logit_bias or a grammar whose tokens
and run-ahead fit the KV store and the proposer's reach, the others fall back to host drafting. A
fallback carries its reason. The loop that ran is named in the stats (``decode_loop``): ``LOOPS``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tileinfer.device_speculation import MAX_DRAFT, drafts_on_device, loop_room
from tileinfer.interfaces import Proposer, Sampler
from tileinfer.notices import notice

STRATEGIES = ("plain", "host", "device")
LOOPS = {("plain", False, False): "sequential", ("plain", True, False): "pipelined",
         ("plain", True, True): "pipelined-grammar", ("host", False, False): "speculative-sequential",
         ("device", True, False): "speculative-device"}


@dataclass(frozen=True)
class Choice:
    """The strategy and policy of one generation; ``split``: the forward pass of a plain step is
    enqueued before the last token is read, its mask and sampling after (a grammar's, ``ahead``
    only); ``reason``: why the plan's own did not apply (empty when it did)."""

    strategy: str
    ahead: bool
    reason: str = ""
    split: bool = False

    @property
    def loop(self) -> str:
        """The name the stats give it (``GenerationStats.decode_loop``)."""
        return LOOPS[(self.strategy, self.ahead, self.split)]


@dataclass(frozen=True)
class DecodePlan:
    """What the engine decodes with (see the module). ``strategy`` and ``ahead`` form a key of
    ``LOOPS``; ``graphs``: steps replayed from CUDA graphs; ``spec_k`` drafts a step (at most;
    ``adaptive``: from 1 to ``spec_k``, ``tileinfer.speculative.DraftLength``); ``proposer`` the
    engine's (None without speculation)."""

    strategy: str = "plain"
    ahead: bool = False
    graphs: bool = False
    spec_k: int = 0
    adaptive: bool = False
    proposer: Proposer | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if (self.strategy, self.ahead, False) not in LOOPS:
            raise ValueError(f"no decode loop runs strategy {self.strategy!r} with ahead={self.ahead}; "
                             f"valid: {sorted(key[:2] for key in LOOPS if not key[2])}")
        if (self.strategy != "plain") != (self.proposer is not None):
            raise ValueError(f"strategy {self.strategy!r} with proposer {self.proposer!r}")

    @classmethod
    def from_config(cls, config, proposer: Proposer | None, device: torch.device) -> "DecodePlan":
        """The plan of the resolved ``config`` (keys ``pipelined``, ``cuda_graphs``, ``spec_k``,
        ``spec_adaptive``) with ``proposer`` on ``device``; a notice for each key with no effect."""
        cuda = device.type == "cuda"
        gpu_only = [key for key in ("cuda_graphs", "pipelined") if getattr(config, key)]
        if gpu_only and not cuda:
            verb = "has" if len(gpu_only) == 1 else "have"
            notice(f"{' and '.join(gpu_only)} {verb} no effect on device {device.type} (CUDA graphs and "
                   "host/GPU overlap need a GPU)")
        ahead = config.pipelined and cuda
        strategy = "plain" if proposer is None else "host"
        if ahead and proposer is not None:
            if not drafts_on_device(proposer):
                notice(f"pipelined does not apply with proposer={config.proposer} (it drafts on the host only, "
                       "which needs each verify result before it drafts); decoding sequentially")
            elif config.spec_k > MAX_DRAFT:
                notice(f"pipelined does not apply with spec_k={config.spec_k} (the device-resident loop verifies at "
                       f"most {MAX_DRAFT + 1} tokens a step); decoding sequentially")
            else:
                strategy = "device"
        return cls(strategy, ahead and strategy != "host", config.cuda_graphs and cuda, config.spec_k,
                   config.spec_adaptive, proposer)

    @property
    def k_values(self) -> list[int]:
        """The draft lengths a step may take."""
        return list(range(1, self.spec_k + 1)) if self.adaptive else [self.spec_k]

    def choose(self, sampler: Sampler, prompt_len: int, max_new: int, logprobs: int | None,
               capacity: int, *, logit_bias: bool = False, grammar: bool = False) -> Choice:
        """The strategy and policy of a generation of ``max_new`` tokens after ``prompt_len`` with
        ``sampler``'s current params, ``logprobs`` (None: not asked for), over a KV store of
        ``capacity`` positions; ``logit_bias``: the sampler adds a bias to the logits; ``grammar``:
        a grammar masks each step's tokens, computed on the host from the tokens committed before
        (plain decoding: split when ``ahead``)."""
        if self.strategy == "plain":
            if self.ahead and logprobs is not None:
                return Choice("plain", False, "logprobs: the host reads each step's logits before the next step")
            if self.ahead and grammar:
                return Choice("plain", True, split=True)
            return Choice("plain", self.ahead)
        if self.strategy == "host":
            return Choice("host", False)
        why = []
        if not sampler.greedy:
            why.append("a sampled generation (the device loop verifies greedily)")
        if sampler.uses_history:
            why.append("a penalty that reads the token history (the device loop keeps none)")
        if logprobs is not None:
            why.append("logprobs (the host reads each step's logits)")
        if logit_bias:
            why.append("logit_bias (the device loop verifies with the raw argmax)")
        if grammar:
            why.append("a grammar (its mask is computed on the host from each step's committed tokens)")
        room = loop_room(prompt_len, max_new, max(self.k_values))
        if room > capacity:
            why.append(f"the prompt, the reply and the loop's run-ahead need {room} positions, the KV store "
                       f"holds {capacity}")
        elif not self.proposer.device_drafting(room):
            why.append(f"the proposer cannot draft on the device up to position {room}")
        return Choice("host", False, "; ".join(why)) if why else Choice("device", True)


__all__ = ["Choice", "DecodePlan", "LOOPS", "STRATEGIES"]
