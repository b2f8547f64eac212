"""A generation's stream for an event loop: the blocking iterator runs in a worker thread.

``async_chunks(stream)`` iterates ``stream`` (an ``Engine.stream``) in a thread of its own and hands
each chunk to the event loop that reads it, so that a server's loop never waits for a decoding
step. When the reader stops early (it closes the async iterator, or its task is cancelled), the
worker closes the stream after the step it is in, which frees the engine, and the reader waits for
that before it goes on.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from typing import TypeVar

T = TypeVar("T")
_END = object()  # the worker's last message: the stream is done


async def async_chunks(stream: Iterator[T]) -> AsyncIterator[T]:
    """The items of ``stream`` as they come, an exception it raises raised here."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    stop = threading.Event()

    def send(item: object) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody reads any more
            stop.set()

    def work() -> None:
        try:
            for item in stream:
                send(item)
                if stop.is_set():
                    break
            else:
                send(_END)
        except BaseException as exc:  # noqa: BLE001 - handed to the reader, raised there
            send(exc)
        finally:
            stream.close()

    worker = loop.run_in_executor(None, work)
    try:
        while True:
            item = await queue.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        await asyncio.shield(worker)


__all__ = ["async_chunks"]
