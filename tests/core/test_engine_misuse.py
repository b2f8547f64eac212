"""The Python API misused: prompts of the wrong type, generations that overlap on one Engine, runs
that do not fit in memory, and steps whose logits are not finite. Each is a clear error (UsageError,
ConfigError, NumericsError), never a silent wrong answer."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tileinfer
from device_loop import rebuild
from tileinfer.decode_plan import DecodePlan
from tileinfer.errors import ConfigError, NumericsError, UsageError
from tileinfer.prompt import check_prompt

PROMPT = [(7 * i) % 23 + 40 for i in range(18)] * 2  # repetitive: n-gram drafts are proposed


def build(folder, **keys) -> tileinfer.Engine:
    return tileinfer.Engine.from_config("reference", model=str(folder), device="cpu", dtype="float32",
                                        progress=False, **{"kv_page_size": 16, **keys})


@pytest.fixture(scope="module")
def engine(tiny_checkpoint):
    return build(tiny_checkpoint)


@pytest.mark.parametrize("prompt, message", [
    (b"def f():", "the prompt is bytes: pass text as a str"),
    (bytearray(b"\x01\x02"), "the prompt is bytearray"),
    ([1.0, 2.0], "token ids must be ints, got float 1.0 at index 0"),
    ([1, 2.5], "got float 2.5 at index 1"),
    ([1, True], "got bool True at index 1"),
    ([1, "f"], "got str 'f' at index 1 \\(pass text as one str\\)"),
    (["def", [1, 2.5]], "got float 2.5 at index 1"),  # a batch: every prompt checked before the first runs
    (torch.tensor([[1, 2, 3]]), "a tensor prompt must be 1-D integer token ids, got shape \\(1, 3\\)"),
    (torch.tensor([1.0, 2.0]), "got shape \\(2,\\) torch.float32"),
    (42, "the prompt must be a str or a sequence of int token ids, got int"),
    (None, "got NoneType"),
    (np.array([[1, 2]]), "an array prompt must be 1-D integer token ids, got shape \\(1, 2\\)"),
    ("def f(\udcff):", "the prompt is not valid UTF-8"),
    ("", "the prompt is empty"),
    ([], "the prompt is empty"),
])
def test_a_prompt_of_the_wrong_kind_is_a_usage_error(engine, prompt, message):
    with pytest.raises(UsageError, match=message):
        engine.generate(prompt, max_new_tokens=2)


@pytest.mark.parametrize("keys, message", [
    ({"max_new_tokens": 2.5}, "max_new_tokens must be an int, got float 2.5"),
    ({"max_new_tokens": "3"}, "max_new_tokens must be an int, got str"),
    ({"max_new_tokens": True}, "max_new_tokens must be an int, got bool"),
    ({"max_new_tokens": 0}, "max_new_tokens must be >= 1, got 0"),
    ({"chat": 1}, "chat must be True or False, got int 1"),
    ({"ignore_eos": "yes"}, "ignore_eos must be True or False"),
])
def test_settings_of_the_wrong_type_are_usage_errors(engine, keys, message):
    with pytest.raises(UsageError, match=message):
        engine.generate([1, 2, 3], **keys)


def test_chat_with_token_ids_is_refused(engine):
    with pytest.raises(UsageError, match="chat=True needs a text prompt"):
        engine.generate([1, 2, 3], chat=True)


def test_integer_ids_of_any_integer_type_are_taken(engine):
    expected = engine.generate([5, 9, 12], max_new_tokens=3).token_ids
    assert engine.generate(torch.tensor([5, 9, 12]), max_new_tokens=3).token_ids == expected
    assert engine.generate(np.array([5, 9, 12]), max_new_tokens=3).token_ids == expected
    assert engine.generate((np.int32(5), 9, 12), max_new_tokens=np.int64(3)).token_ids == expected


def test_a_generation_inside_another_is_refused_and_the_engine_stays_usable(engine):
    stream = engine.stream([5, 9, 12], max_new_tokens=6)
    next(stream)
    with pytest.raises(UsageError, match="already generating"):
        engine.generate([1, 2], max_new_tokens=2)
    rest = list(stream)
    assert rest[-1].stats is not None
    assert len(engine.generate([1, 2], max_new_tokens=2).token_ids) == 2  # free again


def test_an_abandoned_stream_frees_the_engine(engine):
    stream = engine.stream([5, 9, 12], max_new_tokens=6)
    next(stream)
    stream.close()
    assert len(engine.generate([1, 2], max_new_tokens=2).token_ids) == 2


def test_concurrent_generations_from_threads_never_mix(engine):
    """Each thread either gets the tokens a lone generation gives or a UsageError, never others'."""
    prompts = {i: [5 + i, 9, 12, 40 + i] for i in range(6)}
    expected = {i: engine.generate(p, max_new_tokens=8).token_ids for i, p in prompts.items()}
    results: dict[int, object] = {}
    barrier = threading.Barrier(len(prompts))

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = engine.generate(prompts[i], max_new_tokens=8).token_ids
        except UsageError as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(isinstance(r, UsageError) or r == expected[i] for i, r in results.items()), results
    assert any(not isinstance(r, UsageError) for r in results.values())


