"""tileinfer serve: uvicorn on a free localhost port in a thread, driven by the official openai
client (streaming and not) and by raw HTTP (httpx) for the error cases, with a bounded load test."""

from __future__ import annotations

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest

httpx = pytest.importorskip("httpx")  # the server's stack: installed by the [test] extra, absent on the GPU machine
openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")

import tileinfer  # noqa: E402
from conftest import REFERENCE_CPU as BASE  # noqa: E402
from tileinfer.server import create_app, uvicorn_config  # noqa: E402

KEY = "sk-test-key"
PROMPTS = ["def add(a, b):", "class Point:", "for i in range(10):", "import os", "The quick brown fox",
           "print(", "x = 1", "return a + b", "while True:", "if x is None:", "try:", "with open(path) as f:",
           "lambda y: y * 2", "assert n > 0", "yield item", "from math import pi"]


@pytest.fixture(scope="module")
def engine(tiny_checkpoint):
    return tileinfer.Engine.from_config(model=str(tiny_checkpoint), overrides=BASE, progress=False)


@pytest.fixture(scope="module")
def reference(tiny_checkpoint):
    """A second engine, for the replies the server must match."""
    return tileinfer.Engine.from_config(model=str(tiny_checkpoint), overrides=BASE, progress=False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serving(engine, config: dict | None = None, **kw):
    """The app (``create_app(engine, **kw)``) served by uvicorn in a thread on a free port, as
    ``tileinfer serve`` configures it (``uvicorn_config``, with ``config``): yields its base URL,
    the uvicorn Server and its thread."""
    port = free_port()
    config = {"log_level": "warning", **(config or {})}
    server = uvicorn.Server(uvicorn_config(create_app(engine, **kw), port=port, **config))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", server, thread
    finally:
        server.should_exit = True
        thread.join(20)


@contextmanager
def running(engine, config: dict | None = None, **kw):
    """``serving``'s base URL."""
    with serving(engine, config, **kw) as (base, _, _):
        yield base


@pytest.fixture(scope="module")
def url(engine):
    with running(engine, api_key=KEY, queue_size=32) as base:
        yield base


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=60)


def model_id(engine) -> str:
    return engine.folder.name


def chat_ids(engine, messages, **kwargs) -> list[int]:
    text = engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True, **kwargs)
    return engine.tokenizer.encode(text, add_special_tokens=False)


# -- the openai client ---------------------------------------------------------------------------


def test_models_and_health(client, url, engine):
    assert [m.id for m in client.models.list().data] == [model_id(engine)]
    assert httpx.get(f"{url}/health").json() == {"status": "ok"}


def test_completion_matches_the_engine_and_counts_usage(client, engine, reference):
    expected = reference.generate("def add(a, b):", max_new_tokens=12)
    reply = client.completions.create(model=model_id(engine), prompt="def add(a, b):", max_tokens=12,
                                      temperature=0)
    assert reply.choices[0].text == expected.text
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.prompt_tokens == expected.stats.prompt_tokens
    assert reply.usage.completion_tokens == 12 and reply.usage.total_tokens == expected.stats.prompt_tokens + 12


