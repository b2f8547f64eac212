"""The benchmark matrix as pytest-benchmark tests: shape x variant-or-peer x workload.

    pytest bench/suite.py --benchmark-only        # on a GPU: the matrix (Qwen3-0.6B, Qwen3-4B)
    python -m pytest -q                           # anywhere: the smoke (shape tiny, short workloads)

Matrix (a GPU and ``--benchmark-only``, or ``TILEINFER_BENCH_MATRIX=1``): random weights of the
shapes in ``TILEINFER_BENCH_SHAPES`` (comma-separated; default Qwen3-0.6B,Qwen3-4B) under
``TILEINFER_BENCH_CHECKPOINTS`` (default /tmp/tileinfer-checkpoints), full-size workloads, every
variant and peer; each row warms up (workloads.warm_up: a short run of its prompt, the whole
workload for a peer), then pytest-benchmark times ``TILEINFER_BENCH_ROUNDS``
(default 3) rounds of it. The engine's own figure (prefill ms from ``stats.prefill_ms``, decode
tok/s from ``stats.decode_tok_s``) with its roofline fraction or TFLOP/s goes to ``extra_info``;
pytest-benchmark's own time is the wall time of the whole call.

Smoke (otherwise): shape ``tiny``, the CPU workload sizes, every variant plus the ``hf-sdpa``
peer, each run once with benchmarking disabled. On a CPU, variants that select Triton
implementations are skipped when ``TRITON_INTERPRET=1`` (the tests set it: the interpreter takes
~40 s a variant); without it they run their torch twins. Nothing asserts a timing: only that each
row ran and gave a positive finite figure, and that its record has the required fields.
"""

from __future__ import annotations

import functools
import os
import statistics
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

import limits as limits_mod  # noqa: E402
import peers as peers_mod  # noqa: E402
import report  # noqa: E402
import roofline  # noqa: E402
import shapes  # noqa: E402
from tileinfer.config import INTERFACE_KEYS, Config  # noqa: E402
from tileinfer.errors import ConfigError  # noqa: E402
from tileinfer.model_config import ModelConfig  # noqa: E402
from tileinfer.registry import build_registry  # noqa: E402
from variants import VARIANTS, engine_args, resolve  # noqa: E402
from workloads import NAMES, EngineRunner, Measurement, Workload, groups, warm_up, workloads  # noqa: E402

GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if GPU else "cpu")
TRITON_PLUGIN = "tileinfer.plugins.triton"


def matrix_mode(config: pytest.Config) -> bool:
    return GPU and (bool(config.getoption("benchmark_only", False)) or os.environ.get("TILEINFER_BENCH_MATRIX") == "1")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "row" not in metafunc.fixturenames:
        return
    if matrix_mode(metafunc.config):
        shape_names = os.environ.get("TILEINFER_BENCH_SHAPES", "Qwen3-0.6B,Qwen3-4B").split(",")
        names = [*VARIANTS, *peers_mod.PEERS]
    else:
        shape_names, names = ["tiny"], [*VARIANTS, "hf-sdpa"]
    rows = [(s, n, w) for s in shape_names for n in names for w in NAMES]
    metafunc.parametrize("row", rows, ids=["/".join(r) for r in rows])


@pytest.fixture(scope="module")
def mode(request) -> str:
    return "matrix" if matrix_mode(request.config) else "smoke"


@pytest.fixture(scope="module")
def sized(mode) -> dict[str, Workload]:
    return workloads(short=mode == "smoke")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The tiny shape's ops are too small to split: on a 2-core CPU more threads only add jitter."""
    threads = torch.get_num_threads()
    if not GPU:
        torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def env() -> dict:
    return report.environment(limits_mod.measure(DEVICE))


@pytest.fixture(scope="module")
def checkpoint(mode, tmp_path_factory):
    """``checkpoint(shape)``: the folder of a random-weight checkpoint, written once."""
    root = (Path(os.environ.get("TILEINFER_BENCH_CHECKPOINTS", "/tmp/tileinfer-checkpoints")) if mode == "matrix"
            else tmp_path_factory.mktemp("bench-checkpoints"))

    @functools.cache
    def get(shape: str) -> Path:
        return shapes.write_random_checkpoint(shape, root / shape)

    return get


