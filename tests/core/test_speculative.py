"""Speculative decoding: n-gram drafts verified greedily give exactly the greedy tokens, and the
p/q rule of ``verify_sampled`` commits tokens distributed as the target's ``p`` (checked with a
chi-square test that provably rejects wrong rules run through the same harness)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from conftest import reference_engine, repetitive_prompt
from tileinfer.interfaces import Draft, Proposer, SamplingParams
from tileinfer.plugins.reference.sampler import ReferenceSampler
from tileinfer.speculative import verify_greedy, verify_sampled



engine = reference_engine


# -- greedy speculation == greedy decoding -------------------------------------------------------------


@pytest.fixture(scope="module")
def greedy_case(checkpoint_factory):
    folder = checkpoint_factory(tokenizer=False)
    plain = engine(folder).generate(repetitive_prompt(), max_new_tokens=80)
    assert plain.stats.tokens_per_step == 1.0 and len(plain.token_ids) == 80
    return folder, plain


@pytest.mark.parametrize("spec_k", [1, 3, 7])
def test_ngram_speculation_returns_the_greedy_tokens(greedy_case, spec_k):
    folder, plain = greedy_case
    spec = engine(folder, proposer="ngram", spec_k=spec_k).generate(repetitive_prompt(), max_new_tokens=80)
    assert spec.token_ids == plain.token_ids
    assert spec.stats.finish_reason == "length"
    # drafts were accepted: fewer forward passes than tokens
    assert spec.stats.tokens_per_step > 1.0, spec.stats
    assert spec.stats.steps < 79


@pytest.mark.parametrize("n_max", [1, 2])
def test_ngram_options_reach_the_proposer(greedy_case, n_max):
    folder, plain = greedy_case
    e = engine(folder, proposer="ngram", spec_k=3, options={"ngram": {"n_max": n_max}})
    assert e.proposer.options["n_max"] == n_max
    assert e.generate(repetitive_prompt(), max_new_tokens=80).token_ids == plain.token_ids


def eos_for(tokens: list[int], at_least: int) -> tuple[int, int]:
    """A token whose first occurrence in ``tokens`` is at index >= at_least: (token, index)."""
    for i, t in enumerate(tokens):
        if i >= at_least and t not in tokens[:i]:
            return t, i
    raise AssertionError(f"no new token after index {at_least} in {tokens}")


@pytest.mark.parametrize("spec_k", [1, 3, 7])
def test_speculation_stops_at_the_same_eos(greedy_case, checkpoint_factory, spec_k):
    folder, plain = greedy_case
    eos, index = eos_for(plain.token_ids, 12)
    with_eos = checkpoint_factory(tokenizer=False, eos=eos)  # same seed: same weights, an EOS set
    ref = engine(with_eos).generate(repetitive_prompt(), max_new_tokens=80)
    assert ref.token_ids == plain.token_ids[: index + 1]
    assert ref.token_ids[-1] == eos and ref.stats.finish_reason == "eos"
    spec = engine(with_eos, proposer="ngram", spec_k=spec_k).generate(repetitive_prompt(), max_new_tokens=80)
    assert spec.token_ids == ref.token_ids
    assert spec.stats.finish_reason == "eos"


class OracleProposer(Proposer):
    """Drafts the known greedy continuation, so every draft is accepted."""

    def __init__(self, context, prompt_length: int, continuation: list[int]) -> None:
        super().__init__(context)
        self.prompt_length, self.continuation = prompt_length, continuation

    def propose(self, tokens, k):
        done = len(tokens) - self.prompt_length
        return Draft(self.continuation[done:done + k])


@pytest.mark.parametrize("spec_k", [3, 7])
def test_eos_inside_an_accepted_draft_ends_the_generation(greedy_case, checkpoint_factory, spec_k):
    """n-gram drafts rarely put a first-time token in the middle of an accepted run, so an oracle
    proposer does: the engine must cut the step's tokens at the EOS."""
    folder, plain = greedy_case
    eos, index = eos_for(plain.token_ids, 12)
    if index % (spec_k + 1) == 0:  # the last token of a full step: move to a later new token
        eos, index = eos_for(plain.token_ids, index + 1)
    assert index % (spec_k + 1) != 0
    e = engine(checkpoint_factory(tokenizer=False, eos=eos), proposer="ngram", spec_k=spec_k)
    context = dataclasses.replace(e.proposer.context, options={})
    e.proposer = e.decoder.strategies["host"].proposer = OracleProposer(context, len(repetitive_prompt()),
                                                                        plain.token_ids)
    out = e.generate(repetitive_prompt(), max_new_tokens=80)
    assert out.token_ids == plain.token_ids[: index + 1]
    assert out.stats.finish_reason == "eos"
    assert out.stats.steps == -(-index // (spec_k + 1))  # every draft was accepted
    assert e.kv.length == len(repetitive_prompt()) + index + 1  # cut after the EOS, a draft the last step fed


def assert_length_stops(plain, *engines) -> None:
    """Each engine, generation after generation, gives plain greedy's first ``n`` tokens at
    ``max_new_tokens=n`` (n = 1, 2, 9, 33)."""
    for e in engines:
        for n in (1, 2, 9, 33):
            assert e.generate(repetitive_prompt(), max_new_tokens=n).token_ids == plain.token_ids[:n]


def assert_starts_afresh(e, plain, stats, *, shorter: bool = False) -> None:
    """A second greedy generation on ``e`` gives ``plain``'s tokens again, with the first's
    ``stats`` (steps and accepted drafts): nothing of the first carried over; with ``shorter``,
    then shorter ones stop at their length (:func:`assert_length_stops`)."""
    again = e.generate(repetitive_prompt(), max_new_tokens=len(plain.token_ids))
    assert again.token_ids == plain.token_ids
    assert (again.stats.steps, again.stats.accepted_tokens) == (stats.steps, stats.accepted_tokens)
    if shorter:
        assert_length_stops(plain, e)


def test_speculation_respects_max_new_tokens(greedy_case):
    folder, plain = greedy_case
    for n in (1, 2, 9, 33):
        spec = engine(folder, proposer="ngram", spec_k=7).generate(repetitive_prompt(), max_new_tokens=n)
        assert spec.token_ids == plain.token_ids[:n]


def test_verify_greedy_keeps_the_matching_prefix():
    logits = torch.full((4, 6), -1.0)
    logits[0, 2] = logits[1, 5] = logits[2, 0] = logits[3, 4] = 1.0  # argmax rows: 2, 5, 0, 4
    assert verify_greedy([2, 5, 0], logits) == [2, 5, 0, 4]  # all accepted + bonus
    assert verify_greedy([2, 5, 1], logits) == [2, 5, 0]  # correction at the first mismatch
    assert verify_greedy([3, 5, 0], logits) == [2]
    assert verify_greedy([], logits[:1]) == [2]


# -- the p/q rule, statistically -----------------------------------------------------------------------

V = 5
N = 10000  # draws of the correct rule: the wrong ones already fail at N_WRONG (their chi-square grows with N)
TARGET_LOGITS = torch.tensor([
    [1.0, 0.2, -0.5, 0.8, -1.5],
    [-0.3, 1.2, 0.1, -1.0, 0.6],
    [0.0, -0.7, 0.9, 0.4, -0.2],
])
DRAFT_Q = torch.tensor([
    [0.10, 0.40, 0.30, 0.10, 0.10],
    [0.35, 0.05, 0.20, 0.30, 0.10],
])
N_WRONG = 3000  # wrong rules fail by tens of orders of magnitude: fewer draws suffice
# The statistical bound: the chi-square p-value of the empirical counts against the expected
# distribution must be >= ALPHA (a correct rule fails it with probability 1e-4 per check; the
# tests are deterministic, fixed seeds). Wrong rules give p-values below 1e-40 even with N_WRONG.
ALPHA = 1e-4


def chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square goodness of fit: P(X >= stat) for X ~ chi2(bins - 1)."""
    n = counts.sum().double()
    probs = probs.double()
    if (counts[probs == 0] > 0).any():
        return 0.0
    mask = probs > 0
    expected = n * probs[mask]
    stat = ((counts[mask].double() - expected) ** 2 / expected).sum()
    df = int(mask.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat / 2))


def fits(counts: torch.Tensor, probs: torch.Tensor) -> bool:
    return chi2_pvalue(counts, probs) >= ALPHA


def rule_always_accept(draft, draft_probs, logits, sampler):
    """Wrong: accepts every draft, then a bonus token from p."""
    p = sampler.probs(logits)
    return list(draft) + [int(sampler.draw(p[len(draft):]))]


def rule_resample_from_p(draft, draft_probs, logits, sampler):
    """Wrong: the p/q acceptance test, but on rejection draws from p instead of max(0, p - q)."""
    k = len(draft)
    p = sampler.probs(logits)
    q = (torch.nn.functional.one_hot(torch.tensor(draft), V).float() if draft_probs is None else draft_probs)
    for i, d in enumerate(draft):
        if float(sampler.uniform(1)) >= float(p[i, d] / q[i, d]):
            return list(draft[:i]) + [int(sampler.draw(p[i:i + 1]))]
    return list(draft) + [int(sampler.draw(p[k:]))]


def run_rule(rule, k: int, *, one_hot_draft: list[int] | None = None, n: int = N, seed: int = 0):
    """Call ``rule`` ``n`` times with drafts drawn from DRAFT_Q (or the fixed ``one_hot_draft`` with
    q one-hot); return the committed token lists."""
    sampler = ReferenceSampler(SamplingParams(temperature=1.0, seed=seed), "cpu")
    logits = TARGET_LOGITS[: k + 1]
    q = DRAFT_Q[:k]
    if one_hot_draft is None:
        drafts = torch.multinomial(q, n, replacement=True, generator=torch.Generator().manual_seed(seed + 1)).T
        drafts = drafts.tolist()
    else:
        drafts = [one_hot_draft] * n
    probs = None if one_hot_draft is not None else q
    return [rule(d, probs, logits, sampler) for d in drafts]


def counts_at(results, position: int) -> torch.Tensor:
    """Histogram of the committed token at ``position`` (among results at least that long)."""
    tokens = [r[position] for r in results if len(r) > position]
    return torch.bincount(torch.tensor(tokens, dtype=torch.int64), minlength=V)


def target_p(row: int) -> torch.Tensor:
    return torch.softmax(TARGET_LOGITS[row].double(), -1)


def test_sampled_verification_first_token_is_distributed_as_p():
    results = run_rule(verify_sampled, 1)
    assert all(1 <= len(r) <= 2 for r in results)
    first = counts_at(results, 0)
    assert fits(first, target_p(0)), (first, chi2_pvalue(first, target_p(0)))
    # acceptance rate is sum min(p, q): check it too (binomial, 5 sigma)
    accept = sum(len(r) == 2 for r in results) / N
    expected = torch.minimum(target_p(0), DRAFT_Q[0].double()).sum().item()
    assert abs(accept - expected) < 5 * (expected * (1 - expected) / N) ** 0.5
    # the bonus token after an accepted draft comes from the next row of p
    bonus = counts_at(results, 1)
    assert fits(bonus, target_p(1)), (bonus, chi2_pvalue(bonus, target_p(1)))
    # the draft alone is not distributed as p: the test has power


@pytest.mark.parametrize("wrong_rule", [rule_always_accept, rule_resample_from_p])
def test_the_bound_rejects_wrong_rules(wrong_rule):
    results = run_rule(wrong_rule, 1, n=N_WRONG)
    first = counts_at(results, 0)
    assert not fits(first, target_p(0)), (first, chi2_pvalue(first, target_p(0)))
    assert chi2_pvalue(first, target_p(0)) < 1e-40
    # while the correct rule on the same draws passes (same seeds: same drafts and uniforms)
    assert fits(counts_at(run_rule(verify_sampled, 1, n=N_WRONG), 0), target_p(0))


def test_sampled_verification_one_hot_draft():
    draft = [1]  # p(1) = 0.175: rejected most of the time
    results = run_rule(verify_sampled, 1, one_hot_draft=draft)
    first = counts_at(results, 0)
    assert fits(first, target_p(0)), (first, chi2_pvalue(first, target_p(0)))
    accept = sum(len(r) == 2 for r in results) / N
    p1 = target_p(0)[1].item()
    assert abs(accept - p1) < 5 * (p1 * (1 - p1) / N) ** 0.5
    for wrong in (rule_always_accept, rule_resample_from_p):
        wrong_first = counts_at(run_rule(wrong, 1, one_hot_draft=draft, n=N_WRONG), 0)
        assert not fits(wrong_first, target_p(0)), wrong.__name__


def test_sampled_verification_two_token_draft():
    results = run_rule(verify_sampled, 2, seed=1)
    assert all(1 <= len(r) <= 3 for r in results)
    first = counts_at(results, 0)
    assert fits(first, target_p(0)), (first, chi2_pvalue(first, target_p(0)))
    # given the first draft was accepted (the only way to commit two or more tokens here: a
    # correction is never the rejected draft), the second token is distributed as p's next row
    second = counts_at(results, 1)
    assert second.sum() > N // 3
    assert fits(second, target_p(1)), (second, chi2_pvalue(second, target_p(1)))
    third = counts_at(results, 2)
    assert third.sum() > N // 10
    assert fits(third, target_p(2)), (third, chi2_pvalue(third, target_p(2)))
    # the same checks reject a wrong rule on the second token as well
    wrong = run_rule(rule_resample_from_p, 2, seed=1, n=N_WRONG)
    assert not fits(counts_at(wrong, 1), target_p(1))
    assert not fits(counts_at(wrong, 0), target_p(0))


def test_verify_sampled_with_equal_p_and_q_accepts_everything():
    sampler = ReferenceSampler(SamplingParams(temperature=1.0, seed=5), "cpu")
    q = torch.softmax(TARGET_LOGITS[:2], -1)
    for d in range(V):
        assert verify_sampled([d, (d + 1) % V], q, TARGET_LOGITS, sampler)[:2] == [d, (d + 1) % V]


# -- engine-level sampling with speculation -------------------------------------------------------------


def test_engine_sampling_with_ngram_speculation_is_seeded(checkpoint_factory):
    folder = checkpoint_factory(tokenizer=False)
    e = engine(folder, proposer="ngram", spec_k=3, temperature=1.0, seed=11)
    a = e.generate(repetitive_prompt(), max_new_tokens=48)
    b = e.generate(repetitive_prompt(), max_new_tokens=48)
    assert len(a.token_ids) == 48 and a.stats.finish_reason == "length"
    assert a.token_ids == b.token_ids
    fresh = engine(folder, proposer="ngram", spec_k=3, temperature=1.0, seed=11)
    assert fresh.generate(repetitive_prompt(), max_new_tokens=48).token_ids == a.token_ids
    other = engine(folder, proposer="ngram", spec_k=3, temperature=1.0, seed=12)
    assert other.generate(repetitive_prompt(), max_new_tokens=48).token_ids != a.token_ids
    assert all(0 <= t < 320 for t in a.token_ids)
    # and the KV store was rolled back consistently: it holds the prompt and all but the last token
    assert e.kv.length == len(repetitive_prompt()) + 48 - 1


def test_engine_sampling_with_top_k_one_equals_greedy(greedy_case):
    """top_k=1 at temperature 1 is greedy through the sampled path: the p/q rule must reproduce it."""
    folder, plain = greedy_case
    e = engine(folder, proposer="ngram", spec_k=3, temperature=1.0, top_k=1, seed=3)
    out = e.generate(repetitive_prompt(), max_new_tokens=80)
    assert out.token_ids == plain.token_ids
    assert out.stats.tokens_per_step > 1.0
