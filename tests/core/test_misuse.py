"""Misuse, through the command line and the API: every mistake is one clear error (exit status 2,
one ``error:`` line on stderr, nothing on stdout), never a silent wrong answer.

Per class: the model path taken verbatim; float settings finite and in range, sampling robust at
the ends of the range; ``tileinfer config`` and ``generate`` accepting the same values (with
property tests over config values and prompt ids). tests/core/test_cli_output.py has the rest.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import tileinfer
from tileinfer.backends.reference.sampling import sampling_probs
from tileinfer.cli import main
from tileinfer.config import load_config, resolve_config
from tileinfer.errors import ConfigError, UsageError
from tileinfer.interfaces import Attention, RunSpec, SamplingParams
from tileinfer.registry import build_registry, plugin_manager
from cli_checks import IDS, assert_one_error, generate_json
from conftest import REFERENCE_CPU as BASE, run_cli as run

def run_captured(*argv) -> tuple[int, str, str]:
    """``main`` with stdout and stderr captured without pytest's function-scoped fixtures (for
    hypothesis, which runs one test function many times)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def expected(tiny_checkpoint) -> list[int]:
    """The greedy tokens of the tiny checkpoint for IDS, through the API."""
    engine = tileinfer.Engine.from_config(model=str(tiny_checkpoint), overrides=BASE, progress=False)
    return engine.generate(IDS, max_new_tokens=4).token_ids


# -- the model path is a path, verbatim ---------------------------------------------------------

ODD_NAMES = ["a #b", "x: y", "${HOME}", "${oc.env:HOME}", "null", "~", "???", "a=b", "[1, 2]", "{a: 1}", "true",
             "123", "1e3", " #", "'quoted'", "!!python/none"]


@pytest.fixture(scope="module")
def odd_folders(tmp_path_factory, tiny_checkpoint) -> Path:
    """A folder holding a copy of the tiny checkpoint under each of ODD_NAMES."""
    root = tmp_path_factory.mktemp("odd")
    for name in ODD_NAMES:
        shutil.copytree(tiny_checkpoint, root / name)
    return root


@pytest.mark.parametrize("name", ODD_NAMES)
@pytest.mark.parametrize("how", ["--model", "model=", "relative --model", "relative model="])
def test_a_folder_with_any_name_is_taken_verbatim(capsys, monkeypatch, odd_folders, expected, name, how):
    path = str(odd_folders / name)
    if how.startswith("relative"):
        monkeypatch.chdir(odd_folders)
        path = name
    argv = ["--model", path] if how.endswith("--model") else [f"model={path}"]
    assert generate_json(capsys, *argv) == expected


@pytest.mark.parametrize("name", ["a #b", "x: y", "${HOME}", "null", "???"])
def test_config_prints_the_model_path_verbatim_and_reads_it_back(capsys, tmp_path, odd_folders, name):
    code, out, err = run(capsys, "config", f"model={odd_folders / name}")
    assert code == 0, err
    assert yaml.safe_load(out)["model"] == str(odd_folders / name)
    (tmp_path / "printed.yaml").write_text(out)  # what config prints is a config file giving the same path
    assert load_config([tmp_path / "printed.yaml"]).model == str(odd_folders / name)


@pytest.mark.parametrize("argv", [["--model", ""], ["--model="], ["model="], ["model=x", "model="]])
def test_an_empty_model_is_a_usage_error(capsys, argv):
    code, out, err = run(capsys, "generate", "--prompt-ids", "1,2", *argv)
    assert_one_error(code, out, err, "model= is empty: give a checkpoint folder")
    assert_one_error(*run(capsys, "config", "model="), "model= is empty")


def test_the_model_given_twice_is_a_usage_error(capsys, tiny_checkpoint):
    code, out, err = run(capsys, "generate", "--prompt-ids", "1,2", "--model", str(tiny_checkpoint),
                         f"model={tiny_checkpoint}")
    assert_one_error(code, out, err, "given twice")


@pytest.mark.parametrize("argv", [["--model", "null"], ["model=null"], ["--model", "~"], ["model=${HOME}"],
                                  ["--model", "None"]])
def test_a_word_yaml_would_read_is_a_folder_name_not_the_shipped_model(capsys, monkeypatch, tmp_path, argv):
    monkeypatch.chdir(tmp_path)  # none of these folders exists here
    code, out, err = run(capsys, "generate", "--prompt-ids", "1,2", *BASE, *argv)
    assert_one_error(code, out, err, f"model folder not found: {argv[-1].removeprefix('model=')}")


