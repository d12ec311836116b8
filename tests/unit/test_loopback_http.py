"""supervisor.http._loopback.LoopbackHTTP against a real asyncio TCP (or UNIX) server that answers
the way it is told: keep-alive reuse, the server's Connection: close and Keep-Alive
timeout, chunked bodies, an idle connection the server closed (retried once), the key
sent to a UNIX socket child, and every failure named: refused, timeout, dropped,
protocol. A cancelled request closes its connection (that is how llama.cpp learns nobody
waits any more)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from supervisor.http import HTTPTransportError, LoopbackHTTP
from tests.support.load import patience
from tests.support.loopback import loopback_servers

Reply = Callable[[int, bytes], Awaitable[bytes | None]]  # (request number, body) -> raw answer
HANG_UP = b"\x00hang up"  # at the end of an answer: close the connection once it is sent
RESET = b"\x00reset"  # instead of an answer: reset the connection


@dataclass
class Server:
    port: int = 0
    connections: int = 0
    requests: int = 0
    closed_by_client: int = 0  # connections the client closed (EOF while we waited)
    eof: asyncio.Event = field(default_factory=asyncio.Event)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)  # a request was read


def ok(body: bytes, *extra: str) -> bytes:
    head = ["HTTP/1.1 200 OK", "Content-Type: application/json",
            f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Reply], Awaitable[Server]]]:
    async def start(reply: Reply) -> Server:
        state = Server()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            state.connections += 1
            try:
                while True:
                    try:
                        head = await reader.readuntil(b"\r\n\r\n")
                    except asyncio.IncompleteReadError:
                        state.closed_by_client += 1
                        state.eof.set()
                        return
                    length = 0
                    for line in head.split(b"\r\n"):
                        if line.lower().startswith(b"content-length:"):
                            length = int(line.split(b":")[1])
                    body = await reader.readexactly(length)
                    state.requests += 1
                    state.arrived.set()
                    # Answer, unless the client hangs up first (as llama.cpp notices).
                    replying = asyncio.ensure_future(reply(state.requests, body))
                    hangup = asyncio.ensure_future(reader.read(1))
                    await asyncio.wait({replying, hangup}, return_when=asyncio.FIRST_COMPLETED)
                    if hangup.done():
                        replying.cancel()
                        state.closed_by_client += 1
                        state.eof.set()
                        return
                    hangup.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await hangup
                    answer = replying.result()
                    if answer is None:  # hang up without answering
                        return
                    if answer == RESET:  # hang up with a TCP reset
                        sock = writer.get_extra_info("socket")
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                        struct.pack("ii", 1, 0))
                        writer.transport.abort()
                        return
                    writer.write(answer.removesuffix(HANG_UP))
                    await writer.drain()
                    if answer.endswith(HANG_UP) or b"Connection: close" in answer.split(
                            b"\r\n\r\n")[0]:
                        return
            finally:
                writer.close()

        state.port = await listen(handle)
        return state

    async with loopback_servers() as listen:
        yield start


async def echo(n: int, body: bytes) -> bytes:
    return ok(json.dumps({"n": n, "got": json.loads(body or b"null")}).encode())


async def test_requests_share_one_keep_alive_connection(serve: Callable[[Reply], Awaitable[Server]]
                                                        ) -> None:
    server = await serve(echo)
    http = LoopbackHTTP("127.0.0.1", server.port)
    for i in range(5):
        resp = await http.request("POST", "/v1/embeddings", json.dumps({"i": i}).encode(), 5)
        assert resp.status == 200 and json.loads(resp.body) == {"n": i + 1, "got": {"i": i}}
        assert resp.headers["content-type"] == "application/json"
    assert server.connections == 1
    await http.aclose()


async def test_connection_close_and_a_short_keep_alive_timeout_mean_a_new_connection(
        serve: Callable[[Reply], Awaitable[Server]]) -> None:
    async def reply(n: int, body: bytes) -> bytes:
        if n == 1:
            return ok(b"{}", "Connection: close")
        return ok(b"{}", "Keep-Alive: timeout=1, max=100")  # reusable for 1 - 1 = 0 s

    server = await serve(reply)
    http = LoopbackHTTP("127.0.0.1", server.port)
    for _ in range(3):
        assert (await http.request("GET", "/v1/models", None, 5)).status == 200
    assert server.connections == 3
    await http.aclose()


@pytest.mark.parametrize("unanswered", [None, RESET], ids=["closed", "reset"])
async def test_a_reused_connection_closed_or_reset_unanswered_is_retried_once_afresh(
        serve: Callable[[Reply], Awaitable[Server]], unanswered: bytes | None) -> None:
    """A kept connection the server closed, or reset (an idle timeout racing the request),
    before any answer is stale: the request goes once more on a new one, transparently."""
    async def reply(n: int, body: bytes) -> bytes | None:
        return unanswered if n == 2 else ok(b'{"ok": true}')

    server = await serve(reply)
    http = LoopbackHTTP("127.0.0.1", server.port)
    assert (await http.request("POST", "/x", b"{}", 5)).status == 200
    assert json.loads((await http.request("POST", "/x", b"{}", 5)).body) == {"ok": True}
    assert server.connections == 2 and server.requests == 3
    await http.aclose()


async def test_a_fresh_connection_closed_unanswered_is_an_error(
        serve: Callable[[Reply], Awaitable[Server]]) -> None:
    async def reply(n: int, body: bytes) -> bytes | None:
        return None

    server = await serve(reply)
    http = LoopbackHTTP("127.0.0.1", server.port)
    with pytest.raises(HTTPTransportError) as err:
        await http.request("POST", "/x", b"{}", 5)
    assert err.value.kind == "dropped" and "before it answered" in str(err.value)
    assert server.requests == 1  # not retried: the child may be dying
    await http.aclose()


async def test_chunked_and_close_delimited_bodies(serve: Callable[[Reply], Awaitable[Server]]
                                                  ) -> None:
    async def reply(n: int, body: bytes) -> bytes:
        if n == 1:
            return (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                    b"5;ext=1\r\n{\"a\":\r\n4\r\n 12}\r\n0\r\nX-Trailer: 1\r\n\r\n")
        return b'HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{"b": 2}'

    server = await serve(reply)
    http = LoopbackHTTP("127.0.0.1", server.port)
    assert json.loads((await http.request("GET", "/", None, 5)).body) == {"a": 12}
    assert json.loads((await http.request("GET", "/", None, 5)).body) == {"b": 2}
    await http.aclose()


async def test_an_error_status_is_an_answer_not_a_transport_error(
        serve: Callable[[Reply], Awaitable[Server]]) -> None:
    body = b'{"error": {"code": 500, "message": "input is too large to process"}}'

    async def reply(n: int, _: bytes) -> bytes:
        return ok(body).replace(b"200 OK", b"500 Internal Server Error")

    server = await serve(reply)
    http = LoopbackHTTP("127.0.0.1", server.port)
    resp = await http.request("POST", "/v1/embeddings", b"{}", 5)
    assert (resp.status, resp.body) == (500, body)
    await http.aclose()


async def test_refused_when_nothing_listens() -> None:
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    with pytest.raises(HTTPTransportError) as err:
        await LoopbackHTTP("127.0.0.1", port).request("GET", "/", None, 5)
    assert err.value.kind == "refused" and "child not listening" in str(err.value)


@pytest.mark.parametrize("answer", [
    b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"cut\":",  # dropped mid-body
    b"HTTP/1.1 200 OK\r\nContent-Le",  # dropped mid-headers
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nabc",  # mid-chunk
])
async def test_dropped_mid_answer(serve: Callable[[Reply], Awaitable[Server]],
                                  answer: bytes) -> None:
    async def reply(n: int, body: bytes) -> bytes:
        return answer + HANG_UP

    server = await serve(reply)
    http = LoopbackHTTP("127.0.0.1", server.port)
    with pytest.raises(HTTPTransportError) as err:
        await http.request("GET", "/", None, 5)
    assert err.value.kind == "dropped" and "dropped by the child" in str(err.value)
    await http.aclose()


@pytest.mark.parametrize(("answer", "words"), [
    (b"SSH-2.0-OpenSSH_9.2\r\n", "not an HTTP answer"),
    (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "malformed header line"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n", "bad Content-Length"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk size"),
    (b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70_000 + b"\r\n\r\n", "too long"),
])
async def test_not_http_is_a_protocol_error(serve: Callable[[Reply], Awaitable[Server]],
                                            answer: bytes, words: str) -> None:
    async def reply(n: int, body: bytes) -> bytes:
        return answer

    server = await serve(reply)
    http = LoopbackHTTP("127.0.0.1", server.port)
    with pytest.raises(HTTPTransportError) as err:
        await http.request("GET", "/", None, 5)
    assert err.value.kind == "protocol" and words in str(err.value)
    await http.aclose()


async def test_a_timeout_or_a_cancellation_closes_the_connection(
        serve: Callable[[Reply], Awaitable[Server]]) -> None:
    async def reply(n: int, body: bytes) -> bytes:
        await asyncio.sleep(30)  # a long generation
        return ok(b"{}")

    server = await serve(reply)
    http = LoopbackHTTP("127.0.0.1", server.port)
    with pytest.raises(HTTPTransportError) as err:
        await http.request("POST", "/v1/completions", b"{}", 0.2)
    assert err.value.kind == "timeout" and "0.2 s" in str(err.value)
    await asyncio.wait_for(server.eof.wait(), patience(5))  # the server saw the connection close
    server.eof.clear()

    server.arrived.clear()
    task = asyncio.create_task(http.request("POST", "/v1/completions", b"{}", 30))
    await asyncio.wait_for(server.arrived.wait(), patience(5))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(server.eof.wait(), patience(5))
    assert server.closed_by_client == 2 and server.connections == 2
    await http.aclose()


async def test_at_most_max_connections_at_once(serve: Callable[[Reply], Awaitable[Server]]
                                               ) -> None:
    active = 0
    peak = 0

    async def reply(n: int, body: bytes) -> bytes:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.02)
        active -= 1
        return ok(b"{}")

    server = await serve(reply)
    http = LoopbackHTTP("127.0.0.1", server.port, max_connections=3)
    await asyncio.gather(*(http.request("GET", "/", None, 5) for _ in range(12)))
    assert peak == 3 and server.connections == 3 and server.requests == 12
    await http.aclose()


def test_embeddings_as_json_numbers_or_base64_float32() -> None:
    import base64

    import numpy as np

    from supervisor._client import _vector

    values = [0.5, -1.25, 3.0e-8, 0.0]
    packed = base64.b64encode(np.asarray(values, dtype="<f4").tobytes()).decode()
    assert _vector(packed).dtype == np.float32
    assert _vector(packed).tolist() == [float(np.float32(v)) for v in values]
    assert _vector([1, 2.5]).tolist() == [1.0, 2.5]
    for bad in ("not base64!", base64.b64encode(b"abc").decode(), {"x": 1}, None):
        with pytest.raises((ValueError, TypeError)):
            _vector(bad)


def test_request_bodies_are_compact_utf8_json_and_refuse_non_finite_numbers() -> None:
    import json

    from supervisor._transport import _encode

    body = {"input": ["héllo \u2028", "x"], "temperature": 0.5, "n": [1, 2]}
    assert _encode(body) == json.dumps(body, ensure_ascii=False,
                                       separators=(",", ":")).encode()
    for bad in ({"t": float("nan")}, {"a": [1.0, float("-inf")]}, {"i": 1 << 70}):
        with pytest.raises(ValueError, match=r"not a JSON number|not JSON"):
            _encode(bad)


async def test_a_unix_socket_child_gets_its_key_on_every_request(tmp_path: Path) -> None:
    """With a UNIX socket and a key: every request (on one kept connection) goes to the
    socket with "Authorization: Bearer KEY"; a socket that is gone is "refused"."""
    heads: list[bytes] = []
    ended = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError):
            while True:
                heads.append(await reader.readuntil(b"\r\n\r\n"))
                writer.write(ok(b"{}"))
                await writer.drain()
        writer.close()
        await writer.wait_closed()
        ended.set()

    path = tmp_path / "c.sock"
    server = await asyncio.start_unix_server(handle, str(path))
    http = LoopbackHTTP("localhost", 0, unix_path=str(path), api_key="s3cret-key")
    try:
        for _ in range(3):
            assert (await http.request("GET", "/v1/models", None, 5)).status == 200
    finally:
        await http.aclose()
        await asyncio.wait_for(ended.wait(), patience(5))  # the client's close reached the server
        server.close()
        await server.wait_closed()
    assert len(heads) == 3
    for head in heads:
        lines = head.split(b"\r\n")
        assert lines[0] == b"GET /v1/models HTTP/1.1"
        assert b"Host: localhost" in lines and b"Authorization: Bearer s3cret-key" in lines
    path.unlink(missing_ok=True)
    gone = LoopbackHTTP("localhost", 0, unix_path=str(path), api_key="k")
    with pytest.raises(HTTPTransportError) as refused:
        await gone.request("GET", "/health", None, 5)
    assert refused.value.kind == "refused"
    with pytest.raises(ValueError, match="printable ASCII"):
        LoopbackHTTP("localhost", 0, unix_path=str(path), api_key="bad\r\nX-Injected: 1")
