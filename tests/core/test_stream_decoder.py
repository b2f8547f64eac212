"""StreamDecoder (core/tokenizer.py, tokenizers' DecodeStream): the text of a generation piece by
piece, as Engine.stream yields it, checked on the shipped Qwen3 tokenizer. The pieces add up to the
whole decode (special tokens skipped or kept), and a multi-byte character split over tokens is held
back until it is complete."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers

from tileinfer.tokenizer import StreamDecoder, Tokenizer

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "target"
TEXT = (Path(__file__).resolve().parents[2] / "core" / "engine.py").read_text(encoding="utf-8")[:3000] + (
    " héllo 😀 日本語のテキスト 🤖🤖 ünïcödé, Ελληνικά\n\tdone.")


def metaspace_tokenizer() -> Tokenizer:
    """A SentencePiece-style tokenizer (Metaspace: a word's leading space is its first token's '▁',
    dropped at the start of a decode) with a byte-less word-level vocabulary."""
    words = sorted(set(TEXT.split()))
    vocab = {"<unk>": 0, **{f"▁{w}": i + 1 for i, w in enumerate(words)}}
    hf = HFTokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    hf.pre_tokenizer = pre_tokenizers.Metaspace()
    hf.decoder = decoders.Metaspace()
    return Tokenizer(hf, None, {})


def pieces(tokenizer, ids: list[int]) -> list[str]:
    stream = StreamDecoder(tokenizer)
    return [stream.push(t) for t in ids] + [stream.flush()]


@pytest.fixture(scope="module")
def shipped() -> Tokenizer:
    return Tokenizer.from_folder(SHIPPED)


def test_pieces_add_up_to_the_whole_decode(shipped):
    ids = shipped.encode(TEXT)
    for n in (1, 2, 7, 100, len(ids)):
        assert "".join(pieces(shipped, ids[:n])) == shipped.decode(ids[:n])


def test_random_ids_add_up_too(shipped):
    """Ids that are not text (byte tokens out of order, special tokens): still the whole decode."""
    rng = random.Random(3)
    for _ in range(20):
        ids = [rng.randrange(shipped.vocab_size) for _ in range(rng.randrange(1, 60))]
        assert "".join(pieces(shipped, ids)) == shipped.decode(ids)


def test_a_split_character_is_held_back_until_complete(shipped):
    ids = shipped.encode("a😀b")
    out = pieces(shipped, ids)
    assert all("\ufffd" not in p for p in out)
    assert "😀" in out and "".join(out) == "a😀b"
    assert out.index("😀") == len(shipped.encode("a😀")) - 1  # emitted with the character's last byte


def test_an_incomplete_tail_is_flushed_as_its_replacement(shipped):
    ids = shipped.encode("ok😀")[:-1]  # the emoji's last byte token missing
    out = pieces(shipped, ids)
    assert "".join(out[:-1]) == "ok" and out[-1] == shipped.decode(ids)[2:] and "\ufffd" in out[-1]


def test_the_leading_space_of_a_metaspace_decoder_is_kept():
    """A window starting mid-text would lose a word's leading space if decoded alone; the decoder
    keeps the last piece as left context."""
    tok = metaspace_tokenizer()
    ids = tok.encode(" ".join(TEXT.split()[:200]))
    assert 0 not in ids
    out = pieces(tok, ids)
    assert "".join(out) == tok.decode(ids)
    assert all(p.startswith(" ") for p in out[1:-1] if p)


def test_special_tokens_are_skipped_or_kept_as_the_full_decode_does(shipped):
    special = shipped.vocab()["<|im_end|>"]
    ids = [*shipped.encode("x = 1"), special, *shipped.encode("\ny")]
    for skip in (True, False):
        stream = shipped.stream(skip_special_tokens=skip)
        text = "".join([stream.push(t) for t in ids] + [stream.flush()])
        assert text == shipped.decode(ids, skip_special_tokens=skip)
        assert ("<|im_end|>" in text) != skip
