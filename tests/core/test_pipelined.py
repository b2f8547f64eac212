"""Pipelined decoding: the host enqueues step t + 1 before it reads step t's token.

On a CPU the engine ignores ``pipelined`` (with a notice), so the CPU tests build the pipelined
Decoder by hand (``pipelined``: plain decoding, the host one step behind), with eager steps and
with the stand-in graph replay of tests/core/device_loop.py; the GPU tests build it through the
config key.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import yaml

import tileinfer
from conftest import DEVICE
from device_loop import no_sync_in, rebuild, rerun_capture
from tileinfer.cli import main
from tileinfer.config import load_config
from tileinfer.decode_plan import DecodePlan
from tileinfer.interfaces import SamplingParams
from tileinfer.plugins.reference.sampler import ReferenceSampler

PROMPT = [(7 * i) % 23 + 40 for i in range(13)]
NEW = 24  # positions 13 to 36: two page boundaries (16 and 32) with kv_page_size=16
SAMPLED = {"temperature": 0.8, "top_k": 20, "seed": 3}
SAMPLINGS = {"greedy": {}, "sampled": SAMPLED}


@pytest.fixture(scope="module")
def folder(checkpoint_factory):
    return checkpoint_factory(heads=4, kv_heads=2, head_dim=32, hidden=64, layers=2)


PER_OP = {"options": {"triton": {"fuse_epilogue": False, "fuse_inputs": False}}}
VARIANTS = {"reference": ["reference"], "triton-per-op": ["eager", PER_OP], "triton": ["eager"]}


def build(folder, *sources, **keys) -> tileinfer.Engine:
    return tileinfer.Engine.from_config(*(sources or ["reference"]), model=str(folder), device=DEVICE,
                                        dtype="float32", kv_page_size=16, progress=False, **keys)


def pipelined(engine: tileinfer.Engine, *, replayed: bool = False) -> tileinfer.Engine:
    """Put a pipelined Decoder in place (the engine does not on a CPU); ``replayed``: steps from the
    stand-in graph capture, whose static token buffer then receives each token from the sampler."""
    return rebuild(engine, DecodePlan("plain", ahead=True), step_capture=rerun_capture if replayed else None)


def with_eos(engine: tileinfer.Engine, token: int) -> tileinfer.Engine:
    engine.model_config = dataclasses.replace(engine.model_config, eos_token_ids=(token,))
    return engine


def first_seen_at_or_after(tokens: list[int], index: int) -> tuple[int, int]:
    """A token of ``tokens`` that first occurs at ``index`` or later but before the last, and where
    (as an EOS, it leaves room for the step a pipelined run enqueues after it)."""
    for i in range(index, len(tokens) - 1):
        if tokens[i] not in tokens[:i]:
            return tokens[i], i
    raise AssertionError(f"every token after index {index} occurs earlier: {tokens}")


# Stops: which EOS ("none"; the first token; "later": a token first seen at index 5 or later, past
# the page boundary at position 16) and max_new_tokens (None: up to the EOS).
STOPS = {
    "length": ("none", NEW),
    "eos": ("later", NEW),
    "eos-first-token": ("first", NEW),
    "eos-at-the-length": ("later", None),  # max_new_tokens ends at the EOS: no step after it
    "one-token": ("none", 1),
}


@pytest.fixture(scope="module")
def expected_run(folder):
    """``expected_run(sampling, stop)``: the EOS and max_new_tokens of ``stop`` and the sequential
    generation with them (computed once per sampling and stop)."""
    bases, runs = {}, {}

    def run(sampling: str, stop: str) -> tuple[int | None, int, tileinfer.Generation]:
        if (sampling, stop) not in runs:
            eos_kind, max_new = STOPS[stop]
            engine = build(folder, **SAMPLINGS[sampling])
            if sampling not in bases:
                bases[sampling] = engine.generate(PROMPT, max_new_tokens=NEW).token_ids
            base = bases[sampling]
            eos, index = {"none": (None, None), "first": (base[0], 0),
                          "later": first_seen_at_or_after(base, 5)}[eos_kind]
            max_new = index + 1 if max_new is None else max_new
            if eos is not None:
                with_eos(engine, eos)
            runs[sampling, stop] = eos, max_new, engine.generate(PROMPT, max_new_tokens=max_new)
        return runs[sampling, stop]

    return run


@pytest.mark.parametrize("stop", STOPS)
@pytest.mark.parametrize("replayed", [False, True], ids=["eager", "replayed"])
@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_pipelined_gives_the_sequential_tokens(folder, expected_run, sampling, replayed, stop):
    eos, max_new, sequential = expected_run(sampling, stop)
    engine = pipelined(build(folder, **SAMPLINGS[sampling]), replayed=replayed)
    if eos is not None:
        with_eos(engine, eos)
    result = engine.generate(PROMPT, max_new_tokens=max_new)
    assert result.token_ids == sequential.token_ids
    n = len(result.token_ids)
    assert result.stats.finish_reason == sequential.stats.finish_reason == ("length" if eos is None else "eos")
    assert result.token_ids.count(eos) == (0 if eos is None else 1)  # the EOS once, the extra step's token never
    assert result.stats.steps == sequential.stats.steps == n - 1  # the step after an EOS is not counted
    assert result.stats.new_tokens == n and result.stats.tokens_per_step == (1.0 if n > 1 else 0.0)
    if eos is not None and n < max_new:
        # The step after the EOS cached the EOS (its input) and nothing else.
        assert engine.kv.length == len(PROMPT) + n
    else:
        assert engine.kv.length == len(PROMPT) + n - 1  # the last token was fed to no step
    again = engine.generate(PROMPT, max_new_tokens=max_new)  # the same engine, another generation
    assert again.token_ids == result.token_ids


def test_the_host_enqueues_the_next_step_before_it_reads_a_token(folder):
    """The order of the loop, and each token fed to the next step straight from the sampler."""
    base = build(folder).generate(PROMPT, max_new_tokens=NEW).token_ids
    eos, index = first_seen_at_or_after(base, 5)
    engine = with_eos(pipelined(build(folder)), eos)
    decoder, events, sampled, fed = engine.decoder, [], [], []
    plain = decoder.strategies["plain"]
    step, receive, sample, forward = plain.step, decoder.records.receive, engine.sampler.sample, decoder.steps.forward

    def logged_step(k):
        events.append(("step", plain.position))
        return step(k)

    def logged_receive():
        events.append(("read", decoder.records.received))
        return receive()

    def logged_sample(logits, **kw):
        result = sample(logits, **kw)
        sampled.append(result.tokens)
        return result

    def logged_forward(tokens, start):
        fed.append((tokens.data_ptr() == plain.record[2:3].data_ptr(), tokens.clone()))
        return forward(tokens, start)

    plain.step, decoder.records.receive = logged_step, logged_receive
    engine.sampler.sample, decoder.steps.forward = logged_sample, logged_forward
    for max_new, n in ((NEW, index + 1), (index + 1, index + 1), (index, index)):  # EOS; EOS at the length; length
        for log in (events, sampled, fed):
            log.clear()
        assert len(engine.generate(PROMPT, max_new_tokens=max_new).token_ids) == n
        expected = []
        for i in range(n):
            if i + 1 < max_new:  # step i + 1 feeds token i at position len(PROMPT) + i
                expected.append(("step", len(PROMPT) + i))
            expected.append(("read", i))
        assert events == expected
        # Each step is fed the previous step's sampled token as a device tensor (prefill's, then each
        # step's, in the step record the host reads later), never a value read by the host.
        assert len(fed) == len(sampled) - 1
        assert all(in_record and a.device == b.device and torch.equal(a, b) for (in_record, a), b in zip(fed, sampled))


def test_draw_is_torch_multinomial_without_a_sync():
    """Sampler.draw makes the draws torch.multinomial makes, so seeded runs reproduce earlier ones."""
    torch.manual_seed(0)
    sampler = ReferenceSampler(SamplingParams(temperature=1.0, seed=11), torch.device("cpu"))
    reference = torch.Generator().manual_seed(11)
    for rows, vocab in ((1, 7), (3, 320), (2, 5000)):
        probs = torch.softmax(torch.randn(rows, vocab) * 3, dim=-1)
        probs[:, : vocab // 3] = 0  # as top-k and top-p leave it
        probs /= probs.sum(-1, keepdim=True)
        assert sampler.draw(probs).tolist() == torch.multinomial(probs, 1, generator=reference).squeeze(1).tolist()
    assert torch.equal(sampler.uniform(4), torch.rand(4, generator=reference))  # the generators are in step


def notices(caplog) -> list[str]:
    """The notices logged (logger ``tileinfer``) since the last call."""
    found = [r.getMessage() for r in caplog.records if r.name == "tileinfer"]
    caplog.clear()
    return found


def test_pipelined_key_is_accepted_on_a_cpu_with_a_notice(folder, caplog):
    if DEVICE != "cpu":
        pytest.skip("checks the CPU notice")
    caplog.clear()
    engine = build(folder, pipelined=True)
    found = notices(caplog)
    assert len(found) == 1 and found[0].startswith("pipelined has no effect on device cpu")
    assert not engine.decoder.plan.ahead
    assert engine.generate(PROMPT, max_new_tokens=NEW).token_ids == build(folder).generate(
        PROMPT, max_new_tokens=NEW).token_ids


def test_with_a_proposer_pipelined_is_the_device_loop_on_cuda(folder, caplog):
    """(tests/core/test_device_loop_selection.py checks the loop itself.)"""
    caplog.clear()
    engine = build(folder, pipelined=True, proposer="ngram", spec_k=3)
    found = notices(caplog)
    if DEVICE == "cuda":
        assert not found and engine.decoder.loop is not None
    else:
        assert len(found) == 1 and found[0].startswith("pipelined has no effect") and engine.decoder.loop is None
    plain = build(folder).generate(PROMPT * 2, max_new_tokens=NEW)
    result = engine.generate(PROMPT * 2, max_new_tokens=NEW)
    assert result.token_ids == plain.token_ids and result.stats.drafted_tokens > 0
    assert result.stats.decode_loop == ("speculative-device" if DEVICE == "cuda" else "speculative-sequential")


def test_config_has_the_key(capsys):
    assert load_config().pipelined is True and load_config(overrides=["pipelined=false"]).pipelined is False
    assert main(["config", "pipelined=true"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["pipelined"] is True


# -- GPU ---------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("sampling", SAMPLINGS)
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_pipelined_gives_the_eager_tokens_on_the_gpu(folder, variant, graphs, sampling):
    keys = SAMPLINGS[sampling]
    # Greedy: the eager steps' tokens. Sampled: those of the same steps runner decoding
    # sequentially (a rounding difference between runners could flip a draw on a near tie).
    reference = build(folder, *VARIANTS[variant], cuda_graphs=graphs and bool(keys), **keys)
    base = reference.generate(PROMPT, max_new_tokens=NEW).token_ids
    eos, index = first_seen_at_or_after(base, 5)
    for _ in range(2):  # the second time, a fresh engine after another in the same process
        engine = build(folder, *VARIANTS[variant], cuda_graphs=graphs, pipelined=True, **keys)
        assert engine.decoder.plan.ahead and engine.decoder.steps.graphed == graphs
        length = engine.generate(PROMPT, max_new_tokens=NEW)  # across the page boundaries 16 and 32
        assert length.token_ids == base
        assert length.stats.finish_reason == "length" and engine.kv.length == len(PROMPT) + NEW - 1
        stopped = with_eos(engine, eos).generate(PROMPT, max_new_tokens=NEW)
        assert stopped.token_ids == base[:index + 1] and stopped.stats.finish_reason == "eos"
        assert stopped.stats.steps == index and engine.kv.length == len(PROMPT) + index + 1


@pytest.mark.gpu
@pytest.mark.parametrize("sampling", SAMPLINGS)
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
def test_a_pipelined_step_does_not_sync_on_the_gpu(folder, graphs, sampling):
    engine = build(folder, "eager", cuda_graphs=graphs, pipelined=True, **SAMPLINGS[sampling])
    warm = engine.generate(PROMPT, max_new_tokens=NEW)  # kernels compiled, graphs captured
    with no_sync_in(engine.decoder, engine.decoder.strategies["plain"]):
        checked = engine.generate(PROMPT, max_new_tokens=NEW)  # new KV pages at 16 and 32 included
    assert checked.token_ids == warm.token_ids
