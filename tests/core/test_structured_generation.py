"""Generation under a grammar (tileinfer.SamplingParams.structured) on the shipped model, whose text is
noise but whose JSON must not be, and on a tiny random checkpoint: every reply that ends on a stop
validates (json.loads + jsonschema, regex fullmatch, in the choice); a property test over generated
JSON schemas; speculation (n-gram, the shipped draft model) gives the tokens plain decoding gives
under the same grammar; a grammar that allows nothing more ends with finish reason "grammar"."""

from __future__ import annotations

import json
import re

import pytest

import tileinfer
from tileinfer import SamplingParams, StructuredOutput
from tileinfer.structured import StructuredOutputError

from conftest import gpu_available

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("xgrammar")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):"
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 6},
    "age": {"type": "integer", "minimum": 0, "maximum": 99},
    "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 2}},
    "required": ["name", "age", "tags"], "additionalProperties": False}
REGEX = r"[a-z]{2,4}-\d{1,3}"
CHOICE = ["yes", "no", "maybe not"]
GRAMMAR = 'root ::= "(" num ("+" num)* ")"\nnum ::= [1-9] [0-9]?'
KINDS = {
    "json": StructuredOutput(json=SCHEMA),
    "json_object": StructuredOutput(json_object=True),
    "regex": StructuredOutput(regex=REGEX),
    "choice": StructuredOutput(choice=CHOICE),
    "grammar": StructuredOutput(grammar=GRAMMAR),
}


def check(kind: str, text: str) -> None:
    """The text matches its constraint (the reply ended on a stop, not at max_tokens)."""
    if kind == "json":
        jsonschema.validate(json.loads(text), SCHEMA)
    elif kind == "json_object":
        assert isinstance(json.loads(text), dict)
    elif kind == "regex":
        assert re.fullmatch(REGEX, text), text
    elif kind == "choice":
        assert text in CHOICE
    else:
        assert re.fullmatch(r"\((?:[1-9][0-9]?)(?:\+[1-9][0-9]?)*\)", text), text


@pytest.fixture(scope="module")
def shipped():
    return tileinfer.Engine.from_config(progress=False)


@pytest.mark.parametrize("kind", KINDS)
def test_every_finished_reply_of_the_shipped_model_matches_its_constraint(shipped, kind):
    finished = 0
    for temperature, seed in ((0.0, 0), (1.0, 1), (1.0, 2), (0.8, 3)):
        params = SamplingParams(max_tokens=64, temperature=temperature, seed=seed, structured=KINDS[kind])
        reply = shipped.generate(PROMPT, params)
        assert reply.stats.finish_reason in ("eos", "length"), reply.stats
        if reply.stats.finish_reason == "eos":
            finished += 1
            check(kind, reply.text)
    assert finished >= 2  # the noise model still ends most replies within 64 tokens once the grammar allows it


def test_a_tiny_random_checkpoint_gives_valid_replies_too(tiny_checkpoint):
    from conftest import reference_engine

    engine = reference_engine(tiny_checkpoint)
    for kind in ("json", "regex", "choice"):
        reply = engine.generate("def", SamplingParams(max_tokens=48, temperature=1.0, seed=5,
                                                       structured=KINDS[kind]))
        if reply.stats.finish_reason != "length":
            check(kind, reply.text)
        else:
            assert reply.stats.new_tokens == 48


def test_a_constraint_the_engine_cannot_compile_fails_before_decoding(shipped):
    with pytest.raises(StructuredOutputError, match="structured output grammar:"):
        shipped.stream(PROMPT, SamplingParams(structured=StructuredOutput(grammar="root ::= nothing")))


def test_a_grammar_that_allows_nothing_more_ends_with_finish_reason_grammar(shipped):
    """With ignore_eos there is no stop token to end on: once "yes" or "no" is complete, the grammar
    allows no token, and the generation ends there."""
    params = SamplingParams(max_tokens=20, ignore_eos=True, structured=StructuredOutput(choice=["yes", "no"]))
    reply = shipped.generate(PROMPT, params)
    assert reply.stats.finish_reason == "grammar" and reply.text in ("yes", "no")
    assert shipped.tokenizer.decode(reply.token_ids) == reply.text  # the token the grammar rejected is not kept


def test_logprobs_stay_the_raw_models_under_a_grammar(shipped):
    params = SamplingParams(max_tokens=8, logprobs=2, structured=StructuredOutput(choice=["yes", "no"]))
    reply = shipped.generate(PROMPT, params)
    plain = shipped.generate(PROMPT, SamplingParams(max_tokens=1, logprobs=2))
    # the first position's top tokens, unmasked (a masked distribution would put all mass on the choices);
    # the plain run may reuse the cached prompt, whose last row a smaller step rounds a little differently
    mine, raw = reply.logprobs[0].top, plain.logprobs[0].top
    assert [t for t, _ in mine] == [t for t, _ in raw]
    assert [v for _, v in mine] == pytest.approx([v for _, v in raw], abs=1e-5)


