"""``tileinfer.SamplingParams``: what one generation does, as vLLM's SamplingParams names it.

A field left ``None`` takes the engine's value: the config's key of the same name, which is the
checkpoint's generation_config.json unless a config file, a flag or ``KEY=VALUE`` set it
(``tileinfer.sampling_defaults``); ``max_tokens`` ``None`` is the config's ``max_new_tokens``. A
field the caller sets wins. ``resolved(engine_defaults)`` gives the sampler's full
``tileinfer.interfaces.SamplingParams`` (what a Sampler plugin reads).

Every field is checked when the object is made: a bad value is a one-line UsageError naming the
field (``temperature=-1 is not valid: ...``).
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field

from tileinfer.config import SAMPLING_KEYS, check_sampling
from tileinfer.errors import ConfigError, UsageError
from tileinfer.interfaces import SamplingParams as SamplerParams
from tileinfer.logit_bias import check_logit_bias
from tileinfer.sampling_step import MAX_TOP_LOGPROBS
from tileinfer.structured import StructuredOutput

MAX_STOPS = 16  # stop strings per generation (each is searched for at every token)


@dataclass(frozen=True)
class SamplingParams:
    """One generation's settings (``Engine.generate(prompts, params)``).

    Sampling (``None``: the engine's default, from the checkpoint's generation_config.json):
    ``temperature`` (0 is greedy), ``top_p``, ``top_k`` (0 is off), ``min_p``,
    ``repetition_penalty`` (1 is off; on the prompt and the reply), ``presence_penalty`` and
    ``frequency_penalty`` (0 is off; on the reply), ``seed`` (the sampler's generator, set again at
    each generation).

    Length and stops: ``max_tokens`` new tokens at most (``None``: the config's max_new_tokens);
    ``stop``: strings that end the generation where the text first contains one (the text ends
    before it unless ``include_stop_str_in_output``); ``stop_token_ids``: tokens that end it (their
    text left out unless ``include_stop_str_in_output``, as for an EOS); ``ignore_eos``: the
    checkpoint's EOS tokens do not end it (``stop_token_ids`` still do); ``min_tokens``: the first
    that many tokens are never an EOS or a stop token (they are not sampled there, as in vLLM) and a
    stop string they complete does not end the generation.

    Output: ``skip_special_tokens`` leaves special tokens out of the text; ``logprobs``: each
    token's log-probability and the ``logprobs`` most likely tokens of its position (0 to 20;
    ``None``: none); ``prompt_logprobs``: the same for each prompt token (0 to 20: top tokens per
    position; ``None``: none), on ``Generation.prompt_logprobs``, None for the first prompt token.
    Computed in the prefill, chunk by chunk (``tileinfer.prompt_logprobs``): such a generation
    prefills its whole prompt, reusing none of it from the prefix cache.

    ``logit_bias``: ``{token id: bias}``, each bias -100 to 100, added to those tokens' logits before
    the penalties, temperature and truncations (OpenAI's ``logit_bias``; ``tileinfer.logit_bias``);
    logprobs stay the raw model's.

    ``structured``: a ``tileinfer.StructuredOutput`` (a JSON schema, any JSON object, a regex, a
    choice or an EBNF grammar) the text must match: tokens it does not allow are masked before
    every other stage, an EOS only where it is complete; a grammar that allows no token ends the
    generation with finish reason ``"grammar"`` (``tileinfer.structured``).

    ``cache_salt`` (vLLM's): a non-empty string that keys the prefix reuse: the keys and values a
    generation leaves in the KV store serve only the next prompt with the same salt (None: the
    unsalted ones; ``tileinfer.prefix_cache``). Clients of one engine that must not learn whether
    another's prompt started like theirs (from the time to the first token) give each their own
    secret salt.
    """

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: str | Sequence[str] = field(default=())
    stop_token_ids: Sequence[int] = field(default=())
    ignore_eos: bool = False
    min_tokens: int = 0
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    logit_bias: dict[int, float] | None = None
    structured: StructuredOutput | None = None
    cache_salt: str | None = None

    def __post_init__(self) -> None:
        try:
            check_sampling({key: getattr(self, key) for key in SAMPLING_KEYS if getattr(self, key) is not None})
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
        for key in SAMPLING_KEYS:  # an int where a float is meant (temperature=1) reads as that float
            value = getattr(self, key)
            if isinstance(value, numbers.Integral) and isinstance(getattr(SamplerParams, key), float):
                object.__setattr__(self, key, float(value))
        if self.max_tokens is not None:
            object.__setattr__(self, "max_tokens", _count("max_tokens", self.max_tokens, 1))
        object.__setattr__(self, "min_tokens", _count("min_tokens", self.min_tokens, 0))
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise UsageError(f"min_tokens={self.min_tokens} is not valid: more than max_tokens={self.max_tokens}")
        object.__setattr__(self, "stop", _stops(self.stop))
        object.__setattr__(self, "stop_token_ids", _token_ids(self.stop_token_ids))
        for key in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens"):
            if not isinstance(getattr(self, key), bool):
                raise UsageError(f"{key}={getattr(self, key)!r} is not valid: must be True or False")
        for key in ("logprobs", "prompt_logprobs"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, numbers.Integral) or isinstance(value, bool)
                                      or not 0 <= value <= MAX_TOP_LOGPROBS):
                raise UsageError(f"{key}={value!r} is not valid: must be None or an integer in "
                                 f"[0, {MAX_TOP_LOGPROBS}] (top tokens per position)")
        object.__setattr__(self, "logit_bias", check_logit_bias(self.logit_bias))
        if self.structured is not None and not isinstance(self.structured, StructuredOutput):
            raise UsageError(f"structured={self.structured!r} is not valid: must be a tileinfer.StructuredOutput "
                             "or None")
        if self.cache_salt is not None and (not isinstance(self.cache_salt, str) or not self.cache_salt):
            raise UsageError(f"cache_salt={self.cache_salt!r} is not valid: must be None or a non-empty string")

    def resolved(self, defaults: SamplerParams) -> SamplerParams:
        """The sampler's params: ``defaults`` (the engine's) with the fields set here."""
        return dataclasses.replace(defaults, **{key: getattr(self, key) for key in SAMPLING_KEYS
                                                if getattr(self, key) is not None})

    @classmethod
    def of_sampler(cls, sampler: SamplerParams, **fields) -> "SamplingParams":
        """Every sampling field as ``sampler`` (a full ``tileinfer.interfaces.SamplingParams``) sets
        it, and ``fields``."""
        return cls(**{key: getattr(sampler, key) for key in SAMPLING_KEYS}, **fields)


def _count(key: str, value: object, minimum: int) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < minimum:
        raise UsageError(f"{key}={value!r} is not valid: must be an integer >= {minimum}")
    return int(value)


def _stops(value: object) -> tuple[str, ...]:
    stops = (value,) if isinstance(value, str) else value
    if not isinstance(stops, Sequence) or not all(isinstance(s, str) for s in stops):
        raise UsageError(f"stop={value!r} is not valid: must be a string or a list of strings")
    if any(s == "" for s in stops):
        raise UsageError("stop is not valid: a stop string must not be empty")
    if len(stops) > MAX_STOPS:
        raise UsageError(f"stop is not valid: at most {MAX_STOPS} strings, got {len(stops)}")
    return tuple(dict.fromkeys(stops))


def _token_ids(value: object) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not all(
            isinstance(t, numbers.Integral) and not isinstance(t, bool) and t >= 0 for t in value):
        raise UsageError(f"stop_token_ids={value!r} is not valid: must be a list of token ids (integers >= 0)")
    return tuple(int(t) for t in value)


__all__ = ["MAX_STOPS", "SamplingParams"]
