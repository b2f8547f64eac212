"""kv_capacity: ``auto`` (the default) is the model's context, bounded by ``memory_fraction`` of the
free memory after the weights and a prefill chunk's activations; resolved by ``tileinfer config``,
reported in the stats; a prompt or a pool that cannot fit is a one-line error before any weight
loads. The free-memory figure is monkeypatched (``tileinfer.memory.free_bytes``).
"""

from __future__ import annotations

import re

import pytest
import torch
import yaml

import tileinfer
import tileinfer.checkpoint
import tileinfer.memory
from conftest import REFERENCE_CPU, reference_engine, run_cli
from tileinfer.config import load_config, resolve_config
from tileinfer.errors import ConfigError
from tileinfer.memory import activation_bytes, kv_bytes, weight_bytes
from tileinfer.model_config import ModelConfig

PAGE = 16


def budget_for(folder, pages: int, *, fraction: float = 0.9, chunk: int = 4096, dtype=torch.float32) -> int:
    """A free-memory figure in which ``fraction`` holds the weights, a chunk's activations and
    ``pages`` pages of the KV pool, plus half a page."""
    mc = ModelConfig.from_folder(folder)
    need = (weight_bytes(mc, dtype, "none") + activation_bytes(mc, min(chunk, mc.max_positions), dtype)
            + kv_bytes(mc, pages * PAGE + PAGE // 2, dtype, "dtype"))
    return int(need / fraction) + 1


@pytest.fixture
def free(monkeypatch):
    """``free(n)`` makes the device report ``n`` bytes free; the calls are counted in ``free.calls``."""
    calls = []

    def set_free(n: int) -> None:
        def free_bytes(device):
            calls.append(device)
            return n
        monkeypatch.setattr(tileinfer.memory, "free_bytes", free_bytes)

    set_free.calls = calls
    return set_free


@pytest.fixture
def no_loading(monkeypatch):
    """Loading a weight fails the test: what is checked must be checked before."""
    monkeypatch.setattr(tileinfer.checkpoint, "CheckpointReader", None)


def config_of(capsys, *items: str) -> tuple[dict, str]:
    code, out, err = run_cli(capsys, "config", *items)
    assert code == 0, err
    return yaml.safe_load(out), err


def test_auto_is_the_models_context_when_it_fits(capsys, tiny_checkpoint):
    shown, err = config_of(capsys, f"model={tiny_checkpoint}", "kv_page_size=16")
    assert load_config().kv_capacity == "auto"
    assert shown["kv_capacity"] == 512 == ModelConfig.from_folder(tiny_checkpoint).max_positions
    assert "notice" not in err
    engine = reference_engine(tiny_checkpoint, max_new_tokens=2)
    assert engine.config.kv_capacity == engine.capacity == engine.kv.capacity == 512
    assert engine.generate([1, 2, 3]).stats.kv_capacity == 512


def test_an_explicit_capacity_is_capped_by_the_models_context(capsys, tiny_checkpoint):
    assert config_of(capsys, f"model={tiny_checkpoint}", "kv_capacity=100000")[0]["kv_capacity"] == 512
    assert config_of(capsys, f"model={tiny_checkpoint}", "kv_capacity=100", "kv_page_size=16")[0]["kv_capacity"] == 100


@pytest.mark.parametrize("fraction", [0.9, 0.5])
def test_auto_is_bounded_by_the_free_memory(capsys, tiny_checkpoint, free, fraction):
    free(budget_for(tiny_checkpoint, 5, fraction=fraction))
    items = [f"model={tiny_checkpoint}", "kv_page_size=16", "device=cpu", "dtype=float32",
             f"memory_fraction={fraction}"]
    shown, err = config_of(capsys, *items)
    assert shown["kv_capacity"] == 5 * PAGE  # whole pages
    assert shown["memory_fraction"] == fraction
    assert err == (f"notice: kv_capacity=auto: 80 positions fit in memory_fraction={fraction} of the free memory, "
                   "fewer than the model's context (512); prompts and replies are limited to that\n")
    engine = reference_engine(tiny_checkpoint, max_new_tokens=3, memory_fraction=fraction)
    assert engine.capacity == engine.kv.capacity == 80
    assert engine.generate(list(range(70))).stats.kv_capacity == 80
    free(budget_for(tiny_checkpoint, 9, fraction=fraction, chunk=64))  # a smaller chunk leaves more room
    assert resolve_config(load_config(overrides=[*items, "prefill_chunk=64"])).kv_capacity == 9 * PAGE


def test_no_room_for_one_page_is_an_error_before_loading(capsys, tiny_checkpoint, free, no_loading):
    free(budget_for(tiny_checkpoint, 0))
    items = [f"model={tiny_checkpoint}", "kv_page_size=16", "dtype=float32", "device=cpu"]
    code, out, err = run_cli(capsys, "config", *items)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert re.fullmatch(r"error: kv_capacity=auto: the weights \(545.8 KiB\) and a prefill chunk's activations "
                        r"\(2.4 MiB\) leave no room for one KV page \(16.0 KiB\) in memory_fraction=0.9 of the "
                        r"3.2 MiB free on cpu; lower prefill_chunk or set quantize=int8\n", err), err
    with pytest.raises(ConfigError, match="leave no room for one KV page"):
        reference_engine(tiny_checkpoint)


def test_a_prompt_longer_than_the_auto_capacity_fails_before_any_weight_loads(capsys, tiny_checkpoint, free,
                                                                             no_loading):
    free(budget_for(tiny_checkpoint, 4))  # 64 positions
    code, out, err = run_cli(capsys, "generate", "--model", str(tiny_checkpoint), "--prompt-ids",
                             ",".join(["5"] * 60), "--max-new-tokens", "8", *REFERENCE_CPU)
    assert (code, out) == (2, "")
    assert err == "error: the prompt (60 tokens) + max_new_tokens (8) needs 68 positions, more than kv_capacity (64)\n"
    assert free.calls  # the figure was asked for, before any weight was read (CheckpointReader is None)


def test_the_linear_implementations_workspace_is_counted_with_the_weights(capsys, tiny_checkpoint, free):
    """The Triton linear's ``int8_prefill_dequant`` scratch (int8 weights of a 16-bit model: the largest
    Linear but the lm_head, in the model dtype) takes room from the pool as the weights do."""
    mc, dtype = ModelConfig.from_folder(tiny_checkpoint), torch.float16
    shapes = mc.linear_shapes()
    scratch = max(r * c for name, (r, c) in shapes.items() if name != "lm_head") * 2
    assert scratch > kv_bytes(mc, PAGE, dtype, "dtype")  # more than a page: it shows in the page count
    need = (weight_bytes(mc, dtype, "int8") + activation_bytes(mc, min(4096, mc.max_positions), dtype)
            + kv_bytes(mc, 5 * PAGE + PAGE // 2, dtype, "dtype"))
    items = [f"model={tiny_checkpoint}", "kv_page_size=16", "device=cpu", "dtype=float16", "linear=triton",
             "attention=reference", "quantize=int8"]
    free(int((need + scratch) / 0.9) + 1)
    assert config_of(capsys, *items)[0]["kv_capacity"] == 5 * PAGE
    assert config_of(capsys, *items, "options.triton.int8_prefill_dequant=0")[0]["kv_capacity"] > 5 * PAGE
    free(int(need / 0.9) + 1)
    assert config_of(capsys, *items)[0]["kv_capacity"] < 5 * PAGE


def test_loading_checks_the_workspace_too(tiny_checkpoint):
    """``Implementations.check_fits`` (before any weight loads) counts the linear's workspace."""
    from tileinfer.config import load_config
    from tileinfer.model_loader import Implementations
    from tileinfer.resolution import ResolvedConfig

    config = ResolvedConfig.of(load_config(overrides=[f"model={tiny_checkpoint}", "device=cpu", "dtype=float16",
                                                      "linear=triton", "attention=reference", "quantize=int8",
                                                      "kv_page_size=16"])).config
    mc, dtype = ModelConfig.from_folder(tiny_checkpoint), torch.float16
    scratch = max(r * c for name, (r, c) in mc.linear_shapes().items() if name != "lm_head") * 2
    fits = weight_bytes(mc, dtype, "int8") + kv_bytes(mc, 64, dtype, "dtype")
    implementations = Implementations.of(config)
    implementations.check_fits(mc, device=torch.device("cpu"), dtype=dtype, positions=64, free=fits + scratch)
    with pytest.raises(ConfigError, match="more than the"):
        implementations.check_fits(mc, device=torch.device("cpu"), dtype=dtype, positions=64, free=fits + scratch - 1)


def test_the_engine_measures_free_memory_on_its_device(tiny_checkpoint, free):
    free(budget_for(tiny_checkpoint, 3))
    engine = reference_engine(tiny_checkpoint, max_new_tokens=2)
    assert engine.capacity == 48 and {d.type for d in free.calls} == {"cpu"}


def test_memory_fraction_is_a_checked_config_key(capsys):
    for value in ("0", "1.5", "-0.1", "nan", "x"):
        code, out, err = run_cli(capsys, "config", f"memory_fraction={value}")
        assert code == 2 and out == "" and err.startswith("error: memory_fraction=") and err.count("\n") == 1
    for value in ("0", "-1", "1.5", "autox", "true"):
        code, out, err = run_cli(capsys, "config", f"kv_capacity={value}")
        assert code == 2 and err.startswith(f"error: kv_capacity={value}") and err.count("\n") == 1, err


@pytest.mark.gpu
def test_auto_on_a_gpu_is_bounded_by_its_free_memory(tiny_checkpoint, free):
    """cudaMemGetInfo's figure, monkeypatched: the pool holds what fits, and the engine runs."""
    mc = ModelConfig.from_folder(tiny_checkpoint)
    need = (weight_bytes(mc, torch.bfloat16, "none") + activation_bytes(mc, 512, torch.bfloat16)
            + kv_bytes(mc, 4 * PAGE + 1, torch.bfloat16, "dtype"))
    free(int(need / 0.9) + 1)
    engine = tileinfer.Engine.from_config(model=str(tiny_checkpoint), device="cuda", kv_page_size=PAGE, progress=False)
    assert engine.capacity == engine.kv.capacity == 4 * PAGE
    out = engine.generate(list(range(1, 40)), max_new_tokens=8, ignore_eos=True)
    assert len(out.token_ids) == 8 and out.stats.kv_capacity == 4 * PAGE
