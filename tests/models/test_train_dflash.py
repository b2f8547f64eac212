"""models/train_dflash.py end to end on a CPU in seconds: a few steps on a tiny random target and a
synthetic token stream write a z-lab-format drafter that tileinfer loads with proposer=dflash;
the training forward equals tileinfer's drafter on the same weights (what is trained is what runs);
greedy speculation with it keeps plain greedy's tokens; the loss weights are exp(-(k-1)/gamma), the
block mask and the labels are the recipe's, and a drafter learns to copy a repeating stream."""

from __future__ import annotations

import argparse
import json
import math

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from conftest import reference_engine
from tileinfer.models import train_dflash

BLOCK, LAYERS, IDS = 8, 2, [1, 2]


@pytest.fixture(scope="module")
def trained(checkpoint_factory, tmp_path_factory):
    target = checkpoint_factory(layers=4, max_positions=256)
    folder = tmp_path_factory.mktemp("train_dflash")
    data = folder / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    base = rng.integers(3, 320, 50)  # a repeating stream: the target's tokens are easy to predict
    for name, n in (("train.bin", 20000), ("heldout.bin", 4000)):
        np.tile(base, n // 50).astype(np.uint16).tofile(data / name)
    result = train_dflash.main(["--target", str(target), "--data", str(data), "--out", str(folder / "out"),
                                "--steps", "20", "--seq-len", "64", "--batch", "4", "--anchors", "4",
                                "--block-size", str(BLOCK), "--layers", str(LAYERS), "--target-layer-ids",
                                ",".join(map(str, IDS)), "--threads", "1", "--log-every", "10", "--eval-batches", "2"])
    return target, folder / "out", result


def test_writes_the_z_lab_format(trained):
    _, out, result = trained
    config = json.loads((out / "dflash" / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["model_type"] == "qwen3"
    assert config["block_size"] == BLOCK and config["num_target_layers"] == 4
    assert config["dflash_config"] == {"mask_token_id": result["mask_token_id"], "target_layer_ids": IDS}
    assert config["num_hidden_layers"] == LAYERS and config["hidden_size"] == 64
    tensors = load_file(out / "dflash" / "model.safetensors")
    assert not any(k.startswith("model.") or "embed" in k or "lm_head" in k for k in tensors)
    assert tensors["fc.weight"].shape == (64, len(IDS) * 64) and tensors["fc.weight"].dtype == torch.bfloat16
    assert len(tensors) == 11 * LAYERS + 3
    assert result["steps"] == 20 and 1 <= result["heldout"]["tokens_per_step"] <= BLOCK
    history = json.loads((out / "dflash_history.json").read_text())
    assert history["step"][0] == 1 and all(math.isfinite(x) for x in history["loss"])


def test_loss_weights_decay_from_the_first_position():
    w = train_dflash.loss_weights(16, 7.0, "cpu")
    assert w.shape == (15,) and torch.isclose(w.sum(), torch.tensor(1.0))
    torch.testing.assert_close(w[1:] / w[:-1], torch.full((14,), math.exp(-1 / 7)))


def test_the_block_mask_sees_earlier_context_and_its_own_block():
    mask = train_dflash.block_mask(torch.tensor([[3, 1]]), 6, 2)  # 2 blocks of 2 after 6 context positions
    assert mask.shape == (1, 4, 10)
    assert mask[0, :2, :6].tolist() == [[True] * 3 + [False] * 3] * 2
    assert mask[0, 2:, :6].tolist() == [[True] + [False] * 5] * 2
    assert mask[0, :, 6:].tolist() == [[True, True, False, False]] * 2 + [[False, False, True, True]] * 2


def test_the_training_forward_is_tileinfers_drafter(trained):
    """The same context and block through the training module (weights as saved, BF16 -> float32)
    and through tileinfer's drafter: the same logits."""
    target, out, result = trained
    e = reference_engine(target, proposer="dflash", spec_k=BLOCK - 1,
                         options={"dflash": {"model": str(out / "dflash")}})
    teacher = train_dflash.Teacher(target, torch.device("cpu"), IDS)
    drafter = train_dflash.Drafter(teacher.config, LAYERS, len(IDS))
    drafter.load_state_dict({k: v.float() for k, v in load_file(out / "dflash" / "model.safetensors").items()})
    x = torch.randint(3, 320, (1, 40), generator=torch.Generator().manual_seed(0))
    anchor = 29
    args = argparse.Namespace(block_size=BLOCK, labels="target")
    with torch.no_grad():
        want, _ = train_dflash.block_outputs(drafter, teacher, x, torch.tensor([[anchor]]), args,
                                             result["mask_token_id"])
    from tileinfer.interfaces import Step

    with torch.inference_mode():
        e.kv.reset()
        e.kv.reserve(anchor)
        _, hidden = e.model.forward(x[0, :anchor], Step.at(0, anchor, e.device), e.kv, capture=IDS)
        kv = e.proposer.kv
        kv.reset()
        block = torch.tensor([int(x[0, anchor])] + [result["mask_token_id"]] * (BLOCK - 1))
        got = e.proposer.model.forward(e.proposer.model.project(hidden), block, 0, kv)
    torch.testing.assert_close(got, want[0, 0].float(), atol=1e-4, rtol=1e-4)


def test_greedy_speculation_with_the_trained_drafter_keeps_the_greedy_tokens(trained):
    target, out, _ = trained
    prompt = list(range(10, 40)) * 2
    plain = reference_engine(target).generate(prompt, max_new_tokens=40)
    e = reference_engine(target, proposer="dflash", spec_k=BLOCK - 1,
                         options={"dflash": {"model": str(out / "dflash")}})
    got = e.generate(prompt, max_new_tokens=40)
    assert got.token_ids == plain.token_ids and got.stats.drafted_tokens > 0


def test_labels_are_the_targets_greedy_tokens_or_the_streams(trained):
    """Block position k of the block anchored at a: the target's argmax after a+k-1, or x[a+k]."""
    target, out, result = trained
    teacher = train_dflash.Teacher(target, torch.device("cpu"), IDS)
    drafter = train_dflash.Drafter(teacher.config, LAYERS, len(IDS))
    x = torch.randint(3, 320, (2, 40), generator=torch.Generator().manual_seed(1))
    anchors = torch.tensor([[5, 20], [1, 32]])
    with torch.no_grad():
        greedy = teacher.model(input_ids=x).logits.argmax(-1)
        for labels, want in (("target", lambda b, a, k: greedy[b, a + k - 1]), ("data", lambda b, a, k: x[b, a + k])):
            args = argparse.Namespace(block_size=BLOCK, labels=labels)
            logits, got = train_dflash.block_outputs(drafter, teacher, x, anchors, args, result["mask_token_id"])
            assert logits.shape == (2, 2, BLOCK - 1, 320)
            for b in range(2):
                for i in range(2):
                    a = int(anchors[b, i])
                    assert got[b, i].tolist() == [int(want(b, a, k)) for k in range(1, BLOCK)]


def test_a_drafter_learns_to_copy_a_repeating_stream(trained, tmp_path):
    """Trained toward the stream's own tokens (--labels data) on a stream of period 50, the drafter
    predicts most block positions after a few seconds of training (untrained: about 1 / 320)."""
    target, out, _ = trained
    data = out.parent / "data"
    result = train_dflash.main(["--target", str(target), "--data", str(data), "--out", str(tmp_path), "--steps", "200",
                                "--seq-len", "64", "--batch", "4", "--anchors", "4", "--block-size", str(BLOCK),
                                "--layers", str(LAYERS), "--target-layer-ids", ",".join(map(str, IDS)),
                                "--threads", "1",
                                "--log-every", "60", "--eval-batches", "2", "--lr", "3e-3", "--labels", "data"])
    assert result["heldout"]["tokens_per_step"] > 2, result["heldout"]
    assert min(result["heldout"]["position_accuracy"]) > 0.3, result["heldout"]
