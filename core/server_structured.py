"""The structured-output fields of a generation request, as OpenAI and vLLM name them, made into one
``tileinfer.StructuredOutput``.

- ``response_format`` (OpenAI): ``{"type": "text"}`` (no constraint), ``{"type": "json_object"}``
  (any JSON object) or ``{"type": "json_schema", "json_schema": {"name", "description", "schema",
  "strict"}}`` (the reply matches ``schema``; ``strict`` is accepted either way: the grammar always
  holds the reply to the schema);
- vLLM's ``guided_json`` (a schema, object or JSON text), ``guided_regex``, ``guided_choice`` (a
  list of strings) and ``guided_grammar`` (EBNF, xgrammar's GBNF dialect).

At most one of them may constrain a request. Each problem is a 400 naming the field in ``param``
(``response_format.json_schema.schema``, ``guided_regex``, ...): a schema that is not an object, a
regex that does not compile, a grammar or schema the engine cannot compile. A chat reply that
thinks first (Qwen3 with ``enable_thinking``) is constrained after its ``</think>``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tileinfer.openai_api import bad

GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
SCHEMA_PARAM = "response_format.json_schema.schema"


class JsonSchemaFormat(BaseModel):
    """``response_format.json_schema``: OpenAI's named schema (``name`` required, as OpenAI has it)."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """``response_format``: ``text``, ``json_object``, or ``json_schema`` with its ``json_schema``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self):
        if self.type == "json_schema" and self.json_schema is None:
            raise bad('response_format.json_schema is required with type "json_schema"', "response_format.json_schema")
        if self.type != "json_schema" and self.json_schema is not None:
            raise bad(f'response_format.json_schema is only allowed with type "json_schema", not {self.type!r}',
                      "response_format.json_schema")
        return self


def structured_request(parsed) -> tuple[Any, str | None]:
    """The ``StructuredOutput`` of a request (``server_requests._Generation``; None: unconstrained)
    and the field that set it; a 400 naming the field when two set one or a value is not valid."""
    given: list[tuple[str, str, Any]] = []  # (param, StructuredOutput field, value)
    form = parsed.response_format
    if form is not None and form.type == "json_object":
        given.append(("response_format", "json_object", True))
    elif form is not None and form.type == "json_schema":
        given.append((SCHEMA_PARAM, "json", form.json_schema.schema_))
    given += [(name, kind, getattr(parsed, name)) for name, kind in GUIDED.items() if getattr(parsed, name) is not None]
    if not given:
        return None, None
    if len(given) > 1:
        raise bad(f"{given[0][0]} and {given[1][0]} both constrain the reply: give one", given[1][0])
    param, kind, value = given[0]
    from tileinfer.structured import StructuredOutput, StructuredOutputError

    try:
        return StructuredOutput(**{kind: value}), param
    except StructuredOutputError as exc:
        raise bad(f"{param}: {str(exc).split(': ', 1)[1]}", param) from None


def thinks_first(mode: str, tokenizer) -> bool:
    """Whether a chat reply that starts in ``mode`` (``tileinfer.reasoning.thinking_mode`` of its
    generation prompt) thinks before it answers: the template left ``<think>`` open, or the reply
    starts free and ``<think>`` is one token of the vocabulary that the template knows (Qwen3, whose
    replies then open it). A vocabulary without it (the shipped model's) cannot open the block in
    one token: such a reply is constrained from its first token."""
    from tileinfer.reasoning import START, THINK, THINKING

    if mode == THINKING:
        return True
    return mode == START and THINK in (tokenizer.chat_template or "") and THINK in tokenizer.vocab()


def constrain(engine, structured, param: str | None, *, thinks: bool = False):
    """``structured`` for ``engine``: after ``</think>`` when the reply ``thinks`` first (unless it
    already starts after a marker), compiled now; a 400 naming ``param`` when it does not compile
    (or when this tileinfer lacks the grammar engine)."""
    from tileinfer.errors import UsageError
    from tileinfer.reasoning import END_THINK
    from tileinfer.structured import StructuredOutputError

    if thinks and structured.after is None:
        structured = dataclasses.replace(structured, after=END_THINK)
    try:
        engine.compile_structured(structured)
    except StructuredOutputError as exc:
        raise bad(f"{param}: {str(exc).split(': ', 1)[1]}", param) from None
    except UsageError as exc:  # no tokenizer, or xgrammar not installed
        raise bad(f"{param}: {exc}", param, "unsupported_parameter") from None
    return structured


__all__ = ["GUIDED", "JsonSchemaFormat", "ResponseFormat", "SCHEMA_PARAM", "constrain", "structured_request",
           "thinks_first"]
