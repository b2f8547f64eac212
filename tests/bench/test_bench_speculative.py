"""bench/speculative.py on a tiny random checkpoint (CPU, reference config, a few seconds): the
proposers (n-gram, and DFlash with a random z-lab-format drafter at its own spec_k) run on every
benchmark prompt, their tokens equal the plain greedy ones, and the JSON record holds finite
positive figures."""

from __future__ import annotations

import json
import math
import sys

import pytest

from conftest import ROOT, load_script

sys.path.insert(0, str(ROOT / "tests" / "plugins"))
from dflash_checkpoints import make_dflash  # noqa: E402



speculative = load_script("bench/speculative.py", "tileinfer_bench_speculative")


def positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


@pytest.fixture(scope="module")
def record(checkpoint_factory, tmp_path_factory):
    folder = checkpoint_factory(max_positions=512)
    out = tmp_path_factory.mktemp("speculative") / "result.json"
    drafter = make_dflash(out.parent / "dflash", hidden=64, num_target_layers=2, target_layer_ids=[0, 1], block=6,
                          max_positions=1024)
    status = speculative.main(["--model", str(folder), "--device", "cpu", "--config", "reference",
                               "--override", "dtype=float32", "--max-tokens", "200", "--new-tokens", "8",
                               "--repeats", "2", "--dflash-model", str(drafter), "--k", "dflash=5",
                               "--out", str(out)])
    return status, json.loads(out.read_text())


def test_both_proposers_run_on_every_prompt(record):
    status, result = record
    assert status == 0 and result["failures"] == []
    assert [(r["task"], r["file"]) for r in result["prompts"]] == [
        (task, file) for file, _, _ in speculative.prompts_mod.BENCHMARK for task in ("edit", "open")]
    assert result["config"]["none"]["proposer"] == "none" and result["config"]["ngram"]["proposer"] == "ngram"
    assert result["config"]["dflash"]["proposer"] == "dflash" and result["config"]["dflash"]["spec_k"] == 5
    assert result["config"]["ngram"]["spec_k"] == 7 and "draft" not in result["config"]
    assert all(c["linear"] == "reference" and c["dtype"] == "float32" for c in result["config"].values())
    assert result["device"] == "cpu" and result["torch"] and result["date"]
    # On a CPU the engine decodes sequentially (the device loop needs pipelined, on CUDA).
    assert result["decode_loops"] == {"none": ["sequential"], "ngram": ["speculative-sequential"],
                                      "dflash": ["speculative-sequential"]}
    assert all(row["ngram"]["decode_loop"] == "speculative-sequential" for row in result["prompts"])


def test_ngram_keeps_the_greedy_tokens_and_figures_are_sane(record):
    _, result = record
    for row in result["prompts"]:
        plain, ngram = row["none"], row["ngram"]
        assert row["match"] and row["first_difference"] is None
        assert ngram["token_ids"] == plain["token_ids"] and 1 <= len(plain["token_ids"]) <= 8
        assert row["dflash"]["token_ids"] == plain["token_ids"] and row["dflash"]["first_difference"] is None
        assert row["dflash"]["drafted_tokens"] <= 5 * row["dflash"]["steps"]
        assert 0 < row["prompt_tokens"] <= 200
        assert plain["drafted_tokens"] == 0 and plain["acceptance"] is None
        assert 0 <= ngram["accepted_tokens"] <= ngram["drafted_tokens"]
        for run in (plain, ngram):
            assert run["new_tokens"] == len(run["token_ids"]) and positive(run["prefill_ms"])
            assert len(run["decode_tok_s_runs"]) == 2
            if run["new_tokens"] > 1:
                assert positive(run["decode_tok_s"]) and positive(run["steps"]) and run["tokens_per_step"] >= 1
        if plain["new_tokens"] > 1:
            assert positive(row["speedup"])
    assert set(result["summary"]) == {"edit", "open"}


def test_a_difference_is_a_failure_and_exit_status_1(checkpoint_factory, tmp_path, monkeypatch, capsys):
    assert speculative.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert speculative.first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert speculative.first_difference([1, 2], [1, 2, 3]) == 2
    run = speculative.run

    def broken(engine, *args):  # as if speculation changed the last greedy token
        result = run(engine, *args)
        if engine.config.proposer != "none":
            result["token_ids"] = [*result["token_ids"][:-1], result["token_ids"][-1] + 1]
        return result

    monkeypatch.setattr(speculative, "run", broken)
    out = tmp_path / "result.json"
    status = speculative.main(["--model", str(checkpoint_factory(max_positions=512)), "--device", "cpu",
                               "--config", "reference", "--max-tokens", "200", "--new-tokens", "3", "--out", str(out)])
    result = json.loads(out.read_text())
    assert status == 1 and len(result["failures"]) == len(result["prompts"]) == 6
    assert not any(r["match"] for r in result["prompts"])
    captured = capsys.readouterr()
    assert "FAILURE: edit asyncio_runners.py.txt" in captured.err and "plain tok/s" in captured.out


def test_sampled_runs_record_the_proposers_without_comparing_tokens(checkpoint_factory, tmp_path):
    drafter = make_dflash(tmp_path / "dflash", hidden=64, num_target_layers=2, target_layer_ids=[0, 1], block=6,
                          max_positions=1024)
    out = tmp_path / "result.json"
    status = speculative.main(["--model", str(checkpoint_factory(max_positions=512)), "--device", "cpu",
                               "--config", "reference", "--max-tokens", "200", "--new-tokens", "6", "--repeats", "2",
                               "--dflash-model", str(drafter), "--k", "dflash=5", "--sampled", "1.0",
                               "--sampled-drafts", "--out", str(out)])
    result = json.loads(out.read_text())
    assert status == 0 and result["failures"] == []
    assert all(c["temperature"] == 1.0 for c in result["config"].values())
    assert result["config"]["dflash"]["options"]["dflash"]["greedy"] is False
    assert all(r["dflash"]["new_tokens"] >= 1 for r in result["prompts"])


def test_a_k_sweep_records_each_k_and_the_best(checkpoint_factory, tmp_path):
    folder = checkpoint_factory(max_positions=512)
    out = tmp_path / "sweep.json"
    status = speculative.main(["--model", str(folder), "--device", "cpu", "--config", "reference",
                               "--override", "dtype=float32", "--max-tokens", "200", "--new-tokens", "6",
                               "--k", "ngram=1,4", "--out", str(out)])
    result = json.loads(out.read_text())
    assert status == 0 and result["failures"] == []
    assert result["config"]["ngram@1"]["spec_k"] == 1 and result["config"]["ngram@4"]["spec_k"] == 4
    for row in result["prompts"]:
        assert row["ngram@1"]["token_ids"] == row["ngram@4"]["token_ids"] == row["none"]["token_ids"]
        assert row["ngram@1"]["drafted_tokens"] <= row["ngram@1"]["steps"]
    for task, best in result["best"].items():
        summary = result["summary"][task]
        chosen = best["ngram"]
        assert chosen["label"] in ("ngram@1", "ngram@4") and chosen["k"] == int(chosen["label"][-1])
        assert chosen["tok_s"] == max(summary["ngram@1_tok_s"], summary["ngram@4_tok_s"])