@pytest.fixture(scope="module")
def runners():
    """One live runner at a time, reused by consecutive rows with the same key."""
    slot: dict = {}

    def get(key: tuple, make):
        if key not in slot:
            for old in slot.values():
                old.close()
            slot.clear()
            slot[key] = make()
        return slot[key]

    yield get
    for old in slot.values():
        old.close()


@functools.cache
def _triton_names() -> dict[str, set[str]]:
    registry = build_registry()
    return {kind: {e.implementation.name for e in registry.entries(kind) if e.plugin == TRITON_PLUGIN}
            for kind in INTERFACE_KEYS}


def interpreted(config: Config) -> bool:
    """Whether this config would run Triton kernels in the interpreter (a CPU with TRITON_INTERPRET=1)."""
    if GPU or os.environ.get("TRITON_INTERPRET") != "1":
        return False
    return any(getattr(config, kind) in names for kind, names in _triton_names().items())


def test_bench(row, mode, sized, env, checkpoint, runners, benchmark):
    shape, name, workload_name = row
    w = sized[workload_name]
    is_peer = name in peers_mod.PEERS
    extra = [f"device={DEVICE.type}"]
    try:
        config = resolve("default" if is_peer else name, extra)
    except ConfigError as exc:
        pytest.skip(f"variant {name} does not load: {exc}")
    if not is_peer and interpreted(config):
        pytest.skip("Triton variant: the interpreter is too slow for the CPU smoke (it runs on a GPU)")
    folder = checkpoint(shape)
    per_context = not is_peer or name in peers_mod.PER_CONTEXT
    capacity = next(c for c, group in groups(list(sized.values()), config.spec_k, per_context) if w in group)

    def make():
        if is_peer:
            return peers_mod.runner(name, folder, DEVICE, kv_capacity=capacity, device_override=extra)
        return EngineRunner(folder, *engine_args(name, extra), kv_capacity=capacity)

    try:
        runner = runners((shape, name, capacity), make)
    except ConfigError as exc:
        pytest.skip(f"variant {name} does not build: {exc}")
    except Exception as exc:  # a peer that cannot run is reported, not our failure
        if not is_peer:
            raise
        pytest.skip(f"peer {name} did not run: {type(exc).__name__}: {exc}")
    sample = runner.sample(w)
    values: list[float] = []
    try:
        if mode == "matrix":
            warm_up(runner, w)  # kernel compilation, graph capture, first allocations
        else:
            benchmark.disabled = True  # the smoke runs the function once and times nothing
        rounds = int(os.environ.get("TILEINFER_BENCH_ROUNDS", "3")) if mode == "matrix" else 1
        benchmark.pedantic(lambda: values.append(sample()), rounds=rounds, iterations=1)
    except torch.OutOfMemoryError as exc:
        pytest.skip(f"out of memory: {str(exc).splitlines()[0]}")
    except Exception as exc:
        if not is_peer:
            raise
        pytest.skip(f"peer {name} did not run: {type(exc).__name__}: {exc}")
    record = report.record(shape=shape, workload=w, env=env, mc=ModelConfig.from_folder(folder),
                           variant=None if is_peer else name, peer=name if is_peer else None,
                           measurement=Measurement(statistics.median(values), w.unit, values), layout=runner.layout(),
                           kv_capacity=capacity)
    benchmark.extra_info.update({k: record[k] for k in ("value", "unit", "roofline_fraction", "tflops",
                                                         "peak_fraction", "prompt_tokens", "new_tokens")})
    report.check(record)


