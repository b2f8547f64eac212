"""ngram_lookup (backends/reference/ngram.py) against a brute-force search."""

from __future__ import annotations

import torch

from tileinfer.backends.reference.ngram import ngram_lookup


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _ngram_brute(tokens, n_min, n_max, k):
    length = len(tokens)
    for n in range(min(n_max, length - 1), n_min - 1, -1):
        suffix = tokens[length - n:]
        for start in range(0, length - n):  # earlier occurrences start before the suffix does
            if tokens[start:start + n] == suffix:
                return tokens[start + n: start + n + k]
    return []


def test_ngram_longest_suffix_wins():
    tokens = [2, 3, 4, 0, 1, 2, 3, 6, 1, 2, 3]
    assert ngram_lookup(tokens, 1, 3, 3) == [6, 1, 2]  # [1, 2, 3] at 4
    assert ngram_lookup(tokens, 1, 2, 3) == [4, 0, 1]  # [2, 3] first at 0
    assert ngram_lookup(tokens, 1, 1, 2) == [4, 0]  # [3] first at 1


def test_ngram_earliest_occurrence():
    assert ngram_lookup([7, 1, 8, 1, 9, 1], 1, 1, 3) == [8, 1, 9]
    assert ngram_lookup([5, 6, 1, 5, 6, 2, 5, 6], 2, 2, 1) == [1]


def test_ngram_n_min_respected_and_no_match():
    tokens = [1, 2, 3, 9, 4, 3]  # only the 1-gram [3] occurs earlier
    assert ngram_lookup(tokens, 1, 4, 2) == [9, 4]
    assert ngram_lookup(tokens, 2, 4, 2) == []
    assert ngram_lookup([1, 2, 3, 4, 5], 1, 4, 5) == []
    assert ngram_lookup([5], 1, 4, 5) == []


def test_ngram_k_and_end_of_sequence():
    assert ngram_lookup([4, 5, 6, 7, 4], 1, 2, 2) == [5, 6]
    assert ngram_lookup([4, 5, 6, 7, 4], 1, 2, 10) == [5, 6, 7, 4]
    assert ngram_lookup([1, 1, 1, 1], 1, 3, 5) == [1]  # [1, 1, 1] at 0, overlapping the suffix


def test_ngram_matches_brute_force():
    g = gen(8)
    for trial in range(300):
        length = int(torch.randint(1, 40, (1,), generator=g))
        tokens = torch.randint(0, 4, (length,), generator=g).tolist()
        n_min = int(torch.randint(1, 3, (1,), generator=g))
        n_max = n_min + int(torch.randint(0, 4, (1,), generator=g))
        k = int(torch.randint(1, 8, (1,), generator=g))
        assert ngram_lookup(tokens, n_min, n_max, k) == _ngram_brute(tokens, n_min, n_max, k), (tokens, n_min, n_max, k)
