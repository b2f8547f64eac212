"""The INT8 weight-only peers of bench/peers.py (engine-compiled-int8, hf-torchao-int8) built on the
tiny shape on a CPU, a peer that cannot run made visible in the report's peers table, and gemlite's
A16W8 column of the linear benchmark (its reason where gemlite does not import; its figures on a GPU)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from bench import matrix_tables, peers, records
from bench.__main__ import main as bench
from bench.shapes import write_random_checkpoint
from bench.workloads import workloads


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return write_random_checkpoint("tiny", tmp_path_factory.mktemp("ckpt") / "tiny")


def test_the_int8_peers_are_listed_and_built_per_context():
    assert set(peers.INT8_PEERS) <= set(peers.PEERS) and set(peers.INT8_PEERS) <= set(peers.PER_CONTEXT)
    assert len(set(peers.PEERS)) == len(peers.PEERS)


def test_engine_compiled_int8_is_the_compiled_reference_model_with_int8_weights(tiny):
    """Construction and one eager step (the prefill) on a CPU, the decode steps routed to the compiled
    forward pass (here a stand-in that counts them: torch.compile of the tiny model takes ~40 s on this
    project's CPU; the compiled steps run on the GPU)."""
    runner = peers.runner("engine-compiled-int8", tiny, torch.device("cpu"), kv_capacity=64,
                          device_override=["device=cpu"])
    try:
        engine = runner.engine
        assert (engine.config.linear, engine.config.quantize) == ("reference", "int8")
        assert not engine.config.cuda_graphs  # configs/reference.yaml: the graphs are torch.compile's
        forward = engine.decoder.steps.forward_pass
        assert isinstance(forward, peers.CompiledForward) and forward.capacity == engine.kv.capacity
        dtypes = {t.dtype for t in peers._tensors(engine.model)}
        assert torch.int8 in dtypes and torch.bfloat16 not in dtypes  # float32 on a CPU
        assert runner.layout()["quantize"] == "int8"  # its roofline counts INT8 weight bytes
        assert runner.full_warm_up
        ms = runner.sample(workloads(short=True)["prefill1024"])()
        assert ms > 0
        steps = []

        def compiled(tokens, step, kv):
            steps.append(step.max_context)
            return forward.eager(tokens, step, kv)

        forward.compiled = compiled
        engine.generate([5, 6, 7], max_new_tokens=4, ignore_eos=True)
        assert steps == [engine.kv.capacity] * 3  # the prefill eager, each decode step compiled
    finally:
        runner.close()


@pytest.mark.gpu
def test_engine_compiled_int8_decodes_the_tokens_of_the_eager_int8_reference(tiny):
    """The compiled decode steps (CUDA graphs through torch.compile) against the same model run
    eagerly, in float32 so that no rounding difference can flip a greedy choice."""
    from bench.workloads import EngineRunner

    over = ["device=cuda", "dtype=float32"]
    prompt = [(7 * i) % 500 + 3 for i in range(40)]
    runner = peers.runner("engine-compiled-int8", tiny, torch.device("cuda"), kv_capacity=64, device_override=over)
    try:
        compiled = runner.engine.generate(prompt, max_new_tokens=12, ignore_eos=True).token_ids
    finally:
        runner.close()
    eager = EngineRunner(tiny, ["reference"], [*over, "quantize=int8"], kv_capacity=64)
    try:
        assert list(compiled) == list(eager.engine.generate(prompt, max_new_tokens=12, ignore_eos=True).token_ids)
    finally:
        eager.close()


def test_hf_torchao_int8_quantizes_every_linear_with_torchao(tiny):
    pytest.importorskip("torchao")
    runner = peers.runner("hf-torchao-int8", tiny, torch.device("cpu"), kv_capacity=64, device_override=[])
    try:
        linears = {n: m.weight for n, m in runner.model.named_modules() if isinstance(m, torch.nn.Linear)}
        assert "lm_head" in linears and len(linears) == 1 + 7 * 2  # 7 projections a layer, 2 layers
        assert all("Int8" in type(w).__name__ for w in linears.values()), {n: type(w) for n, w in linears.items()}
        assert type(runner.model.model.embed_tokens.weight) is torch.nn.Parameter  # the embedding stays BF16
        assert runner.model.model.embed_tokens.weight.dtype == torch.bfloat16
        assert runner.kwargs["cache_implementation"] == "static" and "compile_config" in runner.kwargs
        assert runner.layout() == {"quantize": "int8"}
        assert runner.sample(workloads(short=True)["prefill1024"])() > 0
    finally:
        runner.close()


def test_a_peer_that_cannot_run_is_a_record_with_its_reason_in_the_peers_table(tiny, tmp_path, monkeypatch):
    """torchao made unimportable: the row is recorded with "cannot run: ...", shown in the peers
    table, and the peers with no row at all are named under it."""
    monkeypatch.setitem(sys.modules, "torchao", None)  # `import torchao` raises ImportError
    with pytest.raises(RuntimeError, match=r"^cannot run: torchao does not import \(ModuleNotFoundError"):
        peers.runner("hf-torchao-int8", tiny, torch.device("cpu"), kv_capacity=64, device_override=[])
    out = tmp_path / "records.jsonl"
    assert bench(["peers", "--shape", "tiny", "--variant", "hf-torchao-int8", "--workload", "prefill1024",
                  "--seconds", "0", "--checkpoints", str(tiny.parent), "--records", str(out)]) == 0
    [row] = records.load(out)
    assert row["peer"] == "hf-torchao-int8" and row["value"] is None
    assert row["note"].startswith("RuntimeError: cannot run: torchao does not import (ModuleNotFoundError")
    peer_table = matrix_tables.peers_table([row])
    assert f"| hf-torchao-int8 | – ({row['note']}) |" in peer_table
    absent = [p for p in peers.PEERS if p != "hf-torchao-int8"]
    assert f"Not measured (no record of this commit): {', '.join(absent)}." in peer_table


def row(peer: str | None, value: float | None, note: str | None = None, variant: str | None = None) -> dict:
    return {"kind": "matrix", "shape": "S", "variant": variant, "peer": peer, "workload": "decode128_ctx1024",
            "value": value, "unit": "tok/s", "roofline_fraction": None if value is None else value / 1000,
            "tflops": None, "peak_fraction": None, "prompt_tokens": 1024, "new_tokens": 128, "note": note,
            "part": None, "config": None, "versions": {"gpu": "G"}, "commit": "abc1234",
            "date": "2026-12-01T10:00:00+00:00", "copy_bandwidth_tb_s": 4.2, "matmul_peak_tflops": 780.0}


def test_peers_of_other_commands_follow_and_absent_peers_are_named():
    rows = [row(None, 400.0, variant="default"), row("engine-compiled-int8", 96.0),
            row("llama.cpp-q8_0", 300.0), row("hf-torchao-int8", None, "RuntimeError: cannot run: " + "x" * 150)]
    table = matrix_tables.peers_table(rows)
    lines = [line.split(" |")[0] for line in table.splitlines() if line.startswith("| ")]
    assert lines == ["| peer", "| default (2026-12-01T10:00:00+00:00)", "| engine-compiled-int8", "| hf-torchao-int8",
                     "| llama.cpp-q8_0"]
    assert "| llama.cpp-q8_0 | 300 tok/s x1.33 |" in table
    assert f"– (RuntimeError: cannot run: {'x' * 150})" in table  # the whole reason, not cut at 100
    assert "Not measured (no record of this commit): hf-sdpa, hf-static-compile, engine-compiled." in table


def test_gemlite_column_records_why_where_gemlite_does_not_import(monkeypatch):
    from bench.kernels import linear

    monkeypatch.setitem(sys.modules, "gemlite", None)
    build, why = linear.gemlite_a16w8()
    assert build is None and why.startswith("gemlite does not import (ModuleNotFoundError")
    assert linear.gemlite_row("ValueError: no", None, None, 1) == {"gemlite_error": "ValueError: no"}


@pytest.mark.gpu
def test_gemlite_a16w8_from_our_int8_weights_matches_the_twin(tmp_path):
    """On the GPU (gemlite carried by bench/device.sh): T = 1 and 16 rows have gemlite's time and
    an error at bfloat16 rounding against the dequantize twin; other rows have no gemlite column."""
    from bench.kernels.linear import GEMLITE_TOKENS

    store = tmp_path / "records.jsonl"
    assert bench(["kernels", "linear", "--models", "tiny", "--tokens", "1,4,16", "--formats", "int8", "--repeats", "3",
                  "--records", str(store)]) == 0
    rows = [r for r in records.load(store) if r["kind"] == "linear"]
    reason = next(r["gemlite"] for r in rows if "gemlite" in r)
    if reason.startswith("gemlite does not import"):
        pytest.skip(reason)
    for r in rows:
        if r["T"] in GEMLITE_TOKENS and not r["swiglu"]:
            assert "gemlite_error" not in r, r
            assert r["gemlite_us"] > 0 and r["gemlite_max_abs_err"] <= 0.02 * r["max_abs_ref"], r
        else:
            assert not any(k.startswith("gemlite") for k in r), r


@pytest.mark.gpu
def test_hf_torchao_int8_decodes_on_the_gpu(tiny):
    """transformers' static cache and torch.compile over torchao's int8 tensors (the path the
    matrix measures), on the tiny shape."""
    pytest.importorskip("torchao")
    runner = peers.runner("hf-torchao-int8", tiny, torch.device("cuda"), kv_capacity=64, device_override=[])
    try:
        assert runner.sample(workloads(short=True)["decode128_ctx1024"])() > 0
    finally:
        runner.close()
