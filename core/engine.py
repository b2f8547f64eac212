"""Engine: load a model as the config says, and generate one sequence at a time.

Prefill runs the prompt in one step; decode runs one token per step, or, with a proposer, a
verify step of ``1 + k`` tokens that commits the accepted drafts plus one target token and rolls
the KV store back over the rejected ones. With ``pipelined`` on a GPU and no proposer, plain
decoding runs with the host one step behind the device (``tileinfer.decoding``); with a proposer
it stays sequential (the host needs each verify result before it drafts), with a notice.
"""

from __future__ import annotations

import importlib.resources
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from tileinfer.config import Config, ConfigSource, check_names, load_config, options_for
from tileinfer.decoding import Commit, PipelinedDecoder, pipelining_applies, prefill
from tileinfer.errors import ConfigError, UsageError
from tileinfer.interfaces import Draft, KVGeometry, KVStore, Proposer, ProposerContext, SamplingParams
from tileinfer.loading import CheckpointReader
from tileinfer.model import Backend, Qwen3Model
from tileinfer.model_config import ModelConfig
from tileinfer.registry import Registry, build_registry
from tileinfer.speculative import verify_greedy, verify_sampled
from tileinfer.steps import MAX_GRAPH_TOKENS, EagerSteps, GraphedSteps, notice_gpu_only
from tileinfer.tokenizer import StreamDecoder, Tokenizer

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass
class GenerationStats:
    prompt_tokens: int
    new_tokens: int
    prefill_ms: float  # prompt in, first token out (pipelined: read after step 1 was enqueued)
    decode_tok_s: float  # tokens after the first, over the time from the first to the last
    steps: int  # steps after the prefill whose tokens were committed (not one a pipelined run discards after an EOS)
    tokens_per_step: float  # new tokens after the first, per step
    drafted_tokens: int  # speculative tokens proposed (0 without a proposer)
    accepted_tokens: int  # of which the target kept
    finish_reason: str  # "eos" or "length"


@dataclass
class Generation:
    token_ids: list[int]  # the new tokens (an EOS that ended the generation included)
    text: str | None  # their text, special tokens skipped (None without a tokenizer)
    stats: GenerationStats

    def to_dict(self) -> dict:
        return {"token_ids": self.token_ids, "text": self.text, "stats": asdict(self.stats)}


