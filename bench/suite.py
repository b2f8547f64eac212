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
peer, each run once with benchmarking disabled (on a CPU ``auto`` resolves to the reference
implementations, so the Triton options are validated but their kernels do not run). A variant that
does not resolve is skipped with the reason (tests/bench/test_bench_variants.py checks that it
names the key). Nothing asserts a timing: only that each row ran and gave a positive finite
figure, and that its record has the required fields.
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
import records  # noqa: E402
import roofline  # noqa: E402
import shapes  # noqa: E402
from tileinfer.errors import ConfigError  # noqa: E402
from tileinfer.model_config import ModelConfig  # noqa: E402
from variants import VARIANTS, engine_args, resolve  # noqa: E402
from workloads import NAMES, EngineRunner, Measurement, Workload, groups, warm_up, workloads  # noqa: E402

GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if GPU else "cpu")


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
    return records.environment(limits_mod.measure(DEVICE))


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


def test_bench(row, mode, sized, env, checkpoint, runners, benchmark):
    shape, name, workload_name = row
    w = sized[workload_name]
    is_peer = name in peers_mod.PEERS
    extra = [f"device={DEVICE.type}"]
    folder = checkpoint(shape)
    try:
        config = resolve("default" if is_peer else name, [*extra, f"model={folder}"])
    except ConfigError as exc:
        pytest.skip(f"variant {name} does not load: {exc}")
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
    record = records.record(shape=shape, workload=w, env=env, mc=ModelConfig.from_folder(folder),
                           variant=None if is_peer else name, peer=name if is_peer else None,
                           measurement=Measurement(statistics.median(values), w.unit, values), layout=runner.layout(),
                           kv_capacity=capacity)
    benchmark.extra_info.update({k: record[k] for k in ("value", "unit", "roofline_fraction", "tflops",
                                                         "peak_fraction", "prompt_tokens", "new_tokens")})
    records.check(record)


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


def test_run_py_end_to_end(tmp_path, capsys):
    """bench/run.py at the tiny shape: limits, two variants, JSON and Markdown with the required
    fields; a second run replaces the first's rows."""
    import json

    import run

    args = ["--shape", "tiny", "--seconds", "0", "--workload", "prefill1024", "--checkpoints", str(tmp_path / "ckpt"),
            "--out", str(tmp_path / "out"), "--no-peers", "--short"]
    with pytest.raises(SystemExit):  # an unknown variant is a usage error
        run.main([*args, "--variant", "no-such-variant"])
    assert run.main([*args, "--workload", "decode128_ctx1024", "--variant", "default", "--variant", "reference"]) == 0
    rows = json.loads((tmp_path / "out" / "results.json").read_text())
    assert {(r["variant"], r["workload"]) for r in rows} == {
        (v, w) for v in ("default", "reference") for w in ("prefill1024", "decode128_ctx1024")}
    for r in rows:
        records.check(r)
    assert "| reference | reference |" in (tmp_path / "out" / "results.md").read_text()
    assert run.main([*args, "--variant", "default"]) == 0
    rows = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [(r["variant"], r["workload"]) for r in rows] == [("default", "prefill1024")]
