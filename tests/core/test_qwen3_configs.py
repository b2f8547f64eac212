"""config.json as Hugging Face publishes Qwen3 checkpoints, in the layouts of older transformers
(top-level ``rope_theta``, ``rope_scaling: null``, ``torch_dtype``) and newer transformers
(``rope_parameters``, ``dtype``, ``layer_types``): every key the loader reads is read, with
values that differ from every fallback, and rope_theta reaches the model (parity with transformers
at rope_theta 1e6, and different logits and tokens at 10000)."""

from __future__ import annotations

import copy
import json
import math
import shutil

import pytest
import torch

import tileinfer
from tileinfer.model_config import ModelConfig

# Qwen/Qwen3-0.6B and Qwen/Qwen3-4B config.json as published (transformers 4.51).
QWEN3_0_6B = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 1024,
    "initializer_range": 0.02,
    "intermediate_size": 3072,
    "max_position_embeddings": 40960,
    "max_window_layers": 28,
    "model_type": "qwen3",
    "num_attention_heads": 16,
    "num_hidden_layers": 28,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
QWEN3_4B = {
    **QWEN3_0_6B,
    "hidden_size": 2560,
    "intermediate_size": 9728,
    "max_window_layers": 36,
    "num_attention_heads": 32,
    "num_hidden_layers": 36,
    "num_key_value_heads": 8,
}
PUBLISHED = {"Qwen3-0.6B": QWEN3_0_6B, "Qwen3-4B": QWEN3_4B}


def newer_layout(old: dict) -> dict:
    """The same config as newer transformers (5.x) writes it: rope_parameters instead of
    rope_theta and rope_scaling, dtype instead of torch_dtype, layer_types, explicit nulls."""
    new = {k: v for k, v in old.items() if k not in ("rope_theta", "rope_scaling", "torch_dtype")}
    new.update(dtype=old["torch_dtype"], layer_types=["full_attention"] * old["num_hidden_layers"],
               pad_token_id=None, rope_parameters={"rope_theta": old["rope_theta"], "rope_type": "default"},
               transformers_version="5.0.0")
    return dict(sorted(new.items()))


def with_values(layout: dict, newer: bool, **values) -> dict:
    """``layout`` (older transformers) with ``values`` set, then written as ``newer`` asks."""
    raw = copy.deepcopy(layout)
    raw.update(values)
    return newer_layout(raw) if newer else raw


def expected(raw: dict) -> dict:
    """What ModelConfig must read from an older-layout ``raw``."""
    eos = raw["eos_token_id"]
    return dict(vocab_size=raw["vocab_size"], hidden_size=raw["hidden_size"],
                intermediate_size=raw["intermediate_size"], num_layers=raw["num_hidden_layers"],
                num_heads=raw["num_attention_heads"], num_kv_heads=raw["num_key_value_heads"],
                head_dim=raw["head_dim"], rms_norm_eps=raw["rms_norm_eps"], rope_theta=raw["rope_theta"],
                max_positions=raw["max_position_embeddings"], tie_word_embeddings=raw["tie_word_embeddings"],
                eos_token_ids=tuple(eos) if isinstance(eos, list) else (eos,), yarn=None)


@pytest.mark.parametrize("newer", [False, True], ids=["transformers4", "transformers5"])
@pytest.mark.parametrize("name", PUBLISHED)
def test_published_configs(name, newer):
    raw = with_values(PUBLISHED[name], newer)
    config = ModelConfig.from_dict(raw)
    assert config.__dict__ == expected(PUBLISHED[name])
    assert config.rope_theta == 1e6 and config.max_positions == 40960 and config.head_dim == 128


QWEN3_YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}  # Qwen3's model card


@pytest.mark.parametrize("newer", [False, True], ids=["transformers4", "transformers5"])
def test_the_model_cards_yarn_settings(newer):
    """rope_scaling as the Qwen3 card writes it (older layout; newer: rope_parameters, with "type"
    beside "rope_type" as transformers 5 saves it): YaRN at factor 4, a context of 131072."""
    raw = with_values(QWEN3_0_6B, False, rope_scaling=QWEN3_YARN)
    if newer:
        raw = newer_layout(raw)
        raw["rope_parameters"].update(QWEN3_YARN, type="yarn")
    config = ModelConfig.from_dict(raw)
    assert (config.yarn.factor, config.yarn.original_max_positions, config.yarn.beta_fast, config.yarn.beta_slow,
            config.yarn.truncate) == (4.0, 32768, 32.0, 1.0, True)
    assert config.yarn.attention_factor == pytest.approx(0.1 * math.log(4.0) + 1, rel=1e-15)
    assert config.max_positions == 131072 and config.rope_theta == 1e6