def shipped_model() -> Path | None:
    """The small model trained for tileinfer (``tileinfer.models``: models/target in the
    repository, installed with the package), if present."""
    try:
        folder = Path(str(importlib.resources.files("tileinfer.models") / "target"))
    except ModuleNotFoundError:  # installed without its models
        return None
    return folder if (folder / "config.json").is_file() else None


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """``auto``: bfloat16 on a GPU; float32 on a CPU, where bfloat16 matmuls are emulated and slow."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[name]


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device=cuda but no CUDA GPU is visible; use device=cpu")
    return torch.device(name)


class Engine:
    """A loaded model with its KV store, sampler and (optional) proposer.

    >>> engine = Engine.from_config(model="path/to/Qwen3-0.6B")
    >>> engine.generate("def fib(n):", max_new_tokens=32).text
    """

    def __init__(self, config: Config, registry: Registry | None = None, *, progress: bool = True) -> None:
        # Everything a user can get wrong is checked before the weights are read.
        self.registry = registry or build_registry()
        check_names(config, self.registry)
        self.config = config
        folder = Path(config.model) if config.model else shipped_model()
        if folder is None:
            raise ConfigError("no model given: pass --model DIR or model=DIR (a Hugging Face Qwen3 checkpoint "
                              "folder); the shipped model models/target is not built yet (models/README.md)")
        if not folder.is_dir():
            raise ConfigError(f"model folder not found: {folder}")
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        params = SamplingParams(config.temperature, config.top_k, config.top_p, config.min_p, config.seed)
        backend = Backend(
            linear=self.registry.get("linear", config.linear),
            attention=self.registry.get("attention", config.attention),
            quantize=config.quantize,
        )
        if config.quantize not in backend.linear.supported_quantize:
            raise ConfigError(f"linear={config.linear} does not support quantize={config.quantize}; it supports: "
                              f"{', '.join(backend.linear.supported_quantize)}")
        kv_class = self.registry.get("kv_store", config.kv_store)
        if kv_class.storage not in backend.attention.supported_storage:
            raise ConfigError(f"attention={config.attention} cannot read kv_store={config.kv_store} pages "
                              f"({kv_class.storage}); it reads: {', '.join(backend.attention.supported_storage)}")
        self.model_config = ModelConfig.from_folder(folder)
        reader = CheckpointReader(folder, self.model_config, self.device, self.dtype)

        self.model = Qwen3Model.build(self.model_config, reader.tensor, backend, progress=progress)
        reader.close()
        self.tokenizer = Tokenizer.from_folder(folder) if (folder / "tokenizer.json").is_file() else None
        self.kv = self._build_kv(kv_class)
        self.sampler = self.registry.get("sampler", config.sampler)(params, self.device)
        self.proposer: Proposer | None = None
        if config.proposer != "none":
            context = ProposerContext(self.model, self.sampler, config, self.registry,
                                      options_for(config, config.proposer))
            self.proposer = self.registry.get("proposer", config.proposer)(context)
        cuda = self.device.type == "cuda"
        gpu_only = [key for key in ("cuda_graphs", "pipelined") if getattr(config, key)]
        if gpu_only and not cuda:
            notice_gpu_only(self.device, gpu_only)
        graphs = config.cuda_graphs and cuda
        self.steps = (GraphedSteps if graphs else EagerSteps)(self.model, self.kv, self._capture())
        if graphs:
            with torch.inference_mode():
                self.steps.capture(range(1, min(config.spec_k + 1, MAX_GRAPH_TOKENS) + 1) if self.proposer else [1])
        self.pipeline: PipelinedDecoder | None = None  # None: the sequential loop of generate
        if config.pipelined and cuda and pipelining_applies(self.device, config.proposer):
            self.pipeline = PipelinedDecoder(self.model, self.kv, self.sampler, self.steps)

    def _build_kv(self, kv_class: type) -> KVStore:
        mc, config = self.model_config, self.config
        self.capacity = min(config.kv_capacity, mc.max_positions)
        geometry = KVGeometry(mc.num_layers, mc.num_kv_heads, mc.head_dim, config.kv_page_size,
                              -(-self.capacity // config.kv_page_size), self.dtype)
        key_norms = [layer.attention.k_norm_weight for layer in self.model.layers]
        return kv_class(geometry, self.device, key_norm_weights=key_norms)

    @classmethod
    def from_config(cls, *sources: ConfigSource, overrides: Sequence[str] = (), registry: Registry | None = None,
                    progress: bool = True, **keys) -> "Engine":
        """Build from default.yaml + ``sources`` (YAML paths or mappings) + ``overrides``
        (``"KEY=VALUE"``) + ``keys`` (e.g. ``model="..."``, ``device="cuda"``)."""
        config = load_config([*sources, keys] if keys else sources, overrides)
        return cls(config, registry, progress=progress)

    # -- input ---------------------------------------------------------------------------------

    def encode_prompt(self, prompt: str, *, chat: bool = False) -> list[int]:
        if self.tokenizer is None:
            raise UsageError(f"{self.config.model} has no tokenizer.json: pass token ids instead of text")
        if chat:
            text = self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
            return self.tokenizer.encode(text, add_special_tokens=False)
        return self.tokenizer.encode(prompt)

    def _check_prompt(self, ids: list[int], max_new_tokens: int) -> None:
        if not ids:
            raise UsageError("the prompt is empty")
        vocab = self.model_config.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise UsageError(f"token id {bad[0]} is outside the vocabulary [0, {vocab})")
        if max_new_tokens < 1:
            raise UsageError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        draft = self.config.spec_k if self.proposer else 0
        need = len(ids) + max_new_tokens + draft
        if need > self.capacity:
            limit = ("the model's max_position_embeddings" if self.capacity == self.model_config.max_positions
                     else "kv_capacity")
            raise UsageError(f"the prompt ({len(ids)} tokens) + max_new_tokens ({max_new_tokens})"
                             + (f" + spec_k ({draft})" if draft else "")
                             + f" needs {need} positions, more than {limit} ({self.capacity})")

    # -- generation ----------------------------------------------------------------------------

    def generate(self, prompt: str | Sequence[int], *, max_new_tokens: int | None = None, chat: bool = False,
                 on_text: Callable[[str], None] | None = None, ignore_eos: bool = False) -> Generation:
        """Generate from a text prompt (``chat`` wraps it in the chat template) or from token ids.

        Stops at an EOS token of generation_config.json (unless ``ignore_eos``, as benchmarks do)
        or after ``max_new_tokens`` (default: the config's). ``on_text`` receives the text as it is
        produced.
        """
        ids = self.encode_prompt(prompt, chat=chat) if isinstance(prompt, str) else [int(t) for t in prompt]
        max_new = self.config.max_new_tokens if max_new_tokens is None else max_new_tokens
        self._check_prompt(ids, max_new)
        stream = StreamDecoder(self.tokenizer) if on_text and self.tokenizer else None
        eos = () if ignore_eos else self.model_config.eos_token_ids
        out: list[int] = []

        def commit(tokens: list[int]) -> bool:
            """Append tokens up to a stop; True when the generation is over."""
            for token in tokens:
                out.append(token)
                if stream:
                    piece = stream.push(token)
                    if piece:
                        on_text(piece)
                if token in eos or len(out) >= max_new:
                    return True
            return False

        with torch.inference_mode():
            self.sampler.generator.manual_seed(self.config.seed)
            self.kv.reset()
            self._drafted = self._accepted = 0
            start = time.perf_counter()
            decode = self.pipeline.run if self.pipeline else self._decode_sequential
            first_time, steps = decode(ids, max_new, commit)
            end = time.perf_counter()
        if stream and (tail := stream.flush()):
            on_text(tail)
        decode_s = end - first_time
        stats = GenerationStats(
            prompt_tokens=len(ids),
            new_tokens=len(out),
            prefill_ms=(first_time - start) * 1e3,
            decode_tok_s=(len(out) - 1) / decode_s if len(out) > 1 and decode_s > 0 else 0.0,
            steps=steps,
            tokens_per_step=(len(out) - 1) / steps if steps else 0.0,
            drafted_tokens=self._drafted,
            accepted_tokens=self._accepted,
            finish_reason="eos" if out[-1] in eos else "length",
        )
        text = self.tokenizer.decode(out) if self.tokenizer else None
        return Generation(out, text, stats)

    def _capture(self) -> tuple[int, ...]:
        return self.proposer.hidden_layers if self.proposer else ()

    def _decode_sequential(self, ids: list[int], max_new: int, commit: Commit) -> tuple[float, int]:
        """Prefill, then one step at a time, each token (or verified draft) read before the next
        step is launched; ``commit`` as for ``PipelinedDecoder.run``. Returns the time the first
        token was out and the number of steps after the prefill."""
        first, hidden = prefill(self.model, self.kv, self.sampler, ids, self._capture())
        first = int(first[0])
        first_time = time.perf_counter()
        out = [first]
        if self.proposer:
            self.proposer.start(ids + out, hidden)
        done = commit([first])
        steps = 0
        while not done:
            new = self._decode_step(ids + out, max_new - len(out))
            out += new
            done = commit(new)
            steps += 1
        return first_time, steps

    def _decode_step(self, sequence: list[int], remaining: int) -> list[int]:
        """One step after ``sequence`` (whose last token is not cached yet); the tokens to commit."""
        cached = len(sequence) - 1
        draft = Draft([])
        if self.proposer and remaining > 1:
            draft = self.proposer.propose(sequence, min(self.config.spec_k, remaining - 1))
        self.kv.reserve(cached + 1 + len(draft.tokens))
        tokens = torch.tensor([sequence[-1], *draft.tokens], dtype=torch.int64, device=self.device)
        logits, hidden = self.steps.forward(tokens, cached)
        if not draft.tokens:
            new = [int(self.sampler.sample(logits).tokens[0])]
        elif self.sampler.greedy:
            new = verify_greedy(draft.tokens, logits)
        else:
            new = verify_sampled(draft.tokens, draft.probs, logits, self.sampler)
        kept = len(new)  # the step's token and the accepted drafts hold valid keys and values
        self._drafted += len(draft.tokens)
        self._accepted += kept - 1
        self.kv.truncate(cached + kept)
        if self.proposer:
            self.proposer.accept(sequence + new, kept - 1, {n: h[:kept] for n, h in hidden.items()})
        return new
