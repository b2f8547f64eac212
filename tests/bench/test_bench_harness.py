"""The benchmark harness: the matrix's failure lines, the warm-up rule of bench/workloads.py,
bench/timing.py on a CPU, the rooflines of bench/shapes.py, the command line; one engine run, the
follow-up turn's workload on a tiny checkpoint."""

from __future__ import annotations

import pytest
import torch

from bench import matrix, peers, shapes, timing
from bench.__main__ import COMMANDS, main as bench
from bench.workloads import (ALL_NAMES, JSON_NAMES, NAMES, TTFT_NAMES, WARMUP_TOKENS, EngineRunner, Measurement,
                             Workload)
from bench.workloads import failure, measure, workloads


def test_a_failed_row_says_why_in_one_line():
    """Out of memory: the size asked for and the deepest line of ours it came through."""
    def allocate():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 128.00 GiB. GPU 0 has a total capacity\nof")

    try:
        allocate()
    except torch.OutOfMemoryError as exc:
        line = allocate.__code__.co_firstlineno + 1
        assert failure(exc) == f"out of memory, tried to allocate 128.00 GiB (at test_bench_harness.py:{line})"
    try:
        {}["x"]
    except KeyError as exc:
        assert failure(exc).startswith("KeyError: 'x' (at test_bench_harness.py:")


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
    limits = timing.Limits(copy_bandwidth=4.2e12, matmul_peak=7.8e14).figures()
    assert limits == {"copy_bandwidth_tb_s": pytest.approx(4.2), "matmul_peak_tflops": pytest.approx(780.0)}


def linear_params(s: dict) -> int:
    """Parameters of one decoder layer's linears, counted from the shape's own fields."""
    h, d, i = s["hidden_size"], s["head_dim"], s["intermediate_size"]
    q, kv = s["num_attention_heads"] * d, s["num_key_value_heads"] * d
    return h * (q + 2 * kv) + q * h + 3 * h * i


@pytest.mark.parametrize("name", sorted(shapes.SHAPES))
def test_rooflines_count_every_weight_once_and_the_kv(name):
    s, mc = shapes.SHAPES[name], shapes.model_config(name)
    weights = s["num_hidden_layers"] * linear_params(s) + s["vocab_size"] * s["hidden_size"]  # the lm_head once
    assert shapes.weight_bytes(mc) == 2 * weights
    assert shapes.kv_bytes_per_position(mc) == 2 * 2 * s["num_hidden_layers"] * s["num_key_value_heads"] * s["head_dim"]
    assert shapes.kv_bytes_per_position(mc, "int8") < shapes.kv_bytes_per_position(mc) * 0.6
    assert shapes.weight_bytes(mc, "int8") < shapes.weight_bytes(mc) * (0.55 if name == "tiny" else 0.51)


def test_prefill_flops_of_qwen3_4b_are_the_readmes():
    """7.44 TFLOP of GEMMs and 0.31 of causal attention for 1,024 tokens at Qwen3-4B."""
    flops = shapes.prefill_flops(shapes.model_config("Qwen3-4B"), 1024)
    assert round(flops["gemm"] / 1e12, 2) == 7.44 and round(flops["attention"] / 1e12, 2) == 0.31


def test_long_prompt_ttft_workloads_are_prefills_outside_the_default_matrix():
    """prefill8192 and prefill32768: one new token, timed in ms, given as TFLOP/s and a fraction of
    the matmul peak like prefill1024; asked for by name, not run by default."""
    full, short = workloads(), workloads(short=True)
    assert set(TTFT_NAMES) <= set(full) and not set(TTFT_NAMES) & set(NAMES) and ALL_NAMES == NAMES + TTFT_NAMES + JSON_NAMES
    for name, tokens in (("prefill8192", 8192), ("prefill32768", 32768)):
        w = full[name]
        assert (w.prompt_tokens, w.new_tokens, w.kind, w.unit) == (tokens, 1, "prefill", "ms")
        assert short[name].prompt_tokens == tokens // 32
    s, mc = shapes.SHAPES["Qwen3-4B"], shapes.model_config("Qwen3-4B")
    limits = {"copy_bandwidth_tb_s": 4.0, "matmul_peak_tflops": 790.0}
    row = matrix.row(shape="Qwen3-4B", workload=full["prefill32768"], mc=mc, name="default", part=None, limits=limits,
                     measurement=Measurement(1000.0, "ms", [1000.0]))
    flops = 2 * 32768 * linear_params(s) * s["num_hidden_layers"] + 2 * s["vocab_size"] * s["hidden_size"] \
        + 4 * 32768**2 / 2 * s["num_attention_heads"] * s["head_dim"] * s["num_hidden_layers"]
    assert row["tflops"] == pytest.approx(flops / 1e12) and row["peak_fraction"] == pytest.approx(flops / 1e12 / 790)


