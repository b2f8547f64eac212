"""``tileinfer quantize`` (core/quantize.py) and loading W8A16 compressed-tensors checkpoints
(core/loading.py): the written files, the pack-quantized layout, the round trip to exactly the
weights ``quantize=int8`` gives at load, and the memory the engine reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from tileinfer.backends.reference.linear import quantize_int8
from tileinfer.cli import main
from tileinfer.errors import CheckpointError, UsageError
from tileinfer.quantize import Int8Weight, int8_of, pack_int8, quantize_checkpoint, unpack_int8

from conftest import reference_engine, run_cli

# non-default config values: rope_theta, an EOS id, GQA 3:1, head_dim 48 != hidden / heads
CKPT = dict(hidden=96, layers=2, vocab=300, intermediate=160, heads=6, kv_heads=2, head_dim=48, std=0.1,
            rope_theta=5e5, eos=7, seed=3)
PROMPT = [5, 9, 13, 200, 17, 4, 80, 81, 82, 40, 41, 3, 2, 1, 250, 251, 299, 0, 6, 8]


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def pair(request, checkpoint_factory, tmp_path_factory) -> tuple[Path, Path]:
    """(source checkpoint, its quantized copy written by the command line)."""
    source = checkpoint_factory(**CKPT, tie=request.param)
    out = tmp_path_factory.mktemp("int8") / "model"
    code = main(["-q", "quantize", "--model", str(source), "--out", str(out)])
    assert code == 0
    return source, out


def test_files_and_layout(pair):
    source, out = pair
    raw = json.loads((out / "config.json").read_text())
    qc = raw["quantization_config"]
    weights = qc["config_groups"]["group_0"]["weights"]
    assert qc["quant_method"] == "compressed-tensors" and qc["format"] == "pack-quantized"
    assert qc["quantization_status"] == "compressed"
    assert (weights["num_bits"], weights["type"], weights["strategy"], weights["symmetric"]) == (8, "int", "channel", True)
    tied = raw.get("tie_word_embeddings", False)
    assert qc["ignore"] == (["lm_head"] if tied else [])
    src = json.loads((source / "config.json").read_text())
    assert {k: v for k, v in raw.items() if k != "quantization_config"} == src
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (out / name).read_bytes() == (source / name).read_bytes()
    with safe_open(str(out / "model.safetensors"), "pt") as f, safe_open(str(source / "model.safetensors"), "pt") as s:
        names = set(f.keys())
        p = "model.layers.1.mlp.down_proj"
        w = s.get_tensor(p + ".weight").float()
        packed, scale, shape = (f.get_tensor(f"{p}.{x}") for x in ("weight_packed", "weight_scale", "weight_shape"))
        assert packed.dtype == torch.int32 and packed.shape == (96, 40)
        assert scale.dtype == torch.float32 and scale.shape == (96, 1)
        assert shape.dtype == torch.int64 and shape.tolist() == [96, 160]
        q, expected_scale = quantize_int8(w)
        assert torch.equal(scale[:, 0], expected_scale)
        # element 4j + k of a row in bits 8k.. of word j, as q + 128
        word = sum(((q[:, k].to(torch.int64) + 128) << (8 * k)) for k in range(4))
        assert torch.equal(packed[:, 0].to(torch.int64) & 0xFFFFFFFF, word)
        assert p + ".weight" not in names
        assert f.get_tensor("model.embed_tokens.weight").dtype == s.get_tensor("model.embed_tokens.weight").dtype
        assert ("lm_head.weight_packed" in names) == (not tied) and "lm_head.weight" not in names


def test_pack_round_trip_any_width():
    g = torch.Generator().manual_seed(1)
    for columns in (1, 4, 7, 33):
        q = torch.randint(-128, 128, (5, columns), generator=g, dtype=torch.int8)
        packed = pack_int8(q)
        assert packed.shape == (5, -(-columns // 4)) and packed.dtype == torch.int32
        assert torch.equal(unpack_int8(packed, columns), q)


def test_loads_to_the_weights_quantized_at_load(pair):
    """The INT8 checkpoint gives the very int8 rows and scales (hence the logits) of its source
    quantized at load, and reports fewer weight bytes."""
    source, out = pair
    at_load = reference_engine(source, quantize="int8")
    stored = reference_engine(out, quantize="int8")
    assert stored.config.quantize == "int8"
    for a, b in zip(at_load.model.layers, stored.model.layers):
        for name in ("qkv", "o_proj", "gate_up", "down"):
            la, lb = getattr(a, name), getattr(b, name)
            assert lb.weight.dtype == torch.int8 and torch.equal(la.weight, lb.weight) and torch.equal(la.scale, lb.scale)
    assert torch.equal(at_load.model.lm_head.weight, stored.model.lm_head.weight)
    assert torch.equal(stored.model.embed, at_load.model.embed) and stored.model.embed.dtype == torch.float32
    assert at_load.generate(PROMPT, max_new_tokens=6).token_ids == stored.generate(PROMPT, max_new_tokens=6).token_ids
    plain = reference_engine(source)
    stats = stored.generate(PROMPT, max_new_tokens=2).stats
    assert stats.weight_bytes == stored.weight_bytes < plain.weight_bytes / 2  # float32 model dtype: ~1/4
    assert stats.kv_bytes == plain.kv_bytes > 0


def test_triton_linear_runs_the_stored_weights(pair, capsys):
    """The Triton linear (interpreter) on the INT8 checkpoint: the reference's tokens, from the CLI
    (the first token from the 20-token prefill, through the GEMM of T > 16 tokens; the second from a
    decode step, through the GEMV)."""
    _, out = pair
    base = ["generate", "--model", str(out), "--prompt-ids", ",".join(map(str, PROMPT)), "--max-new-tokens", "2",
            "--json", "device=cpu", "dtype=float32", "kv_page_size=16", "quantize=int8", "cuda_graphs=false",
            "pipelined=false"]
    code, ref_out, err = run_cli(capsys, *base, "linear=reference", "attention=reference")
    assert code == 0, err
    code, tri_out, err = run_cli(capsys, *base, "linear=triton", "attention=reference")
    assert code == 0, err
    tokens = json.loads(ref_out)["token_ids"]
    assert json.loads(tri_out)["token_ids"] == tokens and len(tokens) == 2
    assert json.loads(tri_out)["stats"]["weight_bytes"] > 0


def test_int8_checkpoint_with_quantize_none_is_an_error(pair, capsys):
    _, out = pair
    with pytest.raises(CheckpointError, match=r"config.json: the checkpoint's weights are INT8 .* quantize=int8"):
        reference_engine(out, quantize="none")
    code, _, err = run_cli(capsys, "generate", "--model", str(out), "--prompt-ids", "1,2", "device=cpu",
                           "linear=reference", "attention=reference", "quantize=none")
    assert code == 1 and err.count("\n") == 1 and err.startswith(f"error: {out / 'config.json'}: ")


def test_the_default_quantize_auto_takes_the_checkpoints(pair, capsys):
    source, out = pair
    base = ["--prompt-ids", ",".join(map(str, PROMPT)), "--max-new-tokens", "4", "--json", "device=cpu",
            "dtype=float32", "kv_page_size=16", "linear=reference", "attention=reference"]
    code, auto_out, err = run_cli(capsys, "generate", "--model", str(out), *base)
    assert code == 0, err
    code, int8_out, err = run_cli(capsys, "generate", "--model", str(source), *base, "quantize=int8")
    assert code == 0, err
    assert json.loads(auto_out)["token_ids"] == json.loads(int8_out)["token_ids"]
    assert json.loads(auto_out)["stats"]["weight_bytes"] == json.loads(int8_out)["stats"]["weight_bytes"]
    code, config_out, err = run_cli(capsys, "config", f"model={out}", "device=cpu")
    assert code == 0, err
    assert "quantize: int8" in config_out
    code, config_out, err = run_cli(capsys, "config", f"model={source}", "device=cpu")
    assert "quantize: none" in config_out


def test_quantize_refuses_a_quantized_checkpoint_and_a_full_folder(pair, tmp_path):
    source, out = pair
    with pytest.raises(UsageError, match="already quantized"):
        quantize_checkpoint(out, tmp_path / "again")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(UsageError, match="not an empty folder"):
        quantize_checkpoint(source, tmp_path / "full")


def test_int8_weight_cat_and_fallback():
    g = torch.Generator().manual_seed(2)
    parts = [Int8Weight(torch.randint(-128, 128, (n, 8), generator=g, dtype=torch.int8), torch.rand(n, generator=g),
                        torch.float16) for n in (3, 5)]
    fused = torch.cat(parts)
    assert isinstance(fused, Int8Weight) and fused.shape == (8, 8) and fused.dtype == torch.float16
    q, scale = int8_of(fused)
    assert torch.equal(q, torch.cat([p.q for p in parts])) and torch.equal(scale, torch.cat([p.scale for p in parts]))
    # any other op sees the dequantized weight; a Linear that knows nothing of INT8 re-quantizes it
    assert torch.equal(fused.float(), (q.float() * scale[:, None]).half().float())
    requantized, _ = quantize_int8(fused)
    assert requantized.dtype == torch.int8 and requantized.shape == (8, 8)
