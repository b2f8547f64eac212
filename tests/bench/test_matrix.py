"""``python -m bench matrix`` on a CPU: every variant and the hf-sdpa peer at the tiny shape and the
short workloads, one sample each, decodes of 2 new tokens (one step after the prefill: a row's figure
and roofline hold at any count, and each step of the persistent variants runs the whole stack in the
interpreter); the figures of a CPU say nothing: only that each row ran, gave a positive finite figure
and its roofline, or says why it did not. The H200 parts cover the matrix."""

from __future__ import annotations

import gc
import math

import pytest
import torch

from bench import matrix, matrix_tables, peers, records
from bench.__main__ import main as bench
from bench.workloads import VARIANTS
from bench.workloads import NAMES

NAMES_RUN = [*VARIANTS, "hf-sdpa"]
SHORT_RUN = ("prefill1024", "decode128_ctx1024")  # one engine a variant: the same (short) context
NEW_TOKENS = 2


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> dict[str, list[dict]]:
    """The smoke run's records by variant or peer: the default at every workload (a runner per
    context), the others at a prefill and a decode of one context. The objects alive before each
    run are frozen (gc.freeze), so that the collection after each runner (bench.workloads.free_memory)
    scans what the runs made, not the test process's heap (0.2 s a collection otherwise)."""
    if torch.cuda.is_available():
        pytest.skip("the CPU smoke (a GPU runs the Qwen3 shapes)")
    folder = tmp_path_factory.mktemp("matrix")
    argv = ["matrix", "--shape", "tiny", "--seconds", "0", "--checkpoints", str(folder / "ckpt"),
            "--records", str(folder / "records.jsonl"), "--commit", "abc1234", "--new-tokens", str(NEW_TOKENS)]
    gc.freeze()
    try:
        assert bench([*argv, "--variant", "default"]) == 0
        gc.freeze()  # also what the first run imported
        others = [a for n in NAMES_RUN if n != "default" for a in ("--variant", n)]
        assert bench([*argv, *others, *(a for w in SHORT_RUN for a in ("--workload", w))]) == 0
    finally:
        gc.unfreeze()
    by_name: dict[str, list[dict]] = {}
    for r in records.load(folder / "records.jsonl"):
        by_name.setdefault(matrix_tables.name(r), []).append(r)
    return by_name


@pytest.mark.parametrize("name", NAMES_RUN)
def test_every_variant_runs_or_says_why(rows, name):
    mine = rows[name]
    assert [r["workload"] for r in mine] == list(NAMES if name == "default" else SHORT_RUN)
    for r in mine:
        assert r["kind"] == "matrix" and r["commit"] == "abc1234" and r["versions"]["torch"] == torch.__version__
        assert r["new_tokens"] == (1 if r["workload"].startswith("prefill") else NEW_TOKENS)
        if r["value"] is None:  # a variant that does not resolve here names its key (test_bench_variants.py)
            assert r["note"].startswith("skipped: ") and name != "default", r
            continue
        assert math.isfinite(r["value"]) and r["value"] > 0 and r["note"] is None
        figure = r["roofline_fraction"] if r["unit"] == "tok/s" else r["tflops"]
        assert math.isfinite(figure) and figure > 0, r
        assert r["config"] == (VARIANTS[name] if name in VARIANTS else None)
    assert len({r["date"] for r in mine}) == 1
    if name == "default":  # a runner per context, each sized to it
        assert len({r["kv_capacity"] for r in mine}) == 3


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU refusal")
def test_a_qwen3_shape_is_refused_on_a_cpu_before_writing_anything(tmp_path, capsys):
    ckpt, out = tmp_path / "ckpt", tmp_path / "records.jsonl"
    assert bench(["matrix", "--shape", "tiny", "--shape", "Qwen3-4B", "--checkpoints", str(ckpt),
                  "--records", str(out)]) == 2
    assert capsys.readouterr().err == ("error: shape Qwen3-4B needs a CUDA GPU (8.0 GB of weights); "
                                       "on a CPU use --shape tiny\n")
    assert not ckpt.exists() and not out.exists()


def test_an_unknown_variant_is_a_one_line_error(capsys):
    assert bench(["matrix", "--variant", "no-such-variant"]) == 2
    assert capsys.readouterr().err.startswith("error: unknown variant 'no-such-variant'; valid: default, ")


@pytest.mark.parametrize("bad", ["no-such+temperature=0", "default+temperature"])
def test_a_variant_with_overrides_must_name_a_variant_and_key_values(capsys, bad):
    assert bench(["matrix", "--variant", bad]) == 2
    assert capsys.readouterr().err.startswith(f"error: unknown variant {bad!r}")