def test_a_config_file_may_still_say_null_for_the_shipped_model(tmp_path):
    (tmp_path / "c.yaml").write_text("model: null\n")
    assert load_config([tmp_path / "c.yaml"]).model is None
    (tmp_path / "d.yaml").write_text("model: ${oc.env:HOME}\n")  # no interpolation: a folder of that name
    assert load_config([tmp_path / "d.yaml"]).model == "${oc.env:HOME}"
    (tmp_path / "e.yaml").write_text("model: 2024\n")  # a number is not a folder: quote it
    with pytest.raises(ConfigError, match="model=2024 is not valid: expected a folder"):
        load_config([tmp_path / "e.yaml"])


def test_no_value_is_interpolated(capsys, tmp_path):
    for item in ["seed=${top_k}", "temperature=${oc.env:HOME}", "pipelined=${cuda_graphs}"]:
        assert_one_error(*run(capsys, "config", item), item, "interpolation is not supported")
    assert_one_error(*run(capsys, "config", "device=${oc.env:DEVICE}"), "device=${oc.env:DEVICE}", "cpu")
    assert_one_error(*run(capsys, "config", "proposer=ngram", "options.ngram.n_max=${spec_k}"),
                     "options.ngram.n_max=${spec_k}", "integer")


def test_api_takes_the_model_verbatim(odd_folders, expected):
    for name in ["${HOME}", "null", "a #b"]:
        assert load_config(overrides=[f"model={name}"]).model == name
        assert load_config([{"model": name}]).model == name
        engine = tileinfer.Engine.from_config("reference", model=odd_folders / name, device="cpu", dtype="float32",
                                              kv_page_size=16, progress=False)  # a Path is fine too
        assert engine.generate(IDS, max_new_tokens=4).token_ids == expected
    with pytest.raises(ConfigError, match="model= is empty"):
        tileinfer.Engine.from_config("reference", model="", device="cpu", progress=False)
    assert load_config([{"model": None}]).model is None  # the shipped model, from a mapping as from a file


# -- float settings finite and in range; sampling robust at the ends --------------------------

BAD_SAMPLING = ["temperature=nan", "temperature=inf", "temperature=-inf", "temperature=-0.5", "temperature=1e400",
                "top_p=0", "top_p=1.5", "top_p=nan", "top_p=-inf", "min_p=1", "min_p=-0.1", "min_p=nan",
                "top_k=-1", "seed=-1", f"seed={2**63}", "seed=99999999999999999999999", "top_k=1.5",
                "temperature=true", "seed=1.0"]


@pytest.mark.parametrize("item", BAD_SAMPLING)
def test_bad_sampling_values_are_one_error_in_config_and_generate(capsys, tiny_checkpoint, item):
    key = item.partition("=")[0]
    assert_one_error(*run(capsys, "config", item), f"{key}=")
    code, out, err = run(capsys, "generate", "--model", str(tiny_checkpoint), "--prompt-ids", "1,2", *BASE, item)
    assert_one_error(code, out, err, f"{key}=")


@pytest.mark.parametrize("values", [{"temperature": math.nan}, {"temperature": math.inf}, {"top_p": math.nan},
                                    {"min_p": math.inf}, {"seed": 2**63}, {"seed": -1}, {"top_k": -2},
                                    {"temperature": 1}, {"top_k": 2.0}, {"seed": True}])
def test_sampling_params_check_as_the_config_does(values):
    config_ok = True
    try:
        load_config([values])
    except ConfigError:
        config_ok = False
    if config_ok:  # an int where a float goes
        SamplingParams(**values)
    else:
        with pytest.raises(UsageError, match=f"{next(iter(values))}="):
            SamplingParams(**values)


@pytest.mark.parametrize("temperature", ["1e-40", "1e-300", "5e-324", "1e-20"])
def test_a_tiny_temperature_is_greedy(capsys, tiny_checkpoint, expected, temperature):
    assert generate_json(capsys, "--model", str(tiny_checkpoint), f"temperature={temperature}") == expected


@pytest.mark.parametrize("temperature", ["1e30", "1e300", "1.7e308"])
def test_a_huge_temperature_samples_valid_tokens(capsys, tiny_checkpoint, temperature):
    tokens = generate_json(capsys, "--model", str(tiny_checkpoint), f"temperature={temperature}", "seed=1")
    assert len(tokens) == 4 and all(0 <= t < 320 for t in tokens)


def test_a_seed_at_the_int64_limit_runs(capsys, tiny_checkpoint):
    tokens = generate_json(capsys, "--model", str(tiny_checkpoint), "temperature=1.0", f"seed={2**63 - 1}")
    assert len(tokens) == 4


