"""The benchmark harness without an engine run: bench/run.py's refusals and failure lines, the
warm-up rule of bench/workloads.py, bench/timing.py on a CPU."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import peers  # noqa: E402
import run  # noqa: E402
import timing  # noqa: E402
from workloads import WARMUP_TOKENS, EngineRunner, Workload, measure, workloads  # noqa: E402


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU refusal")
def test_run_py_refuses_a_qwen3_shape_on_a_cpu_before_writing_anything(tmp_path, capsys):
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    status = run.main(["--shape", "tiny", "--shape", "Qwen3-4B", "--checkpoints", str(ckpt), "--out", str(out)])
    assert status == 2
    assert capsys.readouterr().err == ("error: shape Qwen3-4B needs a CUDA GPU (8.0 GB of weights); "
                                       "on a CPU use --shape tiny\n")
    assert not ckpt.exists() and not out.exists()


def test_a_failed_row_says_why_in_one_line():
    """Out of memory: the size asked for and the deepest line of ours it came through."""
    def allocate():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 128.00 GiB. GPU 0 has a total capacity\nof")

    try:
        allocate()
    except torch.OutOfMemoryError as exc:
        line = allocate.__code__.co_firstlineno + 1
        assert run.failure(exc) == f"out of memory, tried to allocate 128.00 GiB (at test_bench_harness.py:{line})"
    try:
        {}["x"]
    except KeyError as exc:
        assert run.failure(exc).startswith("KeyError: 'x' (at test_bench_harness.py:")


def test_warm_up_runs_the_whole_workload_for_a_peer_and_eight_tokens_for_the_engine():
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
    assert peers.HFRunner.full_warm_up and peers.CompiledEngineRunner.full_warm_up
    assert not getattr(EngineRunner, "full_warm_up", False)


def test_timing_on_a_cpu():
    calls = []
    seconds = timing.median_seconds(lambda: calls.append(1), "cpu", repeats=5, warmup=2)
    assert len(calls) == 7 and 0 <= seconds < 1
    assert timing.repeat(lambda: 1.0, 0) == [1.0]  # at least once
    assert timing.host_seconds(lambda: None, calls=3) >= 0


def gpu_matrix_parts() -> dict[str, tuple[str, list[str], list[str]]]:
    """``bash bench/gpu_matrix.sh --list``: part -> (shape, names, workloads; [] for all four)."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    listed = subprocess.run(["bash", "bench/gpu_matrix.sh", "--list"], cwd=root, capture_output=True, text=True,
                            check=True).stdout.splitlines()
    parts = {}
    for line in listed:
        rows, _, chosen = line.partition(" | ")
        part, shape, *names = rows.split()
        parts[part] = (shape, names, chosen.split())
    return parts


def test_gpu_matrix_parts_cover_every_variant_and_peer_once_per_shape():
    from peers import PEERS
    from variants import VARIANTS

    rows: dict[str, list[str]] = {}
    for part, (shape, (first, *names), _) in gpu_matrix_parts().items():
        assert first == "default", part  # every part measures its baseline
        rows.setdefault(shape, []).extend(names)
    assert set(rows) == set(run.GPU_SHAPES)
    for shape, names in rows.items():
        assert sorted(names) == sorted(n for n in [*VARIANTS, *PEERS] if n != "default"), shape


def test_gpu_matrix_measures_the_int8_peers_beside_our_int8_at_the_int8_targets_workloads():
    """One part per shape holds our INT8 weights and every INT8 peer, at prefill1024 and
    decode128_ctx1024 only (the INT8 targets), so that they are measured in the same run."""
    from peers import INT8_PEERS
    from workloads import NAMES

    int8_parts = {shape: (names, chosen) for shape, names, chosen in gpu_matrix_parts().values() if "int8" in names}
    assert set(int8_parts) == set(run.GPU_SHAPES)
    for shape, (names, chosen) in int8_parts.items():
        assert names == ["default", "int8", *INT8_PEERS], shape
        assert chosen == ["prefill1024", "decode128_ctx1024"] and set(chosen) <= set(NAMES), shape
    assert all(not chosen for _, names, chosen in gpu_matrix_parts().values() if "int8" not in names)


def test_long_prompt_ttft_workloads_are_prefills_outside_the_default_matrix():
    """prefill8192 and prefill32768 (bench/workloads.py): one new token, timed in ms, given as
    TFLOP/s and a fraction of the matmul peak like prefill1024; asked for by name, not run by default."""
    import records
    import shapes
    from tileinfer.model_config import ModelConfig
    from workloads import ALL_NAMES, NAMES, TTFT_NAMES, Measurement

    full, short = workloads(), workloads(short=True)
    assert set(TTFT_NAMES) <= set(full) and not set(TTFT_NAMES) & set(NAMES) and ALL_NAMES == NAMES + TTFT_NAMES
    for name, tokens in (("prefill8192", 8192), ("prefill32768", 32768)):
        w = full[name]
        assert (w.prompt_tokens, w.new_tokens, w.kind, w.unit) == (tokens, 1, "prefill", "ms")
        assert short[name].prompt_tokens == tokens // 32
    mc = ModelConfig.from_dict({**shapes.SHAPES["Qwen3-4B"], "model_type": "qwen3",
                                "architectures": ["Qwen3ForCausalLM"]})
    env = {"copy_bandwidth_tb_s": 4.0, "matmul_peak_tflops": 790.0}
    row = records.record(shape="Qwen3-4B", workload=full["prefill32768"], env=env, mc=mc,
                         measurement=Measurement(1000.0, "ms", [1000.0]))
    flops = 2 * 32768 * sum(o * i for o, i in shapes_of(mc)) * mc.num_layers + 2 * mc.vocab_size * mc.hidden_size \
        + 4 * 32768**2 / 2 * mc.num_heads * mc.head_dim * mc.num_layers
    assert row["tflops"] == pytest.approx(flops / 1e12) and row["peak_fraction"] == pytest.approx(flops / 1e12 / 790)


def shapes_of(mc):
    h, d, i = mc.hidden_size, mc.head_dim, mc.intermediate_size
    return [((mc.num_heads + 2 * mc.num_kv_heads) * d, h), (h, mc.num_heads * d), (2 * i, h), (h, i)]
