"""Chunked prefill (config key ``prefill_chunk``): a prompt run as steps of at most that many tokens.

Float32 on the CPU, reference config, pages of 16 positions, a 90-token prompt: for chunk sizes
that divide the prompt (30, 45) and do not (1, 7, 16, 64), page-aligned (16, 64) or not, the
greedy tokens equal the unchunked prefill's and Hugging Face's, the KV cache holds the same keys
and values, with and without a proposer (ngram; draft, whose own prefill is chunked too); a
proposer reading hidden states gets every chunk's, which together equal the unchunked prefill's;
no step is longer than the chunk; the Triton kernels (interpreter), the materialized-scores
reference attention and INT8 pages agree too. The progress line is checked through a
pseudo-terminal (in process, and the command line in a subprocess); on a GPU, the memory a long
prefill allocates is bounded by the chunk.
"""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import sys
import termios

import pytest
import torch

import tileinfer
from conftest import DEVICE, reference_engine, repetitive_prompt
from device_loop import rows_of_calls
from tileinfer.decode_plan import DecodePlan
from tileinfer.decoding import Decoder
from tileinfer.interfaces import Draft, Proposer, ProposerContext
from tileinfer.steps import StepRunner

NEW = 24
CHUNKS = [1, 7, 16, 30, 45, 64]  # 90 = 3 x 30 = 2 x 45; 16 and 64 are page-aligned; 7 and 30 cross pages
MODEL = dict(hidden=64, layers=2, vocab=320, intermediate=128, std=0.2, tokenizer=False, heads=4, kv_heads=2,
             head_dim=32, seed=5)


def prompt() -> list[int]:
    ids = torch.randint(0, 320, (90,), generator=torch.Generator().manual_seed(11)).tolist()
    assert len(ids) % 16
    return ids


@pytest.fixture(scope="module")
def folder(checkpoint_factory):
    return checkpoint_factory(**MODEL)


@pytest.fixture(scope="module")
def unchunked(folder):
    """The greedy tokens and the prompt's KV cache of a prefill in one step, and HF's tokens."""
    from transformers import Qwen3ForCausalLM

    engine = reference_engine(folder, max_new_tokens=NEW)
    assert engine.config.prefill_chunk >= 90  # the default: one step here
    out = engine.generate(prompt())
    hf = Qwen3ForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.tensor([prompt()])
    with torch.no_grad():
        ref = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NEW,
                          pad_token_id=0)[0, 90:].tolist()
    assert len(set(ref)) >= 6, f"degenerate reference output {ref}"
    return out.token_ids, ref, cache_of(engine, 90)


