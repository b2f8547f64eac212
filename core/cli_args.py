"""The ``tileinfer`` command's arguments: the parser of every subcommand, and their parsing with
``KEY=VALUE`` overrides anywhere among the options. Its errors are one-line UsageErrors."""

from __future__ import annotations

import argparse

from tileinfer.errors import UsageError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not argparse's usage block
        raise UsageError(f"{message} (see {self.prog} --help)")


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", action="append", default=[], metavar="FILE",
                        help="YAML file, or the name of a shipped config (reference, eager), merged over "
                             "configs/default.yaml (repeatable, later wins)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="config overrides, e.g. device=cuda linear=reference options.triton.pdl=false")


# The sampling flags and the config keys they set (a flag and its KEY=VALUE together: a usage error).
SAMPLING_FLAGS = {"temperature": float, "top_p": float, "top_k": int, "min_p": float, "seed": int,
                  "repetition_penalty": float, "presence_penalty": float, "frequency_penalty": float}


def _model_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", metavar="DIR", help="Hugging Face Qwen3 checkpoint folder, taken verbatim (config "
                        "key model; default: the shipped models/target)")


def _generation_flags(parser: argparse.ArgumentParser, per_request: bool = False) -> None:
    """--max-new-tokens and the sampling flags, which set config keys; ``per_request``: the
    server's defaults, which a request's own fields override."""
    tail = "; the default of requests that do not set it" if per_request else ""
    checkpoint = "; default: the checkpoint's generation_config.json, else off"
    parser.add_argument("--max-new-tokens", "--max-tokens", type=int, metavar="N", dest="max_new_tokens",
                        help=f"tokens to generate at most (config key max_new_tokens{tail})")
    parser.add_argument("--temperature", type=float, metavar="T",
                        help=f"sampling temperature, 0 is greedy (config key temperature{tail}{checkpoint})")
    parser.add_argument("--top-p", type=float, metavar="P",
                        help=f"nucleus sampling, 1 is off (config key top_p{tail}{checkpoint})")
    parser.add_argument("--top-k", type=int, metavar="K",
                        help=f"sample from the K most likely tokens, 0 is off (config key top_k{tail}{checkpoint})")
    parser.add_argument("--min-p", type=float, metavar="P",
                        help=f"drop tokens less likely than P times the most likely, 0 is off (config key "
                             f"min_p{tail}{checkpoint})")
    parser.add_argument("--repetition-penalty", "--repeat-penalty", type=float, metavar="R", dest="repetition_penalty",
                        help=f"penalize the tokens of the prompt and the reply (a positive logit divided by R, a "
                             f"negative one multiplied), 1 is off (config key repetition_penalty{tail}{checkpoint})")
    parser.add_argument("--presence-penalty", type=float, metavar="P",
                        help=f"subtract P from the logits of tokens in the reply, in [-2, 2], 0 is off (config key "
                             f"presence_penalty{tail})")
    parser.add_argument("--frequency-penalty", type=float, metavar="F",
                        help=f"subtract F times its count in the reply from a token's logit, in [-2, 2], 0 is off "
                             f"(config key frequency_penalty{tail})")
    parser.add_argument("--seed", type=int, metavar="N",
                        help=f"seed of the sampler, set again at each generation (config key seed{tail})")


def _stop_flags(parser: argparse.ArgumentParser) -> None:
    """Where a generation stops: tileinfer.SamplingParams fields, not config keys."""
    parser.add_argument("--stop", action="append", default=[], metavar="TEXT",
                        help="end the reply where its text first contains TEXT, which is not printed (repeatable)")
    parser.add_argument("--ignore-eos", action="store_true",
                        help="do not stop at the checkpoint's end-of-sequence tokens (the reply runs to "
                             "--max-new-tokens or a stop string)")
    parser.add_argument("--min-tokens", type=int, default=0, metavar="N",
                        help="the first N tokens of the reply are never an end-of-sequence token, and a stop "
                             "string they complete does not end it (default 0)")


def _structured_flags(parser: argparse.ArgumentParser) -> None:
    """What the reply must match (tileinfer.SamplingParams.structured): at most one of them."""
    group = parser.add_argument_group("structured output (at most one; tokens that break it are never sampled)")
    one = group.add_mutually_exclusive_group()
    one.add_argument("--json-schema", metavar="FILE_OR_JSON",
                     help="the reply is JSON valid against this JSON schema (a file, or the schema's JSON text)")
    one.add_argument("--json-object", action="store_true", help="the reply is a JSON object (any)")
    one.add_argument("--regex", metavar="REGEX", help="the whole reply matches this regular expression")
    one.add_argument("--choice", action="append", metavar="TEXT",
                     help="the reply is exactly one of these texts (repeatable: --choice yes --choice no)")
    one.add_argument("--grammar", metavar="FILE",
                     help="the reply matches this EBNF grammar's rule root (GBNF, as llama.cpp and xgrammar read it)")


