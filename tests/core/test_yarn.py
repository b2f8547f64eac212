"""YaRN RoPE scaling as Qwen3 documents it (``rope_scaling: {rope_type: yarn, factor,
original_max_position_embeddings}``), against transformers:

- the cos/sin tables equal transformers' rope init function's ``inv_freq`` and attention factor
  (cos/sin of ``position * inv_freq`` times the factor), bit for bit in float32, for the defaults,
  explicit beta_fast/beta_slow/attention_factor, ``truncate: false`` and mscale/mscale_all_dim;
- a checkpoint saved by transformers with YaRN: the reference path's logits of a 100-token prompt
  (positions past original_max_position_embeddings 32) match transformers' and its greedy tokens
  too; the Triton attention (interpreter) gives the reference's greedy tokens;
- other RoPE types are one-line errors naming the type and the supported ones.
"""

from __future__ import annotations

import json

import pytest
import torch

import tileinfer
from tileinfer.errors import CheckpointError
from tileinfer.interfaces import Step
from tileinfer.model_config import ModelConfig

RAW = dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], vocab_size=64, hidden_size=64, intermediate_size=64,
           num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=128,
           rope_theta=123456.0)
TABLE_CASES = {
    "qwen3-card": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    "older-type-key": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
    "betas-attention-no-truncate": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64,
                                    "beta_fast": 16, "beta_slow": 2, "attention_factor": 1.3, "truncate": False},
    "mscale": {"rope_type": "yarn", "factor": 2.5, "original_max_position_embeddings": 40, "mscale": 0.7,
               "mscale_all_dim": 0.3},
}


@pytest.mark.parametrize("scaling", TABLE_CASES.values(), ids=TABLE_CASES.keys())
def test_tables_equal_transformers_rope_init(scaling):
    from transformers import Qwen3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    raw = {**RAW, "rope_scaling": scaling}
    inv_freq, attention = ROPE_INIT_FUNCTIONS["yarn"](Qwen3Config.from_dict(json.loads(json.dumps(raw))), "cpu")
    config = ModelConfig.from_dict(raw)
    assert config.yarn.attention_factor == attention
    assert config.max_positions == max(128, int(scaling["factor"] * scaling["original_max_position_embeddings"]))
    table = config.rope_table(300, torch.device("cpu"))
    angles = torch.arange(300).float()[:, None] * inv_freq[None, :]
    assert torch.equal(table.cos, angles.cos() * attention) and torch.equal(table.sin, angles.sin() * attention)


@pytest.mark.parametrize("rope_type", ["linear", "dynamic", "longrope", "llama3"])
@pytest.mark.parametrize("section,field", [("rope_scaling", "type"), ("rope_parameters", "rope_type")])
def test_other_rope_types_are_refused(rope_type, section, field):
    raw = {**RAW, section: {field: rope_type, "factor": 2.0}}
    with pytest.raises(CheckpointError) as err:
        ModelConfig.from_dict(raw)
    assert str(err.value) == (f"config.json: {section}: rope type {rope_type!r} is not supported "
                              "(supported: default, yarn)")


@pytest.mark.parametrize("change,message", [
    ({"factor": 0.5}, "rope_scaling.factor must be a finite number >= 1, got 0.5"),
    ({"original_max_position_embeddings": "32"}, "original_max_position_embeddings must be a positive integer"),
    ({"truncate": 1}, "rope_scaling.truncate must be true or false, got 1"),
    ({"beta_fast": -1}, "rope_scaling.beta_fast must be a finite number >= 0, got -1"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor 0.5 is not supported (only 1)"),
])
def test_bad_yarn_values_are_one_line_errors(change, message):
    scaling = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, **change}
    raw = {**RAW, "rope_scaling": scaling}
    with pytest.raises(CheckpointError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ModelConfig.from_dict(raw)


# ---- a checkpoint saved by transformers ------------------------------------------------------------

CHECKPOINTS = {
    "defaults": dict(rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}),
    "explicit": dict(rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
                                   "beta_fast": 8.0, "beta_slow": 2.0, "attention_factor": 1.25}),
}
COMMON = dict(hidden=64, layers=2, vocab=320, intermediate=128, heads=4, kv_heads=2, head_dim=32, std=0.2,
              tokenizer=False, seed=5, rope_theta=50000.0, max_positions=128)
PROMPT = torch.randint(0, 320, (100,), generator=torch.Generator().manual_seed(3)).tolist()
NEW_TOKENS = 8


def engine(folder, *sources, **keys) -> tileinfer.Engine:
    return tileinfer.Engine.from_config("eager", *(sources or ("reference",)), model=str(folder), device="cpu",
                                        dtype="float32", kv_page_size=16, progress=False, **keys)


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_logits_match_transformers(checkpoint_factory, name):
    from transformers import Qwen3ForCausalLM

    folder = checkpoint_factory(**COMMON, **CHECKPOINTS[name])
    rope = json.loads((folder / "config.json").read_text())["rope_parameters"]
    assert rope["rope_type"] == "yarn" and rope["rope_theta"] == 50000.0 and rope["factor"] == 4.0
    hf = Qwen3ForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        expected = hf(ids).logits[0].float()
        hf_tokens = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NEW_TOKENS,
                                pad_token_id=0)[0, len(PROMPT):].tolist()
    ours = engine(folder)
    assert ours.model_config.yarn is not None and ours.model_config.max_positions == 128
    ours.kv.reset()
    with torch.inference_mode():
        step = Step.at(0, len(PROMPT), torch.device("cpu"))
        ours.kv.reserve(step.end)
        logits = ours.model.forward(torch.tensor(PROMPT), step, ours.kv)[0]
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)
    assert ours.generate(PROMPT, max_new_tokens=NEW_TOKENS).token_ids == hf_tokens


def test_triton_attention_reads_the_yarn_tables(checkpoint_factory):
    """A short run past original_max_position_embeddings: the Triton attention (interpreter) gives
    the reference's greedy tokens."""
    folder = checkpoint_factory(**COMMON, **CHECKPOINTS["explicit"])
    prompt = PROMPT[:40]
    expected = engine(folder).generate(prompt, max_new_tokens=4).token_ids
    got = engine(folder, {"attention": "triton", "linear": "reference"}).generate(prompt, max_new_tokens=4)
    assert got.token_ids == expected
