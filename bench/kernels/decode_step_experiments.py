"""Tile and split rules tried inside the whole engine: decode tok/s of the default config with one
kernel rule patched, against the rule as shipped, in the same process.

    python bench/kernels/decode_step_experiments.py [--shapes Qwen3-4B,Qwen3-0.6B] [--contexts 1024,32768]
                                                    [--variants rule,...] [--rounds 3] [--out DIR]

Why in the engine: with programmatic dependent launch a GEMV can load weights while the kernel
before it runs, so a tile that looks equal in bench_decode_linears.py (linears only, back to back)
can differ behind the attention kernels. Experiments:

- ``rule``: the shipped rules;
- ``oproj-bn1-wholek`` / ``oproj-bn2-wholek``: o_proj (the GEMV right after attention) at T = 1
  with BLOCK_K = next_pow2(K), so that each program issues all its weight loads before the grid
  dependency wait, i.e. while attention still runs; BLOCK_N 1 or 2, 4 warps;
- ``splits32``: decode attention with up to 32 splits and 64 keys a split (one 64-key tile per
  program at 1-2k positions instead of two);
- ``inputs-early-trigger``: the fused attention-input kernel lets the decode attention launch at its
  start (before session 4's rule: after its grid dependency wait);
- ``inputs-no-pdl`` / ``attn-no-pdl``: the attention-input kernel / the decode attention (split
  kernel and combine) launched without programmatic dependent launch;
- ``unfused-inputs``: the attention inputs as the per-op chain (torch copies, then Triton kernels);
- ``attn-trigger-after-wait`` / ``combine-trigger-after-wait``: the decode split kernel / the
  combine lets the next kernel launch after its grid dependency wait instead of at its start (so
  the kernels after attention, o_proj's GEMV among them, are placed later).

Each variant is an Engine built (and its graphs captured) with its rule patched; then the
variants' generations (a random prompt of each ``--contexts`` length, 128 new tokens, ignore_eos,
the KV pool sized to the context as bench/run.py does) alternate for
``--rounds`` rounds and the median decode tok/s of each is printed with its ratio to ``rule`` and
its fraction of the memory roofline (weights + KV cache per step over the copy bandwidth measured
in the same run). The greedy tokens of every variant must equal ``rule``'s.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from limits import copy_bandwidth  # noqa: E402
from shapes import SHAPES, kv_bytes_per_position, weight_bytes, write_random_checkpoint  # noqa: E402

from script_args import engine_script_parser, gpu_visible  # noqa: E402


def without_pdl(launcher):
    """``launcher`` with its ``pdl`` argument forced off (the caller's value is ignored)."""
    return lambda *args, **kwargs: launcher(*args, **{**kwargs, "pdl": False})


NEW_TOKENS = 128


@contextlib.contextmanager
def patched(name: str, shape: str):
    import tileinfer.backends.triton.attention_inputs as I
    import tileinfer.backends.triton.linear as L
    import tileinfer.backends.triton.paged_attention as P
    import tileinfer.plugins.triton.attention as A

    s = SHAPES[shape]
    o_proj = (s["hidden_size"], s["num_attention_heads"] * s["head_dim"])
    saved = (L.gemv_config, A.decode_splits, I.TRIGGER_AFTER_WAIT, A.attention_inputs, A.paged_decode_attention,
             P.DECODE_TRIGGER_AFTER_WAIT, P.COMBINE_TRIGGER_AFTER_WAIT)
    if name.startswith("oproj-"):
        block_n = 1 if "bn1" in name else 2
        rule = L.gemv_config

        def gemv_config(N, K, T, sms=L.DEFAULT_NUM_SMS):
            if (N, K) == o_proj and T == 1:
                return L.GemvConfig(block_n, L._next_pow2(K), 1, 4, 1)
            return rule(N, K, T, sms)

        L.gemv_config = gemv_config
    elif name == "splits32":
        A.decode_splits = lambda context: max(1, min(32, context // 64))
    elif name == "inputs-early-trigger":
        I.TRIGGER_AFTER_WAIT = False
    elif name == "inputs-no-pdl":
        A.attention_inputs = without_pdl(saved[3])
    elif name == "attn-no-pdl":
        A.paged_decode_attention = without_pdl(saved[4])
    elif name == "attn-trigger-after-wait":
        P.DECODE_TRIGGER_AFTER_WAIT = True
    elif name == "combine-trigger-after-wait":
        P.COMBINE_TRIGGER_AFTER_WAIT = True
    elif name == "unfused-inputs":
        A.attention_inputs = A.attention_inputs_unfused
    elif name != "rule":
        raise ValueError(name)
    try:
        yield
    finally:
        (L.gemv_config, A.decode_splits, I.TRIGGER_AFTER_WAIT, A.attention_inputs, A.paged_decode_attention,
         P.DECODE_TRIGGER_AFTER_WAIT, P.COMBINE_TRIGGER_AFTER_WAIT) = saved


def compare(shape: str, folder: Path, context: int, variants: list[str], rounds: int, bandwidth: float) -> list[dict]:
    """Decode tok/s of each variant after ``context`` positions, alternating, in this process."""
    import tileinfer

    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, SHAPES[shape]["vocab_size"], (context,), generator=generator).tolist()
    engines = {}
    for name in variants:
        with patched(name, shape):
            engines[name] = tileinfer.Engine.from_config(model=str(folder), device="cuda", progress=False,
                                                         overrides=[f"kv_capacity={context + NEW_TOKENS}"])
            engines[name].generate(prompt, max_new_tokens=8, ignore_eos=True)  # compile, warm up
    speeds: dict[str, list[float]] = {n: [] for n in engines}
    tokens = {}
    for _ in range(rounds):
        for name, engine in engines.items():
            result = engine.generate(prompt, max_new_tokens=NEW_TOKENS, ignore_eos=True)
            speeds[name].append(result.stats.decode_tok_s)
            tokens.setdefault(name, result.token_ids)
    del engines
    torch.cuda.empty_cache()
    step_bytes = weight_bytes(shape) + kv_bytes_per_position(shape) * (context + NEW_TOKENS // 2)
    roofline = bandwidth / step_bytes
    base = statistics.median(speeds["rule"]) if "rule" in speeds else None
    records = []
    for name, values in speeds.items():
        tok_s = statistics.median(values)
        same = tokens[name] == tokens.get("rule", tokens[name])
        ratio = f"x{tok_s / base:.3f} vs rule" if base else ""
        print(f"{shape:<11} ctx {context:<6} {name:<20} {tok_s:7.1f} tok/s  {tok_s / roofline:6.1%} of roofline  "
              f"{ratio}  tokens {'=' if same else '!='} rule  runs {[round(v) for v in values]}", flush=True)
        records.append(dict(shape=shape, context=context, variant=name, decode_tok_s=tok_s, runs=values,
                            roofline_fraction=tok_s / roofline, same_tokens=same))
    return records


def main(argv: list[str] | None = None) -> int:
    parser = engine_script_parser(__doc__)
    parser.add_argument("--contexts", default="1024", help="comma-separated prompt lengths (cached positions)")
    parser.add_argument("--variants", default="rule,oproj-bn1-wholek,oproj-bn2-wholek,splits32")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if not gpu_visible("decode_step_experiments.py"):
        return 2
    bandwidth = copy_bandwidth(torch.device("cuda"))
    print(f"{torch.cuda.get_device_name()}, copy bandwidth {bandwidth / 1e12:.2f} TB/s", flush=True)
    records = []
    for shape in args.shapes.split(","):
        folder = write_random_checkpoint(shape, args.checkpoints / shape)
        for context in (int(c) for c in args.contexts.split(",")):
            records += compare(shape, folder, context, args.variants.split(","), args.rounds, bandwidth)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "decode_step_experiments.json").write_text(json.dumps(
            dict(records=records, copy_bandwidth=bandwidth, date=time.strftime("%Y-%m-%d")), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
