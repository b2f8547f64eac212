"""Train a shipped model: exactly Qwen3 (transformers' Qwen3ForCausalLM), on the token streams of
models/data.py, with the tokenizer of models/tokenizer.py.

    python -m tileinfer.models.train --size target --data DATA_DIR --tokenizer TOK_DIR --out RUN_DIR --minutes 4
    python -m tileinfer.models.train --size draft  ... --resume          # continue from RUN_DIR/ckpt/state.pt

Named sizes (SIZES; parameters counted with the tied embedding once, at vocabulary 8,192):

- ``target``: 6 layers, hidden 384, 6 query heads and 2 KV heads of 64, SwiGLU 1,024: 12.59M
  parameters (3.15M of them the embedding), 25.2 MB in BF16;
- ``draft``: 2 layers, hidden 192, 3 query heads and 1 KV head of 64, SwiGLU 512: 2.36M parameters
  (1.57M embedding), 4.7 MB in BF16. Same tokenizer: a draft model for speculative decoding;
- ``tiny``: for tests (2 layers, hidden 64).

Training: sequences of ``--seq-len`` tokens (default 2,048, the models' max_position_embeddings)
cut from the packed stream (documents separated by <|endoftext|>), in a seeded random order, epoch
after epoch; AdamW (0.9, 0.95, weight decay 0.1 on matrices), linear warmup then cosine decay to
10 % of the peak; gradient clipping at 1.0; BF16 autocast on CUDA (FP32 weights), FP32 on CPU.

The length of the run is ``--steps N``, or ``--minutes M``: the step time is measured over the
first steps and the run is sized to fit M minutes (evaluations, the final one and saving
included: ``--reserve-s``), and stopped when only the reserve is left regardless. A checkpoint
(model, optimizer, step, planned steps, RNG states, loss history) is written every
``--ckpt-every`` steps and at the end; ``--resume`` continues from it and gives the same weights as
an uninterrupted run.

Writes into RUN_DIR: ``model/`` (the Hugging Face checkpoint in BF16: config.json, one
model.safetensors, generation_config.json whose EOS ids are <|im_end|> and <|endoftext|>, and the
tokenizer's files), ``eval.json`` (held-out loss, perplexity, bits per byte, sizes, speed),
``history.json`` and ``loss.png`` (train and held-out loss; needs matplotlib), ``ckpt/state.pt``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from .checkpoints import save_model, save_state, set_rng_state
from .loss_plot import plot
from .tokenizer import ENDOFTEXT, IM_END

SIZES = {
    "target": dict(hidden_size=384, intermediate_size=1024, num_hidden_layers=6, num_attention_heads=6,
                   num_key_value_heads=2, head_dim=64),
    "draft": dict(hidden_size=192, intermediate_size=512, num_hidden_layers=2, num_attention_heads=3,
                  num_key_value_heads=1, head_dim=64),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=32),
}
# Peak learning rate and sequences per step, per size (overridable on the command line).
HYPER = {"target": dict(lr=2e-3, batch=64), "draft": dict(lr=3e-3, batch=64), "tiny": dict(lr=3e-3, batch=4)}


@dataclass
class Plan:
    total_steps: int
    warmup_steps: int
    eval_every: int
    measured_step_s: float | None = None


def qwen3_config(size: str, vocab_size: int, seq_len: int):
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=vocab_size, **SIZES[size], max_position_embeddings=seq_len, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=True,
        initializer_range=0.02, attention_bias=False, use_sliding_window=False, hidden_act="silu",
        bos_token_id=None, eos_token_id=IM_END, pad_token_id=ENDOFTEXT, architectures=["Qwen3ForCausalLM"],
    )


def count_parameters(model) -> dict:
    """Parameters with the tied embedding counted once; of which the embedding."""
    total = sum(p.numel() for p in model.parameters())  # parameters() yields a shared tensor once
    embedding = model.get_input_embeddings().weight.numel()
    return {"parameters": total, "embedding": embedding, "non_embedding": total - embedding,
            "bf16_bytes": 2 * total}


# -- data ------------------------------------------------------------------------------------------


class Stream:
    """Sequences of ``seq_len + 1`` tokens cut every ``seq_len`` from a uint16 token file, on the device."""

    def __init__(self, path: Path, seq_len: int, device: torch.device) -> None:
        tokens = np.fromfile(path, dtype=np.uint16)
        self.count = (len(tokens) - 1) // seq_len
        if self.count < 1:
            raise ValueError(f"{path}: {len(tokens)} tokens, fewer than one sequence of {seq_len + 1}")
        self.tokens = torch.from_numpy(tokens[: self.count * seq_len + 1].astype(np.int64)).to(device)
        self.seq_len = seq_len
        self.offsets = torch.arange(seq_len + 1, device=device)

    def batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self.tokens[indices.to(self.tokens.device)[:, None] * self.seq_len + self.offsets]
        return rows[:, :-1], rows[:, 1:]


class Order:
    """Sample ``i`` of the run is sequence ``perm_e[i % n]`` of epoch ``e = i // n``: a function of
    the step alone, so a resumed run reads the same batches."""

    def __init__(self, count: int, seed: int) -> None:
        self.count, self.seed, self._epoch, self._perm = count, seed, -1, None

    def perm(self, epoch: int) -> torch.Tensor:
        if epoch != self._epoch:
            g = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
            self._epoch, self._perm = epoch, torch.randperm(self.count, generator=g)
        return self._perm

    def indices(self, step: int, batch: int) -> torch.Tensor:
        out = []
        for i in range(step * batch, (step + 1) * batch):
            epoch, pos = divmod(i, self.count)
            out.append(int(self.perm(epoch)[pos]))
        return torch.tensor(out, dtype=torch.int64)


# -- schedule, loss, evaluation --------------------------------------------------------------------


def learning_rate(step: int, plan: Plan, peak: float, floor: float = 0.1) -> float:
    if step < plan.warmup_steps:
        return peak * (step + 1) / plan.warmup_steps
    progress = min(1.0, (step - plan.warmup_steps) / max(1, plan.total_steps - plan.warmup_steps))
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def autocast(device: torch.device):
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def loss_of(model, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=x, use_cache=False).logits
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))


@torch.no_grad()
def evaluate(model, stream: Stream, batch: int, device: torch.device, max_sequences: int | None = None) -> dict:
    """Mean loss (nats per token) over held-out sequences: all, or ``max_sequences`` evenly spaced."""
    was_training = model.training
    model.eval()
    n = stream.count if not max_sequences else min(stream.count, max_sequences)
    indices = torch.linspace(0, stream.count - 1, n).round().long() if n < stream.count else torch.arange(n)
    total, tokens = 0.0, 0
    for i in range(0, n, batch):
        x, y = stream.batch(indices[i:i + batch])
        with autocast(device):
            total += float(loss_of(model, x, y)) * y.numel()
        tokens += y.numel()
    model.train(was_training)
    return {"loss": total / tokens, "tokens": tokens}


# -- the run ---------------------------------------------------------------------------------------


def train(args) -> dict:
    from tqdm import tqdm
    from transformers import Qwen3ForCausalLM

    start_time = time.perf_counter()
    device = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    hyper = HYPER[args.size]
    lr = args.lr or hyper["lr"]
    batch = args.batch or hyper["batch"]
    out: Path = args.out
    state_path = out / "ckpt" / "state.pt"
    meta = json.loads((args.data / "meta.json").read_text())
    vocab = meta["vocab_size"]

    if args.threads:
        torch.set_num_threads(args.threads)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    config = qwen3_config(args.size, vocab, args.seq_len)
    model = Qwen3ForCausalLM._from_config(config, attn_implementation="sdpa", dtype=torch.float32).to(device)
    model.train()
    sizes = count_parameters(model)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda")
    train_stream = Stream(args.data / "train.bin", args.seq_len, device)
    heldout_stream = Stream(args.data / "heldout.bin", args.seq_len, device)
    order = Order(train_stream.count, args.seed)
    tokens_per_step = batch * args.seq_len
    forward = torch.compile(model) if args.compile else model

    history = {"step": [], "train_tokens": [], "train_loss": [], "lr": [], "eval_step": [], "eval_tokens": [],
               "eval_loss": []}
    step, plan = 0, None
    if args.resume and state_path.is_file():
        state = torch.load(state_path, map_location=device, weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, plan, history = state["step"], Plan(**state["plan"]), state["history"]
        set_rng_state(state["rng"])
        print(f"resumed from {state_path} at step {step} of {plan.total_steps}", flush=True)
    elif args.resume:
        print(f"--resume: no checkpoint at {state_path}; starting from scratch", flush=True)
    if plan is None:
        if args.steps:
            total = args.steps
        else:  # provisional until the step time is measured
            total = max(1, int(args.minutes * 60 * args.max_tokens_per_s_guess / tokens_per_step))
        plan = Plan(total, max(1, min(args.warmup, total // 10)), max(1, total // args.evals))
    print(f"{args.size}: {sizes['parameters'] / 1e6:.2f}M parameters ({sizes['embedding'] / 1e6:.2f}M embedding), "
          f"{sizes['bf16_bytes'] / 1e6:.1f} MB in BF16; {device}, {tokens_per_step} tokens a step; train stream "
          f"{train_stream.count * args.seq_len / 1e6:.1f}M tokens, held-out "
          f"{heldout_stream.count * args.seq_len / 1e6:.2f}M",
          flush=True)

    budget_s = args.minutes * 60 if args.minutes else None
    calibrate_at = None if (args.steps or plan.measured_step_s) else step + args.calibrate_steps
    warm_at = step + 5  # the first steps pay for allocation and autotuning; time from the 6th on
    t_warm = None
    eval_s = 0.0
    stopped_early = False
    bar = tqdm(total=plan.total_steps, initial=step, unit="step", dynamic_ncols=True,
               mininterval=1.0 if sys.stderr.isatty() else 15.0)  # a log file: a line every 15 s
    loop_start = time.perf_counter()
    first_step = step
    while step < plan.total_steps:
        if budget_s is not None and time.perf_counter() - start_time > budget_s - args.reserve_s:
            stopped_early = True
            break
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, plan, lr)
        x, y = train_stream.batch(order.indices(step, batch))
        with autocast(device):
            loss = loss_of(forward, x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        if step % args.log_every == 0 or step == plan.total_steps:
            value = float(loss.detach())  # syncs: only every log_every steps
            history["step"].append(step)
            history["train_tokens"].append(step * tokens_per_step)
            history["train_loss"].append(value)
            history["lr"].append(optimizer.param_groups[0]["lr"])
            bar.set_postfix(loss=f"{value:.3f}", refresh=False)
        bar.update(1)
        if step == warm_at:
            if device.type == "cuda":
                torch.cuda.synchronize()
            t_warm = time.perf_counter()
        if calibrate_at is not None and step == calibrate_at and t_warm is not None:
            if device.type == "cuda":
                torch.cuda.synchronize()
            step_s = (time.perf_counter() - t_warm) / (step - warm_at)
            t0 = time.perf_counter()
            evaluate(model, heldout_stream, batch, device, args.eval_sequences)
            one_eval = time.perf_counter() - t0
            left = budget_s - (time.perf_counter() - start_time) - args.reserve_s
            # the evaluations to come, then the steps that fit in what is left
            steps_left = max(1, int((left - args.evals * one_eval) / step_s))
            total = step + steps_left
            plan = Plan(total, max(step, min(args.warmup, total // 10)), max(1, total // args.evals), step_s)
            bar.total = plan.total_steps
            print(f"\nmeasured {step_s * 1e3:.1f} ms a step ({tokens_per_step / step_s / 1e6:.2f}M tokens/s), an "
                  f"evaluation {one_eval:.1f} s: planning {plan.total_steps} steps "
                  f"({plan.total_steps * tokens_per_step / 1e6:.0f}M tokens) in {args.minutes} min", flush=True)
            calibrate_at = None
        if step % plan.eval_every == 0 and step < plan.total_steps:
            t0 = time.perf_counter()
            result = evaluate(model, heldout_stream, batch, device, args.eval_sequences)
            eval_s += time.perf_counter() - t0
            history["eval_step"].append(step)
            history["eval_tokens"].append(step * tokens_per_step)
            history["eval_loss"].append(result["loss"])
            bar.write(f"step {step}: held-out loss {result['loss']:.4f}")
        if step % args.ckpt_every == 0:
            save_state(state_path, model, optimizer, step, plan, history, vars_json(args))
        if args.stop_after and step - first_step >= args.stop_after:
            save_state(state_path, model, optimizer, step, plan, history, vars_json(args))
            bar.close()
            print(f"stopped after {args.stop_after} steps, at step {step} (--stop-after); --resume continues",
                  flush=True)
            return {"size": args.size, "steps": step, "interrupted": True}
    bar.close()
    train_s = time.perf_counter() - loop_start
    save_state(state_path, model, optimizer, step, plan, history, vars_json(args))

    final = evaluate(model, heldout_stream, batch, device, args.final_eval_sequences)
    history["eval_step"].append(step)
    history["eval_tokens"].append(step * tokens_per_step)
    history["eval_loss"].append(final["loss"])
    bytes_per_token = meta["heldout"]["bytes"] / meta["heldout"]["tokens"]
    result = {
        "size": args.size, **sizes, "config": SIZES[args.size], "vocab_size": vocab, "seq_len": args.seq_len,
        "heldout_loss": round(final["loss"], 4), "heldout_perplexity": round(math.exp(final["loss"]), 3),
        "heldout_bits_per_byte": round(final["loss"] / math.log(2) / bytes_per_token, 4),
        "heldout_tokens": final["tokens"], "steps": step, "planned_steps": plan.total_steps,
        "stopped_early": stopped_early, "train_tokens": step * tokens_per_step,
        "epochs": round(step * batch / train_stream.count, 2), "train_seconds": round(train_s, 1),
        "tokens_per_second": round(step * tokens_per_step / max(train_s - eval_s, 1e-9)),
        "batch": batch, "peak_lr": lr, "seed": args.seed, "device": str(device),
        "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None, "torch": torch.__version__,
        "compile": args.compile,
    }
    save_model(model, out / "model", args.tokenizer)
    (out / "history.json").write_text(json.dumps(history) + "\n")
    (out / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(history, out / "loss.png", f"{args.size}: {sizes['parameters'] / 1e6:.2f}M parameters, "
         f"{step * tokens_per_step / 1e6:.3g}M tokens; held-out loss {final['loss']:.3f}")
    print(f"{args.size}: held-out loss {final['loss']:.4f}, perplexity {math.exp(final['loss']):.2f}, "
          f"{result['heldout_bits_per_byte']:.3f} bits/byte after {step} steps ({result['train_tokens'] / 1e6:.1f}M "
          f"tokens, {result['tokens_per_second'] / 1e6:.2f}M tokens/s) in {time.perf_counter() - start_time:.0f} s "
          f"-> {out / 'model'}", flush=True)
    return result


def vars_json(args) -> dict:
    return {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}


def parse(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), required=True)
    parser.add_argument("--data", type=Path, required=True, help="folder of models/data.py (train.bin, heldout.bin)")
    parser.add_argument("--tokenizer", type=Path, required=True, help="folder of models/tokenizer.py")
    parser.add_argument("--out", type=Path, required=True, help="run folder: model/, ckpt/, eval.json, loss.png")
    length = parser.add_mutually_exclusive_group(required=True)
    length.add_argument("--minutes", type=float, help="time budget of the whole run (sizes the schedule to fit)")
    length.add_argument("--steps", type=int, help="a fixed number of steps")
    parser.add_argument("--resume", action="store_true", help="continue from OUT/ckpt/state.pt")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=None, help="sequences a step (default: per size)")
    parser.add_argument("--lr", type=float, default=None, help="peak learning rate (default: per size)")
    parser.add_argument("--warmup", type=int, default=100, help="warmup steps (at most a tenth of the run)")
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--threads", type=int, default=None, help="CPU threads of torch (default: torch's)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (off by default: untested, "
                        "and its compile time weighs in runs of minutes)")
    parser.add_argument("--evals", type=int, default=20, help="held-out evaluations during the run")
    parser.add_argument("--eval-sequences", type=int, default=64, help="held-out sequences of each evaluation "
                        "during the run")
    parser.add_argument("--final-eval-sequences", type=int, default=None, help="held-out sequences of the final "
                        "evaluation (default: all)")
    parser.add_argument("--ckpt-every", type=int, default=250)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--calibrate-steps", type=int, default=30, help="with --minutes: steps timed to size the run")
    parser.add_argument("--reserve-s", type=float, default=15.0, help="with --minutes: seconds kept for the final "
                        "evaluation and saving")
    parser.add_argument("--stop-after", type=int, default=None, help="stop after N steps of this invocation, "
                        "as if interrupted (tests of --resume)")
    parser.add_argument("--max-tokens-per-s-guess", type=float, default=2e6, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.minutes is not None and args.minutes <= 0:
        parser.error("--minutes must be positive")
    return args


def main(argv: list[str] | None = None) -> dict:
    return train(parse(argv))


if __name__ == "__main__":
    main()
