"""Token streams for training: the corpus encoded with the trained tokenizer, plus chat examples.

    python -m tileinfer.models.data CORPUS_DIR TOKENIZER_DIR OUT_DIR [--max-train-mb 320] [--seed 0]

``train.bin``: the training files in a seeded random order (up to ``--max-train-mb`` of them),
each followed by ``<|endoftext|>`` (id 0), as uint16. Mixed in, as further documents, chat
examples of the two benchmark tasks made from training files (models/prompts.py formats them):

- edit (``--edit-frac`` of the files that define a class): the file's head (whole lines, 300 B to
  3.2 KB), the instruction to rename its most used class to another name, and the renamed head as
  the reply;
- open (``--open-frac`` of the files): a head of the file and, as the reply, the lines after it.

Each is rendered with the ChatML template, reply included, ``<|im_end|>`` closing each turn. They
teach the format, the EOS of a reply, and copying; they are ~5-10 % of the tokens.

``heldout.bin``: the held-out files, raw (no chat examples), in corpus order, each followed by id 0.
``meta.json``: tokens, bytes and documents of each stream (bytes per token gives bits per byte).
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

from . import prompts
from .corpus import read_docs

ENDOFTEXT = 0
SUFFIXES = ("V2", "Impl", "Base", "Ex", "Helper", "Manager", "Wrapper", "Proxy", "Legacy", "Core")
PREFIXES = ("New", "Base", "Custom", "Default", "Simple", "Abstract", "My", "Fast", "Async", "Local")


def head_lines(lines: list[str], start: int, budget: int) -> int:
    """End index of the longest run of whole lines from ``start`` of at most ``budget`` characters (>= 1 line)."""
    end, size = start, 0
    while end < len(lines) and (size + len(lines[end]) <= budget or end == start):
        size += len(lines[end])
        end += 1
    return end


def new_name(old: str, head: str, pool: list[str], rng: random.Random) -> str | None:
    for _ in range(8):
        r = rng.random()
        if r < 0.4 and pool:
            name = rng.choice(pool)
        elif r < 0.7:
            name = old + rng.choice(SUFFIXES)
        else:
            name = rng.choice(PREFIXES) + old.lstrip("_")
        if name != old and name not in head:
            return name
    return None


def edit_example(text: str, rng: random.Random, pool: list[str]) -> str | None:
    lines = text.splitlines(keepends=True)
    first_class = next((i for i, line in enumerate(lines) if prompts.CLASS_RE.match(line)), None)
    if first_class is None:
        return None
    budget = rng.randint(300, 3200)
    start = 0 if sum(map(len, lines[:first_class])) < budget // 2 else max(0, first_class - rng.randint(0, 12))
    head = "".join(lines[start:head_lines(lines, start, budget)])
    old = prompts.pick_class(head)
    if old is None:
        return None
    new = new_name(old, head, pool, rng)
    if new is None:
        return None
    messages = prompts.edit_messages(head, old, new)
    messages.append({"role": "assistant", "content": prompts.edit_reply(head, old, new)})
    return prompts.chatml(messages, add_generation_prompt=False)


def open_example(text: str, rng: random.Random) -> str | None:
    lines = text.splitlines(keepends=True)
    cut = head_lines(lines, 0, rng.randint(300, 3000))
    end = head_lines(lines, cut, rng.randint(200, 3000))
    if cut >= len(lines):
        return None
    messages = prompts.continuation_messages("".join(lines[:cut]))
    messages.append({"role": "assistant", "content": prompts.continuation_reply("".join(lines[cut:end]))})
    return prompts.chatml(messages, add_generation_prompt=False)


def _quiet_tokenizer_threads() -> None:
    """A pool worker's initializer: one process per core instead of the tokenizer's own threads."""
    import os

    os.environ["TOKENIZERS_PARALLELISM"] = "false"


@functools.lru_cache(maxsize=1)
def _tokenizer(tokenizer_file: str):
    """The tokenizer of ``tokenizer_file``, read once per process."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(tokenizer_file)


def _encode_chunk(tokenizer_file: str, texts: list[str]) -> bytes:
    ids: list[int] = []
    for e in _tokenizer(tokenizer_file).encode_batch_fast(texts, add_special_tokens=False):
        ids.extend(e.ids)
        ids.append(ENDOFTEXT)
    return np.asarray(ids, dtype=np.uint16).tobytes()