def cache_of(engine: tileinfer.Engine, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [tuple(t.clone() for t in engine.kv.gather(layer, length)) for layer in range(len(engine.model.layers))]


@pytest.mark.parametrize("chunk", CHUNKS)
def test_chunked_greedy_tokens_equal_the_unchunked_ones(folder, unchunked, chunk):
    tokens, hf, cache = unchunked
    engine = reference_engine(folder, max_new_tokens=NEW, prefill_chunk=chunk)
    heads: list[int] = []
    steps = spy_steps(engine, heads)
    out = engine.generate(prompt())
    assert out.token_ids == tokens == hf
    assert heads == [1] * NEW  # the prefill's last row, then each decode step: no chunk's logits discarded
    prefill = steps[:-(NEW - 1)]  # the decode steps after it have one token each
    assert [n for _, n in prefill] == [min(chunk, 90 - s) for s in range(0, 90, chunk)]
    assert [s for s, _ in prefill] == list(range(0, 90, chunk))
    for (k, v), (k0, v0) in zip(cache_of(engine, 90), cache):
        torch.testing.assert_close(k, k0, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(v, v0, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("keys", [{"options": {"reference": {"scores": "materialized"}}}, {"kv_store": "paged_int8"}],
                         ids=["materialized-scores", "int8-kv"])
def test_chunked_prefill_with_the_other_reference_paths(folder, keys):
    whole = reference_engine(folder, max_new_tokens=NEW, **keys).generate(prompt()).token_ids
    assert reference_engine(folder, max_new_tokens=NEW, prefill_chunk=7, **keys).generate(prompt()).token_ids == whole


def spy_steps(engine: tileinfer.Engine, heads: list[int] | None = None) -> list[tuple[int, int]]:
    """Records (start, tokens) of every step of the engine's model (each call of its ForwardPass),
    and checks that each one runs its layers on no more tokens than the step has (the activations a
    step holds); ``heads`` gets the rows of each lm_head call."""
    seen: list[tuple[int, int]] = []
    model, forward_pass = engine.model, engine.decoder.steps.forward_pass
    forward = type(forward_pass).__call__
    rows = rows_of_calls(model.layers[0].gate_up)
    if heads is not None:
        rows_of_calls(model.lm_head, heads)

    class StepSpy(type(forward_pass)):
        def __call__(self, tokens, step, kv, *args, **kw):
            seen.append((step.start, step.num_tokens))
            before = len(rows)
            result = forward(self, tokens, step, kv, *args, **kw)
            assert rows[before:] == [step.num_tokens]
            return result

    forward_pass.__class__ = StepSpy
    return seen


def test_the_prefill_is_one_step_up_to_the_chunk(folder):
    engine = reference_engine(folder, max_new_tokens=1, prefill_chunk=90)
    steps = spy_steps(engine)
    engine.generate(prompt())
    assert steps == [(0, 90)]
    engine = reference_engine(folder, max_new_tokens=1, prefill_chunk=89)
    steps = spy_steps(engine)
    engine.generate(prompt())
    assert steps == [(0, 89), (89, 1)]


@pytest.mark.parametrize("proposer", ["ngram", "draft", "short-draft"])
@pytest.mark.parametrize("chunk", [7, 16, 45])
def test_chunked_prefill_with_a_proposer(checkpoint_factory, proposer, chunk):
    target = checkpoint_factory(tokenizer=False)
    ids = repetitive_prompt() * 2  # 94 tokens: drafts get accepted
    plain = reference_engine(target, max_new_tokens=40).generate(ids)
    keys = {"proposer": proposer.removeprefix("short-"), "spec_k": 3}
    if proposer != "ngram":  # a draft that accepts about half (as in tests/plugins/test_draft.py), or one
        draft = checkpoint_factory(tokenizer=False, std=0.06, max_positions=64 if proposer == "short-draft" else 512)
        keys["options"] = {"draft": {"model": str(draft)}}  # whose context is shorter than the prompt
    engine = reference_engine(target, max_new_tokens=40, prefill_chunk=chunk, **keys)
    out = engine.generate(ids)
    assert out.token_ids == plain.token_ids
    if proposer == "short-draft":
        assert out.stats.drafted_tokens == 0 and engine.proposer._cached == []
    else:
        assert 0 < out.stats.accepted_tokens < out.stats.drafted_tokens, out.stats
    if proposer == "draft":  # its cache is a prefix of the sequence, and equals an unchunked draft's
        cached = engine.proposer._cached
        assert cached == (ids + out.token_ids)[:len(cached)] and len(cached) > len(ids)
        whole = reference_engine(target, max_new_tokens=40, prefill_chunk=4096, **keys)
        assert whole.generate(ids).token_ids == plain.token_ids
        for layer in range(len(engine.proposer.model.layers)):
            for a, b in zip(engine.proposer.kv.gather(layer, len(ids)), whole.proposer.kv.gather(layer, len(ids))):
                torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


class Recording(Proposer):
    """Drafts nothing; records what the engine hands a proposer that reads hidden states."""

    hidden_layers = (0, 1)

    def __init__(self, context: ProposerContext) -> None:
        super().__init__(context)
        self.chunks: list[tuple[list[int], int, dict[int, torch.Tensor]]] = []
        self.started: list[int] | None = None

    def prompt_chunk(self, tokens, start, hidden):
        self.chunks.append((tokens, start, {n: h.clone() for n, h in hidden.items()}))

    def start(self, tokens):
        self.started = tokens

    def propose(self, tokens, k):
        return Draft([])


@pytest.mark.parametrize("chunk", [7, 30, 90])
def test_a_proposer_gets_the_hidden_states_of_every_chunk(folder, chunk):
    engine = reference_engine(folder)
    ids = prompt()

    def run(chunk: int) -> Recording:
        recording = Recording(ProposerContext(engine.model, engine.sampler, engine.config, engine.registry))
        steps = StepRunner(engine.decoder.steps.forward_pass, engine.kv, recording.hidden_layers)
        decoder = Decoder(steps, engine.sampler, DecodePlan("host", spec_k=3, proposer=recording), prefill_chunk=chunk)
        out = [t for step in decoder.run(ids, 3, ()) for t in step]
        assert recording.started == ids + out[:1]
        return recording

    recording, whole = run(chunk), run(4096)
    assert [(t, s) for t, s, _ in recording.chunks] == [(ids[s:s + chunk], s) for s in range(0, 90, chunk)]
    assert len(whole.chunks) == 1
    for n in (0, 1):
        joined = torch.cat([h[n] for _, _, h in recording.chunks])
        assert joined.shape == (90, 64)
        torch.testing.assert_close(joined, whole.chunks[0][2][n], atol=1e-4, rtol=1e-4)  # float32: BLAS blocks a chunk differently


# The Triton kernels under the interpreter cost seconds a step, growing with the weight rows and the
# tokens: a small model (GQA 2 / 1 heads of 16) and a 37-token prompt (pages of 16: chunks cross them).
TRITON_MODEL = dict(hidden=32, heads=2, kv_heads=1, head_dim=16, intermediate=48, vocab=96, layers=2, tokenizer=False)
TRITON_IDS = repetitive_prompt()[:37]


def triton_engine(target, size: int) -> tileinfer.Engine:
    return tileinfer.Engine.from_config("reference", model=str(target), device=DEVICE, dtype="float32",
                                        kv_page_size=16, linear="triton", attention="triton", max_new_tokens=4,
                                        prefill_chunk=size, progress=False)


@pytest.fixture(scope="module")
def triton_unchunked(checkpoint_factory):
    """The Triton engine's greedy tokens and the prompt's KV cache of a prefill in one step."""
    target = checkpoint_factory(**TRITON_MODEL)
    whole = triton_engine(target, 4096)
    tokens = whole.generate(TRITON_IDS).token_ids
    return target, tokens, cache_of(whole, len(TRITON_IDS))


@pytest.mark.parametrize("chunk", [7, 20])  # the Triton decode kernel (<= 16 tokens) and the prefill kernel
def test_the_triton_kernels_prefill_in_chunks(triton_unchunked, chunk):
    """Float32 (the interpreter on a CPU): chunk steps with start > 0 through both paged attention
    kernels (7: six chunks of at most 16 tokens; 20: a second chunk of 17 at start 20). On a GPU the
    chunks' GEMV/GEMM and the whole prompt's GEMM may round differently."""
    target, tokens, cache = triton_unchunked
    chunked = triton_engine(target, chunk)
    steps = spy_steps(chunked)
    assert chunked.generate(TRITON_IDS).token_ids == tokens
    n = len(TRITON_IDS)
    assert steps[:-3] == [(s, min(chunk, n - s)) for s in range(0, n, chunk)]  # then 3 decode steps
    tolerance = 1e-5 if DEVICE == "cpu" else 1e-3
    for (k, v), (k0, v0) in zip(cache_of(chunked, len(TRITON_IDS)), cache):
        torch.testing.assert_close(k, k0, atol=tolerance, rtol=tolerance)
        torch.testing.assert_close(v, v0, atol=tolerance, rtol=tolerance)


def test_prefill_chunk_is_a_checked_config_key(capsys, folder):
    from conftest import run_cli

    code, out, err = run_cli(capsys, "config", "prefill_chunk=512")
    assert code == 0 and "prefill_chunk: 512" in out
    for value in ("0", "-3", "1.5", "x"):
        code, out, err = run_cli(capsys, "config", f"prefill_chunk={value}")
        assert code == 2 and out == "" and err.startswith(f"error: prefill_chunk={value}") and err.count("\n") == 1


# -- the progress line ---------------------------------------------------------------------------------


def pseudo_terminal() -> tuple[int, int]:
    """A pseudo-terminal of 24 rows and 80 columns (a fresh one has none, where tqdm shows nothing)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    return master, slave


def progress_output(engine: tileinfer.Engine, ids: list[int], monkeypatch, *, terminal: bool = True) -> str:
    """What stderr receives while ``engine`` generates from ``ids``: a pseudo-terminal's (read from
    its master side) or, with ``terminal=False``, a pipe's."""
    read_fd, write_fd = pseudo_terminal() if terminal else os.pipe()
    stream = os.fdopen(write_fd, "w")
    assert stream.isatty() == terminal
    monkeypatch.setattr(sys, "stderr", stream)
    try:
        engine.generate(ids, max_new_tokens=2)
    finally:
        stream.close()
    chunks = []
    while True:
        try:
            data = os.read(read_fd, 4096)
        except OSError:  # the pty's master reads EIO once the slave is closed
            break
        if not data:
            break
        chunks.append(data)
    os.close(read_fd)
    return b"".join(chunks).decode()


def test_a_long_prefill_shows_its_progress_on_a_terminal(folder, monkeypatch):
    engine = tileinfer.Engine.from_config("reference", model=str(folder), device="cpu", dtype="float32",
                                          kv_page_size=16, prefill_chunk=32, progress=True)
    shown = progress_output(engine, prompt(), monkeypatch)
    line = "\rprefill 0/90 tokens\rprefill 32/90 tokens\rprefill 64/90 tokens\rprefill 90/90 tokens"
    assert shown == line + "\r" + " " * len("prefill 90/90 tokens") + "\r"  # erased at the end
    assert progress_output(engine, prompt()[:32], monkeypatch) == ""  # one chunk: nothing
    assert progress_output(engine, prompt(), monkeypatch, terminal=False) == ""  # not a terminal: nothing
    quiet = reference_engine(folder, prefill_chunk=32)  # progress=False (what -q asks for)
    assert progress_output(quiet, prompt(), monkeypatch) == ""


# -- activation memory (GPU) ---------------------------------------------------------------------------


@pytest.mark.gpu
def test_the_prefill_activations_are_bounded_by_the_chunk(checkpoint_factory):
    """The default engine (Triton kernels) in float32 on an 8,000-token prompt: the memory allocated
    above the weights and the pool while it generates is bounded by the chunk, not by the prompt."""
    from tileinfer.memory import activation_bytes
    from tileinfer.model_config import ModelConfig

    folder = checkpoint_factory(hidden=256, intermediate=512, layers=2, heads=4, kv_heads=2, head_dim=64,
                                max_positions=8192, tokenizer=False)
    ids = torch.randint(0, 320, (8000,), generator=torch.Generator().manual_seed(3)).tolist()
    peaks, tokens = {}, {}
    for chunk in (512, 8192):
        engine = tileinfer.Engine.from_config(model=str(folder), prefill_chunk=chunk, dtype="float32",
                                              progress=False)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        tokens[chunk] = engine.generate(ids, max_new_tokens=8, ignore_eos=True).token_ids
        peaks[chunk] = torch.cuda.max_memory_allocated() - base
        del engine
    assert tokens[512] == tokens[8192]
    estimate = activation_bytes(ModelConfig.from_folder(folder), 512, torch.float32)
    assert peaks[512] < 4 * estimate, (peaks, estimate)
    assert 8 * peaks[512] < peaks[8192], peaks


def test_the_command_line_shows_the_progress_on_a_terminal(folder):
    """``tileinfer generate`` in a subprocess whose stderr is a pseudo-terminal."""
    import subprocess

    master, slave = pseudo_terminal()
    ids = ",".join(map(str, prompt()))
    done = subprocess.run([sys.executable, "-m", "tileinfer.cli", "generate", "--model", str(folder), "--prompt-ids",
                           ids, "--max-new-tokens", "2", "prefill_chunk=40", "device=cpu", "kv_page_size=16",
                           "linear=reference", "attention=reference"],
                          stdout=subprocess.PIPE, stderr=slave, timeout=300)
    os.close(slave)
    shown = b""
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:
            break
        if not data:
            break
        shown += data
    os.close(master)
    assert done.returncode == 0, shown
    assert b"\rprefill 40/90 tokens\rprefill 80/90 tokens\rprefill 90/90 tokens\r" in shown


@pytest.mark.gpu
@pytest.mark.parametrize("chunk", [4096, 3000])  # the default; one that crosses pages (64) inside chunks
def test_a_32k_prompt_prefilled_in_chunks_gives_the_unchunked_tokens_gpu(checkpoint_factory, chunk):
    """The default engine (Triton kernels, CUDA graphs) in float32 on a 32,760-token prompt (kv_capacity=auto:
    the model's 32,832 positions)."""
    folder = checkpoint_factory(hidden=256, intermediate=512, layers=2, heads=4, kv_heads=2, head_dim=64,
                                max_positions=32832, std=0.2, tokenizer=False)
    ids = torch.randint(0, 320, (32760,), generator=torch.Generator().manual_seed(4)).tolist()
    out = {}
    for size in (chunk, 32832):
        engine = tileinfer.Engine.from_config(model=str(folder), prefill_chunk=size, dtype="float32", progress=False)
        assert engine.capacity == 32832
        out[size] = engine.generate(ids, max_new_tokens=32, ignore_eos=True).token_ids
        del engine
    assert out[chunk] == out[32832], out
