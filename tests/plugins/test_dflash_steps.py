"""proposer=dflash without the host in the way: its steps replayed from CUDA graphs, and device
drafting for the device-resident speculative loop.

On a CPU the graphs are a stand-in capture that re-runs the step with the capture's host start
(0) and only the static buffers changed, so a step that took its inputs from anywhere else (a
position read on the host, a token baked in at the capture) gives other drafts here. Drafts are
compared, not only the target's tokens (which greedy verification keeps whatever the drafts):
the ``random`` drafter's drafts depend on every context position.

The device loop (``tileinfer.device_speculation``) runs eagerly here, the same code the GPU
captures: the target's tokens, the counts and the drafter's own drafts equal the sequential
loop's, with drafters whose drafts are rejected (every verify step leaves k garbage rows of
context behind), accepted in runs, and the shipped drafter's (context-dependent, accepted in runs
of every length), over length and EOS stops and page boundaries; with the drafter's positions
from the step's first on poisoned with NaN before each step (what it must write before reading),
and no device value read on the host inside a step (tests/core/device_loop.py). The Triton
attention runs the same checks under the interpreter.
"""

from __future__ import annotations

import collections

import pytest
import torch

from conftest import DEVICE, ROOT, reference_engine, repetitive_prompt
from tileinfer.plugins.dflash_steps import DFlashSteps

from device_loop import guard_steps, poison_unread_positions, rebuild, rerun_capture
from dflash_checkpoints import TARGET, make_dflash, target_and_drafters
from test_speculative import assert_length_stops


def engine(target, drafter, spec_k: int, **kw):
    return reference_engine(target, proposer="dflash", spec_k=spec_k, options={"dflash": {"model": str(drafter)}},
                            **kw)


def triton_engine(target, drafter, spec_k: int):
    """The Triton attention (under the interpreter on a CPU; the reference linear: the interpreted
    GEMV kernels take minutes and see no positions), float32."""
    import tileinfer

    return tileinfer.Engine.from_config("eager", linear="reference", attention="triton", model=str(target),
                                        device=DEVICE, dtype="float32", kv_page_size=16, kv_capacity=128,
                                        progress=False, proposer="dflash", spec_k=spec_k,
                                        options={"dflash": {"model": str(drafter)}})


def replayed(e) -> DFlashSteps:
    """Give ``e``'s proposer steps replayed through the stand-in, captured up front as on a GPU."""
    p = e.proposer
    p.steps = DFlashSteps(p.model, p.kv, p.block_size, p.mask_token_id, forward=p.steps.forward,
                          capture=rerun_capture)
    with torch.inference_mode():
        p.steps.capture_graphs(range(1, e.config.spec_k + 2))
    assert p.kv.length == 0
    return p.steps


def device_loop(e, capture=None) -> None:
    """Decode ``e``'s greedy generations in the device-resident loop, eagerly (as on a CPU) or
    captured by ``capture``."""
    rebuild(e, loop_capture=capture)


def record_drafts(e) -> list[tuple[int, list[int]]]:
    """(first position, drafts) of each draft, sequential (``propose``) or on the device."""
    seen, p = [], e.proposer
    propose, on_device = p.propose, p.draft_on_device

    def sequential(tokens, k):
        draft = propose(tokens, k)
        seen.append((len(tokens), draft.tokens))
        return draft

    def device(seq, k):  # no host read inside a device step: copies, read after the generation
        drafts = on_device(seq, k)
        seen.append((seq.length.clone(), drafts.clone()))
        return drafts

    p.propose, p.draft_on_device = sequential, device
    return seen


def same_drafts(sequential, device) -> None:
    """Each sequential draft equals the device draft at the same position (the device loop drafts
    k tokens where the sequential one asks for fewer near the end, and runs a step ahead)."""
    at = {int(position): drafts.tolist() for position, drafts in device}
    assert sequential and device
    for position, drafts in sequential:
        assert at[position][:len(drafts)] == drafts, position


@pytest.fixture(scope="module")
def case(checkpoint_factory, tmp_path_factory):
    return target_and_drafters(checkpoint_factory, tmp_path_factory.mktemp("dflash_steps"), 60)


# -- steps replayed from graphs (the stand-in capture) -------------------------------------------------


