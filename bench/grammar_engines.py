"""xgrammar against llguidance on tileinfer's schemas: compile time and per-token mask time.

``python -m bench.grammar_engines [--model FOLDER]`` (default: the shipped model's tokenizer) compiles
each schema of ``SCHEMAS`` with both engines (caches off: every compile is a cold one), then walks a
valid instance of it token by token, timing the mask of each position (xgrammar
``fill_next_token_bitmask``, llguidance ``fill_next_token_bitmask``, both into a CPU bitmask) and
checking that every token of the instance is allowed. Prints one line per engine and schema: the
median of ``--repeat`` compiles, and the median and 99th percentile of the mask times. Needs both
packages (``pip install xgrammar llguidance``); the engine uses xgrammar (``tileinfer.structured``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

SCHEMAS = {
    "flat": ({"type": "object", "properties": {"name": {"type": "string", "maxLength": 16},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 150}},
              "required": ["name", "age"]},
             {"name": "Ada", "age": 36}),
    "enum+array": ({"type": "object", "properties": {
        "colour": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 8}, "maxItems": 4}},
        "required": ["colour", "tags"]},
        {"colour": "green", "tags": ["a", "bc", "def"]}),
    "nested": ({"type": "object", "properties": {
        "user": {"type": "object", "properties": {"id": {"type": "integer"}, "email": {"type": "string"}},
                 "required": ["id", "email"]},
        "items": {"type": "array", "items": {"type": "object", "properties": {
            "sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1},
            "price": {"type": "number", "minimum": 0}}, "required": ["sku", "qty", "price"]}}},
        "required": ["user", "items"]},
        {"user": {"id": 7, "email": "a@b.c"}, "items": [{"sku": "x-1", "qty": 2, "price": 9.5},
                                                         {"sku": "y-2", "qty": 1, "price": 0.25}]}),
    "tool-call": ({"type": "object", "properties": {
        "name": {"const": "get_weather"},
        "arguments": {"type": "object", "properties": {"city": {"type": "string"},
                                                       "unit": {"enum": ["celsius", "fahrenheit"]}},
                      "required": ["city"]}}, "required": ["name", "arguments"]},
        {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}),
}


def _ms(seconds: list[float]) -> str:
    ordered = sorted(seconds)
    return f"median {statistics.median(ordered) * 1e3:.3f} ms, p99 {ordered[int(0.99 * (len(ordered) - 1))] * 1e3:.3f} ms"


def bench_xgrammar(tokenizer, vocab_size: int, eos: list[int], schema: dict, tokens: list[int],
                   repeat: int) -> tuple[list, list]:
    import xgrammar as xgr

    from tileinfer.structured import MAX_WHITESPACE, tokenizer_info

    info = tokenizer_info(tokenizer, vocab_size, eos)
    compiles, masks = [], []
    for _ in range(repeat):
        compiler = xgr.GrammarCompiler(info, cache_enabled=False)
        start = time.perf_counter()
        compiled = compiler.compile_json_schema(json.dumps(schema), any_whitespace=True,
                                                max_whitespace_cnt=MAX_WHITESPACE)
        compiles.append(time.perf_counter() - start)
    matcher = xgr.GrammarMatcher(compiled)
    bitmask = xgr.allocate_token_bitmask(1, vocab_size)
    for token in tokens:
        start = time.perf_counter()
        matcher.fill_next_token_bitmask(bitmask)
        masks.append(time.perf_counter() - start)
        assert bitmask[0, token // 32] >> (token % 32) & 1, "xgrammar forbids a token of the instance"
        assert matcher.accept_token(token)
    return compiles, masks


def bench_llguidance(tokenizer, vocab_size: int, eos: list[int], schema: dict, tokens: list[int],
                     repeat: int) -> tuple[list, list]:
    import llguidance
    import llguidance.hf
    import llguidance.torch
    from transformers import PreTrainedTokenizerFast

    lltok = llguidance.hf.from_tokenizer(PreTrainedTokenizerFast(tokenizer_object=tokenizer._tok),
                                         n_vocab=vocab_size)
    compiles, masks = [], []
    for _ in range(repeat):
        start = time.perf_counter()
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": True})
        matcher = llguidance.LLMatcher(lltok, grammar)
        compiles.append(time.perf_counter() - start)
    assert not matcher.is_error(), matcher.get_error()
    bitmask = llguidance.torch.allocate_token_bitmask(1, vocab_size)
    for token in tokens:
        start = time.perf_counter()
        llguidance.torch.fill_next_token_bitmask(matcher, bitmask, 0)
        masks.append(time.perf_counter() - start)
        assert bitmask[0, token // 32] >> (token % 32) & 1, "llguidance forbids a token of the instance"
        assert matcher.consume_token(token), matcher.get_error()
    return compiles, masks


def main(argv: list[str] | None = None) -> None:
    from tileinfer.checkpoint import read_checkpoint, shipped_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="a checkpoint folder (default: the shipped model)")
    parser.add_argument("--repeat", type=int, default=5, help="cold compiles per schema and engine")
    args = parser.parse_args(argv)
    checkpoint = read_checkpoint(args.model or shipped_model())
    tokenizer, vocab_size = checkpoint.tokenizer, checkpoint.config.vocab_size
    print(f"tokenizer of {checkpoint.folder}: {tokenizer.vocab_size} tokens, lm_head {vocab_size} rows")
    for name, (schema, instance) in SCHEMAS.items():
        tokens = tokenizer.encode(json.dumps(instance, separators=(",", ":")), add_special_tokens=False)
        for engine, run in (("xgrammar", bench_xgrammar), ("llguidance", bench_llguidance)):
            compiles, masks = run(tokenizer, vocab_size, list(checkpoint.config.eos_token_ids), schema, tokens,
                                  args.repeat)
            print(f"{name:11s} {engine:10s} compile {statistics.median(compiles) * 1e3:8.2f} ms | "
                  f"{len(masks)} masks: {_ms(masks)}")


if __name__ == "__main__":
    main()
