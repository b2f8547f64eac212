"""Check trained models on the benchmark prompts with transformers (not with the engine).

    python -m tileinfer.models.evaluate --target models/target --draft models/draft [--out FILE.json]

For each prompt of models/prompts.py (EDIT and OPEN on the three files of models/heldout/, at most
``--max-tokens`` tokens) the target generates ``--new-tokens`` greedy tokens. Reported per prompt:
the reply's first tokens as text; for EDIT, how many of its tokens agree with the expected renamed
file from the start (``edit_prefix_tokens``) and whether the reply's text so far is a prefix of it;
with a draft, the fraction of the target's greedy tokens that the draft's greedy choice predicts
from the same context (``draft_agreement``: an upper bound on what greedy draft-model speculation
accepts per drafted token). Also a raw completion of ``def fibonacci(n):`` by each model.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from . import prompts


def load(folder: Path, device: torch.device):
    from transformers import AutoTokenizer, Qwen3ForCausalLM

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = Qwen3ForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()
    return model, AutoTokenizer.from_pretrained(folder)


@torch.no_grad()
def greedy(model, ids: list[int], new_tokens: int, device: torch.device) -> list[int]:
    x = torch.tensor([ids], device=device)
    out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=new_tokens,
                         pad_token_id=0)
    return out[0, len(ids):].tolist()


@torch.no_grad()
def agreement(draft, ids: list[int], reply: list[int], device: torch.device) -> float:
    """Fraction of ``reply`` tokens equal to the draft's argmax after prompt + the reply before them."""
    if not reply:
        return 0.0
    x = torch.tensor([ids + reply[:-1]], device=device)
    predicted = draft(input_ids=x).logits[0, len(ids) - 1:].argmax(-1).tolist()
    return sum(p == t for p, t in zip(predicted, reply)) / len(reply)


def run(target_dir: Path, draft_dir: Path | None, *, max_tokens: int = 1024, new_tokens: int = 128,
        device: str = "auto") -> dict:
    start = time.perf_counter()
    dev = torch.device(device if device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    target, tok = load(target_dir, dev)
    draft = load(draft_dir, dev)[0] if draft_dir else None
    limit = target.config.max_position_embeddings
    results = {"max_tokens": max_tokens, "new_tokens": new_tokens, "device": str(dev), "prompts": []}
    for p in prompts.benchmark_prompts(tok, max_tokens):
        n = min(new_tokens, limit - len(p.token_ids))
        reply = greedy(target, p.token_ids, n, dev)
        text = tok.decode(reply, skip_special_tokens=True)
        row = {"task": p.task, "file": p.name, "prompt_tokens": len(p.token_ids), "new_tokens": len(reply),
               "reply_start": text[:300]}
        if p.expected is not None:
            expected = tok.encode(p.expected + "<|im_end|>", add_special_tokens=False)
            same = 0
            while same < min(len(reply), len(expected)) and reply[same] == expected[same]:
                same += 1
            row["edit_prefix_tokens"] = same
            row["reply_is_prefix_of_expected"] = (p.expected + "<|im_end|>").startswith(
                tok.decode(reply, skip_special_tokens=False))
        if draft is not None:
            row["draft_agreement"] = round(agreement(draft, p.token_ids, reply, dev), 3)
        results["prompts"].append(row)
    seed = tok.encode("def fibonacci(n):\n", add_special_tokens=False)
    results["samples"] = {"target": tok.decode(greedy(target, seed, 64, dev))}
    if draft is not None:
        results["samples"]["draft"] = tok.decode(greedy(draft, seed, 64, dev))
    results["seconds"] = round(time.perf_counter() - start, 1)
    return results


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=Path, required=True)
    parser.add_argument("--draft", type=Path, default=None)
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    results = run(args.target, args.draft, max_tokens=args.max_tokens, new_tokens=args.new_tokens, device=args.device)
    text = json.dumps(results, indent=2, ensure_ascii=False)
    if args.out:
        args.out.write_text(text + "\n")
    print(text, flush=True)
    return results


if __name__ == "__main__":
    main()
