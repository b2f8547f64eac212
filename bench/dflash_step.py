"""What one DFlash step costs against one plain decode step, at a target's shape with a random
drafter of z-lab's shape.

    python bench/dflash_step.py [--shape Qwen3-4B] [--variant default] [--contexts 1024,8192]
                                [--block 16] [--drafter-layers 5] [--repeats 50] [--out DIR]

The target is a random checkpoint of the shape (bench/shapes.py); the drafter a random checkpoint
in z-lab's format (plugins/dflash_checkpoint.py) of the target's width, as z-lab's drafters are
(hidden size, heads, head_dim and intermediate size of the target), ``--drafter-layers`` layers,
block ``--block``, target layer ids by z-lab's default rule, written once under --checkpoints.
The engine is the variant's (CUDA graphs in the default config) with ``proposer=dflash`` and
``spec_k = block - 1``. A random prompt of N tokens is prefilled (the drafter caches its context),
then each step is called over and over at position N, timed with CUDA events after a warm-up
(``timing.median_seconds``, the median of --repeats):

- ``step1``: a plain decode step (the target, 1 token);
- ``verify{B}``: the target's verify step of B tokens (the newest token and B - 1 drafts);
- ``block``: the drafter's block step (``[last, MASK x (B-1)]``, non-causal);
- ``context{B}``: the drafter's context step of B rows (the device loop writes all B; the
  sequential loop the kept ones);
- ``dflash_step``: block, verify and context enqueued back to back and timed as one, as the
  sequential loop runs them without its host reads;
- ``loop_step``: the device-resident loop's whole step drafting B - 1 tokens (draft, verify,
  accept: one CUDA graph in the default config), each call at the position the last one left
  (the random drafter's drafts are rejected: about one position a call).

Rows have workload ``{step}_ctx{N}``, unit ``ms`` and ``ratio_to_step1`` (the issue's target at
Qwen3-4B: ``dflash_step`` and ``loop_step`` <= 1.35 x ``step1``). Without a GPU the shape is tiny
and the contexts short, which checks the script, not the figures. Writes ``dflash_step.json``
under --out and prints a table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import torch  # noqa: E402

import limits as limits_mod  # noqa: E402
import records  # noqa: E402
from shapes import SHAPES, cpu_refusal, write_random_checkpoint  # noqa: E402
from timing import median_seconds  # noqa: E402
from variants import engine_args  # noqa: E402
from workloads import EngineRunner, free_memory, random_prompt  # noqa: E402

SCRATCH = Path("/tmp/tileinfer-checkpoints")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    gpu = torch.cuda.is_available()
    p.add_argument("--shape", default="Qwen3-4B" if gpu else "tiny", help="target shape (bench/shapes.py); "
                   "default Qwen3-4B on a GPU, tiny on a CPU")
    p.add_argument("--variant", default="default", help="variant of bench/variants.py (default: default)")
    p.add_argument("--contexts", default="1024,8192" if gpu else "32,100",
                   help="cached positions before the step, comma-separated (default 1024,8192; 32,100 on a CPU)")
    p.add_argument("--block", type=int, default=16, help="the drafter's block size B (default 16: 15 drafts)")
    p.add_argument("--drafter-layers", type=int, default=5, help="the drafter's layers (default 5, z-lab's)")
    p.add_argument("--repeats", type=int, default=50 if gpu else 3, help="timed calls per step (median)")
    p.add_argument("--checkpoints", type=Path, default=SCRATCH, help="where random checkpoints are written once")
    p.add_argument("--commit", help="commit hash to record (default: git rev-parse of this checkout)")
    p.add_argument("--out", type=Path, default=Path("bench/results/steps"), help="folder for dflash_step.json")
    args = p.parse_args(argv)
    args.contexts = [int(n) for n in args.contexts.split(",")]
    if not 2 <= args.block <= 16:
        p.error(f"--block {args.block}: the drafter's steps are graphed for blocks of 2 to 16 positions")
    if not gpu and (reason := cpu_refusal(args.shape)):
        p.error(reason)
    return args


def write_random_drafter(shape: str, layers: int, block: int, folder: Path, *, seed: int = 0) -> Path:
    """A random z-lab-format drafter for a target of ``shape`` (skipped if already there)."""
    from safetensors.torch import save_file

    from tileinfer.plugins.dflash_checkpoint import DFlashConfig, default_target_layer_ids

    folder = Path(folder)
    if (folder / "config.json").is_file():
        return folder
    target = SHAPES[shape]
    n_target = target["num_hidden_layers"]
    ids = list(default_target_layer_ids(n_target, layers))
    if not all(0 <= i < n_target for i in ids):  # a target too shallow for the rule (the CPU's tiny shape)
        ids = list(range(min(layers, n_target)))
    vocab = target["vocab_size"]
    config = {**target, "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "num_hidden_layers": layers,
              "tie_word_embeddings": False, "block_size": block, "num_target_layers": n_target,
              "dflash_config": {"mask_token_id": 151669 if vocab > 151669 else vocab - 1, "target_layer_ids": ids}}
    shapes = DFlashConfig.from_dict(config, str(folder / "config.json")).tensor_shapes()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device).manual_seed(seed)
    tensors = {}
    for name, size in shapes.items():
        if len(size) == 1:  # norms
            tensors[name] = torch.ones(size, dtype=torch.bfloat16)
        else:
            w = torch.randn(size, generator=g, device=device, dtype=torch.float32) * 0.02
            tensors[name] = w.to(torch.bfloat16).cpu()
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder


def device_loop(engine, k: int):
    """The engine's device-resident loop, or one built as the engine builds it (None when the
    loop's module is not there)."""
    loop = getattr(engine.decoder, "loop", None)
    if loop is not None and k in loop.k_values:
        return loop
    try:
        from tileinfer.device_speculation import SpeculativeLoop
        from tileinfer.steps import cuda_graph_capture
    except ImportError:
        return None
    capture = cuda_graph_capture if engine.device.type == "cuda" and engine.config.cuda_graphs else None
    return SpeculativeLoop(engine.model, engine.kv, engine.proposer, [k], capture=capture)