def test_a_variant_with_overrides_runs_and_records_them(tmp_path):
    """``VARIANT+KEY=VALUE``: the variant's config with the overrides, recorded under that name; an
    override the config refuses is the row's reason; the engine's notices during a row go with it."""
    if torch.cuda.is_available():
        pytest.skip("the CPU smoke")
    out = tmp_path / "records.jsonl"
    tried = ["eager+prefill_chunk=8", "eager+options.triton.no_such_option=1", "eager+options.ngram.n_max=5"]
    assert bench(["matrix", "--shape", "tiny", "--seconds", "0", "--checkpoints", str(tmp_path / "ckpt"),
                  "--records", str(out), "--commit", "abc1234", "--new-tokens", str(NEW_TOKENS),
                  "--workload", "decode128_ctx1024", *(a for v in tried for a in ("--variant", v))]) == 0
    got = {r["variant"]: r for r in records.load(out)}
    ok, refused, noticed = got[tried[0]], got[tried[1]], got[tried[2]]
    assert ok["value"] > 0 and ok["config"] == [*VARIANTS["eager"], "prefill_chunk=8"] and ok["notices"] == []
    assert noticed["value"] > 0 and noticed["notices"] == [
        "options.ngram (n_max) has no effect: ngram is not selected here (proposer=none)"]
    assert refused["value"] is None and refused["note"].startswith("skipped: ") and "no_such_option" in refused["note"]


def test_fewer_than_two_new_tokens_is_a_usage_error(capsys):
    """A decode figure times the tokens after the first: ``--new-tokens`` takes 2 or more."""
    for bad in ("1", "0", "x"):
        with pytest.raises(SystemExit):
            bench(["matrix", "--new-tokens", bad])
        assert f"{bad}: expected an integer >= 2" in capsys.readouterr().err


def test_the_parts_cover_every_variant_and_peer_once_per_shape(capsys):
    rows: dict[str, list[str]] = {}
    for part in matrix.PARTS.values():
        rows.setdefault(part.shape, []).extend(part.names)
    assert set(rows) == {"Qwen3-0.6B", "Qwen3-4B"}
    for shape, names in rows.items():
        assert sorted(names) == sorted(n for n in [*VARIANTS, *peers.PEERS] if n != "default"), shape
    assert bench(["matrix", "--list-parts"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed[0] == f"1 Qwen3-0.6B default {' '.join(matrix.GRAPH_CHAIN)}"
    assert listed[6] == ("7 Qwen3-0.6B default int8 int8-persistent engine-compiled-int8 hf-torchao-int8 | "
                         "prefill1024 decode128_ctx1024")


def test_the_int8_peers_are_measured_beside_our_int8_at_the_int8_targets_workloads():
    """One part per shape holds our INT8 weights (per-op and persistent steps) and every INT8 peer, at prefill1024 and
    decode128_ctx1024 only, so that they are measured in the same run (and the same default)."""
    int8 = {p.shape: p for p in matrix.PARTS.values() if "int8" in p.names}
    assert set(int8) == {"Qwen3-0.6B", "Qwen3-4B"}
    for part in int8.values():
        assert part.names == ("int8", "int8-persistent", *peers.INT8_PEERS)
        assert part.workloads == ("prefill1024", "decode128_ctx1024")
    assert all(p.workloads == NAMES for p in matrix.PARTS.values() if "int8" not in p.names)


def test_a_part_is_complete_when_every_row_of_its_shape_is_there():
    """The report's tables of a shape need every row its parts measure (report picks the newest
    commit that has them all)."""
    expected = matrix.expected("Qwen3-4B")
    assert ("default", "decode128_ctx32768") in expected and ("hf-torchao-int8", "prefill1024") in expected
    assert ("hf-torchao-int8", "decode128_ctx8192") not in expected
    assert len(expected) == 4 * (1 + len(matrix.GRAPH_CHAIN) + len(matrix.REST) + len(matrix.BF16_PEERS)) + 2 * 4
    assert matrix.expected("tiny") == set()


def test_a_schema_workload_on_random_weights_runs_with_a_stand_in_tokenizer(tmp_path):
    """The JSON-schema decode needs a tokenizer, which a random checkpoint lacks: the run writes a
    stand-in of the shape's vocabulary size, records it, and decodes under the grammar (the
    engine's stats: a sequential loop; with n-gram drafts, the speculative one), beside the
    unconstrained row."""
    if torch.cuda.is_available():
        pytest.skip("the CPU smoke")
    out = tmp_path / "records.jsonl"
    assert bench(["matrix", "--shape", "tiny", "--seconds", "0", "--checkpoints", str(tmp_path / "ckpt"),
                  "--records", str(out), "--commit", "abc1234", "--variant", "default", "--variant", "ngram",
                  "--workload", "decode128_ctx1024", "--workload", "decode128_json_ctx1024"]) == 0
    got = {(r["variant"], r["workload"]): r for r in records.load(out)}
    assert len(got) == 4 and all(r["value"] and r["value"] > 0 for r in got.values()), got
    for variant in ("default", "ngram"):
        schema = got[(variant, "decode128_json_ctx1024")]
        assert schema["tokenizer"].startswith("stand-in byte-level BPE, ") and schema["tokens_per_step"] >= 1
        assert "tokenizer" not in got[(variant, "decode128_ctx1024")]
    assert got[("default", "decode128_json_ctx1024")]["decode_loop"] == "sequential"
    assert got[("ngram", "decode128_json_ctx1024")]["decode_loop"].startswith("speculative")
    vocab = int(got[("default", "decode128_json_ctx1024")]["tokenizer"].rsplit(", ", 1)[1].split()[0])
    assert 259 < vocab <= 512  # the tiny shape's vocabulary: bytes, specials and merges
