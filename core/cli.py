"""The ``tileinfer`` command: generate, chat, serve, plugins, config.

Errors print one line on stderr starting with ``error:`` and exit 2 (usage and config) or 1
(anything else); ``--debug`` shows the traceback instead. An error is always the first line on
stderr: the notices the engine logs while it is built (``tileinfer.notices``, e.g. a setting
with no effect on a CPU) are held back until it was built, then printed as ``notice: ...``
lines; ``--quiet`` drops them.

When the reader of standard output goes away (``tileinfer plugins | head -1``), the command
stops quietly with exit status 141, as a Unix tool killed by SIGPIPE shows in the shell
(128 + 13; only ``set -o pipefail`` makes it the pipeline's status), and prints nothing more. A
command started with standard output closed (``>&-``) is one ``error:`` line.

On a CPU, ``cuda_graphs`` and ``pipelined`` (GPU-only settings, on in default.yaml) are off unless
a ``--config`` file or ``KEY=VALUE`` turns them on: only then does a notice say they have no effect.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import logging
import os
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Sequence

from tileinfer import __version__
from tileinfer.cli_args import SAMPLING_FLAGS, build_parser, parse_args
from tileinfer.errors import TileinferError, UsageError
from tileinfer.notices import LOGGER

BROKEN_PIPE_STATUS = 141  # 128 + SIGPIPE


class _Notices(logging.Handler):
    """Prints the notices logged to ``tileinfer`` as ``notice: ...`` lines on stderr: held back
    until ``show_held()`` (the engine was built), dropped with ``quiet`` or after an error."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.held: list[str] | None = []
        self.quiet = False

    def emit(self, record: logging.LogRecord) -> None:
        if self.quiet:
            return
        if self.held is not None:
            self.held.append(record.getMessage())
        else:
            print(f"notice: {record.getMessage()}", file=sys.stderr, flush=True)

    def show_held(self) -> None:
        held, self.held = self.held or [], None
        for message in held:
            self.emit(logging.makeLogRecord({"msg": message, "levelno": logging.WARNING}))

    def discard_held(self) -> None:
        self.held = []


@contextmanager
def _notices() -> Iterator[_Notices]:
    """The CLI's handler on the ``tileinfer`` logger for one ``main`` call, alone (no propagation
    to handlers a host program configured)."""
    handler = _Notices()
    saved = LOGGER.level, LOGGER.propagate
    LOGGER.addHandler(handler)
    LOGGER.setLevel(logging.WARNING)
    LOGGER.propagate = False
    try:
        yield handler
    finally:
        LOGGER.removeHandler(handler)
        LOGGER.setLevel(saved[0])
        LOGGER.propagate = saved[1]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    with _notices() as notices:
        try:
            args = parse_args(argv)
            notices.quiet = args.quiet
            if args.version:
                print(f"tileinfer {__version__}")
                return 0
            if args.command is None:
                build_parser().print_help(sys.stderr)
                return 2
            if sys.stdout is None and args.command != "serve":
                raise TileinferError(f"standard output is closed: {args.command} has nowhere to write (run it "
                                     "without >&-, or with >/dev/null to discard what it prints)")
            commands = {"generate": _generate, "chat": _chat, "serve": _serve, "plugins": _plugins, "config": _config,
                        "quantize": _quantize}
            status = commands[args.command](args, notices)
            if sys.stdout is not None:
                sys.stdout.flush()  # here, so that a reader gone away is seen here and not at exit
            notices.show_held()
            return status
        except BrokenPipeError:
            return _broken_pipe()
        except KeyboardInterrupt:
            notices.discard_held()
            _report("error: interrupted")
            return 130
        except TileinferError as exc:
            notices.discard_held()
            if debug:
                traceback.print_exc()
            _report(f"error: {exc}".replace("\r", "\\r").replace("\n", "\\n"))  # one line, whatever a value holds
            return exc.exit_status
        except Exception as exc:  # noqa: BLE001 - the CLI reports every failure as one line
            notices.discard_held()
            if debug:
                traceback.print_exc()
            _report(f"error: {type(exc).__name__}: {exc}".splitlines()[0])
            return 1


def _report(line: str) -> None:
    if sys.stderr is None:  # started with stderr closed: nowhere to tell
        return
    try:
        print(line, file=sys.stderr)
    except BrokenPipeError:  # stderr's reader is gone too: nothing left to tell
        pass


