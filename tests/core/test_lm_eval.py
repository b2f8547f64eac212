"""lm-evaluation-harness against tileinfer serve: its ``local-completions`` model (the HF tokenizer of
the served checkpoint, token-id prompts, batches of 2) runs a multiple-choice loglikelihood task
(``echo`` with ``max_tokens`` 1 and ``logprobs`` 1) and a generation task (``stop``, ``max_tokens``)
from a local task file; every loglikelihood it reports is the engine's sum of the continuation's
prompt logprobs, every generation the engine's greedy text. Skipped where ``lm_eval`` is not
installed (it is not in the test extra: it brings datasets, pandas, scikit-learn, ...)."""

from __future__ import annotations

import json
import math

import pytest

lm_eval = pytest.importorskip("lm_eval")
pytest.importorskip("uvicorn")

import tileinfer  # noqa: E402
from conftest import REFERENCE_CPU as BASE  # noqa: E402
from test_server import model_id, running  # noqa: E402

MC = [{"question": "def add(a, b):\n   ", "choices": [" return a + b", " print(a)", " import os"], "answer": 0},
      {"question": "for i in range(10):\n   ", "choices": [" print(i * i)", " return i"], "answer": 0},
      {"question": "class Point:\n    def", "choices": [" __init__(self, x, y):", " add(a, b):"], "answer": 0}]
GEN = [{"prompt": "import os\nimport", "target": " sys"}, {"prompt": "def add(a, b):\n", "target": "    return a + b"}]


def task_files(tmp_path) -> None:
    for name, rows in (("mc", MC), ("gen", GEN)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = "dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {}\ntest_split: test\n"
    (tmp_path / "mc.yaml").write_text(
        "task: tileinfer_mc\n" + data.format(tmp_path / "mc.jsonl") + "output_type: multiple_choice\n"
        "doc_to_text: '{{question}}'\ndoc_to_choice: '{{choices}}'\ndoc_to_target: '{{answer}}'\n"
        "metric_list:\n  - metric: acc\n")
    (tmp_path / "gen.yaml").write_text(
        "task: tileinfer_gen\n" + data.format(tmp_path / "gen.jsonl") + "output_type: generate_until\n"
        "doc_to_text: '{{prompt}}'\ndoc_to_target: '{{target}}'\n"
        "generation_kwargs:\n  until: ['\\n']\n  max_gen_toks: 8\n  do_sample: false\n"
        "metric_list:\n  - metric: exact_match\n")


def test_lm_eval_loglikelihood_and_generation_tasks(tiny_checkpoint, tmp_path):
    from lm_eval.tasks import TaskManager

    engine = tileinfer.Engine.from_config(model=str(tiny_checkpoint), overrides=BASE, progress=False)
    reference = tileinfer.Engine.from_config(model=str(tiny_checkpoint), overrides=BASE, progress=False)
    task_files(tmp_path)
    with running(engine) as base:
        out = lm_eval.simple_evaluate(
            model="local-completions", tasks=["tileinfer_mc", "tileinfer_gen"], batch_size=2, log_samples=True,
            model_args={"base_url": f"{base}/v1/completions", "model": model_id(engine),
                        "tokenizer": str(tiny_checkpoint), "tokenizer_backend": "huggingface", "max_retries": 1,
                        "num_concurrent": 1},
            task_manager=TaskManager(include_path=str(tmp_path)))
    assert set(out["results"]) == {"tileinfer_mc", "tileinfer_gen"}
    assert 0 <= out["results"]["tileinfer_mc"]["acc,none"] <= 1
    tok = reference.tokenizer
    mc = out["samples"]["tileinfer_mc"]
    assert sum(len(s["resps"]) for s in mc) == sum(len(d["choices"]) for d in MC)
    for sample in mc:
        for (context, continuation), ((loglik, _greedy),) in zip(sample["arguments"], sample["resps"]):
            spaces = len(context) - len(context.rstrip())  # lm_eval moves them to the continuation
            whole, ctx = tok.encode(context + continuation), tok.encode(context[:len(context) - spaces])
            scored = reference.generate(whole, tileinfer.SamplingParams(max_tokens=1, prompt_logprobs=1))
            expected = sum(lp.logprob for lp in scored.prompt_logprobs[len(ctx):])
            assert math.isclose(loglik, expected, abs_tol=1e-4), (context, continuation)
    for sample in out["samples"]["tileinfer_gen"]:
        text = reference.generate(sample["arguments"][0][0], tileinfer.SamplingParams(
            max_tokens=8, temperature=0, stop=["\n", "<|im_end|>"], seed=1234)).text
        assert sample["resps"][0][0] == text
