"""spec_adaptive: the draft length follows the last step's acceptance, and greedy tokens stay plain greedy's."""

from __future__ import annotations

import pytest

from conftest import reference_engine, repetitive_prompt
from tileinfer.speculative import DraftLength


def test_the_schedule_grows_by_two_on_full_acceptance_and_shrinks_by_one_otherwise():
    length = DraftLength(7, adaptive=True)
    seen = [length.k]
    for drafted, accepted in [(7, 3), (6, 6), (7, 0), (6, 0), (5, 0), (4, 0), (3, 0), (2, 0), (1, 0), (1, 1), (3, 3)]:
        assert drafted == length.k or drafted < length.k  # a proposer may draft fewer
        length.update(drafted, accepted)
        seen.append(length.k)
    assert seen == [7, 6, 7, 6, 5, 4, 3, 2, 1, 1, 3, 5]
    length.update(0, 0)  # no draft (no n-gram match): nothing learned
    assert length.k == 5
    length.reset()
    assert length.k == 7


def test_fixed_keeps_spec_k():
    length = DraftLength(4)
    length.update(4, 0)
    assert length.k == 4


@pytest.mark.parametrize("proposer", ["ngram", "draft"])
def test_adaptive_greedy_tokens_are_plain_greedys_and_drafts_vary(proposer, tiny_checkpoint):
    keys = dict(spec_k=6, temperature=0.0)
    if proposer == "draft":  # the target as its own draft: drafts accepted, then a rejection now and then
        keys["options"] = {"draft": {"model": str(tiny_checkpoint)}}
    prompt = repetitive_prompt()
    plain = reference_engine(tiny_checkpoint, temperature=0.0).generate(prompt, max_new_tokens=40, ignore_eos=True)
    fixed = reference_engine(tiny_checkpoint, proposer=proposer, **keys).generate(prompt, max_new_tokens=40,
                                                                                 ignore_eos=True)
    adaptive = reference_engine(tiny_checkpoint, proposer=proposer, spec_adaptive=True, **keys).generate(
        prompt, max_new_tokens=40, ignore_eos=True)
    assert adaptive.token_ids == fixed.token_ids == plain.token_ids
    assert adaptive.stats.drafted_tokens > 0
    if proposer == "ngram":  # the random model rejects most n-gram drafts: the length shrinks
        assert adaptive.stats.drafted_tokens != fixed.stats.drafted_tokens
