"""Which kernels' programmatic dependent launch (PDL) helps or hurts a step of T tokens: the step's
cost with PDL switched off for one class of kernels at a time.

    python bench/pdl_probe.py [--shape NAME]... [--tokens 1,2,16] [--context 1024] [--out FILE.json]

For each shape the default engine (CUDA graphs, PDL) is built once on a random checkpoint and a
prompt of ``--context`` tokens is prefilled; then, for each variant, the step runner's graphs are
dropped and the step of T tokens at that position is timed as bench/step_costs.py times it (CUDA
events, median of ``--repeats``), its graph captured again with the variant's launches:

- ``default``: every Triton kernel with PDL;
- ``decode-nopdl``: the split-KV decode attention and its combine without;
- ``attention-nopdl``: the attention's kernels (inputs and decode) without;
- ``linear-nopdl``: the linears' kernels (their RMSNorm, GEMV, reduce) without;
- ``qkv-nopdl``, ``o_proj-nopdl``, ``gate_up-nopdl``, ``down-nopdl``, ``lm_head-nopdl``: one kind
  of linear's kernels without (every layer's);
- ``all-nopdl``: none with PDL (the ``no-pdl`` variant's kernels);
- ``fused-reduce``: every kernel with PDL, and each split-K GEMV adding its partials in the last
  split's program (``GemvConfig.fused_reduce``: one launch fewer per split layer, the same bits)
  instead of the reduce kernel.
- ``late-launch``: every kernel with PDL, the GEMVs letting the next kernel launch after their K
  loop instead of at their start (``GemvConfig.late_launch``).

Switching is done on the built modules (their ``pdl`` attributes, and the attention plugin's
decode call), so it is a diagnostic, not a config. Without a GPU the shape is tiny and PDL is off
everywhere (the rows check the script, not the figures). Writes the rows to --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import torch  # noqa: E402

import tileinfer.backends.triton.linear as triton_linear  # noqa: E402
import tileinfer.plugins.triton.attention as triton_attention  # noqa: E402
from shapes import write_random_checkpoint  # noqa: E402
from step_costs import SCRATCH, step_ms  # noqa: E402
from workloads import EngineRunner, free_memory, random_prompt  # noqa: E402

LINEAR_KINDS = ("qkv", "o_proj", "gate_up", "down", "lm_head")
VARIANTS = ("default", "decode-nopdl", "attention-nopdl", "linear-nopdl",
            *(f"{kind}-nopdl" for kind in LINEAR_KINDS), "all-nopdl", "fused-reduce", "late-launch")


def patched_rule(rule, variant: str):
    """``rule`` (gemv_config) as ``variant`` changes it: ``fused_reduce`` on wherever it splits K,
    or ``late_launch`` everywhere; else ``rule`` itself."""
    def fused_reduce(*args, **kwargs):
        cfg = rule(*args, **kwargs)
        return dataclasses.replace(cfg, fused_reduce=True) if cfg.split_k > 1 else cfg

    def late_launch(*args, **kwargs):
        return dataclasses.replace(rule(*args, **kwargs), late_launch=True)
    return {"fused-reduce": fused_reduce, "late-launch": late_launch}.get(variant, rule)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    gpu = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", action="append", help="default Qwen3-4B and Qwen3-0.6B on a GPU, tiny on a CPU")
    p.add_argument("--tokens", default="1,2,16", help="tokens per step, comma-separated")
    p.add_argument("--context", type=int, default=1024 if gpu else 32, help="cached positions before the step")
    p.add_argument("--repeats", type=int, default=30 if gpu else 3)
    p.add_argument("--checkpoints", type=Path, default=SCRATCH, help="where random checkpoints are written once")
    p.add_argument("--out", type=Path, default=Path("bench/results/steps/pdl_probe.json"))
    args = p.parse_args(argv)
    args.shape = args.shape or (["Qwen3-4B", "Qwen3-0.6B"] if gpu else ["tiny"])
    args.tokens = [int(t) for t in args.tokens.split(",")]
    return args


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse(argv)
    real_decode = triton_attention.paged_decode_attention
    real_rule = triton_linear.gemv_config
    rows = []
    for shape in args.shape:
        folder = write_random_checkpoint(shape, args.checkpoints / shape)
        runner = EngineRunner(folder, [], [], args.context + max(args.tokens))
        engine = runner.engine
        model = engine.model
        kinds = {kind: [getattr(la, kind) for la in model.layers] for kind in LINEAR_KINDS[:-1]}
        kinds["lm_head"] = [model.lm_head]
        linears = [m for group in kinds.values() for m in group]
        attentions = [la.attention for la in model.layers]
        pdl = {id(m): getattr(m, "pdl", False) for m in linears + attentions}

        def use(variant: str) -> None:
            for kind, group in kinds.items():
                for m in group:
                    if hasattr(m, "pdl"):
                        m.pdl = pdl[id(m)] and variant not in ("linear-nopdl", f"{kind}-nopdl", "all-nopdl")
            for m in attentions:
                if hasattr(m, "pdl"):
                    m.pdl = pdl[id(m)] and variant not in ("attention-nopdl", "all-nopdl")
            triton_attention.paged_decode_attention = real_decode if variant != "decode-nopdl" else (
                lambda *a, **kw: real_decode(*a, **{**kw, "pdl": False}))
            triton_linear.gemv_config = patched_rule(real_rule, variant)
            getattr(engine.decoder.steps, "graphs", {}).clear()

        try:
            engine.generate(random_prompt(args.context, engine.model_config.vocab_size), max_new_tokens=1,
                            ignore_eos=True)
            engine.kv.truncate(args.context)
            for variant in VARIANTS:
                use(variant)
                for t in args.tokens:
                    ms = step_ms(engine, t, args.context, args.repeats)
                    rows.append(dict(shape=shape, variant=variant, tokens=t, context=args.context, ms=ms))
                    print(f"{shape:11} {variant:16} T={t:2} {ms:8.3f} ms", flush=True)
        finally:
            use("default")
            del engine, model, linears, attentions
            runner.close()
            free_memory()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return rows


if __name__ == "__main__":
    main()