@pytest.mark.parametrize("spec_k", [3, 7])
def test_replayed_steps_give_the_eager_drafts_and_tokens(case, spec_k):
    target, plain, drafters = case
    eager = engine(target, drafters["random"], spec_k)
    want_drafts = record_drafts(eager)
    want = eager.generate(repetitive_prompt(), max_new_tokens=40)
    e = engine(target, drafters["random"], spec_k)
    steps = replayed(e)
    got_drafts = record_drafts(e)
    got = e.generate(repetitive_prompt(), max_new_tokens=40)
    assert got.token_ids == want.token_ids == plain.token_ids[:40]
    assert got_drafts == want_drafts and len(got_drafts) > 10
    assert sorted(steps.graphs) == ["block"] + sorted(f"context{n}" for n in range(1, spec_k + 2))
    assert e.proposer.kv.length == e.proposer._absorbed == len(repetitive_prompt()) + 39


def test_a_position_read_from_the_host_is_caught(case, monkeypatch):
    """The stand-in is strict enough: an attention that reads the host start changes the drafts."""
    target, _, drafters = case
    e = engine(target, drafters["random"], 3)
    want = record_drafts(e)
    e.generate(repetitive_prompt(), max_new_tokens=12)
    from tileinfer.plugins.reference import attention

    def stale(q, step, kv, layer, scale, fused=None):
        keys, values = kv.gather(layer, step.start + step.num_tokens)
        return attention.causal_attention(q, keys, values, step.start, scale, step.causal)

    monkeypatch.setattr(attention, "dense_attention", stale)
    e = engine(target, drafters["random"], 3)
    replayed(e)
    got = record_drafts(e)
    e.generate(repetitive_prompt(), max_new_tokens=12)
    assert [d for _, d in got] != [d for _, d in want]


def test_the_steps_read_only_their_buffers(case):
    """A replay takes its features, token and positions from the static buffers alone: the same
    context and block through the buffers at another start give the eager logits there."""
    target, _, drafters = case
    e = engine(target, drafters["random"], 7)
    p = e.proposer
    steps = replayed(e)
    g = torch.Generator().manual_seed(1)
    ids = p.model.config.target_layer_ids
    hidden = {i: torch.randn(21, 96, generator=g) for i in ids}
    block = torch.tensor([9] + [p.mask_token_id] * 7)
    with torch.inference_mode():
        p.kv.reset()
        want = p.model.forward(p.model.project(hidden), block, 0, p.kv)
        p.kv.reset()
        p.kv.reserve(21 + 8)
        steps.context({i: h[:16] for i, h in hidden.items()}, 0)  # 16 rows: a graph
        steps.context({i: h[16:] for i, h in hidden.items()}, 16)  # 5 more: another
        logits, picks = steps.block(9, 21)
    torch.testing.assert_close(logits, want, atol=1e-5, rtol=1e-5)
    assert picks.tolist() == want.argmax(-1).tolist()


def test_the_block_runs_through_the_configured_forward_pass(case):
    """The drafter's block step takes the ForwardPass the config names (``forward=counting``: the
    per-op pass, counted; tests/core/test_forward_pass.py), sequentially and in the device loop."""
    from test_forward_pass import CountingForward, counting_registry

    target, plain, drafters = case
    e = engine(target, drafters["random"], 3, forward="counting", registry=counting_registry())
    forward, block = e.proposer.steps.forward, e.proposer.block_size
    assert isinstance(forward, CountingForward) and forward.model is e.proposer.model
    got = e.generate(repetitive_prompt(), max_new_tokens=12)
    assert got.token_ids == plain.token_ids[:12] and got.stats.drafted_tokens > 0
    assert set(forward.calls) == {block} and len(forward.calls) >= got.stats.steps - 1  # the last: 1 token left
    forward.calls.clear()
    device_loop(e)
    assert e.generate(repetitive_prompt(), max_new_tokens=12).token_ids == plain.token_ids[:12]
    assert e.decoder.counters.loop == "speculative-device" and set(forward.calls) == {block}


# -- device drafting (the device-resident loop) --------------------------------------------------------


@pytest.mark.parametrize("which", ["random", "one"])
@pytest.mark.parametrize("spec_k", [1, 3, 7])
def test_the_device_loop_gives_the_sequential_tokens_and_drafts(case, which, spec_k):
    target, plain, drafters = case
    sequential = engine(target, drafters[which], spec_k)
    seq_drafts = record_drafts(sequential)
    want = sequential.generate(repetitive_prompt(), max_new_tokens=60)
    e = engine(target, drafters[which], spec_k)
    device_loop(e)
    dev_drafts = record_drafts(e)
    got = e.generate(repetitive_prompt(), max_new_tokens=60)
    assert e.decoder.counters.loop == "speculative-device"
    assert got.token_ids == want.token_ids == plain.token_ids
    s, w = got.stats, want.stats
    assert (s.steps, s.drafted_tokens, s.accepted_tokens) == (w.steps, w.drafted_tokens, w.accepted_tokens)
    same_drafts(seq_drafts, dev_drafts)
    if which == "one":
        assert s.accepted_tokens > s.steps // 2, s  # runs of accepted drafts: rows kept and dropped
    again = e.generate(repetitive_prompt(), max_new_tokens=60)  # a second generation starts afresh
    assert again.token_ids == plain.token_ids and again.stats.accepted_tokens == s.accepted_tokens


