"""proposer=dflash: reading z-lab's config.json (block size in either place, the default layer
rule, the published Qwen3-8B drafter's shapes), and bad input as one-line errors before decoding:
a drafter that does not fit the target (hidden size, vocabulary, num_target_layers), a missing
mask token, target layer ids out of range, spec_k beyond the block, a missing folder or tensor."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file, save_file

from conftest import reference_engine
from tileinfer.cli import main
from tileinfer.errors import CheckpointError, ConfigError, TileinferError
from tileinfer.plugins.dflash_checkpoint import DFlashConfig, default_target_layer_ids

from dflash_checkpoints import TARGET, make_dflash

# config.json of z-lab/Qwen3-8B-DFlash-b16 as shared/notes/dflash.md section 2 gives it.
QWEN3_8B_DFLASH = {
    "architectures": ["DFlashDraftModel"], "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
    "model_type": "qwen3", "block_size": 16, "num_target_layers": 36,
    "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]},
    "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 5,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-6,
    "rope_theta": 1000000, "max_position_embeddings": 40960, "tie_word_embeddings": False,
}


def test_the_published_qwen3_8b_drafter_config():
    c = DFlashConfig.from_dict(QWEN3_8B_DFLASH)
    assert (c.block_size, c.num_target_layers, c.mask_token_id, c.target_layer_ids) == (16, 36, 151669,
                                                                                       (1, 9, 17, 25, 33))
    shapes = c.tensor_shapes()
    assert len(shapes) == 58 and shapes["fc.weight"] == (4096, 5 * 4096)
    assert shapes["layers.4.self_attn.k_proj.weight"] == (1024, 4096)
    assert not any(n.startswith("model.") or "embed" in n or "lm_head" in n for n in shapes)
    parameters = sum(s[0] * (s[1] if len(s) == 2 else 1) for s in shapes.values())
    assert 1.0e9 < parameters < 1.1e9  # about 1.05B, the notes' estimate


def test_the_default_layer_rule_and_the_block_inside_dflash_config():
    assert default_target_layer_ids(36, 5) == (1, 9, 17, 25, 33)
    assert default_target_layer_ids(7, 1) == (3,)
    assert default_target_layer_ids(7, 3) == (1, 2, 4)
    raw = {**QWEN3_8B_DFLASH, "dflash_config": {"mask_token_id": 7, "block_size": 10}}
    del raw["block_size"]
    c = DFlashConfig.from_dict(raw)
    assert c.block_size == 10 and c.target_layer_ids == (1, 9, 17, 25, 33)


@pytest.mark.parametrize("edit, match", [
    (lambda c: c["dflash_config"].pop("mask_token_id"), "mask_token_id is missing"),
    (lambda c: c["dflash_config"].update(mask_token_id=999), "mask_token_id 999 is outside the vocabulary"),
    (lambda c: c["dflash_config"].update(target_layer_ids=[1, 7]), "holds 7, outside the target's layers"),
    (lambda c: c["dflash_config"].update(target_layer_ids=[-1]), "holds -1"),
    (lambda c: c["dflash_config"].update(target_layer_ids=[]), "non-empty list"),
    (lambda c: c["dflash_config"].update(target_layer_ids=[1, 1]), "repeats a layer"),
    (lambda c: c.pop("block_size"), "missing key 'block_size'"),
    (lambda c: c.update(block_size=1), "block_size must be an integer >= 2"),
    (lambda c: c.pop("num_target_layers"), "missing key 'num_target_layers'"),
    (lambda c: c.update(architectures=["Qwen3ForCausalLM"]), "is not a DFlash drafter"),
    (lambda c: c["dflash_config"].update(causal=True), "causal=True is not supported"),
    (lambda c: c.update(head_dim=7), "head_dim 7 must be even"),
    (lambda c: c.update(quantization_config={"quant_method": "compressed-tensors"}),
     "quantized DFlash drafters are not supported"),
])
def test_bad_drafter_configs_are_one_line_errors(tmp_path, edit, match):
    folder = make_dflash(tmp_path / "d", config_edit=edit)
    with pytest.raises(CheckpointError, match=match) as err:
        DFlashConfig.from_folder(folder)
    assert "\n" not in str(err.value) and str(folder / "config.json") in str(err.value)


# -- against the target, before decoding ---------------------------------------------------------------


@pytest.fixture(scope="module")
def target(checkpoint_factory):
    return checkpoint_factory(**TARGET)


def engine(target, drafter, **kw):
    return reference_engine(target, proposer="dflash", options={"dflash": {"model": str(drafter)}}, **kw)


@pytest.mark.parametrize("kw, match", [
    (dict(hidden=64), "hidden_size 64, the target has hidden_size 96"),
    (dict(vocab=256, mask=3), "vocab_size 256, the target has vocab_size 320"),
    (dict(num_target_layers=6), "num_target_layers 6, the target has layers 7"),
])
def test_a_drafter_that_does_not_fit_the_target_is_an_error(target, tmp_path, kw, match):
    with pytest.raises(ConfigError, match=match) as err:
        engine(target, make_dflash(tmp_path / "d", **kw), spec_k=3)
    assert "\n" not in str(err.value)


def test_target_layer_ids_out_of_range_are_an_error(target, tmp_path):
    with pytest.raises(TileinferError, match="holds 8, outside the target's layers") as err:
        engine(target, make_dflash(tmp_path / "d", target_layer_ids=[1, 8], num_target_layers=7), spec_k=3)
    assert "\n" not in str(err.value)


def test_spec_k_beyond_the_block_is_an_error(target, tmp_path):
    drafter = make_dflash(tmp_path / "d", block=8)
    with pytest.raises(ConfigError, match=r"spec_k=8 is more than .* at most 7 tokens") as err:
        engine(target, drafter, spec_k=8)
    assert "\n" not in str(err.value)
    assert engine(target, drafter, spec_k=7).proposer.block_size == 8


def test_missing_folder_and_default_drafter(target, tmp_path):
    with pytest.raises(ConfigError, match="DFlash drafter folder not found"):
        engine(target, tmp_path / "nowhere", spec_k=3)
    with pytest.raises(ConfigError, match="needs options.dflash.model=DIR"):
        reference_engine(target, proposer="dflash", spec_k=3)


def test_missing_and_unexpected_tensors_are_errors(target, tmp_path):
    drafter = make_dflash(tmp_path / "d")
    tensors = load_file(drafter / "model.safetensors")
    save_file({k: v for k, v in tensors.items() if k != "layers.1.mlp.up_proj.weight"}, drafter / "model.safetensors")
    with pytest.raises(CheckpointError, match="tensor layers.1.mlp.up_proj.weight is missing"):
        engine(target, drafter, spec_k=3)
    save_file({**tensors, "embed_tokens.weight": tensors["fc.weight"][:, :96].contiguous()},
              drafter / "model.safetensors")
    with pytest.raises(CheckpointError, match="unexpected tensor embed_tokens.weight"):
        engine(target, drafter, spec_k=3)
    prefixed = {f"model.{k}": v for k, v in tensors.items()}
    save_file(prefixed, drafter / "model.safetensors")
    with pytest.raises(CheckpointError, match="is missing"):
        engine(target, drafter, spec_k=3)


def test_cli_errors_are_one_line(target, tmp_path, capsys):
    no_mask = make_dflash(tmp_path / "m", config_edit=lambda c: c["dflash_config"].pop("mask_token_id"))
    for argv, status in ((["config", f"model={target}", "proposer=dflash", "options.dflash.model=/no/such"], 2),
                         (["generate", "--model", str(target), "--prompt-ids", "5,6,7", "device=cpu", "proposer=dflash",
                           f"options.dflash.model={make_dflash(tmp_path / 'k')}", "spec_k=9"], 2),
                         (["generate", "--model", str(target), "--prompt-ids", "5,6,7", "device=cpu", "proposer=dflash",
                           f"options.dflash.model={no_mask}"], 2)):
        code = main(argv)
        out, err = capsys.readouterr()
        assert code == status and out == "", (argv, err)
        assert err.startswith("error: ") and err.count("\n") == 1 and err.count("error:") == 1, err


def test_a_shipped_style_config_round_trips(tmp_path):
    folder = make_dflash(tmp_path / "d", target_layer_ids=None, block_in_dflash_config=True)
    c = DFlashConfig.from_folder(folder)
    assert c.target_layer_ids == default_target_layer_ids(7, 2) == (1, 4)
    assert json.loads((folder / "config.json").read_text())["dflash_config"]["block_size"] == c.block_size == 8
