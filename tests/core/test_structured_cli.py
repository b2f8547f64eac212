"""The structured-output flags of `tileinfer generate` (and chat's, which share them): each makes the
reply match its constraint on the shipped model; a bad value or unreadable file is one error line
naming the flag, exit status 2; two at once are refused by the parser."""

from __future__ import annotations

import json
import re

import pytest

from conftest import run_cli

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("xgrammar")

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["n"],
          "additionalProperties": False}


def generate(capsys, *flags: str) -> dict:
    code, out, err = run_cli(capsys, "generate", "--prompt", "def f(", "--max-new-tokens", "48", "--json", "-q",
                             *flags)
    assert code == 0, err
    return json.loads(out)


@pytest.mark.parametrize("as_file", [True, False])
def test_json_schema_from_a_file_or_as_text(capsys, tmp_path, as_file):
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(SCHEMA))
    finished = 0
    for seed in ("1", "2", "3"):
        result = generate(capsys, "--json-schema", str(path) if as_file else json.dumps(SCHEMA), "--temperature", "1",
                          "--seed", seed)
        if result["stats"]["finish_reason"] == "eos":
            finished += 1
            jsonschema.validate(json.loads(result["text"]), SCHEMA)
    assert finished


def test_choice_regex_json_object_and_grammar(capsys, tmp_path):
    assert generate(capsys, "--choice", "yes", "--choice", "no")["text"] in ("yes", "no")
    assert re.fullmatch(r"[a-c]{3}", generate(capsys, "--regex", "[a-c]{3}")["text"])
    reply = generate(capsys, "--json-object", "--temperature", "1", "--seed", "2")
    assert reply["stats"]["finish_reason"] == "length" or isinstance(json.loads(reply["text"]), dict)
    grammar = tmp_path / "pair.gbnf"
    grammar.write_text('root ::= "(" [0-9] "," [0-9] ")"\n')
    assert re.fullmatch(r"\([0-9],[0-9]\)", generate(capsys, "--grammar", str(grammar))["text"])


@pytest.mark.parametrize("flags,words", [
    (["--regex", "a("], "--regex: not a valid regular expression"),
    (["--regex", "a(?=b)"], "--regex: Regex parsing error"),
    (["--grammar", "/no/such/file"], "--grammar /no/such/file: cannot read"),
    (["--json-schema", "/no/such/schema.json"], "--json-schema /no/such/schema.json: cannot read"),
    (["--json-schema", "{not json"], "--json-schema: not valid JSON text"),
    (["--json-schema", '{"type": "nope"}'], "--json-schema: Unsupported type"),
    (["--choice", ""], "--choice: must be a non-empty list of non-empty strings"),
])
def test_a_bad_constraint_is_one_error_line_naming_the_flag(capsys, flags, words):
    code, out, err = run_cli(capsys, "generate", "--prompt", "x", "--max-new-tokens", "2", *flags)
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [f"error: {err.strip()[7:]}"] and words in err


def test_two_constraints_are_refused(capsys):
    code, out, err = run_cli(capsys, "generate", "--prompt", "x", "--regex", "a", "--json-object")
    assert code == 2 and out == "" and "--json-object: not allowed with argument --regex" in err


def test_the_help_lists_the_flags(capsys):
    for command in ("generate", "chat"):
        with pytest.raises(SystemExit):
            run_cli(capsys, command, "--help")
        text = capsys.readouterr().out
        assert all(flag in text for flag in ("--json-schema", "--json-object", "--regex", "--choice", "--grammar"))
