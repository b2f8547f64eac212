"""Prompt log-probabilities (``SamplingParams.prompt_logprobs``, core/prompt_logprobs.py): against
transformers' log-softmax of the same checkpoint in float32 on the CPU (within 1e-4, top-N ids as
its topk), with prompts longer than a prefill chunk; prefilled whole (no prefix reuse), eagerly
(no prefill graph), with a proposer; bad values refused."""

from __future__ import annotations

import math

import pytest
import torch

import tileinfer
from conftest import reference_engine
from device_loop import rebuild, rerun_capture
from test_chunked_prefill import spy_steps
from tileinfer.errors import UsageError
from tileinfer.prompt_logprobs import ROWS

PROMPT = torch.randint(0, 320, (150,), generator=torch.Generator().manual_seed(3)).tolist()


@pytest.fixture(scope="module")
def folder(checkpoint_factory):
    return checkpoint_factory(std=0.2, tokenizer=False, seed=4)


@pytest.fixture(scope="module")
def expected(folder) -> torch.Tensor:
    """transformers' log-softmax at every position of PROMPT: ``[len(PROMPT), V]`` float64."""
    from transformers import Qwen3ForCausalLM

    model = Qwen3ForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT])).logits[0]
    return torch.log_softmax(logits.double(), -1)


def assert_matches(result: list, expected: torch.Tensor, ids: list[int], top: int) -> None:
    assert len(result) == len(ids) and result[0] is None
    for p, lp in enumerate(result[1:], start=1):
        assert lp.token_id == ids[p]
        assert math.isclose(lp.logprob, expected[p - 1, ids[p]].item(), abs_tol=1e-4), p
        values, indices = expected[p - 1].topk(top)
        assert [t for t, _ in lp.top] == indices.tolist(), p
        assert all(math.isclose(v, e, abs_tol=1e-4) for (_, v), e in zip(lp.top, values.tolist())), p


@pytest.mark.parametrize("chunk,top", [(16, 5), (100, 20), (4096, 0)],
                         ids=["chunks-of-16", "chunks-of-100", "one-chunk-top-0"])
def test_prompt_logprobs_are_transformers_log_softmax(folder, expected, chunk, top):
    """Chunks of 16 and of 100 (more rows than ROWS are reduced in pieces) and one chunk; the
    first new token and its logprob unchanged by asking."""
    assert 100 > ROWS
    engine = reference_engine(folder, prefill_chunk=chunk)
    params = tileinfer.SamplingParams(max_tokens=3, ignore_eos=True, logprobs=2)
    result = engine.generate(PROMPT, tileinfer.SamplingParams(max_tokens=3, ignore_eos=True, logprobs=2,
                                                              prompt_logprobs=top))
    assert_matches(result.prompt_logprobs, expected, PROMPT, top)
    plain = engine.generate(PROMPT, params)
    assert plain.prompt_logprobs is None and result.token_ids == plain.token_ids
    assert math.isclose(result.logprobs[0].logprob, expected[-1, result.token_ids[0]].item(), abs_tol=1e-4)
    assert result.to_dict()["prompt_logprobs"][0] is None


def test_the_scored_prompt_is_prefilled_whole_in_scoring_chunks(folder, expected):
    """A prompt the prefix cache holds is prefilled again from 0 when scored (every row's logits
    are needed), in chunks of at most the configured size; the next unscored one reuses it."""
    engine = reference_engine(folder, prefill_chunk=64)
    steps = spy_steps(engine)
    params = tileinfer.SamplingParams(max_tokens=1, prompt_logprobs=1)
    engine.generate(PROMPT, tileinfer.SamplingParams(max_tokens=1))
    steps.clear()
    scored = engine.generate(PROMPT, params)
    assert steps == [(0, 64), (64, 64), (128, 22)] and scored.stats.cached_tokens == 0
    assert_matches(scored.prompt_logprobs, expected, PROMPT, 1)
    again = engine.generate(PROMPT, tileinfer.SamplingParams(max_tokens=1))
    assert again.stats.cached_tokens == len(PROMPT) - 1


