"""What the scripts that build the engine on random weights of named shapes share: their common
arguments (--shapes, --checkpoints, --out) and the check that a GPU is visible."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch


def engine_script_parser(doc: str) -> argparse.ArgumentParser:
    """A parser described by ``doc``'s first line, with --shapes, --checkpoints and --out."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--shapes", default="Qwen3-4B,Qwen3-0.6B", help="comma-separated shapes (bench/shapes.py)")
    parser.add_argument("--checkpoints", type=Path, default=Path("/tmp/tileinfer-checkpoints"),
                        help="where the random-weight checkpoint folders are written")
    parser.add_argument("--out", type=Path, default=None, help="folder for the JSON record (none: print only)")
    return parser


def gpu_visible(script: str) -> bool:
    """True with a CUDA GPU; else one line on stderr saying that ``script`` needs one."""
    if torch.cuda.is_available():
        return True
    print(f"error: {script} needs a CUDA GPU (none is visible)", file=sys.stderr)
    return False
