"""Structured outputs without a model run: StructuredOutput's checks, the compile step against a real
tokenizer (the shipped model's), the matcher (its mask, rollback and the ``after`` marker), the mask
stage on logits, the draft cut that keeps speculative sampling exact, and the plan's fallback to a
host-read loop for a generation with a grammar."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
import torch

import tileinfer
from tileinfer.checkpoint import read_checkpoint, shipped_model
from tileinfer.decode_plan import DecodePlan
from tileinfer.errors import UsageError
from tileinfer.grammar_mask import TokenMask
from tileinfer.interfaces import Draft
from tileinfer.speculative import verify_sampled
from tileinfer.strategies import _cut
from tileinfer.structured import GrammarCompiler, StructuredOutput, StructuredOutputError

pytest.importorskip("xgrammar")

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
          "required": ["n"], "additionalProperties": False}


@pytest.fixture(scope="module")
def compiler() -> GrammarCompiler:
    checkpoint = read_checkpoint(shipped_model())
    return GrammarCompiler(checkpoint.tokenizer, checkpoint.config.vocab_size, checkpoint.config.eos_token_ids)


@pytest.fixture(scope="module")
def tokenizer(compiler):
    return compiler.tokenizer


# -- StructuredOutput ------------------------------------------------------------------------------

BAD = {
    "none": ({}, "json", "exactly one"),
    "two": ({"regex": "a", "choice": ["a"]}, "choice", "exactly one"),
    "schema-not-object": ({"json": [1, 2]}, "json", "must be a JSON object"),
    "schema-text-not-json": ({"json": "{'type': 1"}, "json", "not valid JSON text"),
    "schema-text-array": ({"json": "[]"}, "json", "must be a JSON object"),
    "regex-does-not-compile": ({"regex": "a("}, "regex", "not a valid regular expression"),
    "regex-empty": ({"regex": ""}, "regex", "non-empty string"),
    "choice-empty": ({"choice": []}, "choice", "non-empty list"),
    "choice-str": ({"choice": "yes"}, "choice", "list of non-empty strings"),
    "choice-empty-string": ({"choice": ["yes", ""]}, "choice", "list of non-empty strings"),
    "choice-not-str": ({"choice": ["yes", 1]}, "choice", "list of non-empty strings"),
    "grammar-not-str": ({"grammar": 3}, "grammar", "non-empty string"),
    "json-object-not-bool": ({"json_object": 1}, "json_object", "True or False"),
    "after-empty": ({"regex": "a", "after": ""}, "after", "non-empty string"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_structured_outputs_name_their_field_in_one_line(case):
    fields, field, words = BAD[case]
    with pytest.raises(StructuredOutputError, match=re.escape(words)) as caught:
        StructuredOutput(**fields)
    assert caught.value.field == field and isinstance(caught.value, UsageError)
    assert "\n" not in str(caught.value) and str(caught.value).startswith(f"structured output {field}:")


def test_a_schema_as_text_or_dict_is_one_constraint_and_one_cache_key():
    as_text = StructuredOutput(json=json.dumps(SCHEMA))
    as_dict = StructuredOutput(json=dict(reversed(list(SCHEMA.items()))))
    assert as_text == as_dict and as_text.key == as_dict.key and hash(as_text) == hash(as_dict)
    assert StructuredOutput(choice=["a", "b"]).choice == ("a", "b")
    assert StructuredOutput(choice=["a", 'b"c']).ebnf() == 'root ::= "a" | "b\\"c"'
    assert tileinfer.StructuredOutput is StructuredOutput


def test_sampling_params_take_a_structured_output_only():
    params = tileinfer.SamplingParams(structured=StructuredOutput(regex="[ab]+"))
    assert params.structured.kind == "regex"
    with pytest.raises(UsageError, match="structured=.* must be a tileinfer.StructuredOutput"):
        tileinfer.SamplingParams(structured={"regex": "a"})


# -- compiling -------------------------------------------------------------------------------------

ENGINE_REFUSES = {
    "unknown-type": (StructuredOutput(json={"type": "nope"}), "json", "nope"),
    "bad-ebnf": (StructuredOutput(grammar="root ::= undefined_rule"), "grammar", "undefined_rule"),
    "lookahead": (StructuredOutput(regex="a(?=b)"), "regex", "Lookahead is not supported"),
}


@pytest.mark.parametrize("case", ENGINE_REFUSES)
def test_a_constraint_xgrammar_refuses_is_a_usage_error_naming_the_field(compiler, case):
    structured, field, words = ENGINE_REFUSES[case]
    with pytest.raises(StructuredOutputError, match=re.escape(words)) as caught:
        compiler.compile(structured)
    assert caught.value.field == field and "\n" not in str(caught.value) and ".cc:" not in str(caught.value)


def test_compiled_grammars_are_cached_by_key(compiler):
    first = compiler.compile(StructuredOutput(json=SCHEMA))
    assert compiler.compile(StructuredOutput(json=json.dumps(SCHEMA), after="</think>")) is first


# -- the matcher -----------------------------------------------------------------------------------

def allowed(matcher, tokenizer) -> set[str]:
    bitmask = torch.zeros(1, matcher.words, dtype=torch.int32)
    if not matcher.mask(bitmask):
        return set()
    ids = [t for t in range(matcher.vocab_size) if bitmask[0, t // 32] >> (t % 32) & 1]
    return {tokenizer.decode([t], skip_special_tokens=False) for t in ids}


def test_the_mask_allows_what_the_grammar_does_and_the_stop_tokens_only_at_its_end(compiler, tokenizer):
    matcher = compiler.matcher(StructuredOutput(choice=["yes", "no"]), stop_tokens=[2])
    first = allowed(matcher, tokenizer)
    assert first and first <= {"y", "ye", "yes", "n", "no"} and "<|im_end|>" not in first
    for token in tokenizer.encode("no", add_special_tokens=False):
        assert matcher.accept(token)
    assert allowed(matcher, tokenizer) == {"<|im_end|>"} and not matcher.is_terminated()
    assert not matcher.accept(tokenizer.encode("x", add_special_tokens=False)[0])
    assert matcher.accept(2) and matcher.is_terminated()


def test_rollback_undoes_accepted_tokens(compiler, tokenizer):
    matcher = compiler.matcher(StructuredOutput(regex="(ab|cd)+"), stop_tokens=[2])
    ab, cd = (tokenizer.encode(text, add_special_tokens=False) for text in ("ab", "cd"))
    start = allowed(matcher, tokenizer)
    assert all(matcher.accept(t) for t in ab + cd)
    assert matcher.admissible(ab + tokenizer.encode("x", add_special_tokens=False) + cd) == len(ab)
    matcher.rollback(len(ab + cd))
    assert allowed(matcher, tokenizer) == start


def test_the_constraint_starts_after_the_marker(compiler, tokenizer):
    matcher = compiler.matcher(StructuredOutput(choice=["yes"], after="</end>"), stop_tokens=[2])
    free = allowed(matcher, tokenizer)
    assert len(free) > 1000  # everything, the stop token included, before the marker
    thinking = tokenizer.encode("hmm </en", add_special_tokens=False)
    assert all(matcher.accept(t) for t in thinking) and not matcher.is_terminated()
    closing = tokenizer.encode("d>", add_special_tokens=False)
    assert all(matcher.accept(t) for t in closing)
    assert allowed(matcher, tokenizer) <= {"y", "ye", "yes"}
    matcher.rollback(len(closing))  # back before the marker: free again
    assert allowed(matcher, tokenizer) == free
    assert all(matcher.accept(t) for t in tokenizer.encode("d>ye", add_special_tokens=False))  # text past it counts
    assert allowed(matcher, tokenizer) == {"s"}


def test_the_mask_stage_sets_disallowed_logits_to_minus_infinity_per_row(compiler, tokenizer):
    matcher = compiler.matcher(StructuredOutput(regex="ab(cd)?"), stop_tokens=[2])
    drafts = tokenizer.encode("ab", add_special_tokens=False)
    logits = torch.randn(len(drafts) + 1, matcher.vocab_size)
    masked = TokenMask(matcher, torch.device("cpu")).apply(logits, drafts)
    rows = [{tokenizer.decode([t]) for t in row.isfinite().nonzero().flatten()} for row in masked[:-1]]
    assert rows[0] <= {"a", "ab"} and rows[-1] <= {"b"} if len(drafts) > 1 else True
    last = {tokenizer.decode([t], skip_special_tokens=False) for t in masked[-1].isfinite().nonzero().flatten()}
    assert "<|im_end|>" in last and last - {"<|im_end|>"} <= {"c", "cd"}
    kept = masked.isfinite()
    assert torch.equal(masked[kept], logits[kept])  # the allowed logits unchanged
    assert allowed(matcher, tokenizer) == allowed(compiler.matcher(StructuredOutput(regex="ab(cd)?"), [2]), tokenizer)


# -- speculation -----------------------------------------------------------------------------------

def test_cutting_a_sampled_draft_keeps_speculative_sampling_exact():
    """A draft token d drawn from q that the grammar rejects (p(d) = 0) is cut: the token there is
    drawn from max(0, p - q), as the p/q rule would after rejecting d. Over many seeds the empirical
    distribution matches p."""
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])  # the masked target: token 3 not allowed
    q = torch.tensor([0.1, 0.1, 0.2, 0.6])
    draft, cut = _cut(Draft([3], q[None]), keep=0)
    assert draft.tokens == [] and torch.equal(cut, q)
    generator = torch.Generator().manual_seed(0)
    sampler = SimpleNamespace(probs=lambda logits: p.expand(logits.shape[0], 4),
                              uniform=lambda n: torch.rand(n, generator=generator),
                              draw=lambda probs: (probs / torch.empty_like(probs).exponential_(generator=generator))
                              .argmax(-1))
    counts = torch.zeros(4)
    trials = 20000
    for _ in range(trials):
        # d ~ q; when d is allowed the rule runs as usual, when it is not (d == 3) the draft is cut
        d = int(torch.multinomial(q, 1, generator=generator))
        if d == 3:
            token = verify_sampled([], None, torch.zeros(1, 4), sampler, cut_q=q)[0]
        else:
            token = verify_sampled([d], q[None], torch.zeros(2, 4), sampler)[0]
        counts[token] += 1
    assert torch.allclose(counts / trials, p, atol=0.015)


def test_a_generation_with_a_grammar_drafts_on_the_host_and_splits_its_plain_steps():
    greedy = SimpleNamespace(greedy=True, uses_history=False)
    proposer = SimpleNamespace(device_drafting=lambda positions: True)
    device = DecodePlan("device", True, spec_k=3, proposer=proposer)
    assert device.choose(greedy, 10, 10, None, 512).loop == "speculative-device"
    choice = device.choose(greedy, 10, 10, None, 512, grammar=True)
    assert choice.loop == "speculative-sequential" and "grammar" in choice.reason
    pipelined = DecodePlan("plain", True).choose(greedy, 10, 10, None, 512, grammar=True)
    assert pipelined.loop == "pipelined-grammar" and pipelined.split and pipelined.ahead
