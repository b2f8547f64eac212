"""Non-finite or unreadable weights are one CheckpointError at load, naming the file and the tensor:
NaN or inf anywhere, random bytes after an intact header, truncated files, headers that do not
match their data; through the API and the CLI (one ``error:`` line, no traceback)."""

from __future__ import annotations

import json
import math
import random
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from checkpoint_edits import cli, copies, fails, poke, shard_of
from tileinfer.errors import CheckpointError
from tileinfer.loading import CheckpointReader
from tileinfer.model_config import ModelConfig

CPU = torch.device("cpu")


@pytest.fixture
def copy_of(tmp_path, checkpoint_factory):
    return copies(tmp_path, checkpoint_factory)




@pytest.mark.parametrize("shard", [False, True], ids=["single", "sharded"])
@pytest.mark.parametrize("name,value,where", [
    ("model.layers.1.mlp.down_proj.weight", math.nan, 77),
    ("model.layers.0.self_attn.k_proj.weight", math.inf, 0),
    ("model.embed_tokens.weight", -math.inf, -1),
    ("model.layers.0.self_attn.q_norm.weight", math.nan, 3),
    ("model.norm.weight", math.nan, -1),
    ("lm_head.weight", math.inf, 1000),
])
def test_non_finite_weight(copy_of, shard, name, value, where):
    folder = copy_of(shard=shard)
    file = poke(folder, name, value, where)
    fails(folder, file, f"tensor {name} holds non-finite values (NaN or inf)")


def test_non_finite_weight_tied_and_bf16(copy_of):
    folder = copy_of(tie=True)
    fails(folder, poke(folder, "model.embed_tokens.weight", math.nan, 5), "tensor model.embed_tokens.weight")
    folder = copy_of()
    tensors = {k: v.to(torch.bfloat16) for k, v in load_file(folder / "model.safetensors").items()}
    tensors["model.layers.1.self_attn.o_proj.weight"][2, 3] = math.inf
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    fails(folder, "model.safetensors", "tensor model.layers.1.self_attn.o_proj.weight holds non-finite")


def overwrite_data(file: Path, seed: int, start: int = 0) -> None:
    """Random bytes over the data of ``file`` from byte ``start`` on, its header left intact."""
    raw = bytearray(file.read_bytes())
    begin = 8 + struct.unpack("<Q", raw[:8])[0] + start
    raw[begin:] = random.Random(seed).randbytes(len(raw) - begin)
    file.write_bytes(bytes(raw))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_bytes_after_an_intact_header(copy_of, seed):
    folder = copy_of()
    overwrite_data(folder / "model.safetensors", seed)
    fails(folder, "model.safetensors", "holds non-finite values (NaN or inf)", "tensor model.")


def test_random_bytes_in_one_shard(copy_of):
    folder = copy_of(shard=True)
    file = shard_of(folder, "model.layers.1.mlp.up_proj.weight")
    overwrite_data(file, 5)
    message = fails(folder, file.name, "holds non-finite values")
    name = message.split(": tensor ")[1].split()[0]
    assert shard_of(folder, name) == file  # the first tensor read from that shard


def test_overflow_when_cast_to_the_model_dtype(copy_of):
    """A float32 weight finite in the file but beyond float16's range: named, not loaded as inf."""
    folder = copy_of()
    poke(folder, "model.layers.0.mlp.gate_proj.weight", 1e6, 10)
    config = ModelConfig.from_folder(folder)
    reader = CheckpointReader(folder, config, CPU, torch.float16)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: tensor model\.layers\.0\.mlp\.gate_proj\.weight "
                                              r"overflows float16"):
        reader.tensor("model.layers.0.mlp.gate_proj.weight")
    assert torch.isfinite(reader.tensor("model.layers.0.mlp.up_proj.weight")).all()


def header_of(file: Path) -> tuple[dict, int]:
    raw = file.read_bytes()
    size = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + size]), 8 + size


@pytest.mark.parametrize("shard", [False, True], ids=["single", "sharded"])
def test_truncated_file_names_the_tensor(copy_of, shard):
    folder = copy_of(shard=shard)
    file = shard_of(folder, "model.norm.weight")
    header, begin = header_of(file)
    last = max((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][1])
    data = file.read_bytes()
    file.write_bytes(data[:len(data) - 10])
    fails(folder, file.name, "cannot read safetensors: truncated", f"tensor {last} needs bytes")


@pytest.mark.parametrize("cut", [0, 5, 8, 20])
def test_file_cut_inside_its_header(copy_of, cut):
    folder = copy_of()
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[:cut])
    fails(folder, "model.safetensors", "cannot read safetensors")


def test_header_that_does_not_match_its_data(copy_of):
    folder = copy_of()
    file = folder / "model.safetensors"
    header, begin = header_of(file)
    header["model.norm.weight"]["shape"] = [65]
    body = json.dumps(header).encode()
    file.write_bytes(struct.pack("<Q", len(body)) + body + file.read_bytes()[begin:])
    fails(folder, "model.safetensors", "cannot read safetensors", "tensor model.norm.weight")


def test_non_finite_weight_cli(copy_of, capsys):
    folder = copy_of()
    poke(folder, "model.layers.1.mlp.down_proj.weight", math.nan, 9)
    assert cli(folder, capsys) == (f"{folder / 'model.safetensors'}: tensor model.layers.1.mlp.down_proj.weight "
                                   "holds non-finite values (NaN or inf)")
    folder = copy_of(shard=True)
    file = shard_of(folder, "model.norm.weight")
    file.write_bytes(file.read_bytes()[:-4])
    assert cli(folder, capsys).startswith(f"{file}: cannot read safetensors: truncated: tensor ")
