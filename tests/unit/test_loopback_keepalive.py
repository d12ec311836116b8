"""Keep-alive of a launched child's streams (issue 27): InferenceClient, as a child's
(``ChildAddress``: its UNIX socket and key), against a real asyncio HTTP/1.1 server on a
UNIX socket that serves many requests per connection. A stream read to its end and a
unary call give their connection back for the next request; a cancelled stream, a
failed one and one with more than the end after ``[DONE]`` close theirs (the child
learns nobody reads); closing the client (a child stopped or restarted: the new child
gets a new socket and client) closes what waits; the pool is bounded (``max_idle``)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pytest

from supervisor import ChildRequestError, InferenceClient, Sampling
from supervisor._runtime import LLAMA_SERVER_API
from supervisor._transport import ChildAddress
from supervisor.http import LoopbackHTTP
from tests.support.load import patience

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
KEY = "k" * 32


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def sse(event: dict[str, object]) -> bytes:
    return b"data: " + orjson.dumps(event) + b"\n\n"


TOKENS = b"".join(sse({"choices": [{"delta": {"content": t}, "finish_reason": None}]})
                  for t in ("Hel", "lo"))
LAST = sse({"choices": [{"delta": {}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2}})


@dataclass
class Server:
    """Answers each request by ``script`` (its number from 1 -> what to do)."""

    path: str
    script: dict[int, str] = field(default_factory=dict)
    connections: int = 0
    requests: list[int] = field(default_factory=list)  # the connection of each request
    hung_up: list[int] = field(default_factory=list)  # connections the client closed
    gone: asyncio.Event = field(default_factory=asyncio.Event)  # a connection closed
    hanging: asyncio.Event = field(default_factory=asyncio.Event)  # a "hang" answer began

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                     ) -> None:
        self.connections += 1
        me = self.connections
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                assert f"Authorization: Bearer {KEY}".encode() in head
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                self.requests.append(me)
                if not await self.answer(self.script.get(len(self.requests), "stream"),
                                         reader, writer):
                    return
        finally:
            self.hung_up.append(me)
            self.gone.set()
            writer.close()

    async def answer(self, what: str, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> bool:
        """Send the answer; whether the connection may serve another request."""
        if what == "unary":
            body = orjson.dumps({"choices": [{"text": "ok"}]})
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            return True
        writer.write(HEAD + chunk(TOKENS))
        await writer.drain()
        if what == "hang":  # until the client hangs up
            self.hanging.set()
            await reader.read(1)
            return False
        if what == "error":
            writer.write(chunk(sse({"error": {"message": "boom"}})))
            await reader.read(1)
            return False
        if what == "slow-tail":  # the end comes after the tokens were read
            await asyncio.sleep(0.05)
        tail = chunk(LAST + b"data: [DONE]\n\n")
        if what == "after-done":
            tail += chunk(sse({"choices": [{"delta": {"content": "x"}}]}))
        writer.write(tail)
        await writer.drain()
        await asyncio.sleep(0.01)  # the terminator in a write of its own, as llama-server
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True


Start = Callable[..., Awaitable[tuple[Server, InferenceClient]]]
"""Starts a server on a fresh UNIX socket; it and a child's client of it (``max_idle``:
the client's)."""


@pytest.fixture
async def child() -> AsyncIterator[Start]:
    """A :data:`Start`; every client and server it made is closed at the end."""
    async with contextlib.AsyncExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        made = itertools.count()

        async def start(max_idle: int = 16, stream_interval: float = 0.0
                        ) -> tuple[Server, InferenceClient]:
            state = Server(str(tmp / f"c{next(made)}.sock"))
            await stack.enter_async_context(
                await asyncio.start_unix_server(state.handle, state.path))
            client = InferenceClient(ChildAddress.BASE_URL, model_id="m",
                                     api=LLAMA_SERVER_API, child=ChildAddress(state.path, KEY),
                                     max_idle=max_idle, stream_interval=stream_interval)
            stack.push_async_callback(client.aclose)
            return state, client

        yield start


async def relay(client: InferenceClient, busy: float = 0.0) -> list[tuple[str, str | None]]:
    """Chat as the relay does: up to the chunk with a finish reason, then leave; ``busy``
    seconds (its write downstream) after each chunk."""
    got = []
    stream = client.stream_chat([("user", "hi")], Sampling(max_tokens=2))
    async with contextlib.aclosing(stream):  # type: ignore[type-var]
        async for item in stream:
            got.append((item.text, item.finish_reason))
            if item.finish_reason is not None:
                break
            await asyncio.sleep(busy)
    return got


