"""logit_bias (core/logit_bias.py): greedy decoding with a bias equals transformers' argmax of the
biased logits; +100 forces a token and -100 bans one, greedy and sampled, with penalties, top-k and
a proposer; the device loop hands a biased generation to host drafting, saying why; bad values are
refused naming the field."""

from __future__ import annotations

import pytest
import torch

import tileinfer
from conftest import reference_engine, repetitive_prompt
from device_loop import device_engine
from tileinfer.errors import UsageError

PROMPT = repetitive_prompt()
NEW = 12


@pytest.fixture(scope="module")
def folder(checkpoint_factory):
    return checkpoint_factory(std=0.2, tokenizer=False, seed=4)


@pytest.fixture(scope="module")
def engine(folder):
    return reference_engine(folder)


def params(**kw) -> tileinfer.SamplingParams:
    return tileinfer.SamplingParams(max_tokens=NEW, ignore_eos=True, **kw)


def test_greedy_with_a_bias_is_the_argmax_of_the_biased_logits(folder, engine):
    """A bias small enough to change some tokens and not others, against transformers' logits."""
    from transformers import Qwen3ForCausalLM

    plain = engine.generate(PROMPT, params()).token_ids
    bias = {plain[1]: -3.0, 7: 2.5, 200: 1.5}
    biased = engine.generate(PROMPT, params(logit_bias=bias)).token_ids
    model = Qwen3ForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    vector = torch.zeros(model.config.vocab_size)
    vector[list(bias)] = torch.tensor(list(bias.values()))
    ids = list(PROMPT)
    with torch.no_grad():
        for _ in range(NEW):
            ids.append(int((model(torch.tensor([ids])).logits[0, -1] + vector).argmax()))
    assert biased == ids[len(PROMPT):] and biased != plain


@pytest.mark.parametrize("sampling", [{}, dict(temperature=1.0, seed=5), dict(temperature=0.8, top_k=3, seed=2),
                                      dict(repetition_penalty=1.3, presence_penalty=0.5)],
                         ids=["greedy", "sampled", "top-k", "penalties"])
def test_plus_100_forces_a_token_and_minus_100_bans_it(engine, sampling):
    plain = engine.generate(PROMPT, params(**sampling)).token_ids
    forced = next(t for t in range(300) if t not in plain)
    assert engine.generate(PROMPT, params(logit_bias={forced: 100}, **sampling)).token_ids == [forced] * NEW
    banned = set(plain)
    out = engine.generate(PROMPT, params(logit_bias={t: -100 for t in banned}, **sampling)).token_ids
    assert not banned & set(out)
    assert engine.generate(PROMPT, params(**sampling)).token_ids == plain  # the bias was one generation's


@pytest.mark.parametrize("proposer", ["ngram", "draft"])
def test_a_bias_with_a_proposer(folder, engine, proposer):
    """Host drafting verifies with the biased sampler: the tokens of sequential decoding."""
    draft = [f"options.draft.model={folder}"] if proposer == "draft" else []
    spec = tileinfer.Engine.from_config("reference", model=str(folder), device="cpu", dtype="float32",
                                        kv_page_size=16, progress=False, proposer=proposer, spec_k=3, overrides=draft)
    plain = engine.generate(PROMPT, params()).token_ids
    bias = {plain[2]: -100.0, plain[5]: -5.0}
    assert spec.generate(PROMPT, params(logit_bias=bias)).token_ids == \
        engine.generate(PROMPT, params(logit_bias=bias)).token_ids


def test_the_device_loop_hands_a_biased_generation_to_host_drafting(folder, engine):
    spec = device_engine(folder, proposer="ngram", spec_k=3)
    assert spec.generate(PROMPT, params()).stats.decode_loop == "speculative-device"
    forced = spec.generate(PROMPT, params(logit_bias={9: 100}))
    assert forced.stats.decode_loop == "speculative-sequential" and forced.token_ids == [9] * NEW
    assert "logit_bias" in spec.decoder.choice.reason
    assert spec.generate(PROMPT, params()).stats.decode_loop == "speculative-device"


def test_logprobs_stay_the_raw_models(engine):
    plain = engine.generate(PROMPT, tileinfer.SamplingParams(max_tokens=1, logprobs=0))
    forced = engine.generate(PROMPT, tileinfer.SamplingParams(max_tokens=1, logprobs=0,
                                                              logit_bias={plain.token_ids[0]: -100}))
    assert forced.token_ids != plain.token_ids and forced.logprobs[0].logprob < plain.logprobs[0].logprob


@pytest.mark.parametrize("bias,words", [({-1: 1.0}, "not a token id"), ({"5": 1.0}, "not a token id"),
                                        ({5: 100.5}, r"\[-100, 100\]"), ({5: float("nan")}, r"\[-100, 100\]"),
                                        ({5: True}, r"\[-100, 100\]"), ([5], "mapping")])
def test_bad_biases_are_refused_naming_the_field(bias, words):
    with pytest.raises(UsageError, match=rf"^logit_bias.*{words}"):
        tileinfer.SamplingParams(logit_bias=bias)


def test_a_token_outside_the_vocabulary_is_refused(engine):
    with pytest.raises(UsageError, match=r"^logit_bias: 320 is outside the vocabulary"):
        engine.generate(PROMPT, params(logit_bias={320: 1}))


@pytest.mark.gpu
def test_the_default_gpu_path_with_a_bias(folder):
    """CUDA graphs, the pipelined loop and the device loop with n-gram drafts: a biased greedy
    generation runs host drafting and gives the reference engine's tokens; pipelined plain decoding
    applies the bias on the device (no host round trip)."""
    cpu = reference_engine(folder)
    plain = cpu.generate(PROMPT, params()).token_ids
    bias = {plain[2]: -100.0, plain[4]: -3.0, 11: 2.0}
    expected = cpu.generate(PROMPT, params(logit_bias=bias)).token_ids
    for keys in ({}, {"proposer": "ngram", "spec_k": 3}):
        engine = tileinfer.Engine.from_config(model=str(folder), device="cuda", dtype="float32", progress=False,
                                              **keys)
        result = engine.generate(PROMPT, params(logit_bias=bias))
        assert result.token_ids == expected
        assert result.stats.decode_loop == ("pipelined" if not keys else "speculative-sequential")
