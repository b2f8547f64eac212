"""On a GPU: the reference engine matches Hugging Face transformers there too (skipped without one)."""

from __future__ import annotations

import pytest
import torch

import tileinfer

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_reference_engine_on_cuda_matches_transformers(checkpoint_factory, dtype):
    from transformers import Qwen3ForCausalLM

    folder = checkpoint_factory(heads=8, kv_heads=2, head_dim=64, hidden=128, layers=3)
    torch_dtype = getattr(torch, dtype)
    engine = tileinfer.Engine.from_config("reference", model=str(folder), device="cuda", dtype=dtype, kv_page_size=16,
                                          progress=False)
    hf = Qwen3ForCausalLM.from_pretrained(folder, dtype=torch_dtype).cuda().eval()
    prompt = [(7 * i) % 300 for i in range(45)]
    with torch.no_grad():
        expected = hf(torch.tensor([prompt], device="cuda")).logits[0, -1].float()
    result = engine.generate(prompt, max_new_tokens=1)
    engine.kv.reset()
    engine.kv.reserve(len(prompt))
    with torch.inference_mode():
        logits, _ = engine.model.forward(torch.tensor(prompt, device="cuda"),
                                         tileinfer.interfaces.Step.at(0, len(prompt), engine.device), engine.kv,
                                         last_only=True)
    tolerance = 1e-3 if dtype == "float32" else 5e-2
    torch.testing.assert_close(logits[0], expected, atol=tolerance, rtol=tolerance)
    top2 = expected.topk(2).values
    if top2[0] - top2[1] > 2 * tolerance:  # a closer call may legitimately go either way in bf16
        assert result.token_ids[0] == int(expected.argmax())
    if dtype == "float32":
        out = hf.generate(torch.tensor([prompt], device="cuda"), max_new_tokens=32, do_sample=False)
        assert engine.generate(prompt, max_new_tokens=32).token_ids == out[0, len(prompt):].tolist()


def test_default_config_end_to_end_in_bfloat16(checkpoint_factory):
    """The default config as it ships (bfloat16, the Triton implementations with their fused kernels,
    CUDA graphs, pipelined decoding) on a checkpoint saved by transformers: every greedy token is
    transformers' argmax up to bfloat16 rounding (teacher-forced over the whole generation), and
    the knobs that must not change a bit (the fused kernels against their per-op chains, pipelined
    against sequential decoding over the same graphs) give the same tokens."""
    from transformers import Qwen3ForCausalLM

    folder = checkpoint_factory(heads=16, kv_heads=8, head_dim=128, hidden=256, layers=3, vocab=320,
                                max_positions=4096, std=0.1)
    engine = tileinfer.Engine.from_config(model=str(folder), progress=False)
    config = engine.config
    assert (config.device, config.dtype, config.linear, config.attention) == ("cuda", "bfloat16", "triton", "triton")
    assert config.options["triton"]["fuse_epilogue"] and config.options["triton"]["fuse_inputs"]
    assert engine.decoder.plan.ahead and engine.decoder.steps.graphed
    prompt = [(7 * i) % 300 for i in range(200)]
    tokens = engine.generate(prompt, max_new_tokens=64, ignore_eos=True).token_ids
    assert len(tokens) == 64

    hf = Qwen3ForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).cuda().eval()
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + tokens], device="cuda")).logits[0, len(prompt) - 1:-1].float()
    chosen = logits.gather(1, torch.tensor(tokens, device="cuda")[:, None])[:, 0]
    gap = logits.max(-1).values - chosen  # 0 where transformers picks the same token
    assert (gap <= 0.1).all(), gap.max()
    assert (gap == 0).float().mean() >= 0.9

    for keys in ({"pipelined": False},
                 {"options": {"triton": {"fuse_epilogue": False, "fuse_inputs": False}}},
                 {"options": {"triton": {"pdl": False}}}):
        other = tileinfer.Engine.from_config(keys, model=str(folder), progress=False)
        assert other.generate(prompt, max_new_tokens=64, ignore_eos=True).token_ids == tokens, keys