def _global(parser: argparse.ArgumentParser, main: bool) -> None:
    """--debug and --quiet, before or after the command (the command's copies leave the value the
    main parser set when they are not given)."""
    hide = {} if main else {"help": argparse.SUPPRESS, "default": argparse.SUPPRESS}
    parser.add_argument("--debug", action="store_true", **{"help": "show tracebacks on errors", **hide})
    parser.add_argument("-q", "--quiet", action="store_true",
                        **{"help": "print only the output: no notices (settings with no effect here, choices made "
                                   "for you), no progress (loading bar, long prefills), no stats line", **hide})


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tileinfer", description="Qwen3 inference composed from plugins by a config.")
    _global(parser, main=True)
    parser.add_argument("--version", action="store_true", help="print tileinfer's version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    gen = sub.add_parser("generate", help="generate text from a prompt",
                         description="Generate from a prompt with the model and implementations the config names.")
    _model_flag(gen)
    source = gen.add_mutually_exclusive_group()
    source.add_argument("--prompt", metavar="TEXT", help="prompt text ('-' reads standard input)")
    source.add_argument("--prompt-ids", metavar="IDS", help="prompt as comma-separated token ids, e.g. 1,2,3")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the checkpoint's chat template")
    _generation_flags(gen)
    _stop_flags(gen)
    _structured_flags(gen)
    gen.add_argument("--json", action="store_true",
                     help="print one JSON object (token_ids, text, stats) and nothing else on stdout")
    _global(gen, main=False)
    _common(gen)

    chat = sub.add_parser("chat", help="chat in the terminal, multi-turn, with the model's chat template",
                          description="An interactive chat: each turn is rendered with the checkpoint's chat template "
                          "with the history (the oldest turns dropped when the context is full). /reset clears "
                          "the history, /exit or Ctrl-D quits, Ctrl-C stops the reply being written.")
    _model_flag(chat)
    chat.add_argument("--system", metavar="TEXT", help="system prompt, kept through /reset")
    _generation_flags(chat)
    _stop_flags(chat)
    _structured_flags(chat)
    _global(chat, main=False)
    _common(chat)

    serve = sub.add_parser("serve", help="serve an OpenAI-compatible HTTP API (needs tileinfer[serve])",
                           description="Serve POST /v1/chat/completions and /v1/completions (streaming with "
                           "server-sent events; sampling, penalties and logprobs per request), GET /v1/models and "
                           "GET /health. One request runs at a time, in arrival order; the others wait in a bounded "
                           "queue (503 when it is full).")
    _model_flag(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    serve.add_argument("--queue", type=int, default=16, metavar="N",
                       help="requests that may wait behind the one running (default 16); more get 503")
    serve.add_argument("--api-key", metavar="KEY", help="require 'Authorization: Bearer KEY' on /v1, /tokenize and "
                       "/detokenize requests (visible in the process list: prefer --api-key-file or the environment "
                       "variable TILEINFER_API_KEY, the default; none when unset)")
    serve.add_argument("--api-key-file", metavar="PATH", help="the API key as the first line of PATH")
    serve.add_argument("--served-model-name", nargs="+", metavar="NAME", help="the names a request's model may give "
                       "(default: the model folder's name); responses report the first")
    serve.add_argument("--allowed-hosts", nargs="+", metavar="HOST", help="the Host header names to answer (default "
                       "without an API key: localhost and the --host address; with one: any)")
    _generation_flags(serve, per_request=True)
    _global(serve, main=False)
    _common(serve)

    plugins = sub.add_parser("plugins", help="list every registered implementation per interface, with its options")
    plugins.add_argument("--json", action="store_true", help="print a JSON list")
    _global(plugins, main=False)

    config = sub.add_parser("config", help="print the resolved config as YAML (the model folder and auto values "
                            "resolved, options and the checkpoint's sampling defaults filled in, checked as generate "
                            "checks it)")
    _model_flag(config)
    _generation_flags(config)
    _global(config, main=False)
    _common(config)

    quantize = sub.add_parser("quantize", help="write a weight-only INT8 (W8A16) copy of a checkpoint",
                              description="Quantize every linear (and an untied lm_head) to int8 with one float32 "
                              "scale per output channel, in the compressed-tensors pack-quantized format that vLLM "
                              "reads; the embedding and norms stay as they are. The copy runs as INT8 by default "
                              "(quantize=auto).")
    quantize.add_argument("--model", metavar="DIR", required=True, help="Hugging Face Qwen3 checkpoint folder")
    quantize.add_argument("--out", metavar="DIR", required=True, help="new (or empty) folder to write")
    _global(quantize, main=False)
    return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The arguments, with ``KEY=VALUE`` overrides anywhere among the options (argparse takes them
    only in one run: ``generate device=cpu --model DIR seed=3`` would leave ``seed=3`` over)."""
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    unknown = [item for item in rest if not (hasattr(args, "overrides") and "=" in item and not item.startswith("-"))]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if rest:
        args.overrides = [*args.overrides, *rest]
    return args