# Every key the loader reads, at a value no fallback gives: head_dim differs from hidden / heads,
# rope_theta and rms_norm_eps from the defaults 1e4 and 1e-6, max_position_embeddings from 32768.
NON_DEFAULT = [
    dict(rope_theta=1234567.0, rms_norm_eps=3e-6, head_dim=96, tie_word_embeddings=False, eos_token_id=151643,
         max_position_embeddings=40960, num_key_value_heads=4, vocab_size=151669, intermediate_size=3000,
         num_hidden_layers=7),
    dict(rope_theta=5000000, rms_norm_eps=1e-5, head_dim=80, tie_word_embeddings=True,
         eos_token_id=[151645, 151643], max_position_embeddings=262144, num_key_value_heads=2, vocab_size=152064,
         intermediate_size=11008, num_hidden_layers=3),
    dict(rope_theta=20000.5, rms_norm_eps=2.5e-7, head_dim=256, tie_word_embeddings=False, eos_token_id=[7],
         max_position_embeddings=131072, num_key_value_heads=16, vocab_size=1000, intermediate_size=64,
         num_hidden_layers=1),
]


@pytest.mark.parametrize("newer", [False, True], ids=["transformers4", "transformers5"])
@pytest.mark.parametrize("values", NON_DEFAULT, ids=["untied-eos-int", "tied-eos-list", "untied-eos-list1"])
@pytest.mark.parametrize("name", PUBLISHED)
def test_every_key_read(name, values, newer):
    raw = with_values(PUBLISHED[name], newer, **values)
    assert ModelConfig.from_dict(raw).__dict__ == expected(with_values(PUBLISHED[name], False, **values))


@pytest.mark.parametrize("newer", [False, True], ids=["transformers4", "transformers5"])
def test_from_folder_reads_config_and_generation_config(tmp_path, newer):
    raw = with_values(QWEN3_4B, newer, **NON_DEFAULT[0])
    (tmp_path / "config.json").write_text(json.dumps(raw, indent=2))
    config = ModelConfig.from_folder(tmp_path)
    assert config.__dict__ == expected(with_values(QWEN3_4B, False, **NON_DEFAULT[0]))
    # generation_config.json's eos_token_id (as Qwen3 publishes it) wins over config.json's
    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 151643, "do_sample": True, "eos_token_id": [151645, 151643], "pad_token_id": 151643,
         "temperature": 0.6, "top_k": 20, "top_p": 0.95, "transformers_version": "4.51.0"}))
    assert ModelConfig.from_folder(tmp_path).eos_token_ids == (151645, 151643)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 9}))
    assert ModelConfig.from_folder(tmp_path).eos_token_ids == (9,)
    (tmp_path / "generation_config.json").write_text(json.dumps({"do_sample": False}))
    assert ModelConfig.from_folder(tmp_path).eos_token_ids == (151643,)  # config.json's


def test_where_rope_theta_is_read():
    old = with_values(QWEN3_0_6B, False, rope_theta=2468.0)
    assert ModelConfig.from_dict(old).rope_theta == 2468.0
    new = with_values(QWEN3_0_6B, True, rope_theta=2468.0)
    assert "rope_theta" not in new and ModelConfig.from_dict(new).rope_theta == 2468.0
    # both (a config converted by hand): rope_parameters wins, as in transformers 5
    assert ModelConfig.from_dict({**new, "rope_theta": 10.0}).rope_theta == 2468.0
    # rope_parameters without rope_theta, or null: the top-level key
    assert ModelConfig.from_dict({**old, "rope_parameters": {"rope_type": "default"}}).rope_theta == 2468.0
    assert ModelConfig.from_dict({**old, "rope_parameters": None}).rope_theta == 2468.0
    # neither: transformers' default, 10000
    bare = {k: v for k, v in old.items() if k != "rope_theta"}
    assert ModelConfig.from_dict(bare).rope_theta == 10000.0


