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
