"""Plugin ``ngram``: prompt-lookup speculation, no model of its own."""

from __future__ import annotations

from tileinfer import hookimpl
from tileinfer.backends.reference.ngram import ngram_lookup
from tileinfer.hookspecs import Implementation
from tileinfer.interfaces import Draft, Proposer


class NgramProposer(Proposer):
    """Matches the longest suffix of ``n_max`` down to ``n_min`` tokens earlier in the context and
    proposes the tokens that followed it (deterministic: ``q`` is one-hot)."""

    default_options = {"n_min": 1, "n_max": 4}

    def propose(self, tokens: list[int], k: int) -> Draft:
        return Draft(ngram_lookup(tokens, self.options["n_min"], self.options["n_max"], k))


@hookimpl
def tileinfer_implementations() -> list[Implementation]:
    return [Implementation("proposer", "ngram", NgramProposer, "n-gram lookup in the context (prompt lookup)")]