def test_chat_streaming_and_not_match_the_engine(client, engine, reference):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    expected = reference.generate(chat_ids(reference, messages), max_new_tokens=10).text
    reply = client.chat.completions.create(model=model_id(engine), messages=messages, max_tokens=10)
    assert reply.choices[0].message.content == expected and reply.choices[0].message.role == "assistant"
    assert reply.usage.completion_tokens == 10
    chunks = list(client.chat.completions.create(model=model_id(engine), messages=messages, max_tokens=10,
                                                 stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    assert chunks[-1].usage.prompt_tokens == len(chat_ids(reference, messages))


def test_chat_template_kwargs_reach_the_template(url, engine, reference, monkeypatch):
    # the tiny template ignores unknown variables: check the kwargs are passed by making one fail
    messages = [{"role": "user", "content": "hi"}]
    r = post(url, "/v1/chat/completions", {"messages": messages, "max_tokens": 2,
                                           "chat_template_kwargs": {"add_generation_prompt": False}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template_kwargs"
    seen = {}
    render = type(engine.tokenizer).apply_chat_template

    def spy(self, messages, **kwargs):
        seen.update(kwargs)
        return render(self, messages, **kwargs)

    monkeypatch.setattr(type(engine.tokenizer), "apply_chat_template", spy)
    r = post(url, "/v1/chat/completions", {"messages": messages, "max_tokens": 2,
                                           "chat_template_kwargs": {"enable_thinking": False}})
    assert r.status_code == 200 and seen["enable_thinking"] is False


def test_stop_strings_cut_the_reply_across_token_boundaries(client, engine, reference):
    prompt = "class Point:"
    pieces = [c.text for c in reference.stream(prompt, max_new_tokens=16) if c.text]
    full = "".join(pieces)
    # a stop string spanning the boundary between two streamed pieces
    i = next(i for i in range(1, len(pieces)) if pieces[i - 1] and pieces[i])
    stop = pieces[i - 1][-1] + pieces[i][0]
    expected = full[:full.find(stop)]
    reply = client.completions.create(model=model_id(engine), prompt=prompt, max_tokens=16, stop=[stop, "\x00never"])
    assert reply.choices[0].text == expected and reply.choices[0].finish_reason == "stop"
    streamed = list(client.completions.create(model=model_id(engine), prompt=prompt, max_tokens=16, stop=stop,
                                              stream=True))
    assert "".join(c.choices[0].text for c in streamed) == expected
    assert streamed[-1].choices[0].finish_reason == "stop"


def test_sampling_is_per_request_and_seeded(client, engine, reference):
    kw = dict(model=model_id(engine), prompt="import os", max_tokens=12, temperature=1.5, top_p=0.95, seed=7)
    first, second = (client.completions.create(**kw).choices[0].text for _ in range(2))
    assert first == second
    sampling = tileinfer.interfaces.SamplingParams(temperature=1.5, top_p=0.95, seed=7)
    assert first == reference.generate("import os", max_new_tokens=12, sampling=sampling).text
    greedy = client.completions.create(model=model_id(engine), prompt="import os", max_tokens=12).choices[0].text
    assert greedy == reference.generate("import os", max_new_tokens=12).text  # the default is the config's


# -- errors over raw HTTP ------------------------------------------------------------------------


def post(url, path, body, key=KEY, **kw):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{url}{path}", json=body, headers=headers, timeout=60, **kw)


def assert_error(r, status, param=None, words=""):
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and words in error["message"]
    return error


@pytest.mark.parametrize("field,value", [("echo", True), ("functions", [{"name": "f"}])])
def test_an_unimplemented_field_is_a_400_naming_it(url, field, value):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, field: value}
    error = assert_error(post(url, "/v1/chat/completions", body), 400, field, field)
    assert error["code"] == "unsupported_parameter"


def test_no_op_values_of_unimplemented_fields_are_accepted(url):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "logit_bias": {}, "n": 1}
    assert post(url, "/v1/chat/completions", body).status_code == 200


@pytest.mark.parametrize("path,body,param,words", [
    ("/v1/completions", {"prompt": "hi", "best_of": 3}, "best_of", "best_of"),
    ("/v1/completions", {"prompt": "hi", "colour": 1}, "colour", "unknown field"),
    ("/v1/completions", {"prompt": "hi", "temperature": -1}, "temperature", "temperature"),
    ("/v1/completions", {"prompt": "hi", "top_p": 0}, "top_p", "top_p"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, "max_tokens", "only allowed with echo"),
    ("/v1/completions", {"prompt": ""}, "prompt", "empty"),
    ("/v1/completions", {"prompt": "hi", "stop": [""]}, "stop", "empty"),
    ("/v1/chat/completions", {"messages": []}, "messages", "at least 1 item"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content", "text"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stream_options": {}},
     None, ""),  # an empty stream_options is nothing to refuse
])
def test_bad_requests_are_400_naming_the_field(url, path, body, param, words):
    r = post(url, path, body)
    if param is None:
        assert r.status_code == 200
    else:
        assert_error(r, 400, param, words)


def test_invalid_json_is_a_400(url):
    r = httpx.post(f"{url}/v1/completions", content=b"{not json",
                   headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    assert_error(r, 400, None, "JSON")


def test_a_prompt_too_long_is_a_400(url, engine):
    error = assert_error(post(url, "/v1/completions", {"prompt": "x " * 300, "max_tokens": 400}), 400, "prompt",
                         "positions")
    assert error["code"] == "context_length_exceeded"
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": engine.capacity}
    assert assert_error(post(url, "/v1/chat/completions", body), 400, "messages")["code"] == "context_length_exceeded"


def test_an_unknown_model_is_a_404(url):
    error = assert_error(post(url, "/v1/completions", {"model": "gpt-4", "prompt": "hi"}), 404, "model", "gpt-4")
    assert error["code"] == "model_not_found"


@pytest.mark.parametrize("key", [None, "sk-wrong", KEY + "x"])
def test_a_missing_or_wrong_key_is_a_401(url, key):
    for path in ("/v1/completions", "/v1/chat/completions"):
        assert assert_error(post(url, path, {"prompt": "hi"}, key=key), 401)["code"] == "invalid_api_key"
    assert httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"} if key else {}).status_code == 401


def test_an_unknown_path_is_an_openai_error(url):
    r = httpx.get(f"{url}/v1/nothing")
    assert r.status_code == 404 and set(r.json()["error"]) == {"message", "type", "param", "code"}


class GatedEngine:
    """The real engine whose stream waits for ``gate`` before each chunk (to hold it busy), and
    records how many chunks each stream gave and whether it was closed before its end."""

    def __init__(self, engine, delay: float = 0.0) -> None:
        self._engine, self.delay = engine, delay
        self.gate = threading.Event()
        self.gate.set()
        self.streams: list[dict] = []

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def stream(self, *args, **kw):
        inner = self._engine.stream(*args, **kw)
        record = {"chunks": 0, "finished": False, "closed": False}
        self.streams.append(record)

        def gen():
            try:
                for chunk in inner:
                    self.gate.wait()
                    time.sleep(self.delay)
                    record["chunks"] += 1
                    yield chunk
                record["finished"] = True
            finally:
                record["closed"] = not record["finished"]
                inner.close()

        return gen()


def test_a_full_queue_is_a_503(engine):
    gated = GatedEngine(engine)
    gated.gate.clear()
    with running(gated, queue_size=1) as base:
        body = {"prompt": "hi", "max_tokens": 4}
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(post, base, "/v1/completions", body, None)
            while not gated.streams or not first.running():  # the first is admitted
                time.sleep(0.01)
            time.sleep(0.2)
            second = pool.submit(post, base, "/v1/completions", body, None)  # waits in the queue
            deadline = time.monotonic() + 10
            while len(gated.streams) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            error = assert_error(post(base, "/v1/completions", body, None), 503)
            assert error["code"] == "queue_full"
            gated.gate.set()
            assert first.result().status_code == 200 and second.result().status_code == 200
        assert post(base, "/v1/completions", body, None).status_code == 200  # room again


def test_a_client_gone_mid_stream_frees_the_engine(engine, reference):
    gated = GatedEngine(engine, delay=0.01)
    with running(gated) as base:
        body = {"prompt": "def add(a, b):", "max_tokens": 300, "stream": True}
        with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()
            assert next(line for line in lines if line.startswith("data:"))
        # the client is gone: the stream is closed at its next step, long before its 300 tokens
        deadline = time.monotonic() + 10
        while not gated.streams[0]["closed"] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert gated.streams[0]["closed"] and gated.streams[0]["chunks"] < 300
        gated.delay = 0
        reply = post(base, "/v1/completions", {"prompt": "x = 1", "max_tokens": 8}, None).json()
        assert reply["choices"][0]["text"] == reference.generate("x = 1", max_new_tokens=8).text


# -- load ----------------------------------------------------------------------------------------


def test_concurrent_clients_are_all_answered_in_full_and_unmixed(client, engine, reference):
    """16 clients x 4 requests (plain, streamed, plain, streamed), each client its own prompt,
    greedy: every reply byte-identical to the engine's for its prompt, and the prompts' replies
    distinct, so that a reply handed to the wrong client would show."""
    expected = {p: reference.generate(p, max_new_tokens=8).text for p in PROMPTS}
    assert len(PROMPTS) == 16 and len(set(expected.values())) == len(PROMPTS)

    def user(prompt: str) -> list[str]:
        texts = []
        for stream in (False, True, False, True):
            reply = client.completions.create(model=model_id(engine), prompt=prompt, max_tokens=8, stream=stream)
            texts.append("".join(c.choices[0].text for c in reply) if stream else reply.choices[0].text)
        return texts

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        results = dict(zip(PROMPTS, pool.map(user, PROMPTS)))
    for prompt, texts in results.items():
        assert texts == [expected[prompt]] * 4, prompt


def test_the_cli_reply_is_the_servers(capsys, tiny_checkpoint, client, engine):
    from tileinfer.cli import main

    assert main(["generate", "--model", str(tiny_checkpoint), "--prompt", "def add(a, b):", "--max-new-tokens", "12",
                 "--json", *BASE]) == 0
    cli = json.loads(capsys.readouterr().out)
    reply = client.completions.create(model=model_id(engine), prompt="def add(a, b):", max_tokens=12)
    assert reply.choices[0].text == cli["text"]


def test_the_serve_command_binds_localhost_and_takes_the_key_from_the_environment(tiny_checkpoint, reference):
    import os
    import signal
    import subprocess
    import sys

    port = free_port()
    env = {**os.environ, "TILEINFER_API_KEY": "sk-env"}
    proc = subprocess.Popen([sys.executable, "-m", "tileinfer.cli", "-q", "serve", "--model", str(tiny_checkpoint),
                             "--port", str(port), "--queue", "2", *BASE], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        base, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 60
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else ""
            try:
                if httpx.get(f"{base}/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        assert post(base, "/v1/completions", {"prompt": "hi"}, key=None).status_code == 401
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-env", max_retries=0)
        reply = client.completions.create(model=tiny_checkpoint.name, prompt="import os", max_tokens=6)
        assert reply.choices[0].text == reference.generate("import os", max_new_tokens=6).text
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    assert f"serving {tiny_checkpoint.name} on http://127.0.0.1:{port}/v1" in proc.stderr.read()
