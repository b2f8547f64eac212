"""Every Triton variant gives the reference backend's greedy tokens on a tiny model: on the CPU
under the Triton interpreter, on the GPU compiled (float32 there too, so that tokens must match)."""

from __future__ import annotations

import pytest

import tileinfer
from conftest import DEVICE
from tileinfer.errors import ConfigError

VARIANTS = ["unfused-refattn-eager", "unfused-eager", "tile-eager", "cublas-linears"]
# Repetitive, so that n-gram drafts are proposed and verify steps of several tokens run.
PROMPT = [(7 * i) % 23 + 40 for i in range(18)] * 2


@pytest.fixture(scope="module")
def folder(checkpoint_factory):
    return checkpoint_factory(heads=4, kv_heads=2, head_dim=32, hidden=64, layers=2)


def run(folder, *sources, **keys):
    engine = tileinfer.Engine.from_config(*sources, model=str(folder), device=DEVICE, dtype="float32",
                                          kv_page_size=16, progress=False, **keys)
    return engine.generate(PROMPT, max_new_tokens=10)


@pytest.fixture(scope="module")
def expected(folder):
    return run(folder, "reference").token_ids


@pytest.mark.parametrize("variant", VARIANTS)
def test_variant_matches_reference_greedy_tokens(folder, expected, variant):
    assert run(folder, variant).token_ids == expected


def test_norm_prologue_linear_matches_reference_greedy_tokens(folder, expected):
    assert run(folder, "tile-eager", linear="triton_fused_prologue").token_ids == expected


def test_fused_variant_with_speculative_verify_steps(folder, expected):
    result = run(folder, "tile-eager", proposer="ngram", spec_k=3)
    assert result.token_ids == expected
    assert result.stats.drafted_tokens > 0  # verify steps of several tokens ran


def test_triton_attention_refuses_int8_pages(folder):
    with pytest.raises(ConfigError, match="cannot read kv_store=paged_int8"):
        run(folder, "tile-eager", kv_store="paged_int8")


@pytest.mark.parametrize("variant", ["unfused-eager", "tile-eager"])
def test_triton_plugins_launch_with_pdl_where_supported(folder, variant):
    """Every Triton Linear and Attention decides programmatic dependent launch once, from its
    weights' device: on on an H100/H200, off on the CPU (interpreter) and older GPUs."""
    from tileinfer.backends.triton.pdl import pdl_supported

    engine = tileinfer.Engine.from_config(variant, model=str(folder), device=DEVICE, dtype="float32",
                                          kv_page_size=16, progress=False)
    model = engine.model
    expected = pdl_supported(model.device)
    assert DEVICE == "cuda" or not expected
    modules = [model.lm_head] + [m for layer in model.layers
                                 for m in (layer.qkv, layer.attention, layer.o_proj, layer.gate_up, layer.down)]
    assert [m.pdl for m in modules] == [expected] * len(modules)
