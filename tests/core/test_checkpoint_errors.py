"""Checkpoint metadata of the wrong JSON type or range is one CheckpointError at load, naming the
file and the key (config.json, generation_config.json, tokenizer files, the safetensors index),
through the API and the CLI (one ``error:`` line, no traceback), config.json keys also by property
(any JSON value: read as given, or CheckpointError); and what a run allocates for positions is
sized by what it can reach."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tileinfer.cli import main
from tileinfer.errors import CheckpointError
from tileinfer.loading import CheckpointReader
from tileinfer.model import Backend, Qwen3Model
from tileinfer.model_config import LIMITS, ModelConfig
from tileinfer.registry import build_registry
from checkpoint_edits import cli, copies, fails, load

CPU = torch.device("cpu")


@pytest.fixture
def copy_of(tmp_path, checkpoint_factory):
    return copies(tmp_path, checkpoint_factory)


# ---- metadata of the wrong JSON type or range -------------------------------------------------

def edit_json(folder: Path, file: str, change) -> None:
    path = folder / file
    raw = json.loads(path.read_text())
    raw = change(raw) if callable(change) else change
    path.write_text(raw if isinstance(raw, str) else json.dumps(raw))


def setting(key, value):
    def change(raw):
        raw[key] = value
        return raw
    return change


def dropping(key):
    def change(raw):
        raw.pop(key, None)
        return raw
    return change


INTEGER_KEYS = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "max_position_embeddings"]
CONFIG_CASES = {
    **{f"{key}={value!r}": (key, setting(key, value), f"{key} must be a positive integer, got {shown}")
       for key in INTEGER_KEYS
       for value, shown in [(0, "0"), (-4, "-4"), (4.0, "4.0"), ("64", '"64"'), (True, "true"), ([2], "[2]"),
                            ({"a": 1}, '{"a": 1}')]},
    **{f"{key}=huge": (key, setting(key, LIMITS[key] + 1), f"{key} {LIMITS[key] + 1} is beyond") for key in LIMITS},
    **{f"missing {key}": (key, dropping(key), f"missing key '{key}'")
       for key in ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"]},
    **{f"{key}={value!r}": (key, setting(key, value), f"{key} must be a positive finite number")
       for key in ["rms_norm_eps"] for value in [0, -1e-6, "1e-6", True, [1e-6], math.nan, math.inf]},
    **{f"rope_theta={value!r}": ("rope_theta", lambda raw, v=value: {**raw, "rope_theta": v, "rope_parameters": None},
                                 "rope_theta must be a finite number >= 1")
       for value in [0, -10000.0, 0.5, "10000", False, math.nan, -math.inf, {"x": 1}]},
    **{f"rope_parameters.rope_theta={value!r}": (
        "rope_parameters.rope_theta", lambda raw, v=value: {**raw, "rope_parameters": {"rope_type": "default", "rope_theta": v}},
        "rope_parameters.rope_theta must be a finite number >= 1") for value in [0, "1e6", [1e6], math.inf]},
    "rms_norm_eps=1e400": ("rms_norm_eps", '"rms_norm_eps": 1e400', "rms_norm_eps must be a positive finite number"),
    **{f"{key}={value!r}": (key, setting(key, value), f"{key} must be true or false")
       for key in ["tie_word_embeddings", "use_sliding_window", "attention_bias"] for value in ["true", 1, 0, [], {}]},
    **{f"rope_parameters={value!r}": ("rope_parameters", setting("rope_parameters", value),
                                      "rope_parameters must be a JSON object or null")
       for value in [[], "default", 10000.0, True]},
    **{f"rope_scaling={value!r}": ("rope_scaling", setting("rope_scaling", value), "rope_scaling must be a JSON object")
       for value in [[1], "yarn", 4]},
    "rope_scaling.type=3": ("rope_scaling.type", setting("rope_scaling", {"type": 3}), "must be a string, got 3"),
    "rope_scaling linear": ("rope type", setting("rope_scaling", {"rope_type": "linear", "factor": 4.0}),
                            "'linear' is not supported (supported: default, yarn)"),
    **{f"architectures={value!r}": ("architectures", setting("architectures", value), "architectures must be a list")
       for value in ["Qwen3ForCausalLM", 5, [1], {"Qwen3ForCausalLM": 1}]},
    **{f"layer_types={value!r}": ("layer_types", setting("layer_types", value), "layer_types")
       for value in ["full_attention", ["sliding_attention", "full_attention"], [1, 2]]},
    **{f"eos_token_id={value!r}": ("eos_token_id", setting("eos_token_id", value), "eos_token_id")
       for value in ["2", [1, "a"], -1, 320, [5, 320], True, 1.5, {"id": 2}]},
    "heads not a multiple of kv heads": ("num_key_value_heads", setting("num_key_value_heads", 3), "not a multiple"),
    "odd head_dim": ("head_dim", setting("head_dim", 33), "head_dim 33 must be even"),
    "no head_dim, hidden not a multiple": ("head_dim", lambda raw: {**dropping("head_dim")(raw), "num_attention_heads": 6,
                                                                    "num_key_value_heads": 3}, "head_dim is missing"),
    "a list": ("a JSON object", [1, 2], "expected a JSON object, got a list"),
    "a string": ("a JSON object", json.dumps("qwen3"), "got a string"),
    "a number": ("a JSON object", "3", "got a number"),
    "null": ("a JSON object", "null", "got null"),
    "empty": ("not valid JSON", "", "not valid JSON"),
    "deeply nested": ("not valid JSON", "[" * 100000 + "]" * 100000, "nested too deeply"),
    "huge integer": ("not valid JSON", '{"vocab_size": ' + "9" * 5000 + "}", "not valid JSON"),
}


@pytest.mark.parametrize("case", CONFIG_CASES)
def test_config_json(copy_of, case):
    key, change, words = CONFIG_CASES[case]
    folder = copy_of()
    if isinstance(change, str) and change.startswith('"rms_norm_eps"'):
        text = (folder / "config.json").read_text().replace('"rms_norm_eps": 1e-06', change)
        assert change in text
        (folder / "config.json").write_text(text)
    else:
        edit_json(folder, "config.json", change)
    fails(folder, "config.json", key, words)


def test_config_json_not_utf8_and_unreadable(copy_of):
    folder = copy_of()
    (folder / "config.json").write_bytes(b'{"vocab_size": "\xff"}')
    fails(folder, "config.json", "not valid JSON")
    folder = copy_of()
    (folder / "config.json").unlink()
    (folder / "config.json").mkdir()  # not a file: missing
    fails(folder, "config.json", "missing")


GENERATION_CASES = {
    "a list": ([2], "expected a JSON object, got a list"),
    "a string": ("\"eos\"", "expected a JSON object, got a string"),
    "invalid JSON": ("{'eos_token_id': 2}", "not valid JSON"),
    "eos a string": ({"eos_token_id": "2"}, "eos_token_id must be a token id"),
    "eos a float": ({"eos_token_id": 2.0}, "eos_token_id must be a token id"),
    "eos a bool": ({"eos_token_id": False}, "eos_token_id must be a token id"),
    "eos a list of lists": ({"eos_token_id": [[2]]}, "eos_token_id must be a token id"),
    "eos an object": ({"eos_token_id": {"id": 2}}, "eos_token_id must be a token id"),
    "eos negative": ({"eos_token_id": [2, -1]}, "eos_token_id -1 is outside the vocabulary [0, 320)"),
    "eos beyond the vocabulary": ({"eos_token_id": 100000}, "eos_token_id 100000 is outside the vocabulary"),
}


@pytest.mark.parametrize("case", GENERATION_CASES)
def test_generation_config_json(copy_of, case):
    content, words = GENERATION_CASES[case]
    folder = copy_of(eos=5)
    edit_json(folder, "generation_config.json", content if isinstance(content, (str, list)) else setting(
        "eos_token_id", content["eos_token_id"]))
    fails(folder, "generation_config.json", words)


TOKENIZER_CONFIG_CASES = {
    "a list": ([1], "expected a JSON object, got list"),
    "a string": ("\"x\"", "expected a JSON object, got str"),
    "invalid JSON": ("{", "not valid JSON"),
    "chat_template a number": (setting("chat_template", 5), "chat_template must be a string or a list"),
    "chat_template an object": (setting("chat_template", {"default": "x"}), "chat_template must be"),
    "chat_template list without template": (setting("chat_template", [{"name": "default"}]), "chat_template must be"),
    "chat_template list of strings": (setting("chat_template", ["{{ x }}"]), "chat_template must be"),
    "eos_token a number": (setting("eos_token", 5), "eos_token must be a string"),
    "bos_token a list": (setting("bos_token", ["<s>"]), "bos_token must be a string"),
    "eos_token content a number": (setting("eos_token", {"content": 3}), "eos_token must be a string"),
}


@pytest.mark.parametrize("case", TOKENIZER_CONFIG_CASES)
def test_tokenizer_config_json(copy_of, case):
    change, words = TOKENIZER_CONFIG_CASES[case]
    folder = copy_of()
    edit_json(folder, "tokenizer_config.json", change)
    fails(folder, "tokenizer_config.json", words)


def test_chat_template_list_and_jinja_file(copy_of):
    folder = copy_of()
    edit_json(folder, "tokenizer_config.json", setting("chat_template", [
        {"name": "tool_use", "template": "T"}, {"name": "default", "template": "{{ messages[0]['content'] }}!"}]))
    assert load(folder).tokenizer.apply_chat_template([{"role": "user", "content": "hi"}]) == "hi!"
    folder = copy_of()
    edit_json(folder, "tokenizer_config.json", dropping("chat_template"))
    (folder / "chat_template.jinja").write_bytes(b"\xff\xfe{{ x }}")
    fails(folder, "chat_template.jinja", "cannot read")


@pytest.mark.parametrize("content,words", [
    (b"", "cannot load tokenizer"), (b"{", "cannot load tokenizer"), (b"[]", "cannot load tokenizer"),
    (b"{}", "cannot load tokenizer"), (b"\xff\xfe\x00", "cannot load tokenizer"),
    (b'{"model": 3}', "cannot load tokenizer"), (b"null", "cannot load tokenizer"),
], ids=["empty", "cut", "list", "empty-object", "binary", "wrong-model", "null"])
def test_tokenizer_json(copy_of, content, words):
    folder = copy_of()
    (folder / "tokenizer.json").write_bytes(content)
    fails(folder, "tokenizer.json", words)


INDEX = "model.safetensors.index.json"
INDEX_CASES = {
    "a list": ([1, 2], "not a safetensors index (no weight_map)"),
    "no weight_map": ({"metadata": {}}, "not a safetensors index (no weight_map)"),
    "weight_map a list": (setting("weight_map", [["model.norm.weight", "x"]]), "weight_map must be a JSON object"),
    "weight_map a string": (setting("weight_map", "model.safetensors"), "weight_map must be a JSON object"),
    "weight_map null": (setting("weight_map", None), "weight_map must be a JSON object"),
    "a value a number": (lambda raw: {**raw, "weight_map": {**raw["weight_map"], "model.norm.weight": 1}},
                         "weight_map['model.norm.weight'] must be a file name, got 1"),
    "a value a list": (lambda raw: {**raw, "weight_map": {**raw["weight_map"], "model.norm.weight": ["a"]}},
                       "weight_map['model.norm.weight'] must be a file name"),
    "a value empty": (lambda raw: {**raw, "weight_map": {**raw["weight_map"], "model.norm.weight": ""}},
                      "weight_map['model.norm.weight'] must be a file name"),
    "a value outside": (lambda raw: {**raw, "weight_map": {**raw["weight_map"], "model.norm.weight": "../x.safetensors"}},
                        "outside the checkpoint folder"),
    "a value absolute": (lambda raw: {**raw, "weight_map": {**raw["weight_map"], "model.norm.weight": "/etc/passwd"}},
                         "outside the checkpoint folder"),
    "invalid JSON": ("{\"weight_map\": {", "not valid JSON"),
}


@pytest.mark.parametrize("case", INDEX_CASES)
def test_safetensors_index(copy_of, case):
    change, words = INDEX_CASES[case]
    folder = copy_of(shard=True)
    edit_json(folder, INDEX, change)
    fails(folder, INDEX, words)


@pytest.mark.parametrize("file,change,words", [
    ("config.json", setting("num_attention_heads", 0), "num_attention_heads must be a positive integer, got 0"),
    ("config.json", [1], "config.json: expected a JSON object, got a list"),
    ("config.json", setting("rope_theta", "1e6"), "rope_theta must be a finite number >= 1"),
    ("generation_config.json", setting("eos_token_id", "x"), "eos_token_id must be a token id"),
    ("tokenizer_config.json", [], "expected a JSON object"),
    (INDEX, setting("weight_map", [1]), "weight_map must be a JSON object"),
    ("tokenizer.json", "{", "cannot load tokenizer"),
])
def test_metadata_cli(copy_of, capsys, file, change, words):
    folder = copy_of(shard=file == INDEX, eos=5)
    if file == "tokenizer.json":
        (folder / file).write_text(change)
    else:
        edit_json(folder, file, change)
    message = cli(folder, capsys)
    assert message.startswith(f"{folder / file}: ") and words in message, message
    # a text prompt checks the tokenizer before the weights load: the same line
    if file == "tokenizer.json":
        capsys.readouterr()
        assert main(["generate", "--model", str(folder), "--prompt", "hi", "--config", "reference",
                     "device=cpu", "dtype=float32"]) == 1
        assert capsys.readouterr().err.strip() == f"error: {message}"


# config.json keys by property: any JSON value is read as given or is a CheckpointError.

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6)
# what each key gives when the value is accepted (None: the key's fallback)
READ = {
    "vocab_size": ("vocab_size", None), "hidden_size": ("hidden_size", None),
    "intermediate_size": ("intermediate_size", None), "num_hidden_layers": ("num_layers", None),
    "num_attention_heads": ("num_heads", None), "num_key_value_heads": ("num_kv_heads", 4),
    "head_dim": ("head_dim", 16), "max_position_embeddings": ("max_positions", 32768),
    "rms_norm_eps": ("rms_norm_eps", 1e-6), "rope_theta": ("rope_theta", 10000.0),
    "tie_word_embeddings": ("tie_word_embeddings", False), "eos_token_id": ("eos_token_ids", ()),
}
BASE = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 320, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 32, "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "tie_word_embeddings": False, "eos_token_id": None}
OTHER_KEYS = ["rope_parameters", "rope_scaling", "architectures", "model_type", "hidden_act", "layer_types",
              "attention_bias", "use_sliding_window"]


@settings(max_examples=400, deadline=None)
@given(key=st.sampled_from(sorted(READ) + OTHER_KEYS), value=JSON | st.integers(min_value=1, max_value=4096)
       | st.floats(min_value=1.0, max_value=1e9) | st.lists(st.integers(0, 400), max_size=3))
def test_any_json_value(key, value):
    raw = {**BASE, key: value}
    try:
        config = ModelConfig.from_dict(raw, "config.json")
    except CheckpointError as exc:
        message = str(exc)
        assert message.startswith("config.json: ") and "\n" not in message
        return
    if key in READ:
        field, fallback = READ[key]
        got = getattr(config, field)
        if value is None:
            assert fallback is None or got == fallback
        elif field == "eos_token_ids":
            assert got == (tuple(value) if isinstance(value, list) else (value,))
        else:
            assert got == value and type(got) is type(value) or (isinstance(value, int) and got == float(value))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=JSON, name=st.sampled_from(["config.json", "generation_config.json", INDEX]))
def test_any_json_file(tmp_path, value, name):
    """A whole file replaced by any JSON value: loads, or one CheckpointError naming the file."""
    folder = Path(tempfile.mkdtemp(dir=tmp_path))
    (folder / "config.json").write_text(json.dumps(BASE))
    (folder / name).write_text(json.dumps(value))
    try:
        ModelConfig.from_folder(folder)
        if name == INDEX:
            CheckpointReader(folder, ModelConfig.from_folder(folder), CPU, torch.float32)
    except CheckpointError as exc:
        assert str(exc).startswith(f"{folder}") and "\n" not in str(exc)


# ---- positions: the RoPE table sized by what the run reaches ----------------------------------

def build(folder: Path, **kw) -> Qwen3Model:
    registry = build_registry()
    config = ModelConfig.from_folder(folder)
    backend = Backend(registry.get("linear", "reference"), registry.get("attention", "reference"))
    reader = CheckpointReader(folder, config, CPU, torch.float32)
    return Qwen3Model.build(config, reader.tensor, backend, progress=False, **kw)


def test_rope_table_sized_by_positions(copy_of):
    folder = copy_of()
    assert build(folder).rope.cos.shape == (512, 16)  # default: max_position_embeddings
    assert build(folder, positions=64).rope.cos.shape == (64, 16)
    assert build(folder, positions=10**6).rope.sin.shape == (512, 16)  # never beyond the model's
    edit_json(folder, "config.json", setting("max_position_embeddings", 10**9))
    model = build(folder, positions=100)  # 1e9 positions: 100 rows, not 128 GB
    assert model.rope.cos.shape == (100, 16) and model.config.max_positions == 10**9
    full = build(copy_of())
    torch.testing.assert_close(model.rope.cos, full.rope.cos[:100], atol=0, rtol=0)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="positions must be a positive integer"):
            build(folder, positions=bad)


def test_absurd_sizes_rejected_at_config(copy_of, capsys):
    folder = copy_of()
    edit_json(folder, "config.json", setting("max_position_embeddings", 2**31 + 1))
    fails(folder, "config.json", f"max_position_embeddings {2**31 + 1} is beyond tileinfer's limit ({2**31}")
    assert "max_position_embeddings" in cli(folder, capsys)
    folder = copy_of()
    edit_json(folder, "config.json", setting("vocab_size", 10**12))
    assert cli(folder, capsys).startswith(f"{folder / 'config.json'}: vocab_size 1000000000000 is beyond")