def measure_context(engine, loop, n: int, block: int, repeats: int) -> dict[str, float]:
    """Median ms of each step (the module's names) after ``n`` cached positions (``loop``: the
    device loop, or None)."""
    steps, kv, p = engine.decoder.steps, engine.kv, engine.proposer
    vocab = engine.model_config.vocab_size
    prompt = random_prompt(n, vocab)
    verify = torch.tensor(random_prompt(block, vocab, seed=1), device=engine.device)
    one, last = verify[:1].clone(), int(verify[0])
    out: dict[str, float] = {}

    def timed(name: str, fn) -> None:
        with torch.inference_mode():
            out[name] = median_seconds(fn, engine.device, repeats=repeats, warmup=3) * 1e3

    engine.generate(prompt, max_new_tokens=1, ignore_eos=True)  # the prefill: both caches hold n positions
    kv.truncate(n)
    kv.reserve(n + block)
    p.kv.truncate(n)
    p.kv.reserve(n + block)
    with torch.inference_mode():
        _, hidden = steps.forward(verify, n)
        hidden = {i: h[:block].clone() for i, h in hidden.items()}
    timed("step1", lambda: steps.forward(one, n))
    timed(f"verify{block}", lambda: steps.forward(verify, n))
    timed("block", lambda: p.steps.block(last, n))
    timed(f"context{block}", lambda: p.steps.context(hidden, n - block))

    def dflash_step() -> None:
        p.steps.block(last, n)
        steps.forward(verify, n)
        p.steps.context(hidden, n - block)

    timed("dflash_step", dflash_step)
    if loop is not None:  # the sequence: the prompt and a first token; pages for every call's positions
        kv.truncate(n)
        p.kv.truncate(n)
        loop.begin(prompt, one, (repeats + 4) * block)
        timed("loop_step", lambda: loop.step(block - 1))
    return out


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    env = records.environment(limits_mod.measure(device), args.commit)
    target = write_random_checkpoint(args.shape, args.checkpoints / args.shape)
    drafter = write_random_drafter(args.shape, args.drafter_layers, args.block,
                                   args.checkpoints / f"{args.shape}-dflash-l{args.drafter_layers}-b{args.block}")
    sources, overrides = engine_args(args.variant, ["proposer=dflash", f"spec_k={args.block - 1}",
                                                    f"options.dflash.model={drafter}"])
    capacity = max(args.contexts) + (args.repeats + 8) * args.block + 4 * args.block
    runner = EngineRunner(target, sources, overrides, capacity)
    rows = []
    try:
        with torch.inference_mode():
            loop = device_loop(runner.engine, args.block - 1)  # its graphs are captured before any prefill
        print(runner.engine.proposer.steps.report(), "|", loop.report() if loop else "no device loop", flush=True)
        for n in args.contexts:
            costs = measure_context(runner.engine, loop, n, args.block, args.repeats)
            for name, ms in costs.items():
                rows.append({"shape": args.shape, "variant": args.variant, "peer": None, "workload": f"{name}_ctx{n}",
                             "value": ms, "unit": "ms", "context": n, "block": args.block,
                             "drafter_layers": args.drafter_layers, "ratio_to_step1": ms / costs["step1"],
                             "roofline_fraction": None, "tflops": None, "peak_fraction": None, **env})
                print(f"{args.shape:10} {args.variant:9} N={n:6} {name:12} {ms:8.3f} ms  x{ms / costs['step1']:5.2f}",
                      flush=True)
    finally:
        runner.close()
        free_memory()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "dflash_step.json").write_text(json.dumps(rows, indent=1) + "\n")
    return rows


if __name__ == "__main__":
    main()
