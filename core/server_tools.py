"""The tool fields of a /v1/chat/completions body, checked by pydantic models as OpenAI defines
them: ``tools`` (function tools: ``{"type": "function", "function": {"name", "description",
"parameters", "strict"}}``, ``parameters`` a JSON schema checked with jsonschema), ``tool_choice``
("none", "auto", "required" or ``{"type": "function", "function": {"name"}}``) and the
``tool_calls`` of an assistant message in the history. ``check_tool_choice`` checks them
together; each problem is a 400 naming the field (a history call's ``arguments`` that are not a JSON
object's text: ``messages[1].tool_calls[0].function.arguments``).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

import jsonschema
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from tileinfer.openai_api import bad

NAME_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"  # OpenAI's rule for a function's name


class _Strict(BaseModel):
    """No unknown fields, no coercion, ``null`` as absent."""

    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _absent(cls, body: Any) -> Any:
        return {k: v for k, v in body.items() if v is not None} if isinstance(body, dict) else body


class Function(_Strict):
    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _schema(cls, parameters: dict[str, Any]) -> dict[str, Any]:
        try:
            jsonschema.validators.validator_for(parameters).check_schema(parameters)
        except jsonschema.SchemaError as exc:
            where = "".join(f"[{p!r}]" for p in exc.path)
            raise PydanticCustomError("json_schema", "not a valid JSON schema: {where}{message}",
                                      {"where": f"at {where}: " if where else "", "message": exc.message}) from None
        if parameters.get("type", "object") != "object":
            raise PydanticCustomError("json_schema", 'a function\'s parameters are an object: "type" must be "object"')
        return parameters


class Tool(_Strict):
    type: Literal["function"]
    function: Function


class FunctionName(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: FunctionName


CHOICES = ("none", "auto", "required")


def _tool_choice(value: Any) -> Any:
    """A choice string, or the named function's choice checked (its error names ``tool_choice``)."""
    if isinstance(value, str) and value in CHOICES:
        return value
    if isinstance(value, dict):
        try:
            return NamedToolChoice.model_validate(value)
        except ValidationError as exc:
            error = exc.errors(include_url=False)[0]
            where = ".".join(map(str, error["loc"]))
            raise PydanticCustomError("tool_choice", "{where}: {message}",
                                      {"where": where, "message": error["msg"]}) from None
    choices = '"none", "auto", "required" or {"type": "function", "function": {"name": ...}}'
    raise PydanticCustomError("tool_choice", "must be {choices}", {"choices": choices})


ToolChoice = Annotated[str | NamedToolChoice, BeforeValidator(_tool_choice)]


class CalledFunction(_Strict):
    name: str
    arguments: str | dict[str, Any]  # JSON text of an object (OpenAI's), or the object itself

    @field_validator("arguments")
    @classmethod
    def _object_text(cls, arguments: str | dict[str, Any]) -> str | dict[str, Any]:
        if isinstance(arguments, str):
            try:
                value = json.loads(arguments)
            except ValueError:
                value = None
            if not isinstance(value, dict):
                raise PydanticCustomError("arguments", "must be the JSON text of an object (or the object)")
        return arguments


class MessageToolCall(_Strict):
    """A call an assistant message made, as OpenAI's response gave it."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: CalledFunction


def check_tool_choice(tools: list[Tool] | None, tool_choice: ToolChoice | None) -> None:
    """Tool names unique, and a ``tool_choice`` that has tools to choose from and names one of
    them; APIError(400) naming the field otherwise."""
    names: list[str] = []
    for i, tool in enumerate(tools or ()):
        if tool.function.name in names:
            raise bad(f"tools[{i}].function.name: {tool.function.name!r} is given twice",
                      f"tools[{i}].function.name")
        names.append(tool.function.name)
    if tool_choice is None or tool_choice == "none":
        return
    if not names:
        raise bad("tool_choice needs tools to choose from", "tool_choice")
    if isinstance(tool_choice, NamedToolChoice) and tool_choice.function.name not in names:
        raise bad(f"tool_choice names the function {tool_choice.function.name!r}, which is not among tools "
                  f"({', '.join(map(repr, names))})", "tool_choice")


def choice_of(tools: list[Tool] | None, tool_choice: ToolChoice | None) -> tuple[str, str | None]:
    """(kind, name): "none", "auto" or "required" and None, or "function" and the named function's
    name; OpenAI's default is "auto" with tools, "none" without."""
    if isinstance(tool_choice, NamedToolChoice):
        return "function", tool_choice.function.name
    return tool_choice or ("auto" if tools else "none"), None


__all__ = ["CalledFunction", "Function", "MessageToolCall", "NamedToolChoice", "Tool", "ToolChoice",
           "check_tool_choice", "choice_of"]