@pytest.mark.parametrize("store", ["paged", "paged_int8"])
def test_device_drafting_reads_only_what_it_wrote_and_nothing_on_the_host(case, store):
    """Before each device step the drafter's positions from ``length - 1`` on (the rows the target
    rejected, the last block's, unreserved pages) hold NaN, and the step may read no device value
    on the host: the drafts still equal the sequential loop's (a NaN read would change them)."""
    target, plain, drafters = case
    sequential = engine(target, drafters["random"], 7, kv_store=store)
    seq_drafts = record_drafts(sequential)
    want = sequential.generate(repetitive_prompt(), max_new_tokens=30)
    e = engine(target, drafters["random"], 7, kv_store=store)
    device_loop(e)
    dev_drafts = record_drafts(e)
    guarded = guard_steps(e.decoder.loop)  # the k of each step run under the guard
    poison_unread_positions(e.decoder.loop, [(e.proposer.kv, 1)])  # before each guarded step
    got = e.generate(repetitive_prompt(), max_new_tokens=30)
    assert got.token_ids == want.token_ids and got.stats.decode_loop == "speculative-device"
    assert len(guarded) >= got.stats.steps > 5
    same_drafts(seq_drafts, dev_drafts)
    if store == "paged":
        assert got.token_ids == plain.token_ids[:30]


def test_the_device_loop_stops_at_length_and_eos(case, checkpoint_factory):
    target, plain, drafters = case
    for which in ("random", "one"):
        e = engine(target, drafters[which], 7)
        device_loop(e)
        assert_length_stops(plain, e)
    common = collections.Counter(plain.token_ids).most_common(1)[0][0]
    index = plain.token_ids.index(common)
    with_eos = checkpoint_factory(**TARGET, eos=common)
    for which in ("random", "one"):
        e = engine(with_eos, drafters[which], 3)
        device_loop(e)
        out = e.generate(repetitive_prompt(), max_new_tokens=60)
        assert out.token_ids == plain.token_ids[:index + 1] and out.stats.finish_reason == "eos"


def test_device_drafting_needs_room_for_a_block(case, tmp_path):
    """A sequence whose last block would pass the drafter's context keeps the sequential loop."""
    target, _, _ = case
    short = make_dflash(tmp_path / "short", max_positions=64)
    p = engine(target, short, 3).proposer
    assert p.device_drafting(64 - 8) and not p.device_drafting(64 - 7)


def test_the_shipped_drafter_drafts_the_same_on_the_device():
    """The shipped target and drafter on the EDIT task (drafts accepted in runs of every length):
    the device loop commits the sequential loop's tokens with the same drafts."""
    import tileinfer

    if not (ROOT / "models" / "dflash" / "config.json").is_file():
        pytest.skip("models/dflash/ is not there yet")
    from tileinfer.models import prompts
    keys = dict(proposer="dflash", spec_k=15, device="cpu", dtype="float32", progress=False, temperature=0.0,
                repetition_penalty=1.0)
    sequential = tileinfer.Engine.from_config("reference", **keys)
    edit = prompts.benchmark_prompts(sequential.tokenizer, 300)[0]
    seq_drafts = record_drafts(sequential)
    want = sequential.generate(edit.token_ids, max_new_tokens=40)
    e = tileinfer.Engine.from_config("reference", **keys)
    device_loop(e)
    dev_drafts = record_drafts(e)
    got = e.generate(edit.token_ids, max_new_tokens=40)
    assert got.token_ids == want.token_ids and want.stats.tokens_per_step > 2
    assert got.stats.accepted_tokens == want.stats.accepted_tokens
    same_drafts(seq_drafts, dev_drafts)


