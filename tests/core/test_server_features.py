"""tileinfer serve's endpoints beyond completions, over real HTTP on localhost: served model names,
batches of prompts, /metrics, /version, /tokenize and /detokenize, the access log, streamed
logprobs chunk by chunk, and a bounded shutdown."""

from __future__ import annotations

import logging
import threading
import time

import pytest

httpx = pytest.importorskip("httpx")  # the server's stack: installed by the [test] extra, absent on the GPU machine
openai = pytest.importorskip("openai")
prometheus_parser = pytest.importorskip("prometheus_client.parser")

import tileinfer  # noqa: E402
from test_server import GatedEngine, assert_error, chat_ids, running, serving  # noqa: E402
from test_server import engine, reference  # noqa: E402, F401  (its fixtures: the served engine, one to compare)

NAMES = ["alias-a", "alias-b"]
PROMPTS = ["def add(a, b):", "import os", "class Point:"]


@pytest.fixture(scope="module")
def url(engine):
    with running(engine, {"log_level": "info"}, served_model_names=NAMES) as base:
        yield base


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)


def post(url, path, body):
    return httpx.post(f"{url}{path}", json=body, timeout=60)


def test_served_model_names_are_all_accepted_and_the_first_reported(client, url, engine):
    assert [m.id for m in client.models.list().data] == NAMES
    for name in NAMES:
        reply = client.completions.create(model=name, prompt="x = 1", max_tokens=2)
        assert reply.model == NAMES[0]
    error = assert_error(post(url, "/v1/completions", {"model": engine.folder.name, "prompt": "hi"}), 404, "model")
    assert error["code"] == "model_not_found"


def test_a_batch_of_prompts_is_one_choice_per_prompt_in_order(client, engine, reference):
    expected = [reference.generate(p, max_new_tokens=6).text for p in PROMPTS]
    reply = client.completions.create(model=NAMES[0], prompt=PROMPTS, max_tokens=6)
    assert [c.index for c in reply.choices] == [0, 1, 2] and [c.text for c in reply.choices] == expected
    lengths = [len(engine.encode_prompt(p)) for p in PROMPTS]
    assert reply.usage.prompt_tokens == sum(lengths) and reply.usage.completion_tokens == 18
    ids = [engine.encode_prompt(p) for p in PROMPTS[:2]]
    assert [c.text for c in client.completions.create(model=NAMES[0], prompt=ids, max_tokens=6).choices] \
        == expected[:2]
    texts, finishes = ["", "", ""], [None, None, None]
    for chunk in client.completions.create(model=NAMES[0], prompt=PROMPTS, max_tokens=6, stream=True,
                                           stream_options={"include_usage": True}):
        for c in chunk.choices:
            texts[c.index] += c.text
            finishes[c.index] = c.finish_reason or finishes[c.index]
        usage = chunk.usage
    assert texts == expected and finishes == ["length"] * 3 and usage.completion_tokens == 18


def test_a_bad_prompt_in_a_batch_is_a_400_naming_it(url):
    error = assert_error(post(url, "/v1/completions", {"prompt": ["hi", ""]}), 400, "prompt")
    assert "prompt 1" in error["message"]


def scrape(url: str) -> dict[tuple, float]:
    """/metrics parsed with prometheus_client's parser: {(sample name, sorted labels): value}."""
    text = httpx.get(f"{url}/metrics").text
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in prometheus_parser.text_string_to_metric_families(text) for sample in family.samples}


def test_metrics_count_requests_tokens_and_latencies(url, engine):
    completions = (("endpoint", "/v1/completions"),)
    names = [("tileinfer_requests_total", completions + (("status", "200"),)),
             ("tileinfer_requests_total", completions + (("status", "400"),)),
             ("tileinfer_prompt_tokens_total", ()), ("tileinfer_generation_tokens_total", ()),
             ("tileinfer_time_to_first_token_seconds_count", ()), ("tileinfer_inter_token_latency_seconds_count", ())]
    before = scrape(url)
    assert post(url, "/v1/completions", {"prompt": "import os", "max_tokens": 5}).status_code == 200
    assert post(url, "/v1/completions", {"prompt": "import os", "max_tokens": 0}).status_code == 400
    r = httpx.get(f"{url}/metrics")
    after = scrape(url)
    assert [after[n] - before.get(n, 0) for n in names] == [1, 1, len(engine.encode_prompt("import os")), 5, 1, 4]
    assert after[("tileinfer_requests_waiting", ())] == 0 and after[("tileinfer_requests_running", ())] == 0
    assert r.headers["content-type"].startswith("text/plain")


def test_version(url):
    assert httpx.get(f"{url}/version").json() == {"version": tileinfer.__version__}


def test_tokenize_and_detokenize_as_vllm_shapes_them(url, engine):
    ids = engine.tokenizer.encode("def add(a, b):")
    reply = post(url, "/tokenize", {"prompt": "def add(a, b):", "return_token_strs": True}).json()
    assert reply == {"count": len(ids), "max_model_len": engine.capacity, "tokens": ids,
                     "token_strs": [engine.tokenizer.decode([t], skip_special_tokens=False) for t in ids]}
    messages = [{"role": "user", "content": "hi"}]
    reply = post(url, "/tokenize", {"messages": messages, "model": NAMES[1]}).json()
    assert reply["tokens"] == chat_ids(engine, messages) and reply["token_strs"] is None
    assert post(url, "/detokenize", {"tokens": ids}).json() == {"prompt": engine.tokenizer.decode(ids)}
    vocab = engine.tokenizer.vocab_size
    assert_error(post(url, "/detokenize", {"tokens": [1, vocab]}), 400, "tokens[1]")
    assert_error(post(url, "/tokenize", {"prompt": "hi", "messages": messages}), 400)