TEMPERATURES = [5e-324, 1e-300, 1e-45, 1e-40, 1e-20, 1e-3, 0.7, 1.0, 3.0, 1e10, 1e30, 1e300, 1.7e308]
FILTERS = [{}, {"top_k": 5}, {"top_p": 0.5}, {"min_p": 0.3}, {"top_k": 3, "top_p": 0.9, "min_p": 0.1},
           {"top_k": 1}, {"top_p": 1e-9}, {"min_p": 0.999}]


@pytest.mark.parametrize("filters", FILTERS, ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()) or "none")
@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_sampling_probs_is_a_distribution_at_every_temperature(temperature, filters):
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 97, generator=generator) * torch.tensor([[1.0], [10.0], [1e3], [1e30]])
    logits[0, 3] = float("-inf")  # a masked token stays impossible
    probs = sampling_probs(logits, temperature, **filters)
    assert probs.dtype == torch.float32 and torch.isfinite(probs).all() and (probs >= 0).all()
    assert torch.allclose(probs.sum(-1), torch.ones(4), atol=1e-5)
    assert (probs[0, 3] == 0).all()
    unfiltered = sampling_probs(logits, temperature)
    most_likely = unfiltered == unfiltered.amax(-1, keepdim=True)  # several when the temperature flattens ties
    assert ((probs * most_likely).sum(-1) > 0).all()  # one of the most likely tokens survives the filters
    top = logits.argmax(-1)
    if temperature < 1e-30:  # the greedy limit: one-hot at the argmax (no ties in random logits)
        assert torch.equal(probs, torch.nn.functional.one_hot(top, 97).float())
    if temperature > 1e200 and not filters:  # the uniform limit over the finite logits
        finite = torch.isfinite(logits).float()
        assert torch.allclose(probs, finite / finite.sum(-1, keepdim=True))


def test_sampling_probs_keeps_top_k_when_the_temperature_flattens_everything():
    logits = torch.arange(10.0)[None]
    probs = sampling_probs(logits, 1e300, top_k=3)
    assert torch.allclose(probs, torch.tensor([[0.0] * 7 + [1 / 3] * 3]))


# -- config accepts exactly what generate accepts ----------------------------------------------

def test_config_checks_the_model_folder_as_generate_does(capsys):
    assert_one_error(*run(capsys, "config", "model=/no/such/folder"), "model folder not found: /no/such/folder")


@pytest.mark.parametrize("item, words", [
    ("max_new_tokens=0", ["max_new_tokens=0", "[1, "]), ("spec_k=0", ["spec_k=0"]), ("spec_k=2738407475", ["[1, 256]"]),
    ("kv_capacity=-5", ["kv_capacity=-5"]), ("kv_page_size=0", ["kv_page_size=0"]),
    (f"kv_capacity={2**63}", ["kv_capacity="]), ("max_new_tokens=2.5", ["expected an integer"]),
    ("cuda_graphs=2", ["cuda_graphs=2", "true or false"]), ("top_k=yes", ["top_k=true"]),
    ("options.ngram.n_max=1e999", ["options.ngram.n_max"]), ("x={", ["x={"]), ("seed", ["KEY=VALUE"]),
])
def test_ranges_and_types_are_one_error(capsys, item, words):
    assert_one_error(*run(capsys, "config", "proposer=ngram", item), *words)


class _PagedOnly(Attention):
    """An attention that, like the Triton one's paged kernels, takes power-of-two pages >= 16."""

    @classmethod
    def incompatibilities(cls, run: RunSpec) -> list[str]:
        size = run.kv_page_size
        return [] if size >= 16 and size & (size - 1) == 0 else [f"kv_page_size={size}: not a power of two >= 16"]

    def __call__(self, qkv, step, kv):
        raise NotImplementedError


class _PagedOnlyPlugin:
    @tileinfer.hookimpl
    def tileinfer_implementations(self):
        return [tileinfer.Implementation("attention", "paged_only", _PagedOnly)]


def test_implementations_are_told_the_page_size_before_loading():
    pm = plugin_manager(entry_points=False)
    pm.register(_PagedOnlyPlugin(), name="paged_only_plugin")
    registry = build_registry(pm)
    resolve_config(load_config(overrides=["device=cpu", "attention=paged_only", "kv_page_size=32"]), registry)
    with pytest.raises(ConfigError, match="attention=paged_only cannot run here: kv_page_size=24"):
        resolve_config(load_config(overrides=["device=cpu", "attention=paged_only", "kv_page_size=24"]), registry)