async def test_streams_read_to_the_end_and_unary_calls_share_one_connection(
        child: Start) -> None:
    server, client = await child()
    server.script = {2: "unary"}
    assert await relay(client) == [("Hello", None), ("", "stop")]
    assert await client.complete("hi", Sampling(max_tokens=1)) == "ok"
    assert await relay(client) == [("Hello", None), ("", "stop")]
    assert server.requests == [1, 1, 1]
    assert server.hung_up == []


@pytest.mark.parametrize("what", ["hang", "error", "after-done"])
async def test_a_cancelled_failed_or_overlong_stream_is_never_reused(
        child: Start, what: str) -> None:
    server, client = await child()
    server.script = {2: what}
    await relay(client)  # connection 1, kept
    if what == "hang":
        task = asyncio.ensure_future(relay(client))
        await asyncio.wait_for(server.hanging.wait(), patience(5))
        await asyncio.sleep(0.05)  # its first tokens read
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    elif what == "error":
        with pytest.raises(ChildRequestError, match="boom"):
            await relay(client)
    else:  # an event after [DONE]: not the end of an SSE stream, so not reusable
        assert (await relay(client))[-1] == ("", "stop")
    await asyncio.wait_for(server.gone.wait(), patience(5))
    assert server.hung_up == [1]  # the child learnt that nobody reads
    assert await relay(client) == [("Hello", None), ("", "stop")]
    assert server.requests == [1, 1, 2]  # the next request on a new connection


async def test_closing_the_client_closes_its_pooled_connections(
        child: Start) -> None:
    """A child stopped or restarted closes its client (supervisor._child.stop); the new
    child's client, on its new socket, starts with an empty pool."""
    server, client = await child()
    await relay(client)
    await asyncio.sleep(0.02)
    assert server.hung_up == []
    await client.aclose()
    await asyncio.wait_for(server.gone.wait(), patience(5))
    assert server.hung_up == [1]
    second, client2 = await child()
    assert await relay(client2) == [("Hello", None), ("", "stop")]
    assert (second.connections, server.connections) == (1, 1)


async def test_the_pool_keeps_at_most_max_idle_connections(
        child: Start) -> None:
    server, _ = await child()
    http = LoopbackHTTP("localhost", 0, unix_path=server.path, api_key=KEY, max_idle=1)

    async def read_all() -> bytes:
        async with http.stream("POST", "/v1/chat/completions", b"{}", 5) as answer:
            return await answer.read()

    try:
        bodies = await asyncio.gather(read_all(), read_all(), read_all())
        assert all(body.endswith(b"data: [DONE]\n\n") for body in bodies)
        assert server.connections == 3
        while len(server.hung_up) < 2:
            await asyncio.wait_for(server.gone.wait(), patience(5))
            server.gone.clear()
        await asyncio.sleep(0.02)
        assert len(server.hung_up) == 2  # one kept
        await read_all()
        assert server.connections == 3 and server.requests[-1] not in server.hung_up
    finally:
        await http.aclose()


async def test_a_child_client_with_max_idle_0_keeps_no_connection(child: Start) -> None:
    """``[child] max_idle_connections = 0`` reaches the child's lean transport: every
    request on a connection of its own, each closed after its answer."""
    server, client = await child(max_idle=0)
    server.script = {2: "unary"}
    assert await relay(client) == [("Hello", None), ("", "stop")]
    assert await client.complete("hi", Sampling(max_tokens=1)) == "ok"
    assert await relay(client) == [("Hello", None), ("", "stop")]
    assert server.requests == [1, 2, 3]
    while len(server.hung_up) < 3:
        await asyncio.wait_for(server.gone.wait(), patience(5))
        server.gone.clear()
    assert sorted(server.hung_up) == [1, 2, 3]


async def test_a_paced_stream_whose_end_came_while_its_reader_was_busy_is_reused(
        child: Start) -> None:
    """A stream interval's pause begun with the stream's end already read (it came while
    the relay wrote the chunk before) ends with the stream: the connection goes back to
    the pool reading, and the next request on it is answered (issue 27)."""
    server, client = await child(stream_interval=30.0)
    server.script = {1: "slow-tail"}
    assert await relay(client, busy=0.2) == [("Hello", None), ("", "stop")]
    assert await asyncio.wait_for(relay(client, busy=0.2), patience(5)) == [
        ("Hello", None), ("", "stop")]
    assert server.requests == [1, 1]
    assert server.hung_up == []
