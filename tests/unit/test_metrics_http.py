"""The metrics' loopback HTTP endpoint (daemon/ops/metrics_http.py), served for real on
port 0: GET and HEAD of /metrics, the refusals of other paths, methods and malformed or
oversized requests, slow and surplus connections, closing, and the addresses it refuses."""

from __future__ import annotations

import asyncio
import contextlib
import errno
from collections.abc import AsyncIterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from daemon.ops.metrics_http import (
    CONTENT_TYPE,
    MAX_HEAD_BYTES,
    MAX_HEADERS,
    MetricsServer,
    serve_metrics,
)
from daemon.telemetry.metrics import Metrics


@pytest.fixture
async def server() -> AsyncIterator[MetricsServer]:
    m = Metrics(version="9.9.9")
    m.child_state("generation", "running")
    srv = await serve_metrics(m, "127.0.0.1", 0)
    try:
        yield srv
    finally:
        await srv.close()


async def raw(port: int, data: bytes) -> bytes:
    """Send ``data`` on a fresh connection; return everything until the server closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        return await reader.read()
    finally:
        writer.close()
        await writer.wait_closed()


async def test_get_metrics(server: MetricsServer) -> None:
    """GET /metrics answers 200, the 0.0.4 text content type, and a parseable body."""
    assert server.port > 0
    async with httpx.AsyncClient() as client:
        resp = await client.get(f"http://127.0.0.1:{server.port}/metrics")
    assert resp.status_code == 200
    assert resp.headers["content-type"] == CONTENT_TYPE == (
        "text/plain; version=0.0.4; charset=utf-8")
    assert resp.headers["connection"] == "close"
    names = {f.name for f in text_string_to_metric_families(resp.text)}
    assert {"llamad_build_info", "llamad_child_state", "llamad_requests"} <= names
    assert 'llamad_child_state{model="other",role="generation",state="running"} 1.0' in resp.text
    assert 'llamad_build_info{version="9.9.9"} 1.0' in resp.text


async def test_query_string_is_ignored(server: MetricsServer) -> None:
    """A scraper's query parameters do not change the answer."""
    async with httpx.AsyncClient() as client:
        resp = await client.get(f"http://127.0.0.1:{server.port}/metrics?name[]=x")
    assert resp.status_code == 200


async def test_head_metrics_has_no_body(server: MetricsServer) -> None:
    """HEAD /metrics answers 200 with the length of the body it does not send."""
    resp = await raw(server.port, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    head, _, body = resp.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert body == b""
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")))
    assert length > 0


async def test_other_paths_are_404(server: MetricsServer) -> None:
    """Any path other than /metrics answers 404."""
    async with httpx.AsyncClient() as client:
        for path in ("/x", "/", "/metrics/", "/metricsx"):
            resp = await client.get(f"http://127.0.0.1:{server.port}{path}")
            assert resp.status_code == 404, path


async def test_other_methods_are_405(server: MetricsServer) -> None:
    """POST /metrics answers 405 and says which methods are allowed."""
    async with httpx.AsyncClient() as client:
        resp = await client.post(f"http://127.0.0.1:{server.port}/metrics", content=b"")
    assert resp.status_code == 405
    assert resp.headers["allow"] == "GET, HEAD"


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GARBAGE\r\n\r\n",
        b"GET /metrics\r\n\r\n",
        b"GET /metrics HTTP/2.0\r\n\r\n",
        b"get /metrics HTTP/1.1\r\n\r\n",
        b"GET metrics HTTP/1.1\r\n\r\n",
        b"GET /met rics HTTP/1.1\r\n\r\n",
        b"GET /m\xe9trics HTTP/1.1\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nHost: x\r\n folded: y\r\n\r\n",
    ],
)
async def test_malformed_requests_are_400(server: MetricsServer, request_bytes: bytes) -> None:
    """A malformed request line or header gets 400 and the connection is closed."""
    resp = await raw(server.port, request_bytes)
    assert resp.startswith(b"HTTP/1.1 400 Bad Request\r\n")


async def test_oversized_request_line_is_400(server: MetricsServer) -> None:
    """A request line longer than the head cap gets 400 without the server buffering it all."""
    line = b"GET /" + b"a" * (MAX_HEAD_BYTES + 100) + b" HTTP/1.1\r\n\r\n"
    resp = await raw(server.port, line)
    assert resp.startswith(b"HTTP/1.1 400 ")
    assert resp.endswith(b"a line is longer than 8192 bytes\n")


