"""Train the byte-level BPE tokenizer of the shipped models on the corpus' training split.

    python -m tileinfer.models.tokenizer CORPUS_DIR OUT_DIR [--vocab 8192] [--sample-mb 64]

Qwen's pre-tokenizer (its split regex, then byte-level without the regex: single digits,
indentation runs as their own pieces) and no normalizer, so that ``decode(encode(text)) == text``
for any text, byte for byte: the edit benchmark copies source files. The vocabulary holds the 256
bytes, the merges, and the special tokens at ids 0, 1, 2: ``<|endoftext|>`` (between documents,
and padding), ``<|im_start|>``, ``<|im_end|>`` (the end of a chat turn: the EOS of generation).
Fixed low ids do not move when the vocabulary size changes.

8,192 entries: the embedding is tied to the LM head, and at 16,384 it would be half of the
target's ~12.6M parameters and two thirds of the draft's; code needs fewer distinct pieces than
prose. The cost is ~10 % more tokens per byte than 16,384 would give.

Saved with transformers' ``PreTrainedTokenizerFast.save_pretrained`` together with Qwen3's chat
template (models/chat_template.jinja: tools, tool messages and thinking rendered as Qwen3 renders
them): tokenizer.json, tokenizer_config.json and chat_template.jinja. The BPE is trained on an evenly spaced sample of the training files
(``--sample-mb``), which keeps it to well under a minute.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from .corpus import read_docs

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ENDOFTEXT, IM_START, IM_END = 0, 1, 2
# Qwen2/Qwen3's pre-tokenizer split (tokenizer.json of Qwen/Qwen3-0.6B).
SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
         r"|\s+(?!\S)|\s+")
# Qwen3's chat template (tokenizer_config.json of Qwen/Qwen3-0.6B): system, user, assistant and tool
# messages, tools, reasoning_content and enable_thinking. The training examples (data.py) have
# neither tools nor thinking; for those it writes plain ChatML (prompts.chatml).
CHAT_TEMPLATE = (Path(__file__).parent / "chat_template.jinja").read_text(encoding="utf-8")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


def sample_texts(corpus: Path, sample_bytes: int):
    """Evenly spaced training files adding up to about ``sample_bytes``."""
    total = json.loads((corpus / "stats.json").read_text())["train_bytes"]
    stride = max(1, round(total / max(sample_bytes, 1)))
    for i, doc in enumerate(read_docs(corpus, "train")):
        if i % stride == 0:
            yield doc["text"]


def build_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    return tok


def train(corpus: Path, out: Path, *, vocab: int = 8192, sample_bytes: int = 64_000_000, max_length: int = 2048):
    info = train_on(sample_texts(corpus, sample_bytes), out, vocab=vocab, max_length=max_length)
    print(f"tokenizer: {info['vocab_size']} tokens, trained on ~{sample_bytes / 1e6:.0f} MB in {info['seconds']} s "
          f"-> {out}", flush=True)
    return {"vocab_size": info["vocab_size"], "sample_bytes": sample_bytes, "seconds": info["seconds"]}


def train_on(texts, out: Path, *, vocab: int, max_length: int = 2048, min_frequency: int = 2) -> dict:
    """The byte-level BPE of ``vocab`` entries at most (the special tokens at 0, 1, 2, then the 256
    bytes and the merges) learnt from the strings ``texts``, saved into ``out`` with the chat
    template; its ``vocab_size`` and the ``seconds`` it took."""
    from tokenizers import pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    start = time.perf_counter()
    tok = build_tokenizer()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIAL_TOKENS, min_frequency=min_frequency,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    for i, name in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(name) == i, (name, tok.token_to_id(name))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   model_max_length=max_length, clean_up_tokenization_spaces=False)
    fast.chat_template = CHAT_TEMPLATE
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out)
    return {"vocab_size": tok.get_vocab_size(), "seconds": round(time.perf_counter() - start, 1)}


def copy_files(tokenizer_dir: Path, folder: Path) -> None:
    """Copy the tokenizer's files into a model folder."""
    import shutil

    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copy2(tokenizer_dir / name, folder / name)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpus", type=Path, help="folder written by models/corpus.py")
    parser.add_argument("out", type=Path, help="folder for tokenizer.json, tokenizer_config.json, chat_template.jinja")
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--sample-mb", type=float, default=64, help="MB of training files to learn the merges from")
    parser.add_argument("--max-length", type=int, default=2048, help="model_max_length of tokenizer_config.json")
    args = parser.parse_args(argv)
    return train(args.corpus, args.out, vocab=args.vocab, sample_bytes=int(args.sample_mb * 1e6),
                 max_length=args.max_length)


if __name__ == "__main__":
    main()