# -- speculation -----------------------------------------------------------------------------------

@pytest.mark.parametrize("proposer", ["ngram", "draft"])
def test_speculative_decoding_gives_the_tokens_of_plain_decoding_under_a_grammar(shipped, proposer):
    spec = tileinfer.Engine.from_config(overrides=[f"proposer={proposer}", "spec_k=4"], progress=False)
    drafted = 0
    for kind in ("json", "regex", "grammar"):
        params = SamplingParams(max_tokens=40, structured=KINDS[kind])
        plain, fast = shipped.generate(PROMPT, params), spec.generate(PROMPT, params)
        assert fast.token_ids == plain.token_ids, kind
        assert fast.stats.finish_reason == plain.stats.finish_reason
        assert fast.stats.decode_loop == "speculative-sequential"
        drafted += fast.stats.drafted_tokens
    assert drafted > 0


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU")
def test_on_the_gpu_a_grammar_runs_the_split_or_a_host_loop_and_the_stats_say_which():
    pipelined = tileinfer.Engine.from_config(device="cuda", progress=False)
    params = SamplingParams(max_tokens=32, structured=KINDS["json"])
    assert pipelined.generate(PROMPT, SamplingParams(max_tokens=8)).stats.decode_loop == "pipelined"
    reply = pipelined.generate(PROMPT, params)
    assert reply.stats.decode_loop == "pipelined-grammar"
    sequential = tileinfer.Engine.from_config(device="cuda", overrides=["pipelined=false"], progress=False)
    plain = sequential.generate(PROMPT, params)
    assert plain.stats.decode_loop == "sequential" and plain.token_ids == reply.token_ids
    device = tileinfer.Engine.from_config(device="cuda", overrides=["proposer=ngram"], progress=False)
    # the shipped model's generation defaults carry a repetition penalty, which the device loop does not take
    unpenalized = SamplingParams(max_tokens=8, repetition_penalty=1.0)
    assert device.generate(PROMPT, unpenalized).stats.decode_loop == "speculative-device"
    spec = device.generate(PROMPT, params)
    assert spec.stats.decode_loop == "speculative-sequential" and spec.token_ids == reply.token_ids


# -- a property test over JSON schemas -------------------------------------------------------------

def _leaf() -> st.SearchStrategy[dict]:
    bounds = st.tuples(st.integers(-50, 50), st.integers(0, 60)).map(lambda t: (t[0], t[0] + t[1]))
    return st.one_of(
        bounds.map(lambda b: {"type": "integer", "minimum": b[0], "maximum": b[1]}),
        bounds.map(lambda b: {"type": "number", "minimum": b[0], "maximum": b[1]}),
        st.tuples(st.integers(0, 3), st.integers(0, 5)).map(
            lambda t: {"type": "string", "minLength": t[0], "maxLength": t[0] + t[1]}),
        st.lists(st.sampled_from(["red", "green", "blue", 1, None, True]), min_size=1, max_size=4,
                 unique=True).map(lambda values: {"enum": values}),
        st.just({"type": "boolean"}),
    )


def _schema(children: st.SearchStrategy[dict]) -> st.SearchStrategy[dict]:
    names = st.sampled_from(["a", "b", "id", "name", "x_y"])
    objects = st.dictionaries(names, children, min_size=1, max_size=3).flatmap(
        lambda props: st.lists(st.sampled_from(sorted(props)), unique=True).map(
            lambda required: {"type": "object", "properties": props, "required": required,
                              "additionalProperties": False}))
    arrays = st.tuples(children, st.integers(0, 2), st.integers(0, 2)).map(
        lambda t: {"type": "array", "items": t[0], "minItems": t[1], "maxItems": t[1] + t[2]})
    return st.one_of(objects, arrays)


SCHEMAS = st.recursive(_leaf(), _schema, max_leaves=5).filter(lambda s: s.get("type") in ("object", "array"))


@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(schema=SCHEMAS, seed=st.integers(0, 2**16))
def test_every_reply_that_ends_on_a_stop_validates_against_its_generated_schema(shipped, schema, seed):
    params = SamplingParams(max_tokens=48, temperature=1.0, seed=seed, structured=StructuredOutput(json=schema))
    reply = shipped.generate(PROMPT, params)
    if reply.stats.finish_reason == "eos":
        jsonschema.validate(json.loads(reply.text), schema)
    else:
        assert reply.stats.finish_reason == "length"
