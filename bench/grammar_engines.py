"""xgrammar against llguidance on tileinfer's schemas: compile time and per-token mask time.

``python -m bench grammars [--model FOLDER]`` (default: the shipped model's tokenizer) compiles
each schema of ``SCHEMAS`` with both engines (caches off: every compile is a cold one), then walks a
valid instance of it token by token, timing the mask of each position (xgrammar
``fill_next_token_bitmask``, llguidance ``fill_next_token_bitmask``, both into a CPU bitmask) and
checking that every token of the instance is allowed. Prints and records (kind ``grammar_engines``,
one record per engine and schema) the median of ``--repeat`` compiles, and the median and 99th
percentile of the mask times. Needs both packages (``pip install xgrammar llguidance``); the engine
uses xgrammar (``tileinfer.structured``).
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from . import records

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


def _percentile_ms(seconds: list[float], q: float) -> float:
    ordered = sorted(seconds)
    return ordered[int(q * (len(ordered) - 1))] * 1e3


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


def arguments(p) -> None:
    p.description = __doc__.split("\n\n")[0]
    p.add_argument("--model", type=Path, default=None, help="a checkpoint folder (default: the shipped model)")
    p.add_argument("--repeat", type=int, default=5, help="cold compiles per schema and engine")
    records.arguments(p)


def main(args) -> int:
    from tileinfer.checkpoint import read_checkpoint, shipped_model

    checkpoint = read_checkpoint(args.model or shipped_model())
    tokenizer, vocab_size = checkpoint.tokenizer, checkpoint.config.vocab_size
    print(f"tokenizer of {checkpoint.folder}: {tokenizer.vocab_size} tokens, lm_head {vocab_size} rows")
    run = records.Run("cpu", commit=args.commit, path=args.records)
    for name, (schema, instance) in SCHEMAS.items():
        tokens = tokenizer.encode(json.dumps(instance, separators=(",", ":")), add_special_tokens=False)
        for engine, bench in (("xgrammar", bench_xgrammar), ("llguidance", bench_llguidance)):
            compiles, masks = bench(tokenizer, vocab_size, list(checkpoint.config.eos_token_ids), schema, tokens,
                                    args.repeat)
            r = run.add("grammar_engines", engine=engine, schema=name, model=checkpoint.folder.name,
                        vocab=vocab_size, compile_ms=statistics.median(compiles) * 1e3, masks=len(masks),
                        mask_median_ms=statistics.median(masks) * 1e3, mask_p99_ms=_percentile_ms(masks, 0.99))
            print(f"{name:11s} {engine:10s} compile {r['compile_ms']:8.2f} ms | {len(masks)} masks: median "
                  f"{r['mask_median_ms']:.3f} ms, p99 {r['mask_p99_ms']:.3f} ms")
    print(f"appended {len(run.records)} records to {run.path}")
    return 0
