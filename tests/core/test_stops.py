"""Where a generation stops (core/stops.py) and how the engine honours it: stop strings matched
across tokens and never shown in part, stop_token_ids, ignore_eos and min_tokens (the stop tokens
banned from the first positions)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import tileinfer
from conftest import reference_engine
from tileinfer import SamplingParams, StructuredOutput
from tileinfer.interfaces import SamplingParams as SamplerParams
from tileinfer.interfaces import TokenHistory
from tileinfer.plugins.reference.sampler import ReferenceSampler
from tileinfer.stops import Completion, StopStrings, StopTokenBan
from tileinfer.tokenizer import Tokenizer

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "target"
PROMPT = "def add(a, b):\n"


@pytest.fixture(scope="module")
def shipped() -> Tokenizer:
    return Tokenizer.from_folder(SHIPPED)


@pytest.fixture(scope="module")
def engine(tiny_checkpoint):
    return reference_engine(tiny_checkpoint)


@pytest.fixture(scope="module")
def free(engine) -> tileinfer.Generation:
    """The greedy generation no stop ends (the tiny model's first EOS is ignored)."""
    return engine.generate(PROMPT, SamplingParams(max_tokens=24, ignore_eos=True))


def test_a_stop_string_split_over_pieces_is_found_and_never_shown():
    stops = StopStrings(["STOP", "\n\n"])
    shown = [stops.push(piece) for piece in ["ab", "cS", "T", "O", "Px", "y"]]
    assert shown[:4] == [("ab", None), ("c", None), ("", None), ("", None)]
    assert shown[4] == ("", "STOP")


def test_a_false_start_is_shown_once_it_is_not_a_stop():
    stops = StopStrings(["STOP"])
    assert stops.push("xST") == ("x", None)
    assert stops.push("OX") == ("STOX", None)
    assert stops.push("S") == ("", None)
    assert stops.flush() == "S"


def test_the_earliest_stop_wins_and_include_keeps_it():
    assert StopStrings(["cd", "bc"]).push("abcde") == ("a", "bc")
    assert StopStrings(["cd", "bc"], include=True).push("abcde") == ("abc", "bc")
    assert StopStrings(["bc"]).push("abcde", armed=False) == ("abcde", None)


def completion(shipped, tokens, **fields):
    """Feed ``tokens`` one step at a time: the tokens kept, the text shown, and the completion."""
    done = Completion(SamplingParams(**fields), eos=(0, 2), tokenizer=shipped)
    kept, text = [], []
    for token in tokens:
        taken, shown, over = done.take([token])
        kept += taken
        text.append(shown)
        if over:
            break
    text.append(done.finish())
    return kept, text, done


def test_the_text_stops_before_the_string_and_the_tokens_at_the_one_completing_it(shipped):
    ids = shipped.encode("x = 1\nreturn x\n")
    kept, text, done = completion(shipped, ids, stop=["return"])
    assert "".join(text) == "x = 1\n" and done.finish_reason == "stop" and done.stop_reason == "return"
    assert shipped.decode(kept).endswith("return") and kept == ids[:len(kept)]
    kept, text, _ = completion(shipped, ids, stop=["return"], include_stop_str_in_output=True)
    assert "".join(text) == "x = 1\nreturn"


def test_stop_tokens_eos_ignore_eos_and_min_tokens(shipped):
    ids = shipped.encode("a b c d e f")
    kept, text, done = completion(shipped, [*ids[:2], 2, *ids[2:]])
    assert kept == [*ids[:2], 2] and done.finish_reason == "eos" and done.stop_reason is None
    kept, _, done = completion(shipped, [*ids[:2], 2, *ids[2:]], ignore_eos=True)
    assert kept == [*ids[:2], 2, *ids[2:]] and done.finish_reason == "length"
    kept, text, done = completion(shipped, ids, stop_token_ids=[ids[3]])
    assert kept == ids[:4] and done.stop_reason == ids[3] and "".join(text) == shipped.decode(ids[:3])
    kept, text, done = completion(shipped, ids, stop_token_ids=[ids[3]], include_stop_str_in_output=True)
    assert "".join(text) == shipped.decode(ids[:4])
    kept, _, done = completion(shipped, [2, *ids, 2], min_tokens=3)  # the first EOS is before min_tokens
    assert kept == [2, *ids, 2] and done.finish_reason == "eos"
    kept, _, done = completion(shipped, ids, stop=[" b"], min_tokens=4)
    assert kept == ids and done.finish_reason == "length"


def test_the_engine_stops_at_a_stop_string_and_its_stream_never_shows_part_of_it(engine, free):
    text = free.text
    stop = text[len(text) // 2:len(text) // 2 + 3]
    assert stop and stop in text
    params = SamplingParams(max_tokens=24, ignore_eos=True, stop=[stop])
    chunks = list(engine.stream(PROMPT, params))
    shown = "".join(c.text for c in chunks)
    assert shown == text[:text.index(stop)]  # a piece of the stop string shown would be past this
    result = engine.generate(PROMPT, params)
    assert result.text == shown and result.stats.finish_reason == "stop" and result.stats.stop_reason == stop
    assert result.token_ids == free.token_ids[:len(result.token_ids)] and len(result.token_ids) < 24
    kept = engine.generate(PROMPT, SamplingParams(max_tokens=24, ignore_eos=True, stop=[stop],
                                                  include_stop_str_in_output=True))
    assert kept.text == text[:text.index(stop) + len(stop)]


def test_the_ban_places_each_row_by_the_history():
    """A verify step of 3 rows after 4 new tokens, min_tokens 6: rows 0 and 1 (tokens 5 and 6) may
    not be a stop token, row 2 may; the sampler's probabilities agree."""
    ban = StopTokenBan(ReferenceSampler(SamplerParams(), "cpu"))
    ban.ban({7, 3}, 6)
    history = TokenHistory([1, 2], 16, torch.device("cpu"))
    history.commit([4, 4, 4, 4])
    logits = torch.zeros(3, 10)
    logits[:, 7], logits[:, 3], logits[:, 5] = 3.0, 2.0, 1.0
    assert ban.uses_history
    assert ban.sample(logits, history).tokens.tolist() == [5, 5, 7]
    assert ban.probs(logits, history)[:, 7].tolist() == [0.0, 0.0, 1.0]
    ban.ban({7, 3}, 0)
    assert not ban.uses_history and ban.sample(logits, history).tokens.tolist() == [7, 7, 7]


def test_a_row_with_nothing_but_stop_tokens_is_not_banned():
    """A row where every other token is already at -inf (a structured output that can only end)
    keeps its stop tokens: the ban never leaves a row with no token to sample."""
    ban = StopTokenBan(ReferenceSampler(SamplerParams(), "cpu"))
    ban.ban({7, 3}, 6)
    history = TokenHistory([1, 2], 16, torch.device("cpu"))
    logits = torch.zeros(2, 10)
    logits[1] = float("-inf")
    logits[1, 3] = 1.0
    assert ban.sample(logits, history).tokens.tolist()[1] == 3
    assert ban.probs(logits, history)[1, 3].item() == 1.0 and ban.probs(logits, history)[0, [3, 7]].sum() == 0


def test_a_structured_output_that_completes_before_min_tokens_ends_there(engine):
    choice = StructuredOutput(choice=["ab"])
    free = engine.generate(PROMPT, SamplingParams(max_tokens=24, structured=choice))
    held = engine.generate(PROMPT, SamplingParams(max_tokens=24, min_tokens=20, structured=choice))
    assert held.text == free.text == "ab" and held.token_ids == free.token_ids


def test_the_engine_honours_stop_token_ids_and_min_tokens(engine, tiny_checkpoint):
    free = engine.generate(PROMPT, SamplingParams(max_tokens=24, ignore_eos=True, logprobs=2))
    tokens = free.token_ids
    stop = tokens[1]
    result = engine.generate(PROMPT, SamplingParams(max_tokens=24, ignore_eos=True, stop_token_ids=[stop]))
    assert result.token_ids == tokens[:2] and result.stats.finish_reason == "stop"
    params = SamplingParams(max_tokens=24, ignore_eos=True, stop_token_ids=[stop], min_tokens=6)
    result = engine.generate(PROMPT, params).token_ids
    assert stop not in result[:6] and len(result) >= 6
    assert result[1] == free.logprobs[1].top[1][0]  # the stop token banned: the next most likely instead
    assert stop not in result[6:-1] and (result[-1] == stop or len(result) == 24)
    speculative = reference_engine(tiny_checkpoint, proposer="ngram", spec_k=3)  # verify steps of several rows
    assert speculative.generate(PROMPT, params).token_ids == result
