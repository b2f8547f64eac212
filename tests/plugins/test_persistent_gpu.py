"""``forward=persistent`` on a GPU in bfloat16, the default config (CUDA graphs, the Triton linear
and attention around it): against its twin the per-op step, rows that are the same bits in a
1-token and a 16-token step, and speculative greedy decoding that gives plain greedy's tokens,
token for token, for every proposer and several k, with BF16 and INT8 weights; a few of these cases
over INT8 KV pages (``kv_store=paged_int8``) too.

Shapes: an odd tiny target (7 layers, hidden 96, GQA 4 / 2 heads of 32, the DFlash tests' layer
count), the shipped target (3 query heads a kv head) and the Qwen3-0.6B shape with random weights
(bench/shapes.py); the speculative identity also at Qwen3-4B, with a draft model and a DFlash
drafter of each shape's width, and on the shipped family with its own draft model and drafter.
The per-op step reduces in other orders (the 1-token GEMV on CUDA cores, attention splits sized by
the context), so logits agree to a bound, stated in ``close``; ``pytest -s`` prints the measured differences.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import tileinfer
from conftest import repetitive_prompt
from dflash_checkpoints import make_dflash
from tileinfer.interfaces import Step
from tileinfer.model import stack_forward
from tileinfer.plugins.per_op import PerOpForward
from tileinfer.plugins.persistent_forward import PersistentForward

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
TARGET = dict(layers=7, hidden=96, heads=4, kv_heads=2, head_dim=32, intermediate=160, vocab=320, tie=True,
              tokenizer=False, std=0.2, max_positions=2048)
CONTEXT = 1000


def build(folder, **keys) -> tileinfer.Engine:
    return tileinfer.Engine.from_config(model=str(folder), device="cuda", dtype="bfloat16", progress=False, **keys)


@pytest.fixture(scope="module")
def qwen3_06b():
    """The benchmarks' random Qwen3-0.6B checkpoint, written once for every worker of a run."""
    from bench.shapes import CHECKPOINTS, write_random_checkpoint
    return write_random_checkpoint("Qwen3-0.6B", CHECKPOINTS / "Qwen3-0.6B")


@pytest.fixture(scope="module", params=["tiny", "Qwen3-0.6B", "shipped"])
def folder(request, checkpoint_factory):
    if request.param == "shipped":  # 3 query heads a kv head: attention tiles of 48 rows padded to 64
        return ROOT / "models" / "target"
    return checkpoint_factory(**TARGET) if request.param == "tiny" else request.getfixturevalue("qwen3_06b")