def encode_to(path: Path, texts: list[str], tokenizer_file: Path, *, workers: int | None = None,
              chunk: int = 64) -> int:
    """Encode ``texts``, each followed by <|endoftext|>, into a uint16 file, in order; one process a
    core (the tokenizer's own threads scale poorly: ~1-2 MB/s a core with this pre-tokenizer)."""
    import multiprocessing as mp
    import os

    workers = workers or os.cpu_count() or 1
    chunks = [texts[i:i + chunk] for i in range(0, len(texts), chunk)]
    count = 0
    with path.open("wb") as f:
        encode = functools.partial(_encode_chunk, str(tokenizer_file))
        if workers == 1 or len(chunks) <= 1:
            results = map(encode, chunks)
            pool = None
        else:
            pool = mp.get_context("fork").Pool(workers, _quiet_tokenizer_threads)
            results = pool.imap(encode, chunks)
        try:
            for data in results:
                f.write(data)
                count += len(data) // 2
        finally:
            if pool:
                pool.close()
                pool.join()
    return count


def prepare(corpus: Path, tokenizer: Path, out: Path, *, max_train_bytes: int = 320_000_000, seed: int = 0,
            edit_frac: float = 0.3, open_frac: float = 0.15, workers: int | None = None) -> dict:
    from tokenizers import Tokenizer

    start = time.perf_counter()
    tokenizer_file = tokenizer / "tokenizer.json"
    tok = Tokenizer.from_file(str(tokenizer_file))
    assert tok.token_to_id("<|endoftext|>") == ENDOFTEXT
    if tok.get_vocab_size() > 65536:
        raise ValueError("uint16 streams need a vocabulary of at most 65,536")
    rng = random.Random(seed)
    docs = [d["text"] for d in read_docs(corpus, "train")]
    rng.shuffle(docs)
    chosen, size = [], 0
    for text in docs:
        if size >= max_train_bytes:
            break
        chosen.append(text)
        size += len(text.encode("utf-8"))
    pool: list[str] = []
    texts, edits, opens = list(chosen), 0, 0
    for text in chosen:
        names = prompts.class_names(text)
        if names and rng.random() < edit_frac and (example := edit_example(text, rng, pool)):
            texts.append(example)
            edits += 1
        if rng.random() < open_frac and (example := open_example(text, rng)):
            texts.append(example)
            opens += 1
        pool.extend(n for n in names[:3] if not n.startswith("_"))
        del pool[:-5000]
    rng.shuffle(texts)
    out.mkdir(parents=True, exist_ok=True)
    train_tokens = encode_to(out / "train.bin", texts, tokenizer_file, workers=workers)
    heldout = [d["text"] for d in read_docs(corpus, "heldout")]
    heldout_tokens = encode_to(out / "heldout.bin", heldout, tokenizer_file, workers=workers)
    meta = {
        "dtype": "uint16", "vocab_size": tok.get_vocab_size(), "seed": seed,
        "train": {"files": len(chosen), "file_bytes": size, "edit_examples": edits, "open_examples": opens,
                  "documents": len(texts), "bytes": sum(len(t.encode("utf-8")) for t in texts), "tokens": train_tokens},
        "heldout": {"files": len(heldout), "bytes": sum(len(t.encode("utf-8")) for t in heldout),
                    "tokens": heldout_tokens},
        "seconds": round(time.perf_counter() - start, 1),
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"data: train {train_tokens / 1e6:.1f}M tokens ({len(chosen)} files, {edits} edit and {opens} open "
          f"examples, {meta['train']['bytes'] / train_tokens:.2f} B/token); held-out {heldout_tokens / 1e6:.2f}M "
          f"tokens ({len(heldout)} files); {meta['seconds']} s", flush=True)
    return meta


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpus", type=Path)
    parser.add_argument("tokenizer", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--max-train-mb", type=float, default=320, help="training files to encode (the rest is unused)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--edit-frac", type=float, default=0.3)
    parser.add_argument("--open-frac", type=float, default=0.15)
    parser.add_argument("--workers", type=int, default=None, help="encoding processes (default: one a core)")
    args = parser.parse_args(argv)
    return prepare(args.corpus, args.tokenizer, args.out, max_train_bytes=int(args.max_train_mb * 1e6), seed=args.seed,
                   edit_frac=args.edit_frac, open_frac=args.open_frac, workers=args.workers)


if __name__ == "__main__":
    main()
