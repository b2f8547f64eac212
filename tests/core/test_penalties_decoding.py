"""Penalties and no-repeat n-grams through the decoder: the sampler sees the sequence so far in
every mode (sequential, pipelined, speculative), and greedy decoding with them equals transformers'."""

from __future__ import annotations

import pytest
import torch

import tileinfer
from conftest import reference_engine, repetitive_prompt
from device_loop import rebuild
from tileinfer.decode_plan import DecodePlan
from tileinfer.interfaces import SamplingParams

PROMPT = [(7 * i) % 23 + 40 for i in range(13)]
NEW = 24
PENALTIES = {"repetition": dict(repetition_penalty=1.3), "presence": dict(presence_penalty=1.5),
             "frequency": dict(frequency_penalty=0.8), "all": dict(repetition_penalty=1.2, presence_penalty=0.5,
                                                                  frequency_penalty=0.5)}


@pytest.fixture(scope="module")
def folder(checkpoint_factory):
    return checkpoint_factory(heads=4, kv_heads=2, head_dim=32, hidden=64, layers=2)


def pipelined(engine: tileinfer.Engine) -> tileinfer.Engine:
    """A pipelined Decoder put in place by hand (the engine keeps a CPU run sequential)."""
    return rebuild(engine, DecodePlan("plain", ahead=True))


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("name", list(PENALTIES))
def test_pipelined_gives_the_sequential_tokens(folder, name, sampled):
    params = SamplingParams(**PENALTIES[name], **(dict(temperature=0.9, top_k=30, seed=4) if sampled else {}))
    sequential = reference_engine(folder).generate(PROMPT, max_new_tokens=NEW, sampling=params).token_ids
    engine = pipelined(reference_engine(folder))
    assert engine.generate(PROMPT, max_new_tokens=NEW, sampling=params).token_ids == sequential
    plain = reference_engine(folder).generate(PROMPT, max_new_tokens=NEW,
                                              sampling=SamplingParams(**(dict(temperature=0.9, top_k=30, seed=4)
                                                                         if sampled else {}))).token_ids
    assert sequential != plain  # the penalty changed something


@pytest.mark.parametrize("name", list(PENALTIES))
def test_greedy_with_ngram_speculation_equals_plain_greedy(folder, name):
    params = SamplingParams(**PENALTIES[name])
    prompt = list(range(320)) + repetitive_prompt()  # every id occurs: the n-gram proposer always drafts
    plain = reference_engine(folder).generate(prompt, max_new_tokens=NEW, sampling=params)
    spec = reference_engine(folder, proposer="ngram", spec_k=4).generate(prompt, max_new_tokens=NEW, sampling=params)
    assert spec.token_ids == plain.token_ids
    assert spec.stats.drafted_tokens > 0


def test_no_penalty_keeps_no_history(folder):
    """Greedy without penalties does exactly what it did before: no history, one argmax per step."""
    engine = reference_engine(folder)
    engine.generate(PROMPT, max_new_tokens=4)
    assert engine.decoder.sampling.history is None
    engine.generate(PROMPT, max_new_tokens=4, sampling=SamplingParams(repetition_penalty=1.1))
    history = engine.decoder.sampling.history
    assert history is not None and history.length == len(PROMPT) + 3  # each step commits the token it is fed
    assert history.tokens[:len(PROMPT)].tolist() == PROMPT


def hf_generate(folder, prompt: list[int], **kw) -> list[int]:
    from transformers import Qwen3ForCausalLM

    model = Qwen3ForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             do_sample=False, max_new_tokens=NEW, pad_token_id=0, eos_token_id=None, **kw)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("penalty", [1.3, 0.7])
def test_greedy_repetition_penalty_equals_transformers(folder, penalty):
    ours = reference_engine(folder).generate(PROMPT, max_new_tokens=NEW, ignore_eos=True,
                                             sampling=SamplingParams(repetition_penalty=penalty)).token_ids
    assert ours == hf_generate(folder, PROMPT, repetition_penalty=penalty)


@pytest.mark.parametrize("n", [2, 3])
def test_no_repeat_ngram_option_equals_transformers(folder, n):
    engine = reference_engine(folder, overrides=[f"options.reference.no_repeat_ngram={n}"])
    ours = engine.generate(PROMPT, max_new_tokens=NEW, ignore_eos=True).token_ids
    assert ours == hf_generate(folder, PROMPT, no_repeat_ngram_size=n)
    if n == 2:  # greedy alone repeats a bigram within NEW tokens here
        assert ours != reference_engine(folder).generate(PROMPT, max_new_tokens=NEW, ignore_eos=True).token_ids


@pytest.mark.gpu
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_gpu_pipelined_graphs_give_the_sequential_tokens_with_penalties(folder, sampled):
    """The default GPU engine (Triton, CUDA graphs, pipelined) against the same kernels stepped
    sequentially: the history is kept on the device from the sampled tensors, with no sync."""
    params = SamplingParams(**PENALTIES["all"], **(dict(temperature=0.9, top_k=30, seed=4) if sampled else {}))
    keys = dict(model=str(folder), device="cuda", dtype="float32", kv_page_size=16, progress=False)
    fast = tileinfer.Engine.from_config(**keys)
    assert fast.decoder.plan.ahead
    slow = tileinfer.Engine.from_config(**keys, cuda_graphs=False, pipelined=False)
    expected = slow.generate(PROMPT, max_new_tokens=NEW, sampling=params).token_ids
    assert fast.generate(PROMPT, max_new_tokens=NEW, sampling=params).token_ids == expected
    with_logprobs = fast.generate(PROMPT, max_new_tokens=NEW, sampling=params, logprobs=3)
    assert with_logprobs.token_ids == expected and len(with_logprobs.logprobs) == NEW
