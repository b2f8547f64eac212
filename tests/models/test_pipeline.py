"""The model-making pipeline of models/, end to end on a small scale (CPU, ~30 s): a corpus of 200
files of this Python's stdlib and site-packages, a 512-token BPE, a ``tiny`` Qwen3 trained for a
fixed number of steps, saved in BF16; tileinfer loads it and its greedy tokens equal
transformers' (float32). Also: resuming a run gives the same weights, the benchmark prompts fit
their budget, and packing for the device tool round-trips."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

import tileinfer
from tileinfer.interfaces import Step
from tileinfer.models import corpus, data, evaluate, make_all, prompts, train
from tileinfer.models import tokenizer as tokenizer_script
from tileinfer.tokenizer import Tokenizer as TileTokenizer

STEPS, SEQ_LEN, VOCAB, MAX_PROMPT = 80, 256, 512, 200


def train_args(folder: Path, run: Path, *extra: str) -> list[str]:
    return ["--size", "tiny", "--data", str(folder / "data"), "--tokenizer", str(folder / "tokenizer"),
            "--out", str(run), "--seq-len", str(SEQ_LEN), "--batch", "8", "--threads", "1", "--evals", "3",
            "--eval-sequences", "8", "--ckpt-every", "1000", *extra]


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pipeline")
    stats = corpus.main([str(folder / "corpus"), "--max-files", "200", "--workers", "1"])
    tokenizer_script.main([str(folder / "corpus"), str(folder / "tokenizer"), "--vocab", str(VOCAB), "--sample-mb", "4",
                           "--max-length", str(SEQ_LEN)])
    meta = data.main([str(folder / "corpus"), str(folder / "tokenizer"), str(folder / "data"), "--workers", "1"])
    result = train.main(train_args(folder, folder / "run", "--steps", str(STEPS)))
    return {"folder": folder, "stats": stats, "meta": meta, "result": result, "model": folder / "run" / "model"}


# -- corpus, tokenizer, streams ----------------------------------------------------------------------


def test_corpus_is_split_by_name_and_deduplicated(pipeline):
    folder, stats = pipeline["folder"] / "corpus", pipeline["stats"]
    train_docs = list(corpus.read_docs(folder, "train"))
    heldout_docs = list(corpus.read_docs(folder, "heldout"))
    assert len(train_docs) == stats["train_files"] > 100 and len(heldout_docs) == stats["heldout_files"]
    assert all(not corpus.is_heldout(d["name"]) for d in train_docs)
    assert all(corpus.is_heldout(d["name"]) for d in heldout_docs)
    texts = [d["text"] for d in train_docs + heldout_docs]
    assert len(set(texts)) == len(texts)
    assert all(corpus.MIN_BYTES <= len(t.encode()) <= corpus.MAX_BYTES for t in texts)
    assert [d["name"] for d in train_docs] == sorted(d["name"] for d in train_docs)
    train_bytes = sum(len(d["text"].encode()) for d in train_docs)
    assert json.loads((folder / "stats.json").read_text())["train_bytes"] == train_bytes


def test_corpus_is_deterministic(pipeline, tmp_path):
    corpus.main([str(tmp_path / "again"), "--max-files", "200", "--workers", "1"])
    first = pipeline["folder"] / "corpus"
    for path in sorted(first.glob("*.jsonl")):
        assert (tmp_path / "again" / path.name).read_bytes() == path.read_bytes()


def test_benchmark_files_are_held_out():
    """The committed benchmark files are CPython modules whose names the split holds out."""
    for file, old, new in prompts.BENCHMARK:
        name = "stdlib/" + {"asyncio_runners.py.txt": "asyncio/runners.py"}.get(file, file.removesuffix(".txt"))
        assert corpus.is_heldout(name), name
        text = (prompts.HELDOUT_DIR / file).read_text()
        assert old in prompts.class_names(text) and new not in text
        assert corpus.overlaps(text, corpus.benchmark_lines())  # a copy elsewhere would be dropped from training
    assert [p.name for p, _ in prompts.files_with_class()] == sorted(f for f, _, _ in prompts.BENCHMARK)


def test_tokenizer_round_trips_and_has_the_special_tokens(pipeline):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    folder = pipeline["folder"] / "tokenizer"
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert tok.get_vocab_size() == VOCAB
    assert [tok.token_to_id(t) for t in tokenizer_script.SPECIAL_TOKENS] == [0, 1, 2]
    for doc in corpus.read_docs(pipeline["folder"] / "corpus", "heldout"):
        ids = tok.encode(doc["text"], add_special_tokens=False).ids
        assert tok.decode(ids, skip_special_tokens=False) == doc["text"]
    messages = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "hi\n  there"},
                {"role": "assistant", "content": "ok"}, {"role": "user", "content": "again"}]
    hf = AutoTokenizer.from_pretrained(folder)
    ours = TileTokenizer.from_folder(folder)
    expected = prompts.chatml(messages)
    assert hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == expected
    assert ours.apply_chat_template(messages) == expected
    ids = ours.encode("<|im_start|>user\nx<|im_end|>", add_special_tokens=False)
    assert ids[0] == 1 and ids[-1] == 2 and 0 not in ids


def test_streams_hold_documents_and_chat_examples(pipeline):
    import numpy as np

    folder, meta = pipeline["folder"] / "data", pipeline["meta"]
    train_ids = np.fromfile(folder / "train.bin", dtype=np.uint16)
    heldout_ids = np.fromfile(folder / "heldout.bin", dtype=np.uint16)
    assert len(train_ids) == meta["train"]["tokens"] and len(heldout_ids) == meta["heldout"]["tokens"]
    assert int((train_ids == 0).sum()) == meta["train"]["documents"]
    assert int((heldout_ids == 0).sum()) == meta["heldout"]["files"]
    assert meta["train"]["edit_examples"] > 0 and meta["train"]["open_examples"] > 0
    assert int((train_ids == 2).sum()) == 2 * (meta["train"]["edit_examples"] + meta["train"]["open_examples"])
    assert not (heldout_ids == 1).any()  # held-out: raw files only


# -- the trained model ------------------------------------------------------------------------------


def test_model_folder(pipeline):
    folder, result = pipeline["model"], pipeline["result"]
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"] and config["model_type"] == "qwen3"
    assert config["dtype"] == "bfloat16" and config["tie_word_embeddings"] is True
    assert config["max_position_embeddings"] == SEQ_LEN and config["vocab_size"] == VOCAB
    assert json.loads((folder / "generation_config.json").read_text())["eos_token_id"] == [2, 0]
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (folder / name).is_file(), name
    assert [p.name for p in folder.glob("*.safetensors")] == ["model.safetensors"]
    assert result["steps"] == STEPS and result["parameters"] == result["embedding"] + result["non_embedding"]
    assert result["heldout_loss"] < 5.5  # ln 512 = 6.24 for a uniform guess; about 5.0 after the 80 steps
    evaluation = json.loads((folder.parent / "eval.json").read_text())
    assert evaluation["heldout_perplexity"] == pytest.approx(2.718281828 ** evaluation["heldout_loss"], rel=1e-3)
    history = json.loads((folder.parent / "history.json").read_text())
    assert len(history["eval_loss"]) >= 3 and history["step"][-1] == STEPS
    pytest.importorskip("matplotlib")
    assert (folder.parent / "loss.png").stat().st_size > 1000


@pytest.fixture(scope="module")
def engine(pipeline):
    return tileinfer.Engine.from_config("reference", model=str(pipeline["model"]), device="cpu", dtype="float32", progress=False)


def code_prompt(engine) -> list[int]:
    source = (prompts.HELDOUT_DIR / "netrc.py.txt").read_text()
    return engine.tokenizer.encode(source)[:120]


def test_tileinfer_loads_and_generates(engine):
    result = engine.generate("def fibonacci(n):", max_new_tokens=24)
    assert len(result.token_ids) == 24 and isinstance(result.text, str)
    chat = engine.generate("Continue this Python file.", chat=True, max_new_tokens=8)
    assert chat.stats.prompt_tokens > 5 and chat.token_ids
    assert engine.model_config.eos_token_ids == (2, 0)


def test_greedy_tokens_and_logits_match_transformers(pipeline, engine):
    """The same greedy tokens, and the same logits (1e-4) for the prompt run in one step and then
    for each generated token run as a decode step over the KV cache."""
    from transformers import Qwen3ForCausalLM

    hf = Qwen3ForCausalLM.from_pretrained(pipeline["model"], dtype=torch.float32).eval()
    ids = code_prompt(engine)
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                          do_sample=False, max_new_tokens=40, pad_token_id=0, eos_token_id=None)
        ref_logits = hf(out).logits[0]
    expected = out[0, len(ids):].tolist()
    got = engine.generate(ids, max_new_tokens=40).token_ids
    # tileinfer stops at an EOS of generation_config.json; transformers was told not to
    assert got == expected[:len(got)] and (len(got) == 40 or got[-1] in (0, 2))
    sequence = out[0].tolist()
    engine.kv.reset()
    chunks, start = [], 0
    with torch.inference_mode():
        for n in [len(ids)] + [1] * len(expected):
            step = Step.at(start, n, torch.device("cpu"))
            engine.kv.reserve(step.end)
            logits, _ = engine.model.forward(torch.tensor(sequence[start:start + n]), step, engine.kv)
            chunks.append(logits.float())
            start += n
    torch.testing.assert_close(torch.cat(chunks), ref_logits, atol=1e-4, rtol=1e-4)


def test_resume_gives_the_same_weights(pipeline, tmp_path):
    """Stopped after 3 of 6 steps (between the evaluations at steps 2 and 4) and resumed: the weights
    and the history of the run not stopped."""
    from safetensors.torch import load_file

    folder = pipeline["folder"]
    train.main(train_args(folder, tmp_path / "straight", "--steps", "6"))
    train.main(train_args(folder, tmp_path / "resumed", "--steps", "6", "--stop-after", "3"))
    assert not (tmp_path / "resumed" / "model").exists()
    train.main(train_args(folder, tmp_path / "resumed", "--steps", "6", "--resume"))
    a = load_file(tmp_path / "straight" / "model" / "model.safetensors")
    b = load_file(tmp_path / "resumed" / "model" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    history = json.loads((tmp_path / "resumed" / "history.json").read_text())
    assert history == json.loads((tmp_path / "straight" / "history.json").read_text())


# -- benchmark prompts, evaluation, packing ----------------------------------------------------------


def test_benchmark_prompts_fit_their_budget(engine):
    tok = engine.tokenizer
    for p in prompts.benchmark_prompts(tok, MAX_PROMPT):
        assert len(p.token_ids) <= MAX_PROMPT
        assert p.token_ids == tok.encode(p.text, add_special_tokens=False)
        assert p.text.endswith("<|im_start|>assistant\n") and p.source in p.text
        if p.task == "edit":
            old, new = re.search(r"Rename the class (\w+) to (\w+)", p.text).groups()
            assert old in prompts.class_names(p.source)
            assert p.expected == prompts.fence(prompts.rename(p.source, old, new))
            assert new in p.expected and not re.search(rf"\b{old}\b", p.expected)
    # the cut is the longest that fits: one more line goes over
    source = (prompts.HELDOUT_DIR / "_weakrefset.py.txt").read_text()
    p = prompts.continuation_prompt(source, tok, MAX_PROMPT)
    more = source[:len(p.source) + source[len(p.source):].index("\n") + 1]
    longer = prompts.render(tok, prompts.continuation_messages(more))
    assert len(tok.encode(longer, add_special_tokens=False)) > MAX_PROMPT


def test_evaluate_reports_the_benchmark(pipeline):
    result = evaluate.run(pipeline["model"], pipeline["model"], max_tokens=MAX_PROMPT, new_tokens=6, device="cpu")
    assert [r["task"] for r in result["prompts"]] == ["edit", "open"] * 3
    assert all(r["draft_agreement"] == 1.0 for r in result["prompts"])  # a model agrees with itself
    assert isinstance(result["samples"]["target"], str)


def test_pack_splits_and_round_trips(pipeline, tmp_path, monkeypatch):
    import tarfile

    monkeypatch.setattr(make_all, "PART_BYTES", 100_000)
    run_dir = pipeline["folder"] / "run"
    parts = make_all.pack("tiny", make_all.model_members("tiny", run_dir, {}), tmp_path)
    assert len(parts) > 1 and all((tmp_path / p).stat().st_size <= 100_000 for p in parts)
    whole = tmp_path / "whole.tar"
    whole.write_bytes(b"".join((tmp_path / p).read_bytes() for p in parts))
    with tarfile.open(whole) as tar:
        tar.extractall(tmp_path / "x", filter="data")
    for path in (run_dir / "model").iterdir():
        assert (tmp_path / "x" / "tiny" / path.name).read_bytes() == path.read_bytes()
    assert (tmp_path / "x" / "results" / "tiny_eval.json").is_file()