def _broken_pipe() -> int:
    """Standard output's reader went away: stop quietly. As Python's documentation recommends
    (signal module, "Note on SIGPIPE"), point stdout at /dev/null so that the interpreter's flush
    at exit does not fail again on what is still buffered."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):  # stdout replaced, e.g. by a test
        pass
    return BROKEN_PIPE_STATUS


def _load(args: argparse.Namespace, sources: Sequence = (), extra: Sequence[str] = ()):
    """The config of default.yaml, the --config files, ``sources`` and the overrides (on a CPU the
    GPU-only settings off unless these set them: ``tileinfer.cpu_defaults``)."""
    from tileinfer.cpu_defaults import load_for_device

    return load_for_device([*args.config, *sources], [*args.overrides, *extra])


def _read_stdin() -> str:
    """Standard input as text, decoded strictly as UTF-8 (a UsageError naming the first bad byte)."""
    if sys.stdin is None:  # started with standard input closed
        raise UsageError("--prompt - reads standard input, which is closed")
    data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read()
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"standard input is not valid UTF-8 (byte {data[exc.start]:#04x} at offset "
                         f"{exc.start})") from None


def _flag_sources(args: argparse.Namespace) -> list[dict]:
    """The config keys that --model, --max-new-tokens and the sampling flags set, as a mapping
    merged over the --config files (a path verbatim, numbers as parsed); UsageError when a flag's
    key is also given as KEY=VALUE."""
    given = {item.partition("=")[0].strip() for item in args.overrides}
    keys = {}
    for key in ("model", "max_new_tokens", *SAMPLING_FLAGS):
        value = getattr(args, key, None)
        if value is None:
            continue
        if key in given:
            flag = "--" + key.replace("_", "-")
            meta = "DIR" if key == "model" else "VALUE"
            raise UsageError(f"{key} is given twice: use {flag} {meta} or {key}={meta}, not both")
        keys[key] = value
    return [keys] if keys else []


def _params(args: argparse.Namespace):
    """The generation's tileinfer.SamplingParams of --stop, --ignore-eos, --min-tokens and the
    structured-output flags (the sampling flags set config keys: the engine's defaults)."""
    from tileinfer.sampling_params import SamplingParams

    return SamplingParams(stop=args.stop, ignore_eos=args.ignore_eos, min_tokens=args.min_tokens,
                          structured=_structured(args))


STRUCTURED_FLAGS = {"json": "--json-schema", "json_object": "--json-object", "regex": "--regex", "choice": "--choice",
                    "grammar": "--grammar"}


def _structured(args: argparse.Namespace):
    """The tileinfer.StructuredOutput of --json-schema, --json-object, --regex, --choice or --grammar
    (None: none given); a UsageError naming the flag for a file it cannot read or a bad value."""
    from tileinfer.structured import StructuredOutput, StructuredOutputError

    kinds = {"json": args.json_schema, "json_object": args.json_object or None, "regex": args.regex,
             "choice": args.choice, "grammar": args.grammar}
    kind, value = next(((k, v) for k, v in kinds.items() if v is not None), (None, None))
    if kind is None:
        return None
    if kind == "grammar" or (kind == "json" and not value.lstrip().startswith("{")):
        try:
            value = Path(value).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"{STRUCTURED_FLAGS[kind]} {value}: cannot read: {exc}") from None
    try:
        return StructuredOutput(**{kind: value})
    except StructuredOutputError as exc:
        raise UsageError(f"{STRUCTURED_FLAGS[kind]}: {str(exc).split(': ', 1)[1]}") from None


def _compile_structured(engine, params) -> None:
    """Compile the reply's constraint now, so that one the grammar engine refuses fails naming its flag."""
    from tileinfer.structured import StructuredOutputError

    if params.structured is not None:
        try:
            engine.compile_structured(params.structured)
        except StructuredOutputError as exc:
            raise UsageError(f"{STRUCTURED_FLAGS[exc.field]}: {str(exc).split(': ', 1)[1]}") from None


def _load_engine(args: argparse.Namespace, notices: _Notices):
    """The Engine the command's config names, its notices printed once it was built."""
    from tileinfer.engine import Engine

    engine = Engine(_load(args, _flag_sources(args)), progress=not args.quiet)
    notices.show_held()
    return engine


def _chat(args: argparse.Namespace, notices: _Notices) -> int:
    from tileinfer import chat

    params = _params(args)
    engine = _load_engine(args, notices)
    _compile_structured(engine, params)
    return chat.run(engine, params, system=args.system)


def _serve(args: argparse.Namespace, notices: _Notices) -> int:
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be in [0, 65535], got {args.port}")
    if args.queue < 0:
        raise UsageError(f"--queue must be >= 0, got {args.queue}")
    try:
        from tileinfer import server
    except ImportError as exc:
        raise UsageError(f"serve needs FastAPI and uvicorn ({exc}): pip install 'tileinfer[serve]'") from None
    api_key = server.api_key_of(args.api_key, args.api_key_file)
    engine = _load_engine(args, notices)
    name = (args.served_model_name or [engine.folder.name])[0]
    print(f"serving {name} on http://{args.host}:{args.port}/v1 (Ctrl-C stops)", file=sys.stderr, flush=True)
    server.serve(engine, host=args.host, port=args.port, queue_size=args.queue, api_key=api_key,
                 served_model_names=args.served_model_name, hosts=args.allowed_hosts,
                 log_level="warning" if args.quiet else "info")
    return 0


