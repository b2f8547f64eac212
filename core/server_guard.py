"""What ``tileinfer serve`` checks before a request reaches an endpoint: the API key (``ApiKey``,
``api_key_of``), the Host header and the content type (``Guard``, ASGI middleware), and the
body's size and arrival time (``read_body``). Each refusal is an error in OpenAI's JSON shape."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import json
import os
from collections.abc import Iterable
from pathlib import Path

from starlette.requests import ClientDisconnect, Request
from uvicorn.protocols.http.h11_impl import H11Protocol

from tileinfer.errors import UsageError
from tileinfer.notices import notice
from tileinfer.openai_api import APIError

API_KEY_ENV = "TILEINFER_API_KEY"
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")


def api_key_of(flag: str | None, path: str | None = None, environ: dict | None = None) -> str | None:
    """The API key: ``--api-key`` (``flag``, with a notice that the process list shows it to every
    user of the machine), else the first line of the file ``path`` (``--api-key-file``), else the
    environment variable TILEINFER_API_KEY, else None (no key). A key that is given but blank is a
    UsageError, never "no key"; so are two sources given at once and an unreadable file."""
    environ = os.environ if environ is None else environ
    if flag is not None and path is not None:
        raise UsageError("give --api-key or --api-key-file, not both")
    if flag is not None:
        key, source = flag, "--api-key"
    elif path is not None:
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"--api-key-file: cannot read {path}: {exc}") from None
        key, source = (lines[0] if lines else ""), f"--api-key-file {path}"
    elif API_KEY_ENV in environ:
        key, source = environ[API_KEY_ENV], API_KEY_ENV
    else:
        return None
    key = key.strip()
    if not key:
        raise UsageError(f"the API key of {source} is blank: give a key (or none, to serve without one)")
    if flag is not None:
        notice("the key given with --api-key is visible to every user of this machine in the process list: "
               f"pass --api-key-file PATH or set {API_KEY_ENV} instead")
    return key


class ApiKey:
    """The bearer key a request must carry: ``Authorization: Bearer KEY``, the scheme's name in any
    case (RFC 7235), the key exactly (no prefix, no other case), compared in constant time."""

    def __init__(self, key: str) -> None:
        self._digest = hashlib.sha256(key.encode()).digest()

    def check(self, request: Request) -> None:
        """APIError(401) unless ``request`` carries the key."""
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        # Digests of equal length: the comparison's time says nothing of the key, its length included.
        match = hmac.compare_digest(hashlib.sha256(given.encode()).digest(), self._digest)
        if not (match and scheme.lower() == "bearer"):
            raise APIError(401, "missing or wrong API key: send the header 'Authorization: Bearer KEY'",
                           code="invalid_api_key")


def allowed_hosts(host: str, configured: Iterable[str] | None, keyed: bool) -> frozenset[str] | None:
    """The Host header names served (lower case, no port), or None for any: ``configured`` when
    given; else, without an API key, the loopback names and the bound ``host`` (a page a browser
    loaded from elsewhere cannot reach the server through DNS rebinding); else any. Without a key
    on an address other than loopback, a notice."""
    if configured:
        return frozenset(h.lower().strip("[]") for h in configured)
    if keyed:
        return None
    if not _loopback(host):
        notice(f"serving on {host} without an API key: anyone who reaches it may use it; only requests whose Host "
               "header names localhost or this address are answered (--allowed-hosts to widen, --api-key-file to "
               "require a key)")
    return frozenset({*LOOPBACK_HOSTS, host.lower().strip("[]")})


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host.lower() == "localhost"


def host_name(header: str) -> str:
    """The host of a Host header value: ``[::1]:8000`` -> ``::1``, ``Example.com:80`` -> ``example.com``."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header
    return header.rpartition(":")[0] if header.count(":") == 1 else header


class Guard:
    """ASGI middleware: a request whose Host header is not in ``hosts`` (None: any) is a 403; a POST
    whose body is not ``application/json`` is a 415 (an HTML form cannot send one across sites);
    a declared Content-Length over ``max_body`` bytes is a 413, before any of the body is read."""

    def __init__(self, app, *, hosts: frozenset[str] | None, max_body: int) -> None:
        self.app, self.hosts, self.max_body = app, hosts, max_body

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            error = self._refusal(scope)
            if error is not None:
                return await send_error(send, error, close=True)
        await self.app(scope, receive, send)

    def _refusal(self, scope) -> APIError | None:
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        if self.hosts is not None and host_name(headers.get("host", "")) not in self.hosts:
            return APIError(403, "this server answers requests for localhost only (see --allowed-hosts), not for "
                            f"Host {headers.get('host', '')!r}", code="host_not_allowed")
        if scope["method"] == "POST":
            media = headers.get("content-type", "").partition(";")[0].strip().lower()
            if media != "application/json":
                return APIError(415, f"the body must be JSON with Content-Type: application/json, got {media!r}",
                                code="unsupported_media_type")
            length = headers.get("content-length", "")
            if length.isdigit() and int(length) > self.max_body:
                return too_large(self.max_body)
        return None


def too_large(limit: int) -> APIError:
    return APIError(413, f"the request body is larger than {limit} bytes", code="body_too_large")


async def send_error(send, error: APIError, *, close: bool = False) -> None:
    """``error`` as a whole response on raw ASGI ``send`` (``close``: the connection closes after it,
    its unread body dropped)."""
    body = json.dumps(error.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def read_body(request: Request, limit: int, timeout: float) -> bytes:
    """The request's body as it streams in: APIError(413) as soon as it passes ``limit`` bytes (a
    body without Content-Length, or longer than declared), APIError(408) when it has not arrived
    within ``timeout`` seconds; ClientDisconnect when the client goes away."""
    parts, size = [], 0
    try:
        async with asyncio.timeout(timeout):
            async for part in request.stream():
                size += len(part)
                if size > limit:
                    raise too_large(limit)
                parts.append(part)
    except TimeoutError:
        raise APIError(408, f"the request body did not arrive within {timeout:g} s", code="timeout") from None
    return b"".join(parts)


class HeadDeadlineH11(H11Protocol):
    """uvicorn's h11 protocol, whose idle timeout (``timeout_keep_alive``) also runs from a
    connection's start and keeps running while a request's head trickles in: a connection that has
    not sent a whole request head that long after it opened, or after its last response, is closed.
    (uvicorn alone times out only the wait after a response, and stops the clock at the first byte.)"""

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._head_deadline = self.loop.time() + self.timeout_keep_alive
        self._unset_keepalive_if_required()
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def on_response_complete(self) -> None:
        self._head_deadline = self.loop.time() + self.timeout_keep_alive
        super().on_response_complete()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        waiting_for_head = self.cycle is None or self.cycle.response_complete
        if waiting_for_head and self.timeout_keep_alive_task is None and not self.transport.is_closing():
            left = max(self._head_deadline - self.loop.time(), 0.0)
            self.timeout_keep_alive_task = self.loop.call_later(left, self.timeout_keep_alive_handler)


__all__ = ["API_KEY_ENV", "ApiKey", "ClientDisconnect", "Guard", "HeadDeadlineH11", "LOOPBACK_HOSTS", "allowed_hosts", "api_key_of",
           "host_name", "read_body", "send_error", "too_large"]
