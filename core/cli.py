"""The ``tileinfer`` command: generate, plugins, config.

Errors print one line on stderr starting with ``error:`` and exit 2 (usage and config) or 1
(anything else); ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from typing import Sequence

from tileinfer.errors import TileinferError, UsageError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not argparse's usage block
        raise UsageError(f"{message} (see {self.prog} --help)")


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", action="append", default=[], metavar="FILE",
                        help="YAML file, or the name of a shipped config (reference, eager), merged over "
                             "configs/default.yaml (repeatable, later wins)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="config overrides, e.g. device=cuda linear=reference options.triton.pdl=false")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tileinfer", description="Qwen3 inference composed from plugins by a config.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    gen = sub.add_parser("generate", help="generate text from a prompt",
                         description="Generate from a prompt with the model and implementations the config names.")
    gen.add_argument("--model", metavar="DIR", help="Hugging Face Qwen3 checkpoint folder (config key model; default: the shipped "
                     "models/target once it is built)")
    source = gen.add_mutually_exclusive_group()
    source.add_argument("--prompt", metavar="TEXT", help="prompt text ('-' reads standard input)")
    source.add_argument("--prompt-ids", metavar="IDS", help="prompt as comma-separated token ids, e.g. 1,2,3")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the checkpoint's chat template")
    gen.add_argument("--max-new-tokens", type=int, metavar="N", help="tokens to generate (config key max_new_tokens)")
    gen.add_argument("--json", action="store_true",
                     help="print one JSON object (token_ids, text, stats) and nothing else on stdout")
    gen.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    _common(gen)

    plugins = sub.add_parser("plugins", help="list every registered implementation per interface, with its options")
    plugins.add_argument("--json", action="store_true", help="print a JSON list")
    plugins.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)

    config = sub.add_parser("config", help="print the resolved config as YAML (auto values resolved, options "
                            "filled in, checked as generate checks it)")
    config.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    _common(config)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        args = build_parser().parse_args(argv)
        if args.command is None:
            build_parser().print_help(sys.stderr)
            return 2
        return {"generate": _generate, "plugins": _plugins, "config": _config}[args.command](args)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except TileinferError as exc:
        if debug:
            traceback.print_exc()
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_status
    except Exception as exc:  # noqa: BLE001 - the CLI reports every failure as one line
        if debug:
            traceback.print_exc()
        print(f"error: {type(exc).__name__}: {exc}".splitlines()[0], file=sys.stderr)
        return 1


def _load(args: argparse.Namespace, extra: Sequence[str] = ()):
    from tileinfer.config import load_config

    return load_config(args.config, [*args.overrides, *extra])


def _generate(args: argparse.Namespace) -> int:
    extra = [f"model={args.model}"] if args.model else []
    if args.max_new_tokens is not None:
        extra.append(f"max_new_tokens={args.max_new_tokens}")
    config = _load(args, extra)
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
        prompt = sys.stdin.read() if args.prompt == "-" else args.prompt

    from tileinfer.engine import Engine

    engine = Engine(config)
    if args.json:
        result = engine.generate(prompt, chat=args.chat)
        print(json.dumps(result.to_dict(), ensure_ascii=False))
        return 0
    tokens: list[int] = []
    stats = None
    for chunk in engine.stream(prompt, chat=args.chat):
        tokens += chunk.token_ids
        stats = chunk.stats or stats
        if chunk.text:
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
    print(",".join(map(str, tokens)) if engine.tokenizer is None else "")
    print(f"[{stats.new_tokens} tokens, prefill {stats.prefill_ms:.1f} ms, decode {stats.decode_tok_s:.1f} tok/s, "
          f"{stats.tokens_per_step:.2f} tokens/step, {stats.finish_reason}]", file=sys.stderr)
    return 0


def _plugins(args: argparse.Namespace) -> int:
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


def _config(args: argparse.Namespace) -> int:
    from tileinfer.config import resolve_config, to_yaml

    sys.stdout.write(to_yaml(resolve_config(_load(args))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
