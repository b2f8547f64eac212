"""Penalties and no-repeat n-grams (backends/reference/penalties*.py) against a hand computation:
Python loops over the tokens, one row and one token at a time, written from the definitions."""

from __future__ import annotations

import math

import pytest
import torch

from tileinfer.backends.reference.penalties import generated_counts, penalize
from tileinfer.backends.reference.penalties_ngram import ban_repeated_ngrams

VOCAB = 37
SEEDS = [0, 1, 2]


def by_hand(logits: list[list[float]], tokens: list[int], prompt_len: int, length: int, presence: float,
            frequency: float, repetition: float) -> list[list[float]]:
    out = []
    for i, row in enumerate(logits):
        sequence = tokens[:length + i]
        generated = sequence[prompt_len:]
        new = []
        for t, x in enumerate(row):
            if t in sequence:  # HF RepetitionPenaltyLogitsProcessor: prompt and reply
                x = x / repetition if x > 0 else x * repetition
            count = generated.count(t)  # OpenAI: the reply only
            x = x - frequency * count - presence * (1 if count else 0)
            new.append(x)
        out.append(new)
    return out


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("rows", [1, 4])  # a plain step; a verify step of 3 drafts
@pytest.mark.parametrize("values", [(0.5, 0.0, 1.0), (0.0, 0.7, 1.0), (0.0, 0.0, 1.3), (-0.4, 1.1, 0.8),
                                    (2.0, -2.0, 2.5)], ids=lambda v: "p{}-f{}-r{}".format(*v))
def test_penalties_match_the_definitions(seed, rows, values):
    presence, frequency, repetition = values
    g = torch.Generator().manual_seed(seed)
    prompt_len, length = 9, 21
    tokens = torch.randint(0, 12, (length + rows - 1 + 5,), generator=g)  # few distinct ids: repeats; junk after
    logits = torch.randn(rows, VOCAB, generator=g) * 3
    got = penalize(logits, tokens, prompt_len, length, presence=presence, frequency=frequency, repetition=repetition)
    expected = by_hand(logits.tolist(), tokens.tolist(), prompt_len, length, presence, frequency, repetition)
    torch.testing.assert_close(got, torch.tensor(expected), rtol=1e-6, atol=1e-6)
    assert not torch.equal(got, logits)  # something was penalized


def test_counts_per_row_include_the_drafts_before_it():
    tokens = torch.tensor([5, 5, 1, 2, 2, 3, 9, 9])  # prompt 5 5 1; generated 2 2; drafts 3 9 (then junk 9)
    counts = generated_counts(tokens, 3, 5, 3, 10)
    assert counts[0].tolist() == [0, 0, 2, 0, 0, 0, 0, 0, 0, 0]
    assert counts[1].tolist() == [0, 0, 2, 1, 0, 0, 0, 0, 0, 0]
    assert counts[2].tolist() == [0, 0, 2, 1, 0, 0, 0, 0, 0, 1]


def test_no_penalty_is_the_identity():
    logits = torch.randn(2, VOCAB)
    tokens = torch.randint(0, VOCAB, (30,))
    assert torch.equal(penalize(logits, tokens, 4, 20), logits)


def ngram_by_hand(sequence: list[int], n: int) -> set[int]:
    """Hugging Face's _get_ngrams/_get_generated_ngrams, in loops."""
    if len(sequence) < n:
        return set()
    seen: dict[tuple, set] = {}
    for j in range(len(sequence) - n + 1):
        gram = tuple(sequence[j:j + n])
        seen.setdefault(gram[:-1], set()).add(gram[-1])
    return seen.get(tuple(sequence[len(sequence) - n + 1:]), set())


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("rows", [1, 3])
def test_no_repeat_ngrams_match_the_definition(seed, n, rows):
    g = torch.Generator().manual_seed(seed)
    length = 30
    tokens = torch.randint(0, 6, (length + rows + 3,), generator=g)
    tokens[length - n + 1:length] = tokens[3:3 + n - 1].clone()  # row 0's suffix occurred before: a ban
    logits = torch.randn(rows, VOCAB, generator=g)
    got = ban_repeated_ngrams(logits, tokens, length, n)
    banned_any = False
    for i in range(rows):
        banned = ngram_by_hand(tokens[:length + i].tolist(), n)
        banned_any |= bool(banned)
        for t in range(VOCAB):
            assert got[i, t].item() == (-math.inf if t in banned else logits[i, t].item()), (i, t)
    assert banned_any


def test_a_sequence_shorter_than_n_bans_nothing():
    logits = torch.randn(1, VOCAB)
    assert torch.equal(ban_repeated_ngrams(logits, torch.tensor([1, 2, 0, 0]), 2, 3), logits)
