"""``python -m bench spec`` on a tiny random checkpoint (CPU, reference config, a few seconds): the
proposers (n-gram, and DFlash with a random z-lab-format drafter at its own spec_k) run on every
benchmark prompt, their tokens equal the plain greedy ones, and each record holds finite positive
figures."""

from __future__ import annotations

import math

import pytest

from bench import records, speculative
from bench.__main__ import main as bench
from dflash_checkpoints import make_dflash
from tileinfer.models import prompts


def positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


@pytest.fixture(scope="module")
def result(checkpoint_factory, tmp_path_factory):
    folder = checkpoint_factory(max_positions=512)
    out = tmp_path_factory.mktemp("speculative")
    drafter = make_dflash(out / "dflash", hidden=64, num_target_layers=2, target_layer_ids=[0, 1], block=6,
                          max_positions=1024)
    status = bench(["spec", "--model", str(folder), "--device", "cpu", "--config", "reference", "--override",
                    "dtype=float32", "--max-tokens", "200", "--new-tokens", "8", "--repeats", "2", "--dflash-model",
                    str(drafter), "--k", "dflash=5", "--records", str(out / "records.jsonl"), "--commit", "abc1234"])
    return status, records.load(out / "records.jsonl")


def by(rows: list[dict], label: str) -> list[dict]:
    return [r for r in rows if r["label"] == label]


def test_every_proposer_runs_on_every_prompt(result):
    status, rows = result
    assert status == 0
    expected = [(task, file) for file, _, _ in prompts.BENCHMARK for task in ("edit", "open")]
    for label in ("none", "ngram", "dflash"):
        assert [(r["task"], r["file"]) for r in by(rows, label)] == expected, label
    assert {r["label"] for r in rows} == {"none", "ngram", "dflash"}  # no draft model given: left out
    assert {(r["label"], r["proposer"], r["spec_k"]) for r in rows} == {
        ("none", "none", 7), ("ngram", "ngram", 7), ("dflash", "dflash", 5)}
    assert all(r["kind"] == "speculative" and r["commit"] == "abc1234" and r["mode"] == "greedy" for r in rows)
    assert all(r["config"] == ["reference", "dtype=float32"] for r in rows)
    # On a CPU the engine decodes sequentially (the device loop needs pipelined, on CUDA).
    assert {(r["label"], r["decode_loop"]) for r in rows} == {
        ("none", "sequential"), ("ngram", "speculative-sequential"), ("dflash", "speculative-sequential")}


def test_the_proposers_keep_the_greedy_tokens_and_figures_are_sane(result):
    _, rows = result
    for r in rows:
        assert r["first_difference"] is None and 1 <= r["new_tokens"] <= 8 and 0 < r["prompt_tokens"] <= 200
        assert positive(r["prefill_ms"]) and len(r["decode_tok_s_runs"]) == 2
        if r["label"] == "none":
            assert r["drafted_tokens"] == 0 and r["acceptance"] is None and r["speedup"] is None
        else:
            assert 0 <= r["accepted_tokens"] <= r["drafted_tokens"] <= r["spec_k"] * r["steps"]
        if r["new_tokens"] > 1:
            assert positive(r["decode_tok_s"]) and positive(r["steps"]) and r["tokens_per_step"] >= 1
            assert r["label"] == "none" or positive(r["speedup"])
    table = speculative.summary_table(rows)
    assert table.splitlines()[0] == ("| task | proposer | first token ms | tok/s | speedup | tok/step | acceptance "
                                     "| loop |")
    assert len(table.splitlines()) == 2 + 2 * 3  # two tasks, three proposers


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
    out = tmp_path / "records.jsonl"
    status = bench(["spec", "--model", str(checkpoint_factory(max_positions=512)), "--device", "cpu", "--config",
                    "reference", "--max-tokens", "200", "--new-tokens", "3", "--records", str(out)])
    rows = records.load(out)
    assert status == 1 and len(rows) == 6 * 2  # recorded all the same
    assert all((r["first_difference"] is None) == (r["label"] == "none") for r in rows)
    captured = capsys.readouterr()
    assert captured.err.count("FAILURE: ") == 6 and "FAILURE: edit asyncio_runners.py.txt: ngram" in captured.err
    assert "| task | proposer | first token ms | tok/s |" in captured.out


