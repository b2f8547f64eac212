"""What a generation gives back: ``Generation`` (``Engine.generate``, ``Engine.chat``), the
``Chunk``s of ``Engine.stream``, and the ``GenerationStats`` both carry."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tileinfer.sampling_step import TokenLogprob
from tileinfer.tool_calls import ToolCall


@dataclass
class GenerationStats:
    prompt_tokens: int
    new_tokens: int
    prefill_ms: float  # prompt in, first token out (pipelined: read after step 1 was enqueued)
    decode_tok_s: float  # tokens after the first, over the time from the first to the last
    steps: int  # steps after the prefill whose tokens were committed (not one a pipelined run discards after an EOS)
    tokens_per_step: float  # new tokens after the first, per step
    drafted_tokens: int  # speculative tokens proposed (0 without a proposer)
    accepted_tokens: int  # of which the target kept
    finish_reason: str  # "eos" (an EOS token), "stop" (a stop string or a token of stop_token_ids), "length" or
    # "grammar" (params.structured allowed no token, or ended without a stop token to end on)
    weight_bytes: int  # bytes of the loaded weights (INT8 linears: int8 rows and float32 scales)
    kv_bytes: int  # bytes of the KV pool
    kv_capacity: int  # positions the KV pool holds (kv_capacity resolved: auto sized by the model and the memory)
    decode_loop: str = ""  # sequential, pipelined(-grammar), speculative-sequential or -device (decode_plan.LOOPS)
    stop_reason: str | int | None = None  # the stop string or stop token that ended it ("stop" only)
    cached_tokens: int = 0  # prompt tokens the previous generation left in the KV cache, not prefilled again


@dataclass
class Chunk:
    """What ``Engine.stream`` yields: the tokens committed by one step and their text (None without
    a tokenizer; text held back until a character is complete). The last chunk has no tokens, the
    rest of the text, and the generation's ``stats``."""

    token_ids: list[int]
    text: str | None
    stats: GenerationStats | None = None
    logprobs: list[TokenLogprob] | None = None  # one per token, when params.logprobs asked for them
    prompt_logprobs: list[TokenLogprob | None] | None = None  # the first chunk's: params.prompt_logprobs


@dataclass
class Generation:
    token_ids: list[int]  # the new tokens (the EOS or stop token that ended the generation included)
    text: str | None  # their text up to the stop (params: skip_special_tokens, include_stop_str_in_output; None without a tokenizer)
    stats: GenerationStats
    logprobs: list[TokenLogprob] | None = None  # one per token, when params.logprobs asked for them
    # one per prompt token (None for the first), when params.prompt_logprobs asked for them
    prompt_logprobs: list[TokenLogprob | None] | None = None
    # Engine.chat: the reply's thinking (None: it did not think), its answer, and with tools the calls it made
    reasoning: str | None = None
    content: str | None = None
    tool_calls: list[ToolCall] | None = None

    def to_dict(self) -> dict:
        out = {"token_ids": self.token_ids, "text": self.text, "stats": asdict(self.stats)}
        if self.logprobs is not None:
            out["logprobs"] = [asdict(lp) for lp in self.logprobs]
        if self.prompt_logprobs is not None:
            out["prompt_logprobs"] = [None if lp is None else asdict(lp) for lp in self.prompt_logprobs]
        out.update({k: getattr(self, k) for k in ("reasoning", "content") if getattr(self, k) is not None})
        if self.tool_calls is not None:
            out["tool_calls"] = [call.to_openai() for call in self.tool_calls]
        return out


__all__ = ["Chunk", "Generation", "GenerationStats"]
