"""The tileinfer command: output formats, config printing, and one-line errors with exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import tileinfer
from conftest import DEVICE, REFERENCE_CPU as BASE, run_cli as run


def test_generate_json_prints_one_object_matching_the_api(capsys, tiny_checkpoint):
    code, out, err = run(capsys, "generate", "--model", str(tiny_checkpoint), "--prompt-ids", "5,6,7,8",
                         "--max-new-tokens", "6", "--json", *BASE)
    assert code == 0, err
    result = json.loads(out)  # the whole of stdout is one JSON object
    assert set(result) >= {"token_ids", "text", "stats"}
    engine = tileinfer.Engine.from_config(model=str(tiny_checkpoint), overrides=BASE, progress=False)
    expected = engine.generate([5, 6, 7, 8], max_new_tokens=6)
    assert result["token_ids"] == expected.token_ids
    assert result["text"] == expected.text
    assert result["stats"]["new_tokens"] == 6
    assert {"prefill_ms", "decode_tok_s", "steps", "tokens_per_step"} <= set(result["stats"])


def test_generate_streams_text_and_reports_stats_on_stderr(capsys, tiny_checkpoint):
    code, out, err = run(capsys, "generate", "--model", str(tiny_checkpoint), "--prompt", "def add(a, b):",
                         "--max-new-tokens", "8", *BASE)
    assert code == 0, err
    engine = tileinfer.Engine.from_config(model=str(tiny_checkpoint), overrides=BASE, progress=False)
    expected = engine.generate("def add(a, b):", max_new_tokens=8)
    assert out == expected.text + "\n"
    assert "8 tokens" in err and "tok/s" in err


def test_chat_prompt_goes_through_the_template(capsys, tiny_checkpoint):
    code, out, _ = run(capsys, "generate", "--model", str(tiny_checkpoint), "--prompt", "hi", "--chat",
                       "--max-new-tokens", "3", "--json", *BASE)
    assert code == 0
    engine = tileinfer.Engine.from_config(model=str(tiny_checkpoint), overrides=BASE, progress=False)
    ids = engine.encode_prompt("hi", chat=True)
    assert ids[:2] == engine.tokenizer.encode("<|im_start|>user", add_special_tokens=False)[:2]
    assert json.loads(out)["token_ids"] == engine.generate(ids, max_new_tokens=3).token_ids


def test_plugins_lists_every_interface_with_its_provider(capsys):
    code, out, _ = run(capsys, "plugins", "--json")
    assert code == 0
    listing = json.loads(out)
    found = {(r["interface"], r["name"]): r for r in listing["implementations"]}
    assert set(found) == {("linear", "reference"), ("linear", "triton"), ("attention", "reference"),
                          ("attention", "triton"), ("kv_store", "paged"), ("kv_store", "paged_int8"),
                          ("sampler", "reference"), ("proposer", "ngram"), ("proposer", "draft"),
                          ("proposer", "dflash"), ("forward", "per_op"), ("forward", "persistent")} | {
                          k for k in found if k[1] == "argmin"}
    assert found[("proposer", "ngram")]["plugin"] == "tileinfer.plugins.ngram"
    assert listing["failures"] == []
    options = {o["name"]: o for o in found[("linear", "triton")]["options"]}
    assert options["fuse_epilogue"] == {"name": "fuse_epilogue", "type": "bool", "default": True, "choices": [],
                                        "minimum": None, "help": options["fuse_epilogue"]["help"]}
    assert options["matmul"]["choices"] == ["triton", "torch"] and options["matmul"]["default"] == "triton"
    assert {o["name"] for o in found[("attention", "triton")]["options"]} == {
        "fuse_inputs", "attend", "pdl", "prefill_tiles"}
    assert found[("linear", "triton")]["auto"] == ["cuda"] and found[("linear", "reference")]["auto"] == ["cpu", "cuda"]


def test_plugins_text_lists_each_option_with_type_default_and_meaning(capsys):
    code, out, _ = run(capsys, "plugins")
    assert code == 0
    assert "options.triton.fuse_epilogue (bool, default true): SwiGLU" in out
    assert "options.triton.attend (str, default paged; one of paged, dense): " in out
    assert "options.ngram.n_max (int, default 4; >= 1): " in out


def test_config_merges_files_then_overrides(capsys, tmp_path):
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text("top_k: 5\nseed: 3\n")
    second.write_text("seed: 4\nproposer: ngram\n")
    code, out, _ = run(capsys, "config", "--config", str(first), "--config", str(second), "seed=9", "top_p=0.5")
    assert code == 0
    resolved = yaml.safe_load(out)
    assert (resolved["top_k"], resolved["seed"], resolved["proposer"], resolved["top_p"]) == (5, 9, "ngram", 0.5)
    assert resolved["kv_store"] == "paged"  # untouched keys keep default.yaml's values
    assert resolved["linear"] == resolved["attention"] == ("triton" if DEVICE == "cuda" else "reference")  # auto
    assert resolved["device"] == DEVICE and resolved["dtype"] == ("bfloat16" if DEVICE == "cuda" else "float32")
    assert resolved["options"]["ngram"] == {"n_min": 1, "n_max": 4}  # the chosen proposer's defaults filled in


def test_config_resolves_the_model_folder(capsys, tiny_checkpoint, monkeypatch):
    code, out, _ = run(capsys, "config")
    assert code == 0 and Path(yaml.safe_load(out)["model"]) == tileinfer.shipped_model().resolve()
    monkeypatch.chdir(tiny_checkpoint.parent)
    code, out, _ = run(capsys, "config", "--model", tiny_checkpoint.name, "--top-k", "7")
    resolved = yaml.safe_load(out)
    assert code == 0 and (resolved["model"], resolved["top_k"]) == (str(tiny_checkpoint.resolve()), 7)


@pytest.mark.parametrize(
    "argv, status, words",
    [
        (["config", "nonsense_key=1"], 2, ["unknown config key", "kv_store"]),
        (["config", "attention=flash9"], 2, ["attention=flash9", "valid: auto, reference, triton"]),
        (["config", "proposer=oracle"], 2, ["valid: none, dflash, draft, ngram"]),
        (["config", "options.ngram.n_max=abc"], 2, ["options.ngram.n_max=abc", "integer"]),
        (["config", "linear=triton", "options.triton.matmul=torch"], 2, ["fuse_epilogue=false"]),
        (["config", "dtype=int4"], 2, ["bfloat16"]),
        (["config", "options.ngram.n_maxx=3"], 2, ["n_max"]),
        (["config", "options.turbo.x=3"], 2, ["options.turbo"]),
        (["config", "--config", "/no/such.yaml"], 2, ["not found"]),
        (["generate", "--prompt", "x", "model=/no/such/folder"], 2, ["/no/such/folder"]),
        (["generate", "--model", "/tmp"], 2, ["--prompt"]),
        (["generate", "--prompt-ids", "1,x"], 2, ["comma-separated"]),
        (["frobnicate"], 2, ["invalid choice"]),
    ],
)
def test_errors_are_one_line_with_exit_status(capsys, argv, status, words):
    code, out, err = run(capsys, *argv)
    assert code == status
    assert out == ""
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for word in words:
        assert word in err
    assert "Traceback" not in err


def test_debug_shows_the_traceback(capsys):
    code, _, err = run(capsys, "--debug", "config", "nonsense_key=1")
    assert code == 2
    assert "Traceback" in err and err.rstrip().splitlines()[-1].startswith("error: ")
