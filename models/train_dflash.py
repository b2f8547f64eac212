"""Train a DFlash block drafter for the shipped target and write it in z-lab's format (models/dflash/).

    python3 -m tileinfer.models.train_dflash --out "$OUT"                 # on the GPU machine: ~5 min, builds its data
    python -m tileinfer.models.train_dflash --data DATA --out OUT --steps 5 --seq-len 64 --batch 2   # a CPU smoke run

The target (``--target``, default models/target) is frozen, with its embedding and lm_head, which
the drafter shares (DFlash drafters carry neither). The drafter (shared/notes/dflash.md section 1):
``--layers`` Qwen3 decoder layers of the target's layer shape (heads, KV heads, head_dim, SwiGLU
width), ``fc`` + ``hidden_norm`` projecting the target's layers ``--target-layer-ids`` (their
outputs, before the final norm) into context keys/values of every layer, a final ``norm``; its
layers start as copies of the target's last ones (``--init target``).

Training: sequences of ``--seq-len`` tokens of the token stream; per sequence ``--anchors`` random
anchor positions ``a`` (1 <= a <= seq_len - B), each a block ``[x_a, MASK x (B-1)]`` at positions
``a .. a+B-1`` that sees the context of positions ``< a`` and its own block (all blocks of a
sequence in one masked attention); block position ``k`` (1..B-1) is trained with cross-entropy
toward the target's greedy token there (``--labels target``; ``data``: the stream's token),
weighted ``exp(-(k-1)/gamma)``. AdamW, warmup then cosine decay over the time budget. The mask
token is the stream's rarest ordinary token (the target has no spare row).

Without ``--data`` it builds its token stream as models/make_all.py does, but encoded with the
target's own tokenizer: models/corpus.py over this machine's Python files, then models/data.py
(``--max-train-mb``) into ``--work``. Writes into ``--out``: ``dflash/config.json`` and
``dflash/model.safetensors`` (BF16), ``dflash_eval.json`` (held-out per-position agreement with
the target and the expected tokens per step under teacher forcing), ``dflash_history.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

HERE = Path(__file__).resolve().parent


class RMSNorm(nn.Module):
    def __init__(self, n: int, eps: float) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(n)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # Hugging Face Qwen3's arithmetic
        dtype = x.dtype
        x = x.float()
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)).to(dtype)


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate-half RoPE of ``x`` ``[b, T, heads, d]`` at ``positions`` ``[b, T]``."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    angles = positions.float()[..., None] * inv
    cos, sin = torch.cat([angles.cos()] * 2, -1)[:, :, None], torch.cat([angles.sin()] * 2, -1)[:, :, None]
    half = torch.cat([-x[..., d // 2:], x[..., :d // 2]], -1)
    return (x.float() * cos + half.float() * sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, h: int, heads: int, kv_heads: int, d: int, eps: float) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.d = heads, kv_heads, d
        self.q_proj, self.o_proj = nn.Linear(h, heads * d, bias=False), nn.Linear(heads * d, h, bias=False)
        self.k_proj, self.v_proj = nn.Linear(h, kv_heads * d, bias=False), nn.Linear(h, kv_heads * d, bias=False)
        self.q_norm, self.k_norm = RMSNorm(d, eps), RMSNorm(d, eps)


class MLP(nn.Module):
    def __init__(self, h: int, i: int) -> None:
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(h, i, bias=False), nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)


class Layer(nn.Module):
    def __init__(self, h: int, heads: int, kv_heads: int, d: int, i: int, eps: float) -> None:
        super().__init__()
        self.self_attn, self.mlp = Attention(h, heads, kv_heads, d, eps), MLP(h, i)
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(h, eps), RMSNorm(h, eps)


class Drafter(nn.Module):
    """The DFlash drafter; its state_dict names are z-lab's checkpoint names."""

    def __init__(self, target_config, layers: int, num_features: int) -> None:
        super().__init__()
        c = target_config
        self.theta = c.rope_parameters["rope_theta"] if getattr(c, "rope_parameters", None) else c.rope_theta
        h, eps = c.hidden_size, c.rms_norm_eps
        self.layers = nn.ModuleList(Layer(h, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                                          c.intermediate_size, eps) for _ in range(layers))
        self.fc = nn.Linear(num_features * h, h, bias=False)
        self.hidden_norm, self.norm = RMSNorm(h, eps), RMSNorm(h, eps)

    def forward(self, features: torch.Tensor, block: torch.Tensor, block_positions: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        """``features`` ``[b, L, K*H]`` (context at positions 0..L-1), ``block`` ``[b, Q, H]``
        embedded block tokens at ``block_positions`` ``[b, Q]``, ``mask`` ``[b, Q, L + Q]`` (True:
        visible). Returns the normed hidden states ``[b, Q, H]``."""
        b, length = features.shape[:2]
        q_len = block.shape[1]
        c = self.hidden_norm(self.fc(features))
        ctx_positions = torch.arange(length, device=c.device).expand(b, length)
        h = block
        for layer in self.layers:
            a = layer.self_attn
            x = layer.input_layernorm(h)
            q = rope(a.q_norm(a.q_proj(x).view(b, q_len, a.heads, a.d)), block_positions, self.theta)
            k_ctx = rope(a.k_norm(a.k_proj(c).view(b, length, a.kv_heads, a.d)), ctx_positions, self.theta)
            k_blk = rope(a.k_norm(a.k_proj(x).view(b, q_len, a.kv_heads, a.d)), block_positions, self.theta)
            v = torch.cat([a.v_proj(c), a.v_proj(x)], 1).view(b, length + q_len, a.kv_heads, a.d)
            k = torch.cat([k_ctx, k_blk], 1)
            group = a.heads // a.kv_heads
            k, v = k.repeat_interleave(group, 2), v.repeat_interleave(group, 2)
            dtype = v.dtype  # under autocast the norms' outputs are float32, the projections' bfloat16
            out = F.scaled_dot_product_attention(q.to(dtype).transpose(1, 2), k.to(dtype).transpose(1, 2),
                                                 v.transpose(1, 2), attn_mask=mask[:, None])
            h = h + a.o_proj(out.transpose(1, 2).reshape(b, q_len, a.heads * a.d))
            x = layer.post_attention_layernorm(h)
            h = h + layer.mlp.down_proj(F.silu(layer.mlp.gate_proj(x)) * layer.mlp.up_proj(x))
        return self.norm(h)


def block_mask(anchors: torch.Tensor, length: int, block: int) -> torch.Tensor:
    """``[b, n*B, L + n*B]``: block ``i``'s queries see context positions ``< anchors[:, i]`` and the
    ``B`` keys of their own block."""
    b, n = anchors.shape
    owner = torch.arange(n * block, device=anchors.device) // block  # block of each query / block key
    ctx = torch.arange(length, device=anchors.device)[None, None] < anchors.repeat_interleave(block, 1)[..., None]
    own = (owner[:, None] == owner[None, :]).expand(b, -1, -1)
    return torch.cat([ctx, own], -1)


class Teacher:
    """The frozen target: token embeddings, the chosen layers' outputs (before the final norm, by
    forward hooks) and its greedy next token at every position."""

    def __init__(self, folder: Path, device: torch.device, layer_ids: list[int]) -> None:
        from transformers import Qwen3ForCausalLM

        self.model = Qwen3ForCausalLM.from_pretrained(folder, dtype=torch.float32).to(device).eval()
        self.model.requires_grad_(False)
        self.config, self.layer_ids, self._seen = self.model.config, layer_ids, {}
        for i in layer_ids:
            self.model.model.layers[i].register_forward_hook(self._hook(i))

    def _hook(self, i: int):
        def keep(module, args, output):
            self._seen[i] = output[0] if isinstance(output, tuple) else output
        return keep

    @torch.no_grad()
    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.model(input_ids=x, use_cache=False).logits
        features = torch.cat([self._seen[i] for i in self.layer_ids], -1)
        return features, logits.argmax(-1)


def loss_weights(block: int, gamma: float, device) -> torch.Tensor:
    """``exp(-(k - 1) / gamma)`` for block positions k = 1..B-1, summing to 1."""
    w = torch.exp(-torch.arange(block - 1, device=device, dtype=torch.float32) / gamma)
    return w / w.sum()


def block_outputs(drafter, teacher, x, anchors, args, mask_id):
    """Logits ``[b, n, B-1, V]`` of the blocks anchored at ``anchors`` and their labels ``[b, n, B-1]``."""
    block = args.block_size
    features, greedy = teacher(x)
    b, n = anchors.shape
    offsets = torch.arange(block, device=x.device)
    positions = (anchors[..., None] + offsets).reshape(b, n * block)
    ids = torch.full((b, n, block), mask_id, device=x.device, dtype=torch.int64)
    ids[..., 0] = x.gather(1, anchors)
    embed = teacher.model.model.embed_tokens.weight
    h = drafter(features.to(embed.dtype), F.embedding(ids.reshape(b, -1), embed), positions,
                block_mask(anchors, x.shape[1], block))
    logits = teacher.model.lm_head(h.view(b, n, block, -1)[:, :, 1:])
    source = greedy if args.labels == "target" else x
    shift = 1 if args.labels == "target" else 0  # the target's token at a+k is its argmax after a+k-1
    labels = source.gather(1, (anchors[..., None] + offsets[1:] - shift).reshape(b, -1)).view(b, n, block - 1)
    return logits, labels


def stream(path: Path, device) -> torch.Tensor:
    return torch.from_numpy(np.fromfile(path, dtype=np.uint16).astype(np.int64)).to(device)


def batch_of(tokens: torch.Tensor, b: int, length: int, g: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, tokens.numel() - length, (b,), generator=g)
    return tokens[(starts[:, None] + torch.arange(length)).to(tokens.device)]


def anchors_of(b: int, n: int, length: int, block: int, g: torch.Generator, device) -> torch.Tensor:
    return torch.randint(1, length - block + 1, (b, n), generator=g).to(device)


@torch.no_grad()
def evaluate(drafter, teacher, tokens, args, mask_id, device) -> dict:
    """Held-out: per-position agreement of the drafter's argmax with the labels, and the tokens a
    step would commit (1 + the leading agreements) under teacher forcing."""
    g = torch.Generator().manual_seed(1234)
    hits, lead, count = torch.zeros(args.block_size - 1, device=device), 0.0, 0
    for _ in range(args.eval_batches):
        x = batch_of(tokens, args.batch, args.seq_len, g)
        with autocast(device):
            logits, labels = block_outputs(drafter, teacher, x, anchors_of(args.batch, args.anchors, args.seq_len,
                                                                            args.block_size, g, device), args, mask_id)
        right = (logits.argmax(-1) == labels).float()  # [b, n, B-1]
        hits += right.sum((0, 1))
        lead += float(right.cumprod(-1).sum())
        count += right.shape[0] * right.shape[1]
    accuracy = (hits / count).tolist()
    return {"position_accuracy": [round(a, 4) for a in accuracy], "tokens_per_step": round(1 + lead / count, 3),
            "blocks": count}


def autocast(device: torch.device):
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")


def build_data(args) -> Path:
    """corpus.py over this machine's files, then data.py with the target's tokenizer."""
    from . import corpus, data

    work = args.work
    corpus.main([str(work / "corpus")] + (["--max-files", str(args.max_files)] if args.max_files else []))
    data.main([str(work / "corpus"), str(args.target), str(work / "data"), "--max-train-mb", str(args.max_train_mb)])
    return work / "data"


def save(drafter: Drafter, target_config, args, mask_id: int, folder: Path) -> int:
    from safetensors.torch import save_file
    from transformers import Qwen3Config

    c = target_config
    folder.mkdir(parents=True, exist_ok=True)
    config = Qwen3Config(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                         num_hidden_layers=args.layers, num_attention_heads=c.num_attention_heads,
                         num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim,
                         max_position_embeddings=c.max_position_embeddings, rms_norm_eps=c.rms_norm_eps,
                         rope_parameters={"rope_type": "default", "rope_theta": drafter.theta},
                         tie_word_embeddings=False).to_dict()
    config.update(architectures=["DFlashDraftModel"], dtype="bfloat16", block_size=args.block_size,
                  num_target_layers=c.num_hidden_layers,
                  dflash_config={"mask_token_id": mask_id, "target_layer_ids": list(args.target_layer_ids)})
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tensors = {k: v.detach().to(torch.bfloat16).cpu().contiguous() for k, v in drafter.state_dict().items()}
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return sum(v.numel() for v in tensors.values())


def train(args) -> dict:
    start = time.perf_counter()
    device = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    data_dir = args.data or build_data(args)
    prepared = time.perf_counter() - start
    from transformers import AutoConfig

    target_config = AutoConfig.from_pretrained(args.target)
    n_target = target_config.num_hidden_layers
    if args.target_layer_ids is None:  # z-lab's rule, as plugins/dflash_checkpoint.py applies it
        span = n_target - 4
        args.target_layer_ids = [n_target // 2] if args.layers == 1 else [
            int(round(1 + i * span / (args.layers - 1))) for i in range(args.layers)]
    teacher = Teacher(args.target, device, args.target_layer_ids)
    train_tokens, heldout_tokens = stream(data_dir / "train.bin", device), stream(data_dir / "heldout.bin", device)
    counts = torch.bincount(train_tokens, minlength=target_config.vocab_size)
    counts[:3] = counts.max() + 1  # never a special token
    mask_id = int(counts.argmin())
    drafter = Drafter(target_config, args.layers, len(args.target_layer_ids)).to(device)
    if args.init == "target":  # the last target layers' weights as a warm start
        own = drafter.state_dict()
        for i in range(args.layers):
            src = max(0, n_target - args.layers + i)
            for name, value in teacher.model.model.layers[src].state_dict().items():
                if f"layers.{i}.{name}" in own:
                    own[f"layers.{i}.{name}"].copy_(value)
        drafter.norm.weight.data.copy_(teacher.model.model.norm.weight)
    weights = loss_weights(args.block_size, args.gamma, device)
    decay = [p for p in drafter.parameters() if p.dim() >= 2]
    rest = [p for p in drafter.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                                  lr=args.lr, betas=(0.9, 0.95))
    budget = args.minutes * 60 - args.reserve_s if args.minutes else None
    g = torch.Generator().manual_seed(args.seed)
    history, step = {"step": [], "loss": [], "seconds": []}, 0
    parameters = sum(p.numel() for p in drafter.parameters())
    print(f"drafter: {args.layers} layers, {parameters / 1e6:.2f}M parameters, block {args.block_size}, target layers "
          f"{args.target_layer_ids}, mask token {mask_id}; {device}; data ready after {prepared:.0f} s", flush=True)
    while True:
        elapsed = time.perf_counter() - start
        progress = step / args.steps if args.steps else (elapsed - prepared) / max(budget - prepared, 1e-9)
        if progress >= 1:
            break
        warm = min(1.0, (step + 1) / args.warmup)
        lr = args.lr * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))
        for group in optimizer.param_groups:
            group["lr"] = lr
        x = batch_of(train_tokens, args.batch, args.seq_len, g)
        with autocast(device):
            logits, labels = block_outputs(drafter, teacher, x, anchors_of(args.batch, args.anchors, args.seq_len,
                                                                            args.block_size, g, device), args, mask_id)
        ce = F.cross_entropy(logits.float().flatten(0, 2), labels.flatten(), reduction="none").view(labels.shape)
        loss = (ce * weights).sum(-1).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        if step % args.log_every == 0 or step == 1:
            history["step"].append(step)
            history["loss"].append(round(float(loss.detach()), 4))
            history["seconds"].append(round(time.perf_counter() - start, 1))
            print(f"step {step}: loss {history['loss'][-1]:.4f}, lr {lr:.2e}, {history['seconds'][-1]:.0f} s",
                  flush=True)
    train_s = time.perf_counter() - start - prepared
    drafter.eval()
    result = {"steps": step, "train_seconds": round(train_s, 1), "prepare_seconds": round(prepared, 1),
              "parameters": parameters, "mask_token_id": mask_id, "target_layer_ids": args.target_layer_ids,
              "block_size": args.block_size, "layers": args.layers, "gamma": args.gamma, "labels": args.labels,
              "batch": args.batch, "seq_len": args.seq_len, "anchors": args.anchors, "lr": args.lr,
              "device": str(device), "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None,
              "torch": torch.__version__, "heldout": evaluate(drafter, teacher, heldout_tokens, args, mask_id, device)}
    result["bf16_bytes"] = 2 * save(drafter, target_config, args, mask_id, args.out / "dflash")
    (args.out / "dflash_eval.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "dflash_history.json").write_text(json.dumps(history) + "\n")
    print(f"held-out: {result['heldout']['tokens_per_step']} tokens per step (teacher-forced), position accuracy "
          f"{result['heldout']['position_accuracy'][:4]}...; {step} steps in {train_s:.0f} s -> {args.out / 'dflash'}",
          flush=True)
    return result


def parse(argv: list[str] | None = None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", type=Path, default=HERE / "target", help="the frozen target (default: models/target)")
    p.add_argument("--data", type=Path, help="folder of models/data.py (train.bin, heldout.bin) encoded with the "
                   "target's tokenizer (default: build it in --work)")
    p.add_argument("--work", type=Path, default=HERE.parent / "build" / "dflash-work")
    p.add_argument("--out", type=Path, required=True, help="gets dflash/, dflash_eval.json, dflash_history.json")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--minutes", type=float, default=5.0, help="budget of the whole run, data included")
    length.add_argument("--steps", type=int, help="a fixed number of steps instead (tests)")
    p.add_argument("--reserve-s", type=float, default=20.0, help="with --minutes: kept for evaluation and saving")
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--target-layer-ids", default="1,3,5",
                   help="comma-separated target layers read by the drafter; 'default': z-lab's rule")
    p.add_argument("--init", choices=("target", "random"), default="target")
    p.add_argument("--labels", choices=("target", "data"), default="target")
    p.add_argument("--gamma", type=float, default=7.0, help="loss weight exp(-(k-1)/gamma) of block position k")
    p.add_argument("--seq-len", type=int, default=2048, help="the target's context: drafts run at its positions")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--anchors", type=int, default=64, help="blocks per sequence")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--max-train-mb", type=float, default=96)
    p.add_argument("--max-files", type=int, default=None, help="corpus.py --max-files (tests)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--threads", type=int)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    try:
        args.target_layer_ids = None if args.target_layer_ids == "default" else [
            int(v) for v in args.target_layer_ids.split(",")]
    except ValueError:
        p.error(f"--target-layer-ids {args.target_layer_ids}: expected comma-separated integers or 'default'")
    if args.steps is not None:
        args.minutes = None
    if args.seq_len <= args.block_size:
        p.error("--seq-len must exceed --block-size")
    args.out.mkdir(parents=True, exist_ok=True)
    return args


def main(argv: list[str] | None = None) -> dict:
    return train(parse(argv))


if __name__ == "__main__":
    main()