def test_the_triton_kernels_replay_and_draft_on_the_device(checkpoint_factory, tmp_path):
    """The Triton attention (the paged kernels' small-step path, non-causal blocks, positions
    from the device): replayed steps draft as eager ones, and the device loop as the sequential
    one, the positions it must write before reading poisoned (power-of-two heads: head_dim 32
    for the target, 16 for the drafter; a 2-layer target and a 1-layer drafter, a 13-token prompt
    and 6 new tokens, the target's and the drafter's positions across the page at 16: the
    interpreter is slow)."""
    target = checkpoint_factory(**{**TARGET, "head_dim": 32, "layers": 2})
    drafter = make_dflash(tmp_path / "random", head_dim=16, layers=1, num_target_layers=2, target_layer_ids=(0, 1),
                          max_positions=1024)
    prompt = repetitive_prompt()[:13]
    eager = triton_engine(target, drafter, 3)
    want_drafts = record_drafts(eager)
    want = eager.generate(prompt, max_new_tokens=6)
    e = triton_engine(target, drafter, 3)
    replayed(e)
    got_drafts = record_drafts(e)
    assert e.generate(prompt, max_new_tokens=6).token_ids == want.token_ids
    assert got_drafts == want_drafts and got_drafts
    e = triton_engine(target, drafter, 3)
    device_loop(e)
    dev_drafts = record_drafts(e)
    poison_unread_positions(e.decoder.loop, [(e.proposer.kv, 1)])
    got = e.generate(prompt, max_new_tokens=6)
    assert e.decoder.counters.loop == "speculative-device" and got.token_ids == want.token_ids
    same_drafts(want_drafts, dev_drafts)


# -- on a GPU ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("attention", ["reference", "triton"])
def test_cuda_graphs_give_the_eager_drafts_on_a_gpu(checkpoint_factory, tmp_path, attention):
    """The drafter's steps replayed from CUDA graphs (cuda_graphs=true) draft what its eager steps
    draft, and the target keeps plain greedy's tokens (float32: the replayed attention splits the
    keys for the pool's capacity, the eager one for the context, which rounds differently;
    power-of-two heads for Triton)."""
    import tileinfer

    target = checkpoint_factory(**{**TARGET, "head_dim": 32})
    drafter = make_dflash(tmp_path / "random", head_dim=16, max_positions=1024)
    keys = dict(model=str(target), device="cuda", dtype="float32", kv_page_size=16, progress=False,
                linear=attention, attention=attention, pipelined=False)
    plain = tileinfer.Engine.from_config(cuda_graphs=False, **keys).generate(repetitive_prompt(), max_new_tokens=40)
    runs = {}
    for graphs in (False, True):
        e = tileinfer.Engine.from_config(proposer="dflash", spec_k=7, cuda_graphs=graphs,
                                         options={"dflash": {"model": str(drafter)}}, **keys)
        assert e.proposer.steps.graphed == graphs
        drafts = record_drafts(e)
        runs[graphs] = e.generate(repetitive_prompt(), max_new_tokens=40), drafts
    assert runs[True][0].token_ids == runs[False][0].token_ids == plain.token_ids
    assert runs[True][1] == runs[False][1]
    assert sorted(e.proposer.steps.graphs) == ["block"] + sorted(f"context{n}" for n in range(1, 9))


@pytest.mark.gpu
@pytest.mark.parametrize("attention", ["reference", "triton"])
def test_the_device_loop_from_cuda_graphs_gives_the_sequential_tokens_on_a_gpu(checkpoint_factory, tmp_path,
                                                                               attention):
    """The device loop captured into CUDA graphs with DFlash drafting inside them commits the
    sequential loop's tokens with the same counts, with drafts rejected and accepted in runs."""
    import tileinfer
    from tileinfer.steps import cuda_graph_capture

    target = checkpoint_factory(**{**TARGET, "head_dim": 32})
    keys = dict(model=str(target), device="cuda", dtype="float32", kv_page_size=16, progress=False,
                linear=attention, attention=attention, pipelined=False, cuda_graphs=True)
    plain = tileinfer.Engine.from_config(**keys).generate(repetitive_prompt(), max_new_tokens=60)
    common = collections.Counter(plain.token_ids).most_common(1)[0][0]
    for drafter in (make_dflash(tmp_path / "random", head_dim=16, max_positions=1024),
                    make_dflash(tmp_path / "one", head_dim=16, mask=common, quiet=1e-3, max_positions=1024)):
        runs = []
        for device in (False, True):
            e = tileinfer.Engine.from_config(proposer="dflash", spec_k=7, options={"dflash": {"model": str(drafter)}},
                                             **keys)
            if device:
                device_loop(e, capture=cuda_graph_capture)
            runs.append(e.generate(repetitive_prompt(), max_new_tokens=60))
        assert e.decoder.counters.loop == "speculative-device"
        assert runs[1].token_ids == runs[0].token_ids == plain.token_ids
        s, w = runs[1].stats, runs[0].stats
        assert (s.steps, s.drafted_tokens, s.accepted_tokens) == (w.steps, w.drafted_tokens, w.accepted_tokens)
