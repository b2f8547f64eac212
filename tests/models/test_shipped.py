"""The shipped models (models/target, models/draft; made by models/make_all.py): they load
in tileinfer, greedy output is deterministic and equals transformers' (float32, CPU), they share
the tokenizer and fit the size budget, and n-gram speculation accepts drafts on the EDIT task of
models/prompts.py. Each test skips while its model folder is not there yet."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

import tileinfer
from tileinfer.models import prompts

ROOT = Path(__file__).resolve().parents[2]
MODELS = Path(os.environ.get("TILEINFER_SHIPPED_MODELS") or ROOT / "models")  # another folder: check before committing
WEIGHT_LIMIT = 32_000_000  # bytes of safetensors, target and draft together
NEW_TOKENS = 48


def folder(name: str) -> Path:
    path = MODELS / name
    if not (path / "config.json").is_file():
        pytest.skip(f"models/{name}/ is not there yet: the shipped models are trained on a GPU by "
                    f"models/make_all.py and committed from its output (see models/README.md)")
    return path


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def engines():
    made = {}

    def get(name: str, **kw):
        key = (name, tuple(sorted(kw.items())))
        if key not in made:
            made[key] = tileinfer.Engine.from_config("reference", model=str(folder(name)), device="cpu", dtype="float32",
                                                     progress=False, **kw)
        return made[key]

    return get


def code_ids(engine, tokens: int = 200) -> list[int]:
    return engine.tokenizer.encode((prompts.HELDOUT_DIR / "netrc.py.txt").read_text())[:tokens]


@pytest.mark.parametrize("name", ["target", "draft"])
def test_loads_as_a_qwen3_checkpoint(engines, name):
    engine = engines(name)
    config = json.loads((folder(name) / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"] and config["dtype"] == "bfloat16"
    assert engine.model_config.eos_token_ids == (2, 0)  # <|im_end|>, <|endoftext|>
    assert engine.tokenizer.vocab_size == engine.model_config.vocab_size == 8192
    assert engine.tokenizer.chat_template
    assert [p.name for p in folder(name).glob("*.safetensors")] == ["model.safetensors"]


@pytest.mark.parametrize("name", ["target", "draft"])
def test_greedy_is_deterministic(engines, name):
    engine = engines(name)
    first = engine.generate("def fibonacci(n):", max_new_tokens=NEW_TOKENS)
    second = engine.generate("def fibonacci(n):", max_new_tokens=NEW_TOKENS)
    assert first.token_ids == second.token_ids and first.text == second.text


@pytest.mark.parametrize("name", ["target", "draft"])
def test_greedy_tokens_match_transformers(engines, name):
    from transformers import Qwen3ForCausalLM

    engine = engines(name)
    hf = Qwen3ForCausalLM.from_pretrained(folder(name), dtype=torch.float32).eval()
    ids = code_ids(engine)
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                          do_sample=False, max_new_tokens=NEW_TOKENS, pad_token_id=0)
    expected = out[0, len(ids):].tolist()
    assert engine.generate(ids, max_new_tokens=NEW_TOKENS).token_ids == expected
    if name == "target":  # a working model continues code, it does not loop on a token or two
        assert len(set(expected)) > 4, f"degenerate output {expected}"


def test_shared_tokenizer_and_size_budget():
    target, draft = folder("target"), folder("draft")
    for name in ("tokenizer.json", "chat_template.jinja"):
        assert (target / name).read_bytes() == (draft / name).read_bytes()
    weights = sum(p.stat().st_size for f in (target, draft) for p in f.glob("*.safetensors"))
    assert weights <= WEIGHT_LIMIT, f"{weights / 1e6:.1f} MB of weights"


def test_ngram_speculation_accepts_drafts_on_the_edit_task(engines):
    old, new = prompts.BENCHMARK[0][1:]
    source = (prompts.HELDOUT_DIR / prompts.BENCHMARK[0][0]).read_text()
    plain = engines("target")
    prompt = prompts.edit_prompt(source, old, new, plain.tokenizer, 1024)
    assert len(prompt.token_ids) <= 1024
    reference = plain.generate(prompt.token_ids, max_new_tokens=64)
    spec = engines("target", proposer="ngram").generate(prompt.token_ids, max_new_tokens=64)
    assert spec.token_ids == reference.token_ids  # speculation keeps the greedy tokens
    assert spec.stats.tokens_per_step > 1, spec.stats
