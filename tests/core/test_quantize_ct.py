"""A W8A16 checkpoint written by the compressed-tensors package's own code (channel strategy,
pack-quantized, bfloat16 scales, the lm_head ignored), read by tileinfer: its int8 rows and scales
dequantize to exactly the weights that transformers + compressed-tensors dequantize, -128 codes
included, and the engine runs it. Skipped where compressed-tensors is not installed (it is not a
dependency of tileinfer: ``pip install compressed-tensors``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import tileinfer

ct = pytest.importorskip("compressed_tensors")

CKPT = dict(hidden=128, layers=2, vocab=320, intermediate=192, std=0.2, seed=4, tokenizer=False)


@pytest.fixture(scope="module")
def ct_checkpoint(checkpoint_factory, tmp_path_factory) -> Path:
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationArgs,
        QuantizationConfig,
        QuantizationScheme,
        QuantizationStatus,
        apply_quantization_config,
    )
    from compressed_tensors.quantization.utils import calculate_qparams
    from transformers import Qwen3ForCausalLM

    model = Qwen3ForCausalLM.from_pretrained(checkpoint_factory(**CKPT), dtype=torch.bfloat16)
    args = QuantizationArgs(num_bits=8, type="int", symmetric=True, strategy="channel")
    config = QuantizationConfig(config_groups={"group_0": QuantizationScheme(targets=["Linear"], weights=args)},
                                ignore=["lm_head"])
    apply_quantization_config(model, config)
    for module in model.modules():
        if hasattr(module, "weight_scale"):
            w = module.weight.float()
            scale, _ = calculate_qparams(w.amin(1, keepdim=True), w.amax(1, keepdim=True), args)
            module.weight_scale.data.copy_(scale.to(module.weight_scale.dtype))
            module.quantization_status = QuantizationStatus.FROZEN
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    out = tmp_path_factory.mktemp("ct") / "model"
    model.save_pretrained(out)
    compressor.update_config(out)
    return out


def test_written_by_compressed_tensors(ct_checkpoint):
    qc = json.loads((ct_checkpoint / "config.json").read_text())["quantization_config"]
    assert qc["format"] == "pack-quantized" and qc["config_groups"]["group_0"]["weights"]["strategy"] == "channel"


def test_reads_what_transformers_dequantizes(ct_checkpoint):
    from transformers import CompressedTensorsConfig, Qwen3ForCausalLM

    hf = Qwen3ForCausalLM.from_pretrained(ct_checkpoint, dtype=torch.bfloat16,
                                          quantization_config=CompressedTensorsConfig(run_compressed=False))
    ours = tileinfer.Engine.from_config("reference", model=str(ct_checkpoint), device="cpu", dtype="bfloat16",
                                        quantize="int8", kv_page_size=16, progress=False)
    codes = set()
    for n, layer in enumerate(ours.model.layers):
        hf_layer = hf.model.layers[n]
        a, m = hf_layer.self_attn, hf_layer.mlp
        for lin, parts in ((layer.qkv, (a.q_proj, a.k_proj, a.v_proj)), (layer.o_proj, (a.o_proj,)),
                           (layer.gate_up, (m.gate_proj, m.up_proj)), (layer.down, (m.down_proj,))):
            assert lin.weight.dtype == torch.int8 and lin.scale.dtype == torch.float32
            dequantized = (lin.weight.float() * lin.scale[:, None]).to(torch.bfloat16)
            assert torch.equal(dequantized, torch.cat([p.weight.detach() for p in parts]))
            codes |= {int(lin.weight.min()), int(lin.weight.max())}
    assert -128 in codes  # compressed-tensors' absmax / 127.5 scale uses the whole range
    # the ignored lm_head comes in bfloat16 and is quantized at load, the embedding stays bfloat16
    assert ours.model.lm_head.weight.dtype == torch.int8 and ours.model.embed.dtype == torch.bfloat16
    assert len(ours.generate([3, 1, 4, 1, 5, 9, 2, 6], max_new_tokens=4).token_ids) == 4
