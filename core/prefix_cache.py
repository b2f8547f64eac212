"""Prefix reuse: what the last generation left in the KV store serves the next prompt that starts with it.

The engine runs one sequence; after a generation its KV store holds the keys and values of the
prompt and of the new tokens that were fed to a step (``tileinfer.decoding``). ``PrefixCache``
remembers those token ids. A new prompt keeps the longest common prefix of them and itself, less
one token when the prompt is all cached (the first logits come from a real step), and the store is
truncated to it; the prefill runs from there. Nothing is kept beyond the store's own pages, so the
memory is bounded by the KV pool, as llama.cpp's prompt cache is.

Exact: the positions kept hold the keys and values a cold prefill of those tokens writes (the same
tokens at the same positions, causal attention), so greedy decoding gives the cold prefill's tokens
(up to the kernels' rounding, which does not depend on the step that wrote a position in the tests).

The ids are trusted only while the store is as the generation left it: any ``reserve`` or
``truncate`` by another caller (``KVStore.version``) or a generation that did not end in order
(an error) makes the next prompt prefill cold.

A generation may carry a salt (``SamplingParams.cache_salt``, vLLM's ``cache_salt``): what it leaves
serves only a generation with the same salt (None: the unsalted ones), so that a client cannot tell
from the time to its first token (or from ``cached_tokens``) whether another client's prompt started
like its own.
"""

from __future__ import annotations

from collections.abc import Sequence

from tileinfer.interfaces import KVStore


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The number of leading token ids ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class PrefixCache:
    """The token ids whose keys and values ``kv`` holds at positions ``0 ..`` after the last
    generation, and that generation's salt (``enabled=False``: none are kept; every prompt
    prefills from position 0)."""

    def __init__(self, kv: KVStore, enabled: bool = True) -> None:
        self.kv, self.enabled = kv, enabled
        self.ids: list[int] = []
        self.salt: str | None = None
        self._version = -1

    def start(self, ids: Sequence[int], reuse: bool = True, salt: str | None = None) -> int:
        """A generation of the prompt ``ids`` (at least one token) salted with ``salt`` begins: the
        store is cut to the positions it can keep (reset when none: ``reuse=False``, or another
        salt than the last generation's) and the number of them is returned; the prompt's tokens
        from there are to be prefilled. Until ``keep`` the cache holds nothing."""
        cached, self.ids = self.ids, []
        same_salt, self.salt = self.salt == salt, salt
        valid = self.enabled and reuse and same_salt and self._version == self.kv.version \
            and len(cached) == self.kv.length
        start = min(common_prefix(cached, ids), len(ids) - 1) if valid else 0
        if start:
            self.kv.truncate(start)
        else:
            self.kv.reset()
        return start

    def keep(self, ids: Sequence[int]) -> None:
        """The generation ended in order: the store holds ``ids`` at positions ``0 .. len(ids) - 1``
        (its length is ``len(ids)``), for the next generation with its salt."""
        assert len(ids) == self.kv.length, "the cached ids are the store's positions"
        if self.enabled:
            self.ids, self._version = list(ids), self.kv.version

    def forget(self) -> None:
        """Nothing reusable (the next prompt prefills cold)."""
        self.ids = []


__all__ = ["PrefixCache", "common_prefix"]
