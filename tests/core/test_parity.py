"""Parity with Hugging Face transformers' Qwen3ForCausalLM, float32 on CPU.

Random tiny checkpoints (tied and untied embeddings, single file and sharded, GQA groups 1, 2 and
4, head_dim 64 and 128) are run by both. For every combination of kv_store {paged} x proposer
{none, ngram} x kv_page_size {16, 64}:

- full-prompt logits agree with HF's within ``atol = rtol = 1e-4`` (measured: max |diff| < 1e-5 for logits up to ~7), also when
  the prompt is run as two steps (the second with ``start > 0``);
- greedy generation gives the same 40 new tokens as HF ``generate(do_sample=False)``.

The prompt has 37 tokens (not a multiple of either page size: it crosses page boundaries at 16,
and generation crosses the one at 64); its second half repeats its first so n-gram drafts exist.
Weights use std 0.2 so that greedy outputs are varied, not one token repeated.
"""

from __future__ import annotations

import json

import pytest
import torch

import tileinfer
from tileinfer.interfaces import Step
from tileinfer.model_config import ModelConfig

CPU = torch.device("cpu")
ATOL = RTOL = 1e-4
NEW_TOKENS = 40
COMMON = dict(hidden=64, layers=2, vocab=320, intermediate=128, std=0.2, tokenizer=False)
CHECKPOINTS = {
    "tied-g1-d64": dict(tie=True, heads=4, kv_heads=4, head_dim=64, seed=1),
    "untied-sharded-g2-d128": dict(tie=False, heads=4, kv_heads=2, head_dim=128, shard=True, seed=2),
    "untied-g4-d64": dict(tie=False, heads=4, kv_heads=1, head_dim=64, seed=3),
    "tied-sharded-g4-d128": dict(tie=True, heads=8, kv_heads=2, head_dim=128, shard=True, seed=4),
}
COMBOS = [(kv, proposer, page) for kv in ("paged",) for proposer in ("none", "ngram") for page in (16, 64)]



def prompt() -> list[int]:
    first = torch.randint(0, 320, (20,), generator=torch.Generator().manual_seed(123)).tolist()
    ids = first + first[:17]
    assert len(ids) == 37 and len(ids) % 16 and len(ids) % 64
    return ids


@pytest.fixture(scope="module")
def references(checkpoint_factory):
    """Per checkpoint: (folder, HF logits of the prompt, HF greedy tokens), computed once."""
    from transformers import Qwen3ForCausalLM

    cache = {}

    def get(name):
        if name not in cache:
            kw = CHECKPOINTS[name]
            folder = checkpoint_factory(**COMMON, **kw)
            config = json.loads((folder / "config.json").read_text())
            assert ModelConfig.from_folder(folder).eos_token_ids == ()  # nothing stops generation early
            assert config["tie_word_embeddings"] == kw["tie"]
            sharded = (folder / "model.safetensors.index.json").is_file()
            assert sharded == kw.get("shard", False)
            if sharded:
                files = set(json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"].values())
                assert len(files) > 1
            hf = Qwen3ForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
            assert hf.config.num_attention_heads // hf.config.num_key_value_heads in (1, 2, 4)
            ids = torch.tensor([prompt()])
            with torch.no_grad():
                logits = hf(ids).logits[0].float()
                out = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                  max_new_tokens=NEW_TOKENS, pad_token_id=0)
            tokens = out[0, ids.shape[1]:].tolist()
            assert len(tokens) == NEW_TOKENS  # HF did not stop early
            assert len(set(tokens)) >= 8, f"degenerate reference output {tokens}"
            cache[name] = (folder, logits, tokens)
        return cache[name]

    return get


@pytest.fixture(scope="module")
def engines(references):
    cache = {}

    def get(name, kv_store, proposer, page):
        key = (name, kv_store, proposer, page)
        if key not in cache:
            folder = references(name)[0]
            cache[key] = tileinfer.Engine.from_config(
                "reference",
                model=str(folder), device="cpu", dtype="float32", kv_store=kv_store, proposer=proposer,
                kv_page_size=page, spec_k=4, progress=False)
        return cache[key]

    return get


def run(engine, ids: list[int], splits: list[int]) -> torch.Tensor:
    """Logits of every prompt position, the prompt run as steps of the given sizes."""
    engine.kv.reset()
    out, start = [], 0
    with torch.inference_mode():
        for n in splits:
            step = Step.at(start, n, CPU)
            engine.kv.reserve(step.end)
            logits, _ = engine.model.forward(torch.tensor(ids[start:start + n]), step, engine.kv)
            out.append(logits)
            start += n
    assert start == len(ids)
    return torch.cat(out)


@pytest.mark.parametrize("kv_store,proposer,page", COMBOS)
@pytest.mark.parametrize("name", CHECKPOINTS)
def test_prompt_logits_match_hf(references, engines, name, kv_store, proposer, page):
    _, ref, _ = references(name)
    engine = engines(name, kv_store, proposer, page)
    ids = prompt()
    ours = run(engine, ids, [len(ids)])
    assert ours.dtype == torch.float32 and ours.shape == ref.shape == (37, 320)
    torch.testing.assert_close(ours, ref, atol=ATOL, rtol=RTOL)
    # the same positions as a prefill of 20 then a step of 17 with start = 20 (a page boundary
    # crossed inside the step for page size 16)
    torch.testing.assert_close(run(engine, ids, [20, 17]), ref, atol=ATOL, rtol=RTOL)
    # and token by token for the first 18 (decode steps)
    torch.testing.assert_close(run(engine, ids[:18], [1] * 18), ref[:18], atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("kv_store,proposer,page", COMBOS)
@pytest.mark.parametrize("name", CHECKPOINTS)
def test_greedy_tokens_match_hf(references, engines, name, kv_store, proposer, page):
    _, _, ref = references(name)
    engine = engines(name, kv_store, proposer, page)
    gen = engine.generate(prompt(), max_new_tokens=NEW_TOKENS)
    assert gen.token_ids == ref
    assert gen.stats.finish_reason == "length" and gen.stats.new_tokens == NEW_TOKENS
    if proposer == "none":
        assert gen.stats.steps == NEW_TOKENS - 1
