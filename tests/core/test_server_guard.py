"""tileinfer serve against a hostile client, over real HTTP on localhost: the API key's check, a
blank key, the Host header and content type without a key, bodies too large, too slow or nested
too deeply, roles, idle connections, clients that go away, and work kept off the event loop."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

httpx = pytest.importorskip("httpx")  # the server's stack: installed by the [test] extra, absent on the GPU machine

from test_server import KEY, assert_error, post, serving  # noqa: E402
from test_server import engine, url  # noqa: E402, F401  (its fixtures: the served engine, a server with KEY)
from tileinfer import server_requests  # noqa: E402
from tileinfer.errors import UsageError  # noqa: E402
from tileinfer.server import create_app  # noqa: E402
from tileinfer.server_guard import api_key_of  # noqa: E402

LIMIT = 64 << 10  # the open server's body limit
BODY = {"prompt": "hi", "max_tokens": 2}


@pytest.fixture(scope="module")
def served(engine):
    """A server without a key, short limits: (base URL, uvicorn Server)."""
    with serving(engine, {"idle_timeout_s": 0.5}, max_body_bytes=LIMIT, body_timeout_s=0.5) as (base, server, _):
        yield base, server


@pytest.fixture(scope="module")
def open_url(served):
    return served[0]


@pytest.fixture
def server_log():
    """The records of the server's loggers (uvicorn's and tileinfer.server) during a test, at INFO."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = records.append
    loggers = [logging.getLogger(name) for name in ("uvicorn", "uvicorn.error", "tileinfer.server")]
    saved = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.INFO)
    yield records
    for lg, level in zip(loggers, saved):
        lg.removeHandler(handler)
        lg.setLevel(level)


# -- the API key ---------------------------------------------------------------------------------