def test_roofline_counts_match_the_shapes_and_the_readme():
    """Byte and FLOP counts: bench/shapes.py's weight bytes, README's 7.44 + 0.31 TFLOP (Qwen3-4B)."""
    for name, raw in shapes.SHAPES.items():
        mc = ModelConfig.from_dict({**raw, "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]})
        assert roofline.weight_bytes(mc) == shapes.weight_bytes(name)
        assert roofline.kv_bytes_per_position(mc) == shapes.kv_bytes_per_position(name)
        assert roofline.kv_bytes_per_position(mc, "int8") < roofline.kv_bytes_per_position(mc) * 0.6
        assert roofline.weight_bytes(mc, "int8") < roofline.weight_bytes(mc) * (0.55 if name == "tiny" else 0.51)
    mc = ModelConfig.from_dict({**shapes.SHAPES["Qwen3-4B"], "model_type": "qwen3",
                                "architectures": ["Qwen3ForCausalLM"]})
    flops = roofline.prefill_flops(mc, 1024)
    assert round(flops["gemm"] / 1e12, 2) == 7.44 and round(flops["attention"] / 1e12, 2) == 0.31


def test_every_variant_loads_or_says_why():
    """A variant either resolves or raises ConfigError (then the matrix skips it with the reason)."""
    for name in VARIANTS:
        try:
            resolve(name)
        except ConfigError as exc:
            assert str(exc)


def test_run_py_end_to_end(tmp_path, capsys):
    """bench/run.py at the tiny shape: limits, two variants, JSON and Markdown with the required fields."""
    import json

    import run

    args = ["--shape", "tiny", "--variant", "reference", "--seconds", "0", "--workload", "prefill1024",
            "--workload", "decode128_ctx1024", "--checkpoints", str(tmp_path / "ckpt"), "--out", str(tmp_path / "out"),
            "--no-peers", "--short"]
    with pytest.raises(SystemExit):  # an unknown variant is a usage error
        run.main([*args, "--variant", "no-such-variant"])
    assert run.main(args) == 0
    rows = json.loads((tmp_path / "out" / "results.json").read_text())
    assert {r["workload"] for r in rows} == {"prefill1024", "decode128_ctx1024"}
    for r in rows:
        report.check(r)
    assert "Ablation" in (tmp_path / "out" / "results.md").read_text()


def test_cuda_graph_table_gives_each_rows_gain():
    """The seed's three-row CUDA-graph table, from the ablation rows (made-up values)."""
    def row(variant: str, value: float) -> dict:
        return {"shape": "S", "variant": variant, "peer": None, "workload": report.GRAPH_WORKLOAD, "value": value,
                "unit": "tok/s", "roofline_fraction": value / 500, "tflops": None, "prompt_tokens": 1024,
                "new_tokens": 128, "note": None}

    rows = [row("tile-eager", 100.0), row("no-pipelining", 300.0), row("default", 450.0), row("unfused-eager", 50.0)]
    text = report.tables(rows)
    table = text.split("### CUDA graphs")[1]
    assert "| fused | CUDA graphs | no-pipelining | 300 tok/s (60.0%) | x3.00 |" in table
    assert "| fused | CUDA graphs + pipelined | default | 450 tok/s (90.0%) | x1.50 |" in table
    assert "| one kernel per op | eager | unfused-eager | 50.0 tok/s (10.0%) |  |" in table
    assert "no-fused-kernels" not in table  # rows not measured are left out
    assert report.CROSS_RUN not in table
    rows[2]["date"] = "another run"
    table = report.tables(rows).split("### CUDA graphs")[1]
    assert f"| default | 450 tok/s (90.0%) | x1.50{report.CROSS_RUN} |" in table
    assert f"{report.CROSS_RUN}: the two rows come from different runs." in table


def _row(variant: str | None, workload: str, value: float, date: str, peer: str | None = None) -> dict:
    unit = "ms" if workload.startswith("prefill") else "tok/s"
    return {"shape": "S", "variant": variant, "peer": peer, "workload": workload, "value": value, "unit": unit,
            "roofline_fraction": value / 1000 if unit == "tok/s" else None, "tflops": None if unit == "tok/s" else 1.0,
            "peak_fraction": None if unit == "tok/s" else 0.5, "prompt_tokens": 1024, "new_tokens": 128,
            "note": None, "date": date}


def test_merge_keeps_a_replaced_default_as_the_baseline_of_its_run():
    run1 = [_row("default", "prefill1024", 10.0, "1"), _row("cublas-linears", "prefill1024", 9.0, "1"),
            _row("reference", "prefill1024", 40.0, "1")]
    run2 = [_row("default", "prefill1024", 20.0, "2"), _row("reference", "prefill1024", 50.0, "2")]
    rows = report.merge(run1, run2)
    assert [(r["variant"], r["date"], bool(r.get("superseded"))) for r in rows] == [
        ("default", "1", True), ("cublas-linears", "1", False), ("default", "2", False), ("reference", "2", False)]
    assert [r["value"] for r in report.current(rows)] == [9.0, 20.0, 50.0]
    # the same run writing again (run.py writes after every row) replaces its own rows
    again = report.merge(rows, [*run2, _row("no-pipelining", "prefill1024", 21.0, "2")])
    assert again == [*rows, _row("no-pipelining", "prefill1024", 21.0, "2")]
    # once no row of run 1 is left, its baseline goes too
    gone = report.merge(rows, [_row("cublas-linears", "prefill1024", 18.0, "3")])
    assert all(r["date"] != "1" for r in gone)


def test_gains_divide_by_the_default_of_the_same_run_and_mark_the_others():
    run1 = [_row("default", "prefill1024", 10.0, "1"), _row("cublas-linears", "prefill1024", 9.0, "1")]
    run2 = [_row("default", "prefill1024", 20.0, "2"), _row(None, "prefill1024", 30.0, "2", peer="hf-sdpa")]
    run3 = [_row("reference", "prefill1024", 40.0, "3")]
    text = report.tables(report.merge(report.merge(run1, run2), run3))
    assert "| default | configs/default.yaml | 20.0 ms |" in text  # the newest default is the figure
    assert "| cublas-linears | linear=cublas | 9.00 ms x0.90 |" in text  # 10 / 9, its own run
    assert f"| reference | reference | 40.0 ms x2.00{report.CROSS_RUN} |" in text  # no default in its run
    assert "| hf-sdpa | 30.0 ms x1.50 |" in text
    ablation, peers = text.split("### Ablation")[1].split("### Peers")
    assert report.CROSS_RUN_NOTE in ablation and report.CROSS_RUN_NOTE not in peers


def test_a_failed_row_says_why_in_one_line():
    """Out of memory: the size asked for and the deepest line of ours it came through."""
    import run

    def allocate():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 128.00 GiB. GPU 0 has a total capacity\nof")

    try:
        allocate()
    except torch.OutOfMemoryError as exc:
        line = allocate.__code__.co_firstlineno + 1
        assert run.failure(exc) == f"out of memory, tried to allocate 128.00 GiB (at suite.py:{line})"
    try:
        {}["x"]
    except KeyError as exc:
        assert run.failure(exc).startswith("KeyError: 'x' (at suite.py:")


def test_warm_up_runs_the_whole_workload_for_a_peer_and_eight_tokens_for_the_engine():
    from workloads import WARMUP_TOKENS, measure

    class Runner:
        def __init__(self, full: bool) -> None:
            self.full_warm_up, self.runs = full, []

        def sample(self, workload: Workload):
            return lambda: self.runs.append(workload.new_tokens) or 1.0

    w = workloads()["decode128_ctx1024"]
    for full, first in ((True, w.new_tokens), (False, WARMUP_TOKENS)):
        runner = Runner(full)
        measure(runner, w, seconds=0)
        assert runner.runs == [first, w.new_tokens]
    assert peers_mod.HFRunner.full_warm_up and peers_mod.CompiledEngineRunner.full_warm_up
    assert not getattr(EngineRunner, "full_warm_up", False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU message")
@pytest.mark.parametrize("script", ["prefill_host_time", "profile_decode_step", "decode_step_experiments"])
def test_engine_scripts_say_in_one_line_that_they_need_a_gpu(script, capsys, monkeypatch):
    import importlib

    monkeypatch.syspath_prepend(str(Path(__file__).parent / "kernels"))
    module = importlib.import_module(script)
    assert module.main(["--shapes", "tiny"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {script}.py needs a CUDA GPU (none is visible)\n"
