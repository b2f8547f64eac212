"""Plugin ``ngram``: prompt-lookup speculation, no model of its own."""

from __future__ import annotations

from tileinfer import hookimpl
from tileinfer.backends.reference.ngram import ngram_lookup
from tileinfer.hookspecs import Implementation
from tileinfer.interfaces import Draft, Proposer, RunSpec
from tileinfer.options import Option


class NgramProposer(Proposer):
    """Matches the longest suffix of ``n_max`` down to ``n_min`` tokens earlier in the context and
    proposes the tokens that followed it (deterministic: ``q`` is one-hot)."""

    declared_options = (
        Option("n_min", int, 1, "the shortest suffix matched", minimum=1),
        Option("n_max", int, 4, "the longest suffix matched (tried first)", minimum=1),
    )

    @classmethod
    def incompatibilities(cls, run: RunSpec) -> list[str]:
        if run.options["n_min"] > run.options["n_max"]:
            return [f"options.ngram.n_min ({run.options['n_min']}) is larger than options.ngram.n_max "
                    f"({run.options['n_max']})"]
        return []

    def propose(self, tokens: list[int], k: int) -> Draft:
        return Draft(ngram_lookup(tokens, self.options["n_min"], self.options["n_max"], k))


@hookimpl
def tileinfer_implementations() -> list[Implementation]:
    return [Implementation("proposer", "ngram", NgramProposer, "n-gram lookup in the context (prompt lookup)")]