async def test_oversized_headers_are_400(server: MetricsServer) -> None:
    """Headers over the byte cap, or over the count cap, get 400."""
    big = b"GET /metrics HTTP/1.1\r\n" + b"X-A: " + b"a" * 5000 + b"\r\n" \
        + b"X-B: " + b"b" * 5000 + b"\r\n\r\n"
    resp = await raw(server.port, big)
    assert resp.startswith(b"HTTP/1.1 400 ")
    assert resp.endswith(b"request head is longer than 8192 bytes\n")
    many = b"GET /metrics HTTP/1.1\r\n" + b"X: y\r\n" * (MAX_HEADERS + 1) + b"\r\n"
    resp = await raw(server.port, many)
    assert resp.startswith(b"HTTP/1.1 400 ")
    assert resp.endswith(b"more than 64 headers\n")
    enough = b"GET /metrics HTTP/1.1\r\n" + b"X: y\r\n" * MAX_HEADERS + b"\r\n"
    assert (await raw(server.port, enough)).startswith(b"HTTP/1.1 200 ")


async def test_truncated_request_is_400(server: MetricsServer) -> None:
    """A client that half-closes after part of a request gets 400."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    writer.write_eof()
    try:
        assert (await reader.read()).startswith(b"HTTP/1.1 400 ")
    finally:
        writer.close()
        await writer.wait_closed()


async def read_until_closed(reader: asyncio.StreamReader) -> bytes:
    """What arrives before the server closes the connection (a reset counts as closed)."""
    try:
        return await reader.read()
    except ConnectionResetError:
        return b""


async def close_quietly(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(ConnectionResetError):
        await writer.wait_closed()


async def test_slow_client_is_dropped_after_read_timeout() -> None:
    """A client that never finishes its request head is disconnected without an answer."""
    srv = await serve_metrics(Metrics(), "127.0.0.1", 0, read_timeout=0.05)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        writer.write(b"GET /metrics HTTP/1.1\r\n")
        assert await read_until_closed(reader) == b""
        await close_quietly(writer)
    finally:
        await srv.close()


async def test_connections_past_the_cap_are_closed_unanswered() -> None:
    """With max_connections held open, a new connection is closed at once and unanswered,
    and once one of them ends, a scrape is served again."""
    srv = await serve_metrics(Metrics(), "127.0.0.1", 0, max_connections=3)
    held = [await asyncio.open_connection("127.0.0.1", srv.port) for _ in range(3)]
    try:
        for _, writer in held:  # each is being served: its head is half sent
            writer.write(b"GET /metr")
            await writer.drain()
        await asyncio.sleep(0.05)
        try:  # aborted: an RST, or an end before its request was read
            refused = await raw(srv.port, b"GET /metrics HTTP/1.1\r\n\r\n")
        except ConnectionResetError:
            refused = b""
        assert refused == b""
        await close_quietly(held.pop()[1])
        await asyncio.sleep(0.05)
        assert (await raw(srv.port, b"GET /metrics HTTP/1.1\r\n\r\n")).startswith(
            b"HTTP/1.1 200 OK")
    finally:
        for _, writer in held:
            await close_quietly(writer)
        await srv.close()


async def test_close_drops_idle_connections_and_stops_listening() -> None:
    """close() ends open connections and the port refuses new ones; a second close is a no-op."""
    srv = await serve_metrics(Metrics(), "127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
    writer.write(b"GET /metr")
    await writer.drain()
    await srv.close()
    assert await read_until_closed(reader) == b""
    await close_quietly(writer)
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", srv.port)
    await srv.close()


async def test_async_context_manager_closes() -> None:
    """``async with`` closes the server on exit."""
    async with await serve_metrics(Metrics(), "localhost", 0) as srv:
        async with httpx.AsyncClient() as client:
            resp = await client.get(f"http://127.0.0.1:{srv.port}/metrics")
        assert resp.status_code == 200
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", srv.port)


@pytest.mark.parametrize(
    "host", ["0.0.0.0", "", "::", "192.168.1.10", "example.com", "localhost.evil", "[::]"]
)
async def test_non_loopback_hosts_are_refused(host: str) -> None:
    """Anything but a loopback address is refused with ValueError before binding."""
    with pytest.raises(ValueError, match="not a loopback address"):
        await serve_metrics(Metrics(), host, 0)


async def test_port_out_of_range_is_refused() -> None:
    """A port outside 0..65535 is refused with ValueError."""
    with pytest.raises(ValueError, match="out of range"):
        await serve_metrics(Metrics(), "127.0.0.1", 70000)


async def test_port_in_use_is_oserror(server: MetricsServer) -> None:
    """Binding a port that is taken raises OSError (EADDRINUSE)."""
    with pytest.raises(OSError, match="error while attempting to bind") as info:
        await serve_metrics(Metrics(), "127.0.0.1", server.port)
    assert info.value.errno == errno.EADDRINUSE
