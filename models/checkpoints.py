"""What a training run saves: its resumable state (model, optimizer, step, plan, history, random
number generators) and the Hugging Face checkpoint of the model in BF16."""

from __future__ import annotations

import os
import random
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from .tokenizer import ENDOFTEXT, IM_END, copy_files


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_state(path: Path, model, optimizer, step: int, plan, history: dict, args: dict) -> None:
    """Everything a resumed run needs (``plan``: train.py's Plan dataclass), written atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                "plan": asdict(plan), "history": history, "rng": rng_state(), "args": args}, tmp)
    os.replace(tmp, path)


def save_model(model, folder: Path, tokenizer_dir: Path) -> None:
    """The Hugging Face checkpoint in BF16, with generation_config.json and the tokenizer's files."""
    from transformers import GenerationConfig, Qwen3ForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("model*.safetensors*"):
        old.unlink()
    copy = Qwen3ForCausalLM(model.config)
    copy.load_state_dict({k: v.detach().cpu() for k, v in model.state_dict().items()})
    copy = copy.to(torch.bfloat16)
    copy.config.dtype = torch.bfloat16
    copy.generation_config = GenerationConfig(eos_token_id=[IM_END, ENDOFTEXT], pad_token_id=ENDOFTEXT,
                                              do_sample=False)
    copy.save_pretrained(folder)  # one model.safetensors
    copy_files(tokenizer_dir, folder)