@pytest.mark.parametrize("header,status", [
    (f"Bearer {KEY}", 200), (f"bearer {KEY}", 200), (f"BEARER {KEY}", 200),  # the scheme's name in any case
    ("bearer sk-wrong", 401), ("bearer anything", 401), (f"Bearer {KEY[:-1]}", 401), ("Bearer sk", 401),
    (f"Bearer {KEY}x", 401), (f"Bearer {KEY.upper()}", 401), (f"Basic {KEY}", 401), (f"Bearer{KEY}", 401),
    (KEY, 401), ("Bearer", 401), ("", 401),
])
def test_the_key_is_compared_exactly(url, header, status):
    r = httpx.post(f"{url}/v1/completions", json=BODY, headers={"Authorization": header} if header else {})
    assert r.status_code == status, r.text
    if status == 401:
        assert r.json()["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize("path", ["/tokenize", "/detokenize"])
def test_tokenize_needs_the_key(url, path):
    assert_error(post(url, path, {"prompt": "hi", "tokens": [1]}, key=None), 401)


def test_a_blank_key_is_an_error_not_auth_off(engine, tmp_path, caplog):
    for blank in ("", "  ", "\t"):
        with pytest.raises(UsageError, match="blank"):
            create_app(engine, api_key=blank)
        with pytest.raises(UsageError, match="TILEINFER_API_KEY"):
            api_key_of(None, None, {"TILEINFER_API_KEY": blank})
        with pytest.raises(UsageError, match="--api-key"):
            api_key_of(blank, None, {})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(UsageError, match="--api-key-file"):
        api_key_of(None, str(tmp_path / "empty"), {})
    with pytest.raises(UsageError, match="cannot read"):
        api_key_of(None, str(tmp_path / "missing"), {})
    (tmp_path / "key").write_text("sk-file\n")
    with caplog.at_level(logging.WARNING, "tileinfer"):
        assert api_key_of(None, str(tmp_path / "key"), {"TILEINFER_API_KEY": "sk-env"}) == "sk-file"
        assert api_key_of(None, None, {"TILEINFER_API_KEY": "sk-env"}) == "sk-env"
        assert api_key_of(None, None, {}) is None
        assert not caplog.records
        assert api_key_of("sk-flag", None, {"TILEINFER_API_KEY": "sk-env"}) == "sk-flag"
    assert len(caplog.records) == 1 and "process list" in caplog.records[0].getMessage()


# -- without a key: Host header and content type ---------------------------------------------------


@pytest.mark.parametrize("host,status", [("evil.example", 403), ("evil.example:80", 403), ("127.0.0.2", 403),
                                         ("localhost.evil.example", 403), ("localhost", 200), ("LOCALHOST:1", 200),
                                         ("127.0.0.1", 200), ("[::1]:8000", 200)])
def test_a_foreign_host_header_is_refused_without_a_key(open_url, host, status):
    r = httpx.post(f"{open_url}/v1/completions", json=BODY, headers={"Host": host})
    assert r.status_code == status, r.text
    if status == 403:
        assert r.json()["error"]["code"] == "host_not_allowed"


def test_any_host_header_with_a_key(url):
    r = httpx.post(f"{url}/v1/completions", json=BODY, headers={"Host": "api.example.com",
                                                                   "Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                                          None])
def test_a_body_that_is_not_json_is_a_415(open_url, content_type):
    headers = {"Content-Type": content_type} if content_type else {}
    r = httpx.post(f"{open_url}/v1/completions", content=b'{"prompt": "hi"}', headers=headers)
    assert_error(r, 415)


def test_json_with_a_charset_is_accepted(open_url):
    r = httpx.post(f"{open_url}/v1/completions", content=b'{"prompt": "hi", "max_tokens": 2}',
                   headers={"Content-Type": "Application/JSON; charset=utf-8"})
    assert r.status_code == 200, r.text


# -- bodies ----------------------------------------------------------------------------------------


def test_a_body_over_the_limit_is_a_413_declared_or_streamed(open_url):
    big = b'{"prompt": "' + b"x" * LIMIT + b'"}'
    assert_error(httpx.post(f"{open_url}/v1/completions", content=big,
                            headers={"Content-Type": "application/json"}), 413)

    def chunks():  # no Content-Length: the limit is found as the body streams in
        for i in range(0, len(big), 8192):
            yield big[i:i + 8192]

    assert_error(httpx.post(f"{open_url}/v1/completions", content=chunks(),
                            headers={"Content-Type": "application/json"}), 413)
    assert post(open_url, "/v1/completions", BODY, key=None).status_code == 200  # the server goes on


def test_a_body_that_does_not_arrive_is_a_408(open_url):
    def slow():
        yield b'{"prompt": '
        time.sleep(0.8)
        yield b'"hi"}'

    assert_error(httpx.post(f"{open_url}/v1/completions", content=slow(), headers={"Content-Type": "application/json"}),
                 408)


@pytest.mark.parametrize("body", [b"[" * 20_000 + b"]" * 20_000, b'{"prompt": "hi", "user": ' + b"[" * 70
                                  + b"]" * 70 + b"}", b'{"prompt": "hi", "temperature": NaN}'])
def test_deep_or_odd_json_is_a_400_in_json(open_url, body):
    r = httpx.post(f"{open_url}/v1/completions", content=body, headers={"Content-Type": "application/json"})
    assert_error(r, 400)


@pytest.mark.parametrize("message,param", [({"role": "hacker", "content": "hi"}, "messages[0].role"),
                                           ({"content": "hi"}, "messages[0].role"),
                                           ({"role": "user", "content": 5}, "messages[0].content"),
                                           ({"role": "user", "content": "hi", "colour": 1}, "messages[0].colour")])
def test_a_bad_message_is_a_400_naming_the_field(open_url, message, param):
    body = {"messages": [{"role": "system", "content": "be brief"}, message]}
    assert_error(post(open_url, "/v1/chat/completions", body, key=None), 400, param.replace("[0]", "[1]"))


# -- connections -----------------------------------------------------------------------------------


def test_an_idle_connection_is_closed(served):
    base, server = served
    port = int(base.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as idle, \
            socket.create_connection(("127.0.0.1", port), timeout=10) as trickle:
        trickle.sendall(b"POST /v1/completions HTTP/1.1\r\n")  # a head that never ends
        assert idle.recv(1) == b"" and trickle.recv(1) == b""  # closed by the server (not by the 10 s timeout)


def test_a_client_gone_leaves_an_info_line_not_an_error(open_url, server_log):
    port = int(open_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as s:  # gone while sending its body
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 1000\r\n\r\n{\"prompt\"")
    body = {"prompt": "def add(a, b):", "max_tokens": 200, "stream": True}
    with httpx.stream("POST", f"{open_url}/v1/completions", json=body) as r:  # gone mid-stream
        assert next(line for line in r.iter_lines() if line.startswith("data:"))
    deadline = time.monotonic() + 10
    while sum("client went away" in r.getMessage() for r in server_log) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    gone = [r for r in server_log if "client went away" in r.getMessage()]
    assert len(gone) == 2 and all(r.levelno == logging.INFO for r in gone)
    assert not [r for r in server_log if r.levelno >= logging.WARNING], [r.getMessage() for r in server_log]


def test_parsing_and_templating_run_off_the_event_loop(open_url, engine, monkeypatch):
    on_loop = []

    def loop_running() -> bool:
        try:
            asyncio.get_running_loop()
            return True
        except RuntimeError:
            return False

    decode, template = server_requests.decode_json, type(engine.tokenizer).apply_chat_template
    monkeypatch.setattr(server_requests, "decode_json", lambda body: on_loop.append(loop_running()) or decode(body))
    monkeypatch.setattr(type(engine.tokenizer), "apply_chat_template",
                        lambda self, *a, **k: on_loop.append(loop_running()) or template(self, *a, **k))
    assert post(open_url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
                key=None).status_code == 200
    assert len(on_loop) >= 2 and not any(on_loop)  # the body decoded, the template rendered (twice: with and
    # without the generation prompt, which tells whether the reply starts in the thinking)


def test_others_are_answered_while_a_body_trickles_in(url):
    sent_first_part, answered = threading.Event(), threading.Event()

    def trickle():
        yield b'{"max_tokens": 2, "prompt": "'
        sent_first_part.set()
        answered.wait(20)
        yield b"x" * 64 + b'"}'

    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(httpx.post, f"{url}/v1/completions", content=trickle(),
                           headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
        assert sent_first_part.wait(20)
        assert post(url, "/v1/completions", BODY).status_code == 200  # while the other body is still arriving
        answered.set()
        assert slow.result().status_code == 200


@pytest.mark.parametrize("flags,env,words", [(["--api-key", ""], {}, "--api-key is blank"),
                                             ([], {"TILEINFER_API_KEY": " "}, "TILEINFER_API_KEY is blank"),
                                             (["--api-key-file", "/nonexistent/key"], {}, "cannot read")])
def test_serve_refuses_a_blank_key_at_startup(tiny_checkpoint, capsys, monkeypatch, flags, env, words):
    from tileinfer.cli import main

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(["serve", "--model", str(tiny_checkpoint), *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and words in err and len(err.splitlines()) == 1