def _generate(args: argparse.Namespace, notices: _Notices) -> int:
    config = _load(args, _flag_sources(args))
    if args.prompt is None and args.prompt_ids is None:
        raise UsageError("give a prompt: --prompt TEXT or --prompt-ids 1,2,3")
    if args.prompt_ids is not None:
        try:
            prompt = [int(x) for x in args.prompt_ids.split(",") if x.strip()]
        except ValueError:
            raise UsageError(f"--prompt-ids must be comma-separated integers, got {args.prompt_ids!r}") from None
        if args.chat:
            raise UsageError("--chat needs a text prompt (--prompt), not token ids")
    else:
        prompt = _read_stdin() if args.prompt == "-" else args.prompt
    params = _params(args)

    from tileinfer.engine import Engine
    from tileinfer.prompt import check_prompt
    from tileinfer.resolution import ResolvedConfig

    # Resolved once; everything about the prompt that needs no weights (UTF-8, empty, vocabulary,
    # length) checked before the engine loads them.
    resolved = ResolvedConfig.of(config)
    ids = check_prompt(resolved, prompt, chat=args.chat)
    engine = Engine(resolved, progress=not args.quiet)
    notices.show_held()  # after the engine was built: an error is the first line on stderr
    _compile_structured(engine, params)
    if args.json:
        result = engine.generate(ids, params)
        print(json.dumps(result.to_dict(), ensure_ascii=False))
        return 0
    tokens: list[int] = []
    stats = None
    for chunk in engine.stream(ids, params):
        tokens += chunk.token_ids
        stats = chunk.stats or stats
        if chunk.text:
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
    print(",".join(map(str, tokens)) if engine.tokenizer is None else "")
    sys.stdout.flush()
    if args.quiet:
        return 0
    print(f"[{stats.new_tokens} tokens, prefill {stats.prefill_ms:.1f} ms, decode {stats.decode_tok_s:.1f} tok/s, "
          f"{stats.tokens_per_step:.2f} tokens/step, {stats.finish_reason}, {stats.decode_loop}"
          f"{f', {stats.cached_tokens} cached' if stats.cached_tokens else ''}]", file=sys.stderr)
    return 0


def _plugins(args: argparse.Namespace, notices: _Notices) -> int:
    from tileinfer.hookspecs import KINDS
    from tileinfer.registry import build_registry

    registry = build_registry()
    rows = []
    for kind in KINDS:
        for e in registry.entries(kind):
            impl = e.implementation
            try:
                declared = registry.get(kind, impl.name).declared_options
            except TileinferError as exc:
                declared, error = (), str(exc)
            else:
                error = None
            rows.append({"interface": kind, "name": impl.name, "plugin": e.plugin, "distribution": e.distribution,
                         "summary": impl.summary, "auto": list(impl.auto), "priority": impl.priority,
                         "options": [{"name": o.name, "type": o.type.__name__, "default": o.default,
                                      "choices": list(o.choices), "minimum": o.minimum, "help": o.help}
                                     for o in declared],
                         **({"error": error} if error else {})})
    if args.json:
        print(json.dumps({"implementations": rows, "failures": registry.failures}, indent=2))
        return 0
    for kind in KINDS:
        special = "  (none: no speculation)" if kind == "proposer" else ""
        if any(r["auto"] for r in rows if r["interface"] == kind):
            special = "  (auto: the highest priority that runs on the device)"
        print(f"{kind}:{special}")
        for row in (r for r in rows if r["interface"] == kind):
            auto = f"; auto on {', '.join(row['auto'])} (priority {row['priority']})" if row["auto"] else ""
            print(f"  {row['name']:<12} {row['summary']}")
            print(f"  {'':<12} from {row['plugin']} [{row['distribution']}]{auto}")
            for option in registry.get(kind, row["name"]).declared_options if "error" not in row else ():
                print(f"  {'':<12} options.{row['name']}.{option.describe()}")
            if "error" in row:
                print(f"  {'':<12} cannot be loaded: {row['error']}")
    for failure in registry.failures:
        print(f"failed to load: {failure}")
    return 0


def _config(args: argparse.Namespace, notices: _Notices) -> int:
    from tileinfer.config import to_yaml
    from tileinfer.resolution import ResolvedConfig

    resolved = ResolvedConfig.of(_load(args, _flag_sources(args)))
    folder = resolved.checkpoint.folder.resolve()
    sys.stdout.write(to_yaml(dataclasses.replace(resolved.config, model=str(folder))))
    filled, checkpoint = resolved.null_sampling, resolved.checkpoint
    if filled:  # where the sampling values left null came from
        from_checkpoint = [key for key in filled if key in checkpoint.sampling]
        rest = [key for key in filled if key not in from_checkpoint]
        sys.stdout.write(f"# null in the config: {', '.join(filled)}; from {checkpoint.folder / 'generation_config.json'}: "
                         f"{', '.join(from_checkpoint) or 'none'}" + (f"; off: {', '.join(rest)}" if rest else "") + "\n")
    return 0


def _quantize(args: argparse.Namespace, notices: _Notices) -> int:
    from tileinfer.quantize import quantize_checkpoint

    out = quantize_checkpoint(args.model, args.out, progress=not args.quiet)
    print(f"wrote {out} (W8A16, compressed-tensors pack-quantized); run it with --model {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
