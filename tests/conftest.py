"""Shared fixtures: tiny random Qwen3 checkpoints written by transformers' save_pretrained."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

# Without a GPU, Triton kernels run under the interpreter. Triton reads this when a kernel is
# decorated, so it must be set before any tileinfer.backends.triton module is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ROOT = Path(__file__).resolve().parents[1]

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "for i in range(10):\n    print(i * i)\n",
    "import os\nimport sys\nprint(os.path.join(sys.prefix, 'lib'))\n",
    "The quick brown fox jumps over the lazy dog.\n",
]


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """The tests run tiny matmuls: on a 2-core machine intra-op threads only add overhead and
    jitter (loops of small ops ran up to 20x slower with 2 threads)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# The reference implementations on the CPU, eager: what the command-line tests mean (the default
# config is the Triton engine on a GPU).
REFERENCE_CPU = ["device=cpu", "dtype=float32", "kv_page_size=16", "linear=reference", "attention=reference",
                 "cuda_graphs=false", "pipelined=false"]


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """``tileinfer ARGV...`` in this process: its exit status, standard output and standard error."""
    from tileinfer.cli import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def reference_engine(folder: Path, **keys):
    """An engine of the reference config on the CPU in float32, pages of 16 positions."""
    import tileinfer

    return tileinfer.Engine.from_config("reference", model=str(folder), device="cpu", dtype="float32",
                                        kv_page_size=16, progress=False, **keys)


def repetitive_prompt() -> list[int]:
    """47 tokens (not a multiple of the page size) whose second half repeats the first: n-gram and
    draft proposals get accepted."""
    base = list(range(10, 30))
    return base + base + base[:7]


def gpu_available() -> bool:
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def write_tokenizer(folder: Path, vocab_size: int) -> None:
    """A byte-level BPE tokenizer trained on a few lines, saved by transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS * 20, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)


def make_checkpoint(folder: Path, *, tie: bool = False, heads: int = 4, kv_heads: int = 2, head_dim: int = 32,
                    hidden: int = 64, layers: int = 2, vocab: int = 320, intermediate: int = 128,
                    max_positions: int = 512, shard: bool = False, seed: int = 0, std: float = 0.05,
                    eos: int | None = None, tokenizer: bool = True, rope_theta: float = 10000.0,
                    rope_scaling: dict | None = None) -> Path:
    """Save a random Qwen3ForCausalLM with transformers; norm weights are random too (HF starts
    them at 1, which would hide a norm applied without its weight). ``rope_scaling``: e.g. YaRN's
    parameters, as a config.json's ``rope_scaling`` holds them."""
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         head_dim=head_dim, max_position_embeddings=max_positions, tie_word_embeddings=tie,
                         initializer_range=std, rope_theta=rope_theta, eos_token_id=eos,
                         **({"rope_scaling": dict(rope_scaling)} if rope_scaling else {}))
    model = Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, max_shard_size="100KB" if shard else "10GB")
    if eos is not None:
        GenerationConfig(eos_token_id=eos).save_pretrained(folder)
    if tokenizer:
        write_tokenizer(folder, min(vocab, 300))
    return folder


@pytest.fixture(scope="session")
def checkpoint_factory(tmp_path_factory):
    """``checkpoint_factory(**kw)``: a cached checkpoint folder per distinct set of arguments."""
    made: dict[str, Path] = {}

    def factory(**kw) -> Path:
        key = json.dumps(kw, sort_keys=True)
        if key not in made:
            made[key] = make_checkpoint(tmp_path_factory.mktemp("ckpt"), **kw)
        return made[key]

    return factory


@pytest.fixture(scope="session")
def tiny_checkpoint(checkpoint_factory) -> Path:
    return checkpoint_factory()