def test_a_run_that_does_not_fit_in_memory_fails_before_loading(tiny_checkpoint, monkeypatch):
    import tileinfer.checkpoint
    import tileinfer.memory

    monkeypatch.setattr(tileinfer.checkpoint, "CheckpointReader", None)  # loading would raise TypeError
    monkeypatch.setattr(tileinfer.memory, "free_bytes", lambda device: 10_000)
    with pytest.raises(ConfigError, match=r"the run needs .* GiB on cpu \(weights .* KV pool .* for 512 "
                                          r"positions\), more than the 0.0 GiB free; lower kv_capacity"):
        build(tiny_checkpoint, kv_capacity=512)


def test_a_page_larger_than_the_capacity_is_refused(tiny_checkpoint, checkpoint_factory):
    with pytest.raises(ConfigError, match=r"kv_page_size \(1024\) is larger than kv_capacity \(64\)"):
        build(tiny_checkpoint, kv_capacity=64, kv_page_size=1024)
    folder = checkpoint_factory(max_positions=48)  # the capacity is the model's context: found by the engine
    with pytest.raises(ConfigError, match=r"kv_page_size \(64\) is larger than the KV capacity \(48 positions\)"):
        build(folder, kv_page_size=64)


def test_the_prompt_is_checked_from_the_folder_alone(tiny_checkpoint, monkeypatch):
    """What the command line runs before loading any weight."""
    import tileinfer.checkpoint

    monkeypatch.setattr(tileinfer.checkpoint, "CheckpointReader", None)
    resolved = tileinfer.ResolvedConfig.of(tileinfer.load_config(
        overrides=[f"model={tiny_checkpoint}", "device=cpu", "kv_capacity=64", "max_new_tokens=8"]))
    assert check_prompt(resolved, [1, 2, 3]) == [1, 2, 3]
    assert check_prompt(resolved, "def f():")  # text through the tokenizer
    for prompt, message in (("", "empty"), ("\udcff", "not valid UTF-8"), ([400], "outside the vocabulary"),
                            (list(range(60)), r"needs 68 positions, more than kv_capacity \(64\)")):
        with pytest.raises(UsageError, match=message):
            check_prompt(resolved, prompt)


# -- non-finite logits ---------------------------------------------------------------------------

def poison_lm_head(engine: tileinfer.Engine, row: int = 7) -> None:
    """Weights that overflow at run time (a load-time check cannot see a finite weight's overflow):
    one lm_head row of NaN makes every step's logits non-finite."""
    engine.model.lm_head.weight[row] = float("nan")


@pytest.mark.parametrize("keys", [{}, {"proposer": "ngram", "spec_k": 3},
                                  {"temperature": 0.8, "seed": 3},
                                  {"temperature": 0.8, "seed": 3, "proposer": "ngram", "spec_k": 3}],
                         ids=["greedy", "greedy-ngram", "sampled", "sampled-ngram"])
def test_nothing_is_sampled_from_non_finite_logits(tiny_checkpoint, keys):
    engine = build(tiny_checkpoint, **keys)
    poison_lm_head(engine)
    with pytest.raises(NumericsError, match=f"the logits for position {len(PROMPT)} are not finite"):
        engine.generate(PROMPT, max_new_tokens=8)


def test_pipelined_decoding_stops_at_non_finite_logits_without_feeding_a_bad_id(tiny_checkpoint):
    engine = build(tiny_checkpoint)
    rebuild(engine, DecodePlan("plain", ahead=True))
    good = engine.generate(PROMPT, max_new_tokens=4).token_ids
    poison_lm_head(engine)
    with pytest.raises(NumericsError, match="not finite"):
        engine.generate(PROMPT, max_new_tokens=4)
    assert good  # the same decoder gave tokens before the weights went bad


# -- property: any list of ids is tokens or a UsageError -------------------------------------------

@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ids=st.lists(st.integers(min_value=-2**70, max_value=2**70) | st.integers(min_value=0, max_value=400),
                    max_size=80),
       max_new=st.integers(min_value=-3, max_value=40))
def test_any_prompt_ids_give_tokens_or_a_usage_error(engine, ids, max_new):
    try:
        result = engine.generate(ids, max_new_tokens=max_new)
    except UsageError:
        assert not ids or max_new < 1 or any(not 0 <= t < 320 for t in ids) or len(ids) + max_new > 512
        return
    assert 1 <= len(result.token_ids) <= max_new and all(0 <= t < 320 for t in result.token_ids)


def test_sampling_is_chosen_per_generation(tiny_checkpoint):
    """A generation's own SamplingParams, the config's otherwise; a seed reproduces its tokens."""
    from tileinfer.interfaces import SamplingParams

    engine = build(tiny_checkpoint)
    greedy = engine.generate(PROMPT, max_new_tokens=12).token_ids
    hot = SamplingParams(temperature=1.5, seed=11)
    sampled = engine.generate(PROMPT, max_new_tokens=12, sampling=hot).token_ids
    assert sampled != greedy
    assert engine.generate(PROMPT, max_new_tokens=12).token_ids == greedy  # the config's again
    assert engine.generate(PROMPT, max_new_tokens=12, sampling=hot).token_ids == sampled
    configured = build(tiny_checkpoint, temperature=1.5, seed=11).generate(PROMPT, max_new_tokens=12).token_ids
    assert configured == sampled
    with pytest.raises(UsageError, match="sampling must be a tileinfer.SamplingParams, got dict"):
        engine.generate(PROMPT, sampling={"temperature": 1.0})
    with pytest.raises(UsageError, match="temperature"):
        SamplingParams(temperature=float("nan"))
