"""Bad INT8 checkpoints: one CheckpointError line naming the file and the key or tensor, raised
while the engine is built, before any weight is read (the quantized tensors' names, dtypes and
shapes are checked from the safetensors headers) and so before any decoding."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import tileinfer
from tileinfer.cli import main
from tileinfer.errors import CheckpointError
from tileinfer.loading import CheckpointReader
from tileinfer.quantize import quantize_checkpoint

CKPT = dict(hidden=64, layers=2, vocab=300, intermediate=96, std=0.1, seed=6, tokenizer=False)
DOWN = "model.layers.1.mlp.down_proj"


@pytest.fixture(scope="module")
def quantized(checkpoint_factory, tmp_path_factory) -> Path:
    return quantize_checkpoint(checkpoint_factory(**CKPT), tmp_path_factory.mktemp("q") / "model")


@pytest.fixture
def copy(quantized, tmp_path) -> Path:
    target = tmp_path / "model"
    shutil.copytree(quantized, target)
    return target


def edit_config(folder: Path, change) -> None:
    raw = json.loads((folder / "config.json").read_text())
    change(raw["quantization_config"])
    (folder / "config.json").write_text(json.dumps(raw))


def edit_tensors(folder: Path, change) -> None:
    tensors = load_file(folder / "model.safetensors")
    change(tensors)
    save_file(tensors, folder / "model.safetensors")


def fails(folder: Path, file: str, *words: str, monkeypatch=None) -> str:
    """Building the engine raises one CheckpointError line starting with ``folder/file`` and holding
    ``words``, before any tensor of the checkpoint is read."""
    if monkeypatch is not None:
        def no_weights(self, name):
            raise AssertionError(f"weight {name} read before the checkpoint was checked")
        monkeypatch.setattr(CheckpointReader, "tensor", no_weights)
    with pytest.raises(CheckpointError) as info:
        tileinfer.Engine.from_config("reference", model=str(folder), device="cpu", dtype="float32", quantize="int8",
                                     kv_page_size=16, progress=False)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{folder / file}: "), message
    for word in words:
        assert word in message, message
    return message


CONFIG_CASES = {
    "gptq": (lambda qc: qc.update(quant_method="gptq"), ["quant_method", "gptq", "W8A16"]),
    "group": (lambda qc: qc["config_groups"]["group_0"]["weights"].update(strategy="group", group_size=128),
              ["group-wise scales", "group_size 128", "channel"]),
    "w8a8": (lambda qc: qc["config_groups"]["group_0"].update(input_activations={"num_bits": 8}),
             ["input_activations", "activation quantization"]),
    "4-bit": (lambda qc: qc["config_groups"]["group_0"]["weights"].update(num_bits=4), ["num_bits 4", "needs 8"]),
    "asymmetric": (lambda qc: qc["config_groups"]["group_0"]["weights"].update(symmetric=False), ["symmetric"]),
    "format": (lambda qc: (qc.update(format="marlin-24"), qc["config_groups"]["group_0"].pop("format")),
               ["format \"marlin-24\"", "pack-quantized"]),
    "sparse": (lambda qc: qc.update(sparsity_config={"format": "sparse-24-bitmask"}), ["sparsity_config"]),
    "frozen": (lambda qc: qc.update(quantization_status="frozen"), ["quantization_status"]),
    "no-groups": (lambda qc: qc.update(config_groups={}), ["config_groups"]),
}


@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_unsupported_quantization_config(copy, case):
    change, words = CONFIG_CASES[case]
    edit_config(copy, change)
    fails(copy, "config.json", "quantization_config", *words)


def test_quantization_config_not_an_object(copy):
    raw = json.loads((copy / "config.json").read_text())
    raw["quantization_config"] = "int8"
    (copy / "config.json").write_text(json.dumps(raw))
    fails(copy, "config.json", "quantization_config must be a JSON object")


def drop(tensors: dict, *parts: str) -> dict:
    for part in parts:
        del tensors[f"{DOWN}.{part}"]
    return tensors


TENSOR_CASES = {
    "scale-shape": (lambda t: t.update({f"{DOWN}.weight_scale": torch.ones(64, 2)}),
                    [f"tensor {DOWN}.weight_scale", "[64, 2]", "one scale per output channel"]),
    "scale-dtype": (lambda t: t.update({f"{DOWN}.weight_scale": torch.ones(64, 1, dtype=torch.int32)}),
                    [f"tensor {DOWN}.weight_scale", "I32"]),
    "no-scale": (lambda t: t.pop(f"{DOWN}.weight_scale"), [f"{DOWN} has no scales", f"{DOWN}.weight_scale is missing"]),
    "packed-shape": (lambda t: t.update({f"{DOWN}.weight_packed": torch.zeros(64, 23, dtype=torch.int32)}),
                     [f"tensor {DOWN}.weight_packed", "[64, 23]", "[64, 24]"]),
    "packed-dtype": (lambda t: t.update({f"{DOWN}.weight_packed": torch.zeros(64, 24, dtype=torch.int64)}),
                     [f"tensor {DOWN}.weight_packed", "I64"]),
    "shape-tensor": (lambda t: t.update({f"{DOWN}.weight_shape": torch.tensor([64, 95])}),
                     [f"tensor {DOWN}.weight_shape", "[64, 95]", "[64, 96]"]),
    "zero-point": (lambda t: t.update({f"{DOWN}.weight_zero_point": torch.zeros(64, 1, dtype=torch.int32)}),
                   [f"{DOWN}.weight_zero_point", "asymmetric"]),
    "scale-alone": (lambda t: drop(t, "weight_packed", "weight_shape").update({f"{DOWN}.weight": torch.zeros(64, 96)}),
                    [f"tensor {DOWN}.weight_scale has no int8 weight"]),
    "missing": (lambda t: drop(t, "weight_packed", "weight_scale"), [f"{DOWN}.weight is missing"]),
}


@pytest.mark.parametrize("case", list(TENSOR_CASES))
def test_bad_quantized_tensors(copy, case, monkeypatch):
    change, words = TENSOR_CASES[case]
    edit_tensors(copy, change)
    fails(copy, "model.safetensors" if case != "missing" else "", *words, monkeypatch=monkeypatch)


def test_quantized_tensors_without_quantization_config(copy, monkeypatch):
    raw = json.loads((copy / "config.json").read_text())
    del raw["quantization_config"]
    (copy / "config.json").write_text(json.dumps(raw))
    fails(copy, "model.safetensors", "is quantized, but config.json has no quantization_config",
          monkeypatch=monkeypatch)


def test_non_finite_scale_at_load(copy):
    def change(tensors):
        tensors[f"{DOWN}.weight_scale"][3, 0] = float("inf")
    edit_tensors(copy, change)
    fails(copy, "model.safetensors", f"tensor {DOWN}.weight_scale holds non-finite values")


def test_naive_int8_weights_load(copy, quantized):
    """naive-quantized: a plain int8 ``weight`` beside its scales, the same model."""
    from tileinfer.quantize import unpack_int8

    def change(tensors):
        packed = tensors.pop(f"{DOWN}.weight_packed")
        tensors[f"{DOWN}.weight"] = unpack_int8(packed, 96)
    edit_tensors(copy, change)
    kw = dict(device="cpu", dtype="float32", quantize="int8", kv_page_size=16, progress=False)
    naive = tileinfer.Engine.from_config("reference", model=str(copy), **kw)
    packed = tileinfer.Engine.from_config("reference", model=str(quantized), **kw)
    assert torch.equal(naive.model.layers[1].down.weight, packed.model.layers[1].down.weight)


def test_cli_one_line(copy, capsys):
    edit_config(copy, lambda qc: qc["config_groups"]["group_0"]["weights"].update(strategy="group", group_size=64))
    capsys.readouterr()
    code = main(["generate", "--model", str(copy), "--prompt-ids", "1,2", "--config", "reference", "device=cpu",
                 "quantize=int8"])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and err.startswith(f"error: {copy / 'config.json'}: "), err
    assert "group-wise scales" in err
