"""prefix_cache: a prompt that starts with what the last generation left in the KV cache prefills the rest
only, with the tokens of a cold prefill (greedy), on the reference CPU path and the Triton kernels."""

from __future__ import annotations

import pytest

import tileinfer
from tileinfer import SamplingParams
from tileinfer.chat import ChatSession
from tileinfer.prefix_cache import common_prefix
from conftest import DEVICE, REFERENCE_CPU, repetitive_prompt
from dflash_checkpoints import make_dflash

TRITON_MODEL = dict(hidden=32, heads=2, kv_heads=1, head_dim=16, intermediate=48, vocab=96, layers=2, tokenizer=False)
# A DFlash drafter for the tiny target (hidden 64, 2 layers, vocabulary 320).
DFLASH = dict(hidden=64, vocab=320, layers=1, heads=4, kv_heads=2, head_dim=16, intermediate=96, block=4,
              num_target_layers=2, target_layer_ids=(0, 1))
NEW = 4  # new tokens a generation: the cache then holds the prompt and the first NEW - 1 of them


def reference(folder, **keys) -> tileinfer.Engine:
    overrides = REFERENCE_CPU + [f"{k}={v}" for k, v in keys.items()]
    return tileinfer.Engine.from_config(model=str(folder), overrides=overrides, progress=False)


def triton(folder, **keys) -> tileinfer.Engine:
    return tileinfer.Engine.from_config("reference", model=str(folder), device=DEVICE, dtype="float32",
                                        kv_page_size=16, linear="triton", attention="triton", progress=False, **keys)


@pytest.fixture(scope="module")
def pair(tiny_checkpoint):
    """A reference engine that reuses prefixes and one that does not."""
    return reference(tiny_checkpoint), reference(tiny_checkpoint, prefix_cache="false")


def cases(prompt: list[int], out: list[int]) -> dict[str, tuple[list[int], int]]:
    """After a generation of ``prompt`` whose new tokens are ``out``: prompts and the tokens they reuse."""
    cached = prompt + out[:NEW - 1]
    return {
        "diverges mid-way": (prompt[:10] + [3, 1, 4], 10),
        "a prefix of the cache": (prompt[:15], 14),
        "equal to the cache": (cached, len(cached) - 1),
        "extends the cache": (cached + [5, 9], len(cached)),
        "shares nothing": ([(prompt[0] + 1) % 90] + prompt[1:], 0),
    }


def record_drafts(engine) -> list[list[int]]:
    """The drafts ``engine``'s proposer makes from now on (on the host), appended to the list returned."""
    log: list[list[int]] = []
    proposer = engine.proposer
    if proposer is not None:
        propose = proposer.propose
        proposer.propose = lambda tokens, k: (draft := propose(tokens, k), log.append(draft.tokens))[0]
    return log


def check_reuse(warm, cold, prompt: list[int], lag: int = 0, proposer_holds: int | None = None) -> None:
    """Each case after a generation of ``prompt``: the cold engine's tokens, the reuse counted: the
    target's, at most ``proposer_holds`` positions where the proposer's own cache holds no more, and
    up to ``lag`` tokens fewer where it may lag the target's."""
    drafts = {engine: record_drafts(engine) for engine in (warm, cold)}
    out = warm.generate(prompt, max_new_tokens=NEW).token_ids
    for name, (ids, reused) in cases(prompt, out).items():
        warm.generate(prompt, max_new_tokens=NEW)
        for log in drafts.values():
            log.clear()
        got = warm.generate(ids, max_new_tokens=NEW)
        expected = cold.generate(ids, max_new_tokens=NEW)
        assert got.token_ids == expected.token_ids, name
        assert drafts[warm] == drafts[cold], name  # the proposer's state of the kept prefix is the cold one
        assert expected.stats.cached_tokens == 0, name
        holds = reused if proposer_holds is None else min(reused, proposer_holds)
        assert holds - lag <= got.stats.cached_tokens <= holds and (got.stats.cached_tokens > 0) == (holds > 0), name
        assert got.stats.prompt_tokens == len(ids)


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0


def test_prompts_that_share_part_of_the_cache_give_a_cold_prefills_tokens(pair):
    check_reuse(*pair, repetitive_prompt()[:30])


def test_the_triton_kernels_reuse_a_prefix_exactly(checkpoint_factory):
    """Under the interpreter (few generations): a prompt that diverges inside the second page of 16,
    then one that extends the cache; both attention kernels (the 2-token prefill of the second)."""
    folder = checkpoint_factory(**TRITON_MODEL)
    warm, cold = triton(folder), triton(folder, prefix_cache=False)
    prompt = repetitive_prompt()[:21]
    warm.generate(prompt, max_new_tokens=2)
    diverges = prompt[:18] + [3, 1]
    got = warm.generate(diverges, max_new_tokens=2)
    assert (got.token_ids, got.stats.cached_tokens) == (cold.generate(diverges, max_new_tokens=2).token_ids, 18)
    extends = diverges + got.token_ids[:1] + [5]
    got = warm.generate(extends, max_new_tokens=2)
    assert (got.token_ids, got.stats.cached_tokens) == (cold.generate(extends, max_new_tokens=2).token_ids, 21)