def test_the_follow_up_turn_prefills_only_its_new_tokens(tiny_checkpoint):
    """prefill50_after4000: each sample leaves the history in the cache and times the 50 new tokens
    after it (the sample fails where the engine reused fewer); its FLOPs are those 50 tokens'
    after the history's positions; a peer's runner refuses it in one line."""
    w = workloads(short=True)["prefill50_after4000"]
    assert (w.cached, w.prompt_tokens - w.cached, w.kind, w.unit) == (4000 // 32, 50, "prefill", "ms")
    assert "prefill50" in TTFT_NAMES and w.name in TTFT_NAMES
    runner = EngineRunner(tiny_checkpoint, [], ["kv_page_size=16"], w.positions())
    try:
        sample = runner.sample(w)
        assert sample() > 0 and sample() > 0
    finally:
        runner.close()
    mc = shapes.model_config("Qwen3-4B")
    cold, follow = shapes.prefill_flops(mc, 4050), shapes.prefill_flops(mc, 50, 4000)
    lm_head = 2.0 * mc.vocab_size * mc.hidden_size  # the last token's, in both
    assert follow["gemm"] - lm_head == pytest.approx((cold["gemm"] - lm_head) * 50 / 4050)
    assert follow["attention"] == pytest.approx(cold["attention"] - shapes.prefill_flops(mc, 4000)["attention"])
    with pytest.raises(NotImplementedError, match="no KV cache across generations"):
        peers.HFRunner.sample(None, w)


def test_every_time_to_first_token_the_bench_reports_is_a_cold_prefill(tiny_checkpoint):
    """The engine keeps what a generation leaves for the next prompt that starts with it (prefix
    reuse): a repeated prompt is served from the cache. The prefill rows, the spec bench's and the
    server bench's direct path each run a cold prefill (cached_tokens 0), every repeat."""
    from bench import server, speculative
    from bench.workloads import random_prompt

    w = workloads(short=True)["prefill1024"]
    runner = EngineRunner(tiny_checkpoint, [], ["kv_page_size=16"], w.positions())
    engine, seen = runner.engine, []
    real_stream = engine._stream

    def spy(ids, params):
        for chunk in real_stream(ids, params):
            if chunk.stats is not None:
                seen.append(chunk.stats.cached_tokens)
            yield chunk

    try:
        prompt = random_prompt(w.prompt_tokens, engine.model_config.vocab_size)
        engine.generate(prompt, max_new_tokens=1, ignore_eos=True)
        assert engine.generate(prompt, max_new_tokens=1, ignore_eos=True).stats.cached_tokens == len(prompt) - 1
        engine._stream = spy
        sample = runner.sample(w)
        assert sample() > 0 and sample() > 0
        speculative.run(engine, prompt, 2, 2)
        server.direct(engine, "def f(x):", 2)
        server.direct(engine, "def f(x):", 2)
        assert seen == [0] * 7
    finally:
        runner.close()


def test_every_command_has_a_truthful_help(capsys):
    """``python -m bench COMMAND --help`` of each command builds its parser (the kernels' subcommands too)."""
    for command in COMMANDS:
        with pytest.raises(SystemExit) as exit_:
            bench([command, "--help"])
        assert exit_.value.code == 0, command
        assert f"usage: python -m bench {command}" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        bench(["no-such-command"])
    assert exit_.value.code == 2 and "invalid choice: 'no-such-command'" in capsys.readouterr().err


def test_the_json_schema_workload_decodes_its_tokens_under_the_grammar(tiny_checkpoint):
    """decode128_json_ctx1024 (short: 8 tokens) runs every token under DECODE_SCHEMA, which no run
    can complete before its count: a decode rate over the full count, read on the host each step."""
    pytest.importorskip("xgrammar")
    w = workloads(short=True)["decode128_json_ctx1024"]
    assert w.schema and w.kind == "decode" and w.name in JSON_NAMES
    runner = EngineRunner(tiny_checkpoint, ["reference"], ["device=cpu", "dtype=float32"], w.positions())
    assert runner.sample(w)() > 0
    assert runner.engine.decoder.counters.steps == w.new_tokens - 1


def test_a_persistent_build_of_an_unknown_shape_is_a_one_line_error(capsys, tmp_path):
    records = tmp_path / "r.jsonl"
    assert bench(["persistent-build", "--shape", str(tmp_path / "nothing"), "--records", str(records)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: --shape ") and "checkpoint folder" in err
    assert not records.exists()