def steps(engine, t: int, forward) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of one step of ``t`` tokens after CONTEXT positions, and the layer-0 keys after it."""
    m, kv = engine.model, engine.kv
    ids = torch.randint(0, m.config.vocab_size, (CONTEXT + t,), generator=torch.Generator().manual_seed(3)).cuda()
    kv.reset()
    kv.reserve(CONTEXT + t)
    stack_forward(m, ids[:CONTEXT], Step.at(0, CONTEXT, m.device), kv)
    logits, _ = forward(ids[CONTEXT:], Step.at(CONTEXT, t, m.device), kv)
    return logits.clone(), kv.k[0].clone()


def close(out: torch.Tensor, ref: torch.Tensor) -> None:
    """bf16 logits of two reduction orders: within 3 % of the largest logit, and the same argmax on
    at least 90 % of the rows."""
    diff = (out - ref).abs().max().item() / ref.abs().max().item()
    same = (out.argmax(-1) == ref.argmax(-1)).float().mean().item()
    print(f"max |diff| / max |logit| {diff:.2e}, same argmax {same:.2f}")
    assert diff < 0.03 and same >= 0.9


@pytest.mark.parametrize("quantize, kv_store", [("none", "paged"), ("int8", "paged"), ("none", "paged_int8"),
                                                ("int8", "paged_int8")])
def test_steps_agree_with_the_per_op_step(folder, quantize, kv_store):
    e = build(folder, quantize=quantize, kv_store=kv_store)
    per_op, persistent = PerOpForward(e.model), PersistentForward(e.model)
    for t in (1, 16):
        ref, _ = steps(e, t, per_op)
        out, _ = steps(e, t, persistent)
        close(out, ref)


@pytest.mark.parametrize("quantize, kv_store", [("none", "paged"), ("int8", "paged"), ("none", "paged_int8")])
def test_rows_are_the_same_bits_in_a_1_and_a_16_token_step(folder, quantize, kv_store):
    e = build(folder, quantize=quantize, kv_store=kv_store)
    fwd, m, kv = PersistentForward(e.model), e.model, e.kv
    together, keys = steps(e, 16, fwd)
    ids = torch.randint(0, m.config.vocab_size, (CONTEXT + 16,), generator=torch.Generator().manual_seed(3)).cuda()
    for i in range(16):
        kv.truncate(CONTEXT + i)
        kv.reserve(CONTEXT + i + 1)
        alone, _ = fwd(ids[CONTEXT + i:CONTEXT + i + 1], Step.at(CONTEXT + i, 1, m.device), kv)
        assert torch.equal(alone[0], together[i]), f"row {i}"
    assert torch.equal(bits(kv.k[0]), bits(keys))


def bits(pages: torch.Tensor) -> torch.Tensor:
    """The bytes of a page pool: the pool is torch.empty, and its unwritten slots may hold NaN bit
    patterns (memory of an earlier allocation), which compare unequal to themselves by value."""
    return pages.view(torch.uint8)


@pytest.mark.parametrize("options", [{"stages": 1},
                                     {"item_calls": True, "max_registers": 128, "programs_per_sm": 4},
                                     {"int8_convert": "permute"}, {"int8_convert": "cast"}])
@pytest.mark.parametrize("quantize", ["none", "int8"])
def test_how_the_chunks_are_loaded_changes_no_bit(folder, quantize, options):
    """Options that change when or how a GEMV chunk reaches the program (or how int8 weights become
    floats), not what it adds up: the same bits with BF16 weights; with INT8 weights the pipelined
    build (``stages`` 3, the default) and the register build (1) gave other last bits at the
    Qwen3-0.6B shape on an H100 (2026-12-05: the pipelined build's dot operands have Triton's
    kWidth 4, the register build's 2, so each MMA sums its K elements in another order), so there
    the logits are held to the per-op bound, and every build's rows stay batch-invariant."""
    e = build(folder, quantize=quantize)
    fwd = PersistentForward(e.model, options=options)
    for t in (1, 16):
        plain, _ = steps(e, t, PersistentForward(e.model))
        out, _ = steps(e, t, fwd)
        if quantize == "int8" and "stages" in options:  # the register build against the pipelined default
            close(out, plain)
        else:
            assert torch.equal(out, plain), f"T={t}"
    together, _ = steps(e, 16, fwd)
    alone, _ = steps(e, 1, fwd)
    assert torch.equal(alone[0], together[0])


PROPOSERS = [("ngram", 1), ("ngram", 3), ("ngram", 7), ("ngram", 15), ("draft", 2), ("draft", 5), ("dflash", 7),
             ("dflash", 15)]


@pytest.fixture(scope="module")
def tiny_case(checkpoint_factory, tmp_path_factory):
    """The target, a 2-layer draft model and a DFlash drafter with heads of 16 (attention=triton
    takes power-of-two heads only)."""
    target = checkpoint_factory(**TARGET)
    drafts = {"draft": checkpoint_factory(**{**TARGET, "seed": 1, "layers": 2}),
              "dflash": make_dflash(tmp_path_factory.mktemp("dflash") / "d", head_dim=16, mask=5, max_positions=1024,
                                    block=16)}
    return target, drafts


SPEC_CASES = [(proposer, k, quantize, "paged") for proposer, k in PROPOSERS for quantize in ("none", "int8")]
SPEC_CASES += [("ngram", 3, "none", "paged_int8"), ("draft", 5, "none", "paged_int8"),
               ("dflash", 7, "none", "paged_int8"), ("ngram", 15, "int8", "paged_int8")]


@pytest.mark.parametrize("proposer, k, quantize, kv_store", SPEC_CASES)
def test_speculative_greedy_gives_plain_greedy_tokens(tiny_case, proposer, k, quantize, kv_store):
    target, drafts = tiny_case
    prompt = repetitive_prompt()
    keys = dict(forward="persistent", quantize=quantize, kv_store=kv_store)
    plain = build(target, **keys).generate(prompt, max_new_tokens=64).token_ids
    options = {proposer: {"model": str(drafts[proposer])}} if proposer in drafts else {}
    spec = build(target, **keys, proposer=proposer, spec_k=k, options=options)
    assert spec.generate(prompt, max_new_tokens=64).token_ids == plain


# At the Qwen3 shapes (random weights): every proposer, two k each, the default and INT8 weights; a
# 2-layer draft model of the family's width and vocabulary, a 1-layer DFlash drafter in z-lab's format.
QWEN3_SPEC = [("ngram", 3), ("ngram", 15), ("draft", 3), ("draft", 7), ("dflash", 7), ("dflash", 15)]


@pytest.fixture(scope="module")
def qwen3_family():
    """shape -> (target, {proposer: model folder}), written once per shape in the benchmarks' cache
    of random checkpoints, which the workers of a parallel run share (bench.shapes.written_once:
    one family of each shape on the disk, not one a worker)."""
    from bench.shapes import CHECKPOINTS, write_random_checkpoint, write_random_drafter

    def get(shape: str):
        return (write_random_checkpoint(shape, CHECKPOINTS / shape),
                {"draft": write_random_checkpoint(shape, CHECKPOINTS / f"{shape}-draft2", seed=1, layers=2),
                 "dflash": write_random_drafter(shape, 1, 16, CHECKPOINTS / f"{shape}-dflash1x16")})

    return get


PLAIN: dict[tuple[str, str], list[int]] = {}  # (shape, quantize) -> plain greedy's tokens, once per worker


@pytest.mark.parametrize("proposer, k", QWEN3_SPEC)
@pytest.mark.parametrize("quantize", ["none", "int8"])
@pytest.mark.parametrize("shape", ["Qwen3-0.6B", "Qwen3-4B"])
def test_speculative_greedy_gives_plain_greedy_tokens_at_the_qwen3_shapes(qwen3_family, shape, quantize, proposer,
                                                                           k):
    """One case of a shape at a time over the workers of a parallel run (a lock: two 4B engines a
    case, so several cases at once would not fit the GPU); each worker's plain tokens taken once."""
    from bench.shapes import CHECKPOINTS, locked
    from bench.workloads import free_memory

    target, drafts = qwen3_family(shape)
    prompt = repetitive_prompt()
    keys = dict(forward="persistent", quantize=quantize)
    with locked(CHECKPOINTS / f".gpu-tests-{shape}.lock"):
        if (shape, quantize) not in PLAIN:
            PLAIN[shape, quantize] = build(target, **keys).generate(prompt, max_new_tokens=48).token_ids
        options = {proposer: {"model": str(drafts[proposer])}} if proposer in drafts else {}
        spec = build(target, **keys, proposer=proposer, spec_k=k, options=options)
        assert spec.generate(prompt, max_new_tokens=48).token_ids == PLAIN[shape, quantize], f"{proposer}@{k}"
        del spec
        free_memory()


# The shipped family (3 query heads a kv head) with its own draft model and DFlash drafter, on the
# spec table's EDIT prompt: the persistent step runs (no notice) and keeps plain greedy's tokens.
SHIPPED_SPEC = [("ngram", 15), ("draft", 3), ("draft", 7), ("dflash", 7), ("dflash", 15)]


@pytest.mark.parametrize("proposer, k", SHIPPED_SPEC)
def test_the_shipped_family_in_the_persistent_step_gives_plain_greedy_tokens(proposer, k, caplog):
    import logging

    from tileinfer.models import prompts

    greedy = dict(forward="persistent", temperature=0.0, repetition_penalty=1.0)
    with caplog.at_level(logging.WARNING, logger="tileinfer"):
        plain = build(ROOT / "models" / "target", **greedy)
        options = {"draft": {"model": str(ROOT / "models" / "draft")}} if proposer == "draft" else {}
        spec = build(ROOT / "models" / "target", **greedy, proposer=proposer, spec_k=k, options=options)
        edit = prompts.benchmark_prompts(plain.tokenizer, 300)[0]
        want = plain.generate(edit.token_ids, max_new_tokens=64).token_ids
        got = spec.generate(edit.token_ids, max_new_tokens=64)
    assert not [r.getMessage() for r in caplog.records if "forward=persistent" in r.getMessage()]
    assert got.token_ids == want, f"{proposer}@{k}"
    assert got.stats.tokens_per_step > 1, got.stats