def parse(*argv: str):
    import argparse

    p = argparse.ArgumentParser()
    speculative.arguments(p)
    return p.parse_args(list(argv))


def test_sampled_runs_record_the_proposers_without_comparing_tokens(checkpoint_factory, tmp_path):
    import torch

    folder = checkpoint_factory(max_positions=512)
    drafter = make_dflash(tmp_path / "dflash", hidden=64, num_target_layers=2, target_layer_ids=[0, 1], block=6,
                          max_positions=1024)
    argv = ["--model", str(folder), "--device", "cpu", "--config", "reference", "--max-tokens", "200",
            "--new-tokens", "6", "--repeats", "2", "--dflash-model", str(drafter), "--k", "dflash=5", "--sampled",
            "1.0", "--sampled-drafts"]
    engines = speculative.engines(parse(*argv), torch.device("cpu"))
    assert all(e.config.temperature == 1.0 for e in engines.values())
    assert engines["dflash"].config.options["dflash"]["greedy"] is False
    out = tmp_path / "records.jsonl"
    assert bench(["spec", *argv, "--records", str(out)]) == 0
    rows = records.load(out)
    assert {r["mode"] for r in rows} == {"sampled 1.0"} and all(r["sampled_drafts"] for r in rows)
    assert all(r["first_difference"] is None and r["new_tokens"] >= 1 for r in rows)


def test_a_k_sweep_records_each_k_and_marks_the_best(checkpoint_factory, tmp_path):
    out = tmp_path / "records.jsonl"
    assert bench(["spec", "--model", str(checkpoint_factory(max_positions=512)), "--device", "cpu", "--config",
                  "reference", "--override", "dtype=float32", "--override", "options.ngram.n_max=5", "--max-tokens",
                  "200", "--new-tokens", "6", "--k", "ngram=1,4", "--records", str(out)]) == 0
    rows = records.load(out)
    # the engines' notices, run-wide: plain decoding's engine takes the n-gram option and does not draft
    unused = "options.ngram (n_max) has no effect: ngram is not selected here (proposer=none)"
    assert all(unused in r["notices"] for r in rows)
    assert {(r["label"], r["spec_k"]) for r in rows if r["proposer"] == "ngram"} == {("ngram@1", 1), ("ngram@4", 4)}
    assert all(r["first_difference"] is None for r in rows)
    assert all(r["drafted_tokens"] <= r["steps"] for r in by(rows, "ngram@1"))
    for task in ("edit", "open"):
        tok_s = {label: sum(r["decode_tok_s"] for r in by(rows, label) if r["task"] == task) for label in
                 ("ngram@1", "ngram@4")}
        best = max(tok_s, key=tok_s.get)
        assert any(line.startswith(f"| {task} | {best}* |") for line in speculative.summary_table(rows).splitlines())


@pytest.mark.parametrize("argv,message", [(["--k", "ngram"], "expected PROPOSER=K[,K...]"),
                                          (["--k", "beam=3"], "expected PROPOSER=K[,K...]"),
                                          (["--k", "ngram=0"], "expected PROPOSER=K[,K...]")])
def test_a_bad_k_is_a_usage_error(capsys, argv, message):
    with pytest.raises(SystemExit):
        parse(*argv)
    assert message in capsys.readouterr().err


def test_sampled_drafts_need_sampling(capsys):
    assert bench(["spec", "--sampled-drafts"]) == 2
    assert capsys.readouterr().err == "error: --sampled-drafts needs --sampled T\n"