def test_streamed_prompt_logprobs_come_with_the_first_chunk(folder, expected):
    engine = reference_engine(folder, prefill_chunk=32)
    chunks = list(engine.stream(PROMPT, tileinfer.SamplingParams(max_tokens=4, ignore_eos=True, prompt_logprobs=3)))
    assert_matches(chunks[0].prompt_logprobs, expected, PROMPT, 3)
    assert all(c.prompt_logprobs is None for c in chunks[1:])


def test_prefill_graphs_are_not_used_for_a_scored_prompt(folder, expected):
    """Stand-in CUDA graphs (re-run on replay) serve the chunks of an unscored prompt only."""
    engine = reference_engine(folder, prefill_chunk=64)
    engine = rebuild(engine, engine.decoder.plan, step_capture=rerun_capture)
    graphs = engine.decoder.steps.prefill_graphs
    scored = engine.generate(PROMPT, tileinfer.SamplingParams(max_tokens=1, prompt_logprobs=2))
    assert not graphs.graphs
    assert_matches(scored.prompt_logprobs, expected, PROMPT, 2)
    engine.generate(PROMPT, tileinfer.SamplingParams(max_tokens=1))
    assert graphs.graphs


@pytest.mark.parametrize("proposer", ["ngram", "draft"])
def test_prompt_logprobs_with_a_proposer(folder, expected, proposer):
    draft = [f"options.draft.model={folder}"] if proposer == "draft" else []
    engine = tileinfer.Engine.from_config("reference", model=str(folder), device="cpu", dtype="float32",
                                          kv_page_size=16, progress=False, prefill_chunk=40, proposer=proposer,
                                          spec_k=3, overrides=draft)
    plain = engine.generate(PROMPT, tileinfer.SamplingParams(max_tokens=6, ignore_eos=True))
    scored = engine.generate(PROMPT, tileinfer.SamplingParams(max_tokens=6, ignore_eos=True, prompt_logprobs=4))
    assert scored.token_ids == plain.token_ids
    assert_matches(scored.prompt_logprobs, expected, PROMPT, 4)


def test_a_one_token_prompt_has_only_none(folder):
    result = reference_engine(folder).generate([5], tileinfer.SamplingParams(max_tokens=1, prompt_logprobs=2))
    assert result.prompt_logprobs == [None]


@pytest.mark.parametrize("value", [-1, 21, 1.5, True, "2"])
def test_bad_prompt_logprobs_are_refused_naming_the_field(value):
    with pytest.raises(UsageError, match=r"^prompt_logprobs="):
        tileinfer.SamplingParams(prompt_logprobs=value)


@pytest.mark.gpu
@pytest.mark.parametrize("forward", ["per_op", "persistent"])
def test_the_default_gpu_path_scores_the_prompt(folder, expected, forward):
    """The default config on a GPU in float32 (the Triton kernels, CUDA graphs, the pipelined loop):
    the scored prompt's chunks run eagerly, every row's logits of the Triton lm_head, within 1e-3 of
    transformers (the kernels' float32 sums round otherwise); the unscored prompt after it is served
    by the prefill graphs and gives the same first token."""
    engine = tileinfer.Engine.from_config(model=str(folder), device="cuda", dtype="float32", progress=False,
                                          prefill_chunk=64, forward=forward)
    assert engine.decoder.steps.prefill_graphs is not None
    scored = engine.generate(PROMPT, tileinfer.SamplingParams(max_tokens=4, ignore_eos=True, prompt_logprobs=5))
    assert not engine.decoder.steps.prefill_graphs.graphs
    result = scored.prompt_logprobs
    assert len(result) == len(PROMPT) and result[0] is None
    for p, lp in enumerate(result[1:], start=1):
        assert math.isclose(lp.logprob, expected[p - 1, PROMPT[p]].item(), abs_tol=1e-3), p
        values = expected[p - 1].topk(5).values.tolist()
        assert all(math.isclose(v, e, abs_tol=1e-3) for (_, v), e in zip(lp.top, values)), p
    plain = engine.generate(PROMPT, tileinfer.SamplingParams(max_tokens=4, ignore_eos=True))
    assert engine.decoder.steps.prefill_graphs.graphs and plain.token_ids == scored.token_ids