def test_a_chat_prefills_only_each_new_turn(pair):
    warm, cold = pair
    messages = [{"role": "system", "content": "You write Python."}]
    for turn, user in enumerate(["def add(a, b):", "class Point:", "import os"]):
        messages.append({"role": "user", "content": user})
        params = SamplingParams(max_tokens=5)
        got, expected = warm.chat(messages, params), cold.chat(messages, params)
        assert got.token_ids == expected.token_ids
        assert expected.stats.cached_tokens == 0
        assert (got.stats.cached_tokens > 0) == (turn > 0)
        if turn:  # the history up to the previous reply at least
            assert got.stats.cached_tokens >= previous
        previous = got.stats.prompt_tokens - 10
        messages.append({"role": "assistant", "content": got.text})


def test_reset_and_trimmed_turns_stay_exact(tiny_checkpoint):
    """A small context drops the oldest turns (the rendered history changes at its start) and /reset
    clears it: the replies are those of an engine that prefills cold."""
    warm, cold = (reference(tiny_checkpoint, kv_capacity=96, **keys) for keys in ({}, {"prefix_cache": "false"}))
    sessions = [ChatSession(e, SamplingParams(max_tokens=8), system="Be brief.") for e in (warm, cold)]
    for user in ["def add(a, b):", "class Point:", "/reset", "for i in range(10):", "The quick brown fox"]:
        if user == "/reset":
            for session in sessions:
                session.reset()
            continue
        assert sessions[0].reply(user, lambda text: None) == sessions[1].reply(user, lambda text: None)
    assert len(sessions[0].turns) < 4  # the context dropped turns


def test_a_closed_stream_leaves_what_was_fed(pair):
    warm, cold = pair
    prompt = repetitive_prompt()[:24]
    stream = warm.stream(prompt, max_new_tokens=8)
    first = next(stream).token_ids + next(stream).token_ids
    stream.close()
    got = warm.generate(prompt + first, max_new_tokens=NEW)
    assert got.token_ids == cold.generate(prompt + first, max_new_tokens=NEW).token_ids
    assert got.stats.cached_tokens == len(prompt) + 1  # the second token was not fed to a step yet


def test_another_use_of_the_store_makes_the_next_prompt_cold(pair):
    warm, _ = pair
    prompt = repetitive_prompt()[:12]
    warm.generate(prompt, max_new_tokens=NEW)
    warm.kv.truncate(warm.kv.length)  # any reserve or truncate outside a generation
    assert warm.generate(prompt, max_new_tokens=NEW).stats.cached_tokens == 0
    assert warm.generate(prompt, max_new_tokens=NEW).stats.cached_tokens == len(prompt) - 1


@pytest.mark.parametrize("proposer", ["ngram", "draft", "dflash"])
def test_every_proposer_reuses_the_prefix_exactly(checkpoint_factory, tiny_checkpoint, tmp_path, proposer):
    """ngram reads the whole sequence at each draft; the draft model keeps its own KV cache of the
    kept positions, the DFlash drafter their context, and both are fed the rest: every case of
    :func:`cases` gives the cold engine's tokens and reuses a prefix (the draft model's cache may
    lag the target's by the tokens it had not caught up on)."""
    keys = {"proposer": proposer, "spec_k": 3}
    if proposer == "draft":
        keys["options.draft.model"] = str(checkpoint_factory(seed=9))
    if proposer == "dflash":
        keys["options.dflash.model"] = str(make_dflash(tmp_path / "dflash", **DFLASH))
    warm, cold = reference(tiny_checkpoint, **keys), reference(tiny_checkpoint, prefix_cache="false", **keys)
    check_reuse(warm, cold, repetitive_prompt()[:30], lag=2 if proposer == "draft" else 0)
    if proposer == "draft":  # the kept positions are not run through the draft model again
        fed = {e: draft_tokens_run(e) for e in (warm, cold)}
        ids = repetitive_prompt()[:30]
        warm.generate(ids[:24], max_new_tokens=NEW)
        for log in fed.values():
            log.clear()
        got = warm.generate(ids, max_new_tokens=NEW)
        cold.generate(ids, max_new_tokens=NEW)
        assert got.stats.cached_tokens > 0 and sum(fed[warm]) == sum(fed[cold]) - got.stats.cached_tokens


def draft_tokens_run(engine) -> list[int]:
    """The token counts of the draft model's forward passes from now on, appended to the list returned."""
    log: list[int] = []
    forward = engine.proposer.forward

    def counted(ids, *args, **kw):
        log.append(ids.numel())
        return forward(ids, *args, **kw)

    engine.proposer.forward = counted
    return log


@pytest.mark.gpu
@pytest.mark.parametrize("proposer", ["none", "ngram", "draft"])
def test_the_default_gpu_path_reuses_a_prefix_exactly(checkpoint_factory, tiny_checkpoint, proposer):
    """The default config on a GPU (CUDA graphs, the pipelined loop; with a proposer the
    device-resident loop), float32 so that the reused and the cold step shapes round alike: every
    case of :func:`cases` gives the cold engine's tokens and drafts and counts its reuse."""
    keys = {} if proposer == "none" else {"proposer": proposer, "spec_k": 3}
    if proposer == "draft":
        keys["options"] = {"draft": {"model": str(checkpoint_factory(seed=9))}}

    def engine(**more) -> tileinfer.Engine:
        return tileinfer.Engine.from_config(model=str(tiny_checkpoint), device="cuda", dtype="float32",
                                            progress=False, **keys, **more)

    # after a generation in the device loop, the draft model's record is the prompt less its last token
    prompt = repetitive_prompt()[:30]
    check_reuse(engine(), engine(prefix_cache=False), prompt,
                proposer_holds=len(prompt) - 1 if proposer == "draft" else None)