def test_defaults_of_optional_keys():
    """Keys a config.json may leave out take transformers' defaults (head_dim: hidden / heads)."""
    raw = {k: v for k, v in QWEN3_0_6B.items() if k not in (
        "head_dim", "num_key_value_heads", "rms_norm_eps", "rope_theta", "max_position_embeddings",
        "tie_word_embeddings", "eos_token_id")}
    config = ModelConfig.from_dict(raw)
    assert (config.head_dim, config.num_kv_heads, config.rms_norm_eps, config.rope_theta, config.max_positions,
            config.tie_word_embeddings, config.eos_token_ids) == (64, 16, 1e-6, 10000.0, 32768, False, ())


# ---- rope_theta reaches the model -----------------------------------------------------------------

NEW_TOKENS = 24
CHECKPOINT = dict(hidden=64, layers=2, vocab=320, intermediate=128, heads=4, kv_heads=2, head_dim=64, std=0.2,
                  tokenizer=False, seed=11, rope_theta=1e6)


def prompt() -> list[int]:
    return torch.randint(0, 320, (60,), generator=torch.Generator().manual_seed(7)).tolist()


def engine(folder):
    return tileinfer.Engine.from_config("reference", model=str(folder), device="cpu", dtype="float32",
                                        progress=False)


def prompt_logits(e) -> torch.Tensor:
    from tileinfer.interfaces import Step

    ids = prompt()
    e.kv.reset()
    with torch.inference_mode():
        step = Step.at(0, len(ids), torch.device("cpu"))
        e.kv.reserve(step.end)
        return e.model.forward(torch.tensor(ids), step, e.kv)[0]


@pytest.fixture(scope="module")
def theta_checkpoint(checkpoint_factory):
    """(folder saved by transformers with rope_theta 1e6, HF logits of the prompt, HF greedy tokens)."""
    from transformers import Qwen3ForCausalLM

    folder = checkpoint_factory(**CHECKPOINT)
    raw = json.loads((folder / "config.json").read_text())
    assert raw["rope_parameters"]["rope_theta"] == 1e6  # transformers 5 writes the newer layout
    hf = Qwen3ForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.tensor([prompt()])
    with torch.no_grad():
        logits = hf(ids).logits[0].float()
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NEW_TOKENS,
                          pad_token_id=0)
    return folder, logits, out[0, ids.shape[1]:].tolist()


def rewrite(folder, target, change) -> None:
    shutil.copytree(folder, target)
    raw = json.loads((target / "config.json").read_text())
    change(raw)
    (target / "config.json").write_text(json.dumps(raw, indent=2))


def test_rope_theta_reaches_the_model(theta_checkpoint, tmp_path):
    folder, hf_logits, hf_tokens = theta_checkpoint
    ours = engine(folder)
    assert ours.model_config.rope_theta == 1e6
    torch.testing.assert_close(prompt_logits(ours), hf_logits, atol=1e-4, rtol=1e-4)
    assert ours.generate(prompt(), max_new_tokens=NEW_TOKENS).token_ids == hf_tokens

    # the same weights in the older layout (top-level rope_theta, rope_scaling null): the same
    def older(raw):
        rope = raw.pop("rope_parameters")
        raw.update(rope_theta=rope["rope_theta"], rope_scaling=None, torch_dtype=raw.pop("dtype"))
        del raw["layer_types"]
    rewrite(folder, tmp_path / "older", older)
    again = engine(tmp_path / "older")
    torch.testing.assert_close(prompt_logits(again), hf_logits, atol=1e-4, rtol=1e-4)
    assert again.generate(prompt(), max_new_tokens=NEW_TOKENS).token_ids == hf_tokens

    # and at 10000 (the fallback) the same weights give other logits and other tokens
    rewrite(folder, tmp_path / "fallback", lambda raw: raw["rope_parameters"].update(rope_theta=10000.0))
    other = engine(tmp_path / "fallback")
    assert (prompt_logits(other) - hf_logits).abs().max() > 0.1
    assert other.generate(prompt(), max_new_tokens=NEW_TOKENS).token_ids != hf_tokens
