"""``tileinfer.SamplingParams``: what one generation does, as vLLM's SamplingParams names it; the one
params type of the Python API, of the server (each request's fields make one) and of the Sampler
interface (``tileinfer.interfaces.SamplingParams`` is this class).

A field left ``None`` takes the engine's value: the config's key of the same name, which is the
checkpoint's generation_config.json unless a config file, a flag or ``KEY=VALUE`` set it
(``tileinfer.sampling_defaults``); ``max_tokens`` ``None`` is the config's ``max_new_tokens``. A
field the caller sets wins. ``resolved(defaults)`` fills the sampling fields left ``None``: a
Sampler is always given params whose sampling fields are all set (the engine's defaults under the
generation's own; ``NEUTRAL``'s, every one off, where a caller gave none).

Every field is checked when the object is made: a bad value is a one-line UsageError naming the
field (``temperature=-1 is not valid: ...``).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tileinfer.config import SAMPLING_KEYS, check_sampling
from tileinfer.errors import ConfigError, UsageError
from tileinfer.structured import StructuredOutput

MAX_STOPS = 16  # stop strings per generation (each is searched for at every token)
MAX_TOP_LOGPROBS = 20
MAX_BIAS = 100.0
INT_KEYS = ("top_k", "seed")  # the other sampling keys are floats


@dataclass(frozen=True)
class SamplingParams:
    """One generation's settings (``Engine.generate(prompts, params)``).

    Sampling (``None``: the engine's default, from the checkpoint's generation_config.json):
    ``temperature`` (0 is greedy), ``top_p``, ``top_k`` (0 is off), ``min_p``,
    ``repetition_penalty`` (1 is off), ``presence_penalty`` and ``frequency_penalty`` (0 is off),
    ``seed`` (the sampler's generator, set again at each generation). The penalties act before
    temperature and the truncations, greedy included: presence and frequency as OpenAI and vLLM
    define them, on the generated tokens (each logit minus ``frequency * count + presence * (count >
    0)``); repetition as Hugging Face and vLLM define it, on the prompt and the generated tokens (a
    seen token's logit divided by it when positive, multiplied by it when not). Their ranges are the
    config's (``config.check_sampling``): finite, ``temperature >= 0``, ``0 < top_p <= 1``, ``0 <=
    min_p < 1``, ``top_k >= 0``, a seed in ``[0, 2**63 - 1]``, presence and frequency in ``[-2, 2]``,
    repetition ``> 0``.

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
            if isinstance(value, numbers.Integral) and key not in INT_KEYS:
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

    def resolved(self, defaults: "SamplingParams") -> "SamplingParams":
        """These params with each sampling field left ``None`` taken from ``defaults`` (the engine's,
        or ``NEUTRAL``); the others as they are."""
        return dataclasses.replace(self, **{key: getattr(defaults, key) for key in SAMPLING_KEYS
                                            if getattr(self, key) is None})

    @property
    def sampling(self) -> dict[str, object]:
        """The sampling fields that are set (the config keys of the same names)."""
        return {key: getattr(self, key) for key in SAMPLING_KEYS if getattr(self, key) is not None}

    @property
    def greedy(self) -> bool:
        """``temperature`` is 0 (of resolved params: a sampler's)."""
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        """Whether any penalty is on (a sampler then reads the token history; of resolved params)."""
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1


def check_logit_bias(value: object) -> dict[int, float] | None:
    """``None`` or ``{token id (int >= 0): bias (a finite number in [-100, 100])}`` as a new dict of
    floats; UsageError naming ``logit_bias`` otherwise (an empty mapping is None: no bias)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise UsageError(f"logit_bias={value!r} is not valid: must be a mapping of token ids to biases")
    out: dict[int, float] = {}
    for token, bias in value.items():
        if not isinstance(token, numbers.Integral) or isinstance(token, bool) or token < 0:
            raise UsageError(f"logit_bias is not valid: {token!r} is not a token id (an integer >= 0)")
        if not isinstance(bias, numbers.Real) or isinstance(bias, bool) or not math.isfinite(bias) \
                or not -MAX_BIAS <= bias <= MAX_BIAS:
            raise UsageError(f"logit_bias is not valid: the bias of token {token} is {bias!r}, not a number in "
                             f"[-{MAX_BIAS:g}, {MAX_BIAS:g}]")
        out[int(token)] = float(bias)
    return out or None


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


# Every sampling field at its off value: greedy, no truncation, no penalty, seed 0 (what a sampler
# built without the engine's defaults takes for the fields its params leave None).
NEUTRAL = SamplingParams(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, seed=0, presence_penalty=0.0,
                         frequency_penalty=0.0, repetition_penalty=1.0)

__all__ = ["MAX_BIAS", "MAX_STOPS", "MAX_TOP_LOGPROBS", "NEUTRAL", "SamplingParams", "check_logit_bias"]
