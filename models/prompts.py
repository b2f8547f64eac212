"""The two speculative-decoding tasks, on held-out Python files, as chat prompts of at most N tokens.

- EDIT: rename a class throughout a source file. The reply copies the input with one name
  changed, so drafts that copy the prompt (n-gram lookup, a draft model) are mostly accepted.
- OPEN: continue the file. Open text: drafts are accepted far less.

A prompt is the file cut at a line boundary to the longest head whose prompt, rendered with the
chat template (generation prompt included), is at most ``max_tokens`` tokens (1,024 by default,
as the speculative-decoding benchmarks specify). The benchmark files are three modules of CPython
3.11.7's standard library, committed under ``models/heldout/`` (PSF License, ``LICENSE-Python.txt`` there), whose
names are held out of the shipped models' training corpus (``models/corpus.py``), so the results
reproduce on any machine:

>>> from tileinfer.tokenizer import Tokenizer
>>> tok = Tokenizer.from_folder(Path("models/target"))
>>> for p in benchmark_prompts(tok, 1024):
...     print(p.task, p.name, len(p.token_ids))

``tokenizer`` is either tileinfer's ``Tokenizer`` or a transformers tokenizer (anything with
``apply_chat_template(messages, tokenize=False, add_generation_prompt=True)`` and
``encode(text, add_special_tokens=False)``); a bare ``tokenizers.Tokenizer`` gets ChatML rendered
here. The shipped models were also trained on examples made by ``edit_messages``/``edit_reply`` and
``continuation_messages``/``continuation_reply`` from training files (``models/data.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

HELDOUT_DIR = Path(__file__).resolve().parent / "heldout"
DEFAULT_MAX_TOKENS = 1024

EDIT_INSTRUCTION = "Rename the class {old} to {new} throughout this Python file. Reply with the whole file."
CONTINUE_INSTRUCTION = "Continue this Python file."
CLASS_RE = re.compile(r"^[ \t]*class[ \t]+([A-Za-z_][A-Za-z0-9_]*)", re.MULTILINE)

# (file under models/heldout/, class to rename, new name): the EDIT tasks of the benchmark.
BENCHMARK = (
    ("asyncio_runners.py.txt", "Runner", "LoopRunner"),
    ("_weakrefset.py.txt", "WeakSet", "WeakRefSet"),
    ("netrc.py.txt", "NetrcParseError", "NetrcSyntaxError"),
)


@dataclass
class Prompt:
    task: str  # "edit" or "open"
    name: str  # the source file's name
    messages: list[dict]  # the chat, without the reply
    text: str  # rendered with the chat template, generation prompt included
    token_ids: list[int]  # len(token_ids) <= max_tokens
    source: str  # the head of the file that the prompt holds
    expected: str | None  # edit: the reply asked for (the fenced renamed head); open: None


# -- the chat ----------------------------------------------------------------------------------


def fence(code: str) -> str:
    return "```python\n" + code + ("" if code.endswith("\n") else "\n") + "```"


def class_names(source: str) -> list[str]:
    """Names of the classes defined in ``source``, in order, once each."""
    return list(dict.fromkeys(CLASS_RE.findall(source)))


def rename(source: str, old: str, new: str) -> str:
    """Every whole-word occurrence of ``old`` replaced (code, strings and comments alike)."""
    return re.sub(rf"\b{re.escape(old)}\b", new, source)


def edit_messages(source: str, old: str, new: str) -> list[dict]:
    return [{"role": "user", "content": EDIT_INSTRUCTION.format(old=old, new=new) + "\n\n" + fence(source)}]


def edit_reply(source: str, old: str, new: str) -> str:
    return fence(rename(source, old, new))


def continuation_messages(head: str) -> list[dict]:
    return [{"role": "user", "content": CONTINUE_INSTRUCTION + "\n\n" + fence(head)}]


def continuation_reply(tail: str) -> str:
    return fence(tail)


def chatml(messages: list[dict], *, add_generation_prompt: bool = True) -> str:
    """The shipped chat template (Qwen3's, models/chat_template.jinja) in Python, for messages
    without tools or thinking whose last user message is not followed by an assistant's."""
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def render(tokenizer, messages: list[dict]) -> str:
    if hasattr(tokenizer, "apply_chat_template"):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return chatml(messages)


def encode(tokenizer, text: str) -> list[int]:
    ids = tokenizer.encode(text, add_special_tokens=False)
    return list(getattr(ids, "ids", ids))


# -- cutting to fit ----------------------------------------------------------------------------


def fit(source: str, build, tokenizer, max_tokens: int) -> tuple[str, list[dict], str, list[int]]:
    """The longest head of ``source`` (whole lines) whose prompt ``build(head)`` is at most
    ``max_tokens`` tokens: (head, messages, text, ids). Binary search: adding lines never removes
    tokens (the pre-tokenizer splits at newlines)."""
    lines = source.splitlines(keepends=True)

    def attempt(n: int):
        head = "".join(lines[:n])
        messages = build(head)
        text = render(tokenizer, messages)
        return head, messages, text, encode(tokenizer, text)

    lo, hi, best = 1, len(lines), None
    while lo <= hi:
        mid = (lo + hi) // 2
        result = attempt(mid)
        if len(result[3]) <= max_tokens:
            best, lo = result, mid + 1
        else:
            hi = mid - 1
    if best is None:
        raise ValueError(f"not even the first line of the file fits in {max_tokens} tokens")
    return best


def edit_prompt(source_text: str, old: str, new: str, tokenizer, max_tokens: int = DEFAULT_MAX_TOKENS, *,
                name: str = "") -> Prompt:
    """EDIT: rename ``old`` to ``new`` in the head of ``source_text`` that fits ``max_tokens`` (or, when
    the class is defined after that head, in the lines from its definition on that fit)."""
    build = lambda h: edit_messages(h, old, new)  # noqa: E731
    head, messages, text, ids = fit(source_text, build, tokenizer, max_tokens)
    if old not in class_names(head):  # a small budget: start the file at the class instead
        match = re.search(rf"^[ \t]*class[ \t]+{re.escape(old)}\b", source_text, re.MULTILINE)
        if match is None:
            raise ValueError(f"{name or 'the file'}: defines no class {old}")
        head, messages, text, ids = fit(source_text[match.start():], build, tokenizer, max_tokens)
    return Prompt("edit", name, messages, text, ids, head, edit_reply(head, old, new))


def continuation_prompt(source_text: str, tokenizer, max_tokens: int = DEFAULT_MAX_TOKENS, *, name: str = "") -> Prompt:
    """OPEN: continue the head of ``source_text`` that fits ``max_tokens``."""
    head, messages, text, ids = fit(source_text, continuation_messages, tokenizer, max_tokens)
    return Prompt("open", name, messages, text, ids, head, None)


# -- the files ---------------------------------------------------------------------------------


def pick_class(source: str) -> str | None:
    """The class of ``source`` whose name occurs most often (ties: the first defined), or None."""
    names = class_names(source)
    if not names:
        return None
    return max(names, key=lambda n: (len(re.findall(rf"\b{re.escape(n)}\b", source)), -names.index(n)))


def files_with_class(folder: Path = HELDOUT_DIR, *, min_uses: int = 2) -> list[tuple[Path, str]]:
    """(file, class) for the files of ``folder`` (``*.py``, ``*.py.txt``) that define a class used
    at least ``min_uses`` times in the file, so renaming it is meaningful."""
    found = []
    for path in sorted([*Path(folder).glob("*.py"), *Path(folder).glob("*.py.txt")]):
        source = path.read_text(encoding="utf-8")
        old = pick_class(source)
        if old and len(re.findall(rf"\b{re.escape(old)}\b", source)) >= min_uses:
            found.append((path, old))
    return found


def heldout_docs_with_class(corpus_dir: Path, *, min_uses: int = 2, limit: int | None = None):
    """(name, text, class) of the corpus' held-out files that define a class used ``min_uses`` times."""
    import json

    with (Path(corpus_dir) / "heldout.jsonl").open(encoding="utf-8") as f:
        for line in f:
            doc = json.loads(line)
            old = pick_class(doc["text"])
            if old and len(re.findall(rf"\b{re.escape(old)}\b", doc["text"])) >= min_uses:
                yield doc["name"], doc["text"], old
                if limit is not None:
                    limit -= 1
                    if limit <= 0:
                        return


def benchmark_prompts(tokenizer, max_tokens: int = DEFAULT_MAX_TOKENS, folder: Path = HELDOUT_DIR) -> list[Prompt]:
    """The benchmark: for each file of BENCHMARK an EDIT prompt, then an OPEN prompt."""
    prompts = []
    for file, old, new in BENCHMARK:
        source = (Path(folder) / file).read_text(encoding="utf-8")
        prompts.append(edit_prompt(source, old, new, tokenizer, max_tokens, name=file))
        prompts.append(continuation_prompt(source, tokenizer, max_tokens, name=file))
    return prompts


def def_lines(limit: int, exclude: str = "def fibonacci(n):", folder: Path = HELDOUT_DIR) -> list[str]:
    """Short raw prompts: the distinct ``def`` lines of the benchmark's held-out files, dedented, in
    file order, without ``exclude`` (the README's prompt); at most ``limit``."""
    seen: list[str] = []
    for name in sorted({b[0] for b in BENCHMARK}):
        for line in (folder / name).read_text().splitlines():
            m = re.match(r"\s*(def \w+\(.*\):)\s*$", line)
            if m and m.group(1) not in seen and m.group(1) != exclude:
                seen.append(m.group(1))
    return seen[:limit]