@pytest.mark.parametrize("size", [8, 24, 100])
def test_the_triton_attention_rejects_a_page_size_its_kernels_cannot_take(capsys, size):
    assert_one_error(*run(capsys, "config", "device=cpu", "attention=triton", f"kv_page_size={size}"),
                     f"kv_page_size={size}")


@pytest.mark.parametrize("items,says", [(["kv_page_size=128", "kv_capacity=64"], "is larger than kv_capacity (64)"),
                                        ([f"kv_page_size={2**40}"], "is larger than the KV capacity (")])
def test_a_page_larger_than_the_capacity_is_one_error_in_config_and_generate(capsys, tiny_checkpoint, items, says):
    assert_one_error(*run(capsys, "config", *items), "kv_page_size (", says)
    code, out, err = run(capsys, "generate", "--model", str(tiny_checkpoint), "--prompt-ids", "1,2", *BASE, *items)
    assert_one_error(code, out, err, "kv_page_size (", says)
    with pytest.raises(ConfigError, match=re.escape(says)):
        tileinfer.Engine.from_config("reference", model=str(tiny_checkpoint), overrides=items, progress=False)


def test_a_page_larger_than_the_models_context_is_one_error_before_loading(capsys, tiny_checkpoint):
    """The capacity is also capped by the model's max_position_embeddings (512 here): config cannot
    know it, generate says so before loading."""
    code, out, err = run(capsys, "generate", "--model", str(tiny_checkpoint), "--prompt-ids", "1,2", *BASE,
                         "kv_page_size=1024")
    assert_one_error(code, out, err, "kv_page_size (1024)", "512")


KEYS = ["model", "device", "dtype", "quantize", "linear", "attention", "kv_store", "sampler", "proposer",
        "max_new_tokens", "temperature", "top_k", "top_p", "min_p", "seed", "spec_k", "kv_page_size", "cuda_graphs",
        "pipelined", "kv_capacity", "options.ngram.n_max", "options.ngram.n_min", "options.reference.x"]
WORDS = ["auto", "cpu", "cuda", "reference", "triton", "paged", "paged_int8", "ngram", "none", "int8", "float32",
         "bfloat16", "float16", "null", "~", "???", "${HOME}", "", "true", "false", ".nan", "-.inf", "[1]", "{a: 1}"]
VALUES = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.integers(min_value=-3, max_value=70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["nan", "inf", "-inf", "1e-40", "1e-300", "1e300", "1e400", "0.0", "-0.0", "1.0", "0.5"]),
    st.booleans().map(lambda b: str(b).lower()),
    st.sampled_from(WORDS),
    st.text(max_size=12),
)
# generate on the tiny checkpoint: 4 new tokens unless the key under test says otherwise
GENERATE_BASE = ["max_new_tokens=4", "kv_page_size=16", "dtype=float32"]
SLOW = {"triton"}  # Triton under the interpreter: checked by config alone here


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.sampled_from(KEYS), value=VALUES)
def test_config_and_generate_accept_the_same_values(tiny_checkpoint, key, value):
    item = f"{key}={value}"
    code, out, err = run_captured("config", item)
    if code != 0:
        event("config: rejected")
        assert_one_error(code, out, err)
        return
    resolve_config(load_config(overrides=[item]))  # the API agrees
    if value in SLOW or key == "model":  # a model that exists (config checked it) is another checkpoint
        return
    code, out, err = run_captured("generate", "-q", "--model", str(tiny_checkpoint), "--prompt-ids", "5,6,7",
                                  "--json", *GENERATE_BASE, item)
    if code != 0:  # only the prompt and the model's limits are left for generate to reject
        event("config: accepted; generate: the prompt does not fit")
        assert_one_error(code, out, err, "positions")
    else:
        event("config: accepted; generate: generated")
        assert json.loads(out)["token_ids"]


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(ids=st.lists(st.one_of(st.integers(min_value=-5, max_value=330), st.integers(min_value=-(2**70),
                                                                                    max_value=2**70)),
                    max_size=600))
def test_prompt_ids_are_generated_from_or_one_error(tiny_checkpoint, ids):
    code, out, err = run_captured("generate", "--model", str(tiny_checkpoint), "--prompt-ids", ",".join(map(str, ids)),
                                  "--max-new-tokens", "2", "--json", *BASE)
    valid = bool(ids) and all(0 <= t < 320 for t in ids) and len(ids) + 2 <= 512
    if valid:
        assert code == 0, err
        assert len(json.loads(out)["token_ids"]) == 2
    else:
        assert_one_error(code, out, err)