def test_one_access_log_line_per_request_with_tokens_and_timings(url):
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("tileinfer.server")
    logger.addHandler(handler)
    ours = ('"POST /v1/completions"', '"GET /nowhere"')  # a line of an earlier test's request may still arrive

    def lines() -> list[logging.LogRecord]:
        return [r for r in records if any(path in r.getMessage() for path in ours)]
    try:
        time.sleep(0.2)  # the lines of earlier tests' requests arrive and are dropped
        records.clear()
        assert post(url, "/v1/completions", {"prompt": "import os", "max_tokens": 3}).status_code == 200
        assert httpx.get(f"{url}/nowhere").status_code == 404
        deadline = time.monotonic() + 10  # a line is written once its response was sent
        while len(lines()) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)  # a second line for either request would arrive by now
    finally:
        logger.removeHandler(handler)
    assert len(lines()) == 2 and all(r.levelno == logging.INFO for r in lines())
    completion, = [r.getMessage() for r in lines() if '"POST /v1/completions" 200 prompt_tokens=' in r.getMessage()]
    assert "completion_tokens=3 first_token_ms=" in completion and "total_ms=" in completion
    assert any('"GET /nowhere" 404' in r.getMessage() for r in lines())


def test_streamed_logprobs_go_with_the_text_of_their_tokens(client, engine, reference):
    """Each chunk carries the logprobs of the tokens its text came from: the engine's chunks grouped
    as the server sends them (a chunk whose text is held back gives its tokens to the next)."""
    messages = [{"role": "user", "content": "hi there"}]

    def expected_chunks(ids: list[int]) -> list[tuple[str, list[str]]]:
        out, pending = [], []
        for piece in reference.stream(ids, max_new_tokens=12, logprobs=1):
            pending += [engine.tokenizer.decode([lp.token_id], skip_special_tokens=False) for lp in piece.logprobs or ()]
            if piece.text:
                out.append((piece.text, pending))
                pending = []
        return out

    chat = [(c.choices[0].delta.content, [e.token for e in c.choices[0].logprobs.content])
            for c in client.chat.completions.create(model=NAMES[0], messages=messages, max_tokens=12, logprobs=True,
                                                    top_logprobs=1, stream=True)
            if c.choices and c.choices[0].delta.content]
    assert chat == expected_chunks(chat_ids(engine, messages))
    completion = [(c.choices[0].text, c.choices[0].logprobs.tokens)
                  for c in client.completions.create(model=NAMES[0], prompt="def add(a, b):", max_tokens=12,
                                                     logprobs=1, stream=True) if c.choices[0].text]
    assert completion == expected_chunks(engine.encode_prompt("def add(a, b):"))


def test_a_stop_ends_a_long_generation_within_the_shutdown_timeout(engine):
    gated = GatedEngine(engine, delay=0.02)
    with serving(gated, {"shutdown_timeout_s": 0.2}) as (base, server, thread):
        body = {"prompt": "def add(a, b):", "max_tokens": 300, "stream": True}
        got_first, lines = threading.Event(), []

        def client():
            try:
                with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=60) as r:
                    for line in r.iter_lines():
                        lines.append(line)
                        got_first.set()
            except httpx.TransportError:
                pass  # the server cut the stream

        reader = threading.Thread(target=client, daemon=True)
        reader.start()
        assert got_first.wait(20)
        server.should_exit = True  # what SIGTERM sets
        thread.join(20)
        assert not thread.is_alive()
        deadline = time.monotonic() + 10
        while not gated.streams[0]["closed"] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert gated.streams[0]["closed"] and gated.streams[0]["chunks"] < 300  # cut short, not run to its end
        reader.join(20)
        assert "data: [DONE]" not in lines


def test_usage_reports_the_cached_prompt_tokens(client, engine, reference):
    """A conversation's next turn, and a completion that repeats a prompt, reuse the served engine's
    KV cache: usage.prompt_tokens_details.cached_tokens counts it (streamed usage too); the replies
    are those of a cold prefill."""
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    first = client.chat.completions.create(model=NAMES[0], messages=messages, max_tokens=6, temperature=0)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "and then?"}]
    chunks = list(client.chat.completions.create(model=NAMES[0], messages=messages, max_tokens=6, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    ids = chat_ids(reference, messages)
    reference.kv.reset()  # a cold prefill
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == reference.generate(
        ids, max_new_tokens=6).text
    assert 0 < chunks[-1].usage.prompt_tokens_details.cached_tokens < chunks[-1].usage.prompt_tokens == len(ids)
    once = client.completions.create(model=NAMES[0], prompt="import os", max_tokens=3, temperature=0)
    again = client.completions.create(model=NAMES[0], prompt="import os", max_tokens=3, temperature=0)
    assert again.choices[0].text == once.choices[0].text
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
    assert first.usage.prompt_tokens_details.cached_tokens >= 0
