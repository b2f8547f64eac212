"""The token-mask stage of sampling: a generation's grammar matcher, and the masks of a step's rows.

``Matcher`` (one per generation, ``tileinfer.structured.GrammarCompiler.matcher``) follows the
committed tokens: ``accept(token)`` advances it (False: the grammar rejects the token, nothing
changes), ``rollback(n)`` undoes the last ``n`` accepted tokens, ``mask(bitmask, row)`` writes the
tokens allowed next into a row of a packed bitmask (bit ``t % 32`` of int32 word ``t // 32``) and
says whether any is, ``is_terminated()`` is true once a stop token completed the grammar. Stop
tokens are allowed only where the grammar can end. With ``after``, every token is allowed and
nothing is checked until the output's bytes contain the marker; the constraint then starts right
after it (bytes of the same token after the marker are the grammar's first input).

``TokenMask`` is what ``tileinfer.sampling_step.SamplingStep`` applies before its sampler sees
the logits (so before penalties, temperature and the truncations, for every sampler): row ``i``
of a step follows the committed tokens and the first ``i`` drafts staged for it; the masks are
computed on the host (while the device runs the step: the logits are not read) and applied on the
device, the disallowed logits set to ``-inf`` in a copy (the raw logits stay for logprobs). A row
where the grammar allows nothing (a dead end) is left unmasked: the token sampled there is
rejected when committed, which ends the generation (finish reason ``"grammar"``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Sequence

import torch

MAX_ROLLBACK = 64  # tokens a matcher can undo (a verify step's drafts: spec_k is at most 16)


class Matcher:
    """The grammar state of one generation over ``compiled`` (an xgrammar ``CompiledGrammar``) for
    an lm_head of ``vocab_size`` rows; ``stop_tokens`` end the generation where the grammar is
    complete; ``after`` and ``token_bytes`` (each token's bytes): see the module."""

    def __init__(self, compiled, stop_tokens: Collection[int], vocab_size: int, *, after: str | None = None,
                 token_bytes: Sequence[bytes] | None = None) -> None:
        import xgrammar as xgr

        assert after is None or token_bytes is not None, "the after marker is looked for in the tokens' bytes"
        stops = sorted(stop_tokens)
        self._matcher = xgr.GrammarMatcher(compiled, override_stop_tokens=stops or None,
                                           terminate_without_stop_token=not stops)
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        self.marker = after.encode() if after else b""
        self.token_bytes = token_bytes
        self.active = not self.marker
        self._tail = b""  # the output's last bytes, while the marker is looked for
        self._undo: deque[tuple] = deque(maxlen=MAX_ROLLBACK)  # per accepted token: how to undo it

    def accept(self, token: int) -> bool:
        """Advance by ``token``; False (and no change) when the grammar does not allow it."""
        if self.active:
            if not self._matcher.accept_token(token):
                return False
            self._undo.append(("grammar", 1))
            return True
        text = self._tail + bytes(self.token_bytes[token]) if 0 <= token < len(self.token_bytes) else self._tail
        at = text.find(self.marker)
        if at < 0:
            self._undo.append(("before", self._tail))
            self._tail = text[len(text) - len(self.marker) + 1:] if len(self.marker) > 1 else b""
            return True
        rest = text[at + len(self.marker):]
        if rest and not self._matcher.accept_string(rest):
            return False
        self._undo.append(("start", self._tail, 1 if rest else 0))
        self.active, self._tail = True, b""
        return True

    def rollback(self, n: int) -> None:
        """Undo the last ``n`` accepted tokens (at most ``MAX_ROLLBACK``)."""
        assert 0 <= n <= len(self._undo), f"cannot roll back {n} tokens, {len(self._undo)} kept"
        steps = 0
        for _ in range(n):
            entry = self._undo.pop()
            if entry[0] == "grammar":
                steps += 1
            elif entry[0] == "before":
                self._tail = entry[1]
            else:  # the token that completed the marker: back to looking for it
                steps += entry[2]
                if steps:
                    self._matcher.rollback(steps)
                steps, self.active, self._tail = 0, False, entry[1]
        if steps:
            self._matcher.rollback(steps)

    def is_terminated(self) -> bool:
        """Whether a stop token (or, without stop tokens, the end of the grammar) ended it."""
        return self.active and self._matcher.is_terminated()

    def mask(self, bitmask: torch.Tensor, row: int = 0) -> bool:
        """Write the tokens allowed next into ``bitmask[row]`` (int32 on the CPU, ``words`` wide)
        and return whether any is (False: a dead end)."""
        if not self.active:
            bitmask[row].fill_(-1)
            return True
        self._matcher.fill_next_token_bitmask(bitmask, row)
        return bool(bitmask[row].any())

    def admissible(self, tokens: Sequence[int]) -> int:
        """How many of ``tokens``, in order, the grammar accepts from here (the state unchanged)."""
        count = 0
        for token in tokens:
            if not self.accept(token):
                break
            count += 1
        self.rollback(count)
        return count


class TokenMask:
    """Masks the logits of one generation's steps with ``matcher`` on ``device``."""

    def __init__(self, matcher: Matcher, device: torch.device) -> None:
        self.matcher, self.device = matcher, torch.device(device)
        self._host = torch.zeros(0, matcher.words, dtype=torch.int32)
        self._bits = torch.arange(32, dtype=torch.int32, device=self.device)

    def _buffer(self, rows: int) -> torch.Tensor:
        if self._host.shape[0] < rows:
            host = torch.zeros(rows, self.matcher.words, dtype=torch.int32)
            self._host = host.pin_memory() if self.device.type == "cuda" else host
        return self._host[:rows]

    def apply(self, logits: torch.Tensor, drafts: Sequence[int] = ()) -> torch.Tensor:
        """``logits`` ``[T, V]`` with each row's disallowed tokens at ``-inf`` (a copy); row ``i``
        follows the committed tokens and ``drafts[:i]``, which the grammar accepts."""
        rows = logits.shape[0]
        bitmask = self._buffer(rows)
        matcher, accepted = self.matcher, 0
        for row in range(rows):
            if not matcher.mask(bitmask, row):
                bitmask[row].fill_(-1)  # a dead end: whatever is sampled is rejected when committed
            if row < rows - 1 and row < len(drafts):
                assert matcher.accept(drafts[row]), "drafts are cut where the grammar rejects them"
                accepted += 1
        matcher.rollback(accepted)
        words = bitmask.to(self.device, non_blocking=True)
        allowed = (words.unsqueeze(-1) >> self._bits).bitwise_and_(1).view(rows, -1).bool()
        vocab = logits.shape[-1]
        if allowed.shape[-1] < vocab:  # rows of the lm_head past the matcher's vocabulary: never allowed
            allowed = torch.nn.functional.pad(allowed, (0, vocab - allowed.shape[-1]))
        return logits.masked_fill(~allowed[:, :vocab], float("-inf"))


__all__ = ["MAX_ROLLBACK", "Matcher", "TokenMask"]
