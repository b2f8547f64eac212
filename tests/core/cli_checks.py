"""Checks shared by the command-line tests: one ``error:`` line and nothing else, and the tokens of
``tileinfer generate --json`` on the reference config."""

from __future__ import annotations

import json

from conftest import REFERENCE_CPU as BASE, run_cli as run

IDS = [5, 6, 7, 8]


def assert_one_error(code: int, out: str, err: str, *words: str, status: int = 2) -> None:
    assert code == status, (code, err)
    assert out == ""
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for word in words:
        assert word in err, err


def generate_json(capsys, *argv, prompt: tuple[str, ...] = ("--prompt-ids", ",".join(map(str, IDS)))) -> list[int]:
    code, out, err = run(capsys, "generate", *prompt, "--max-new-tokens", "4", "--json", *BASE, *argv)
    assert code == 0, err
    return json.loads(out)["token_ids"]
