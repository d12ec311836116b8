"""A lean HTTP/1.1 client for the unary JSON requests llamad sends to its own children.

httpx spends about 1.5 ms of CPU on each request on these 2-core machines, measured on
one-sentence ``/v1/embeddings`` calls: 1.95 ms of CPU per call with httpx, 0.90 with
aiohttp, 0.50 with this client, JSON included. The call itself takes about 10 ms, so the
transport alone was a tenth of it, and CPU the child needs. This client does only what a
child llamad launched on loopback needs: plain HTTP/1.1 to a known server (llama.cpp's
cpp-httplib, uvicorn), requests with a ``Content-Length`` body, answers with a
``Content-Length`` or chunked body, keep-alive with the server's ``Connection: close``
and ``Keep-Alive: timeout=`` honoured. Streams, health probes and endpoints keep httpx.

A connection whose request was cancelled or failed is closed, never reused: closing it
is how llama.cpp learns that nobody waits for the answer any more.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

MAX_HEADER_LINES = 100
MAX_BODY_BYTES = 256 * 1024 * 1024  # an answer larger than this is not a child's JSON
_LIMIT = 64 * 1024  # longest status or header line (StreamReader limit)


class HTTPTransportError(Exception):
    """A request that got no (complete) HTTP answer.

    ``kind`` is one of ``refused`` (nothing listens), ``timeout``, ``dropped`` (the server
    closed the connection mid-answer) or ``protocol`` (not an HTTP answer we can read).
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]  # names lower-cased; a repeated header keeps its last value
    body: bytes


class _Stale(Exception):
    """A reused connection was closed by the server before it answered (idle timeout)."""


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.expires = float("inf")  # time.monotonic() after which the server may close it

    def usable(self) -> bool:
        return (time.monotonic() < self.expires and not self.reader.at_eof()
                and not self.writer.is_closing())

    def close(self) -> None:
        self.writer.close()


class LoopbackHTTP:
    """Keep-alive connections to one ``host:port``, at most ``max_connections`` at once."""

    def __init__(self, host: str, port: int, *, connect_timeout: float = 2.0,
                 max_connections: int = 64) -> None:
        self._host = host
        self._port = port
        self._host_header = f"{host}:{port}".encode("ascii")
        self._connect_timeout = connect_timeout
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: list[_Connection] = []
        self._closed = False

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    async def request(self, method: str, path: str, body: bytes | None,
                      timeout: float | None) -> Response:
        """Send one request and read its whole answer, within ``timeout`` seconds.

        Raises:
            HTTPTransportError: no complete answer (refused, timeout, dropped, protocol).
        """
        async with self._slots:
            try:
                async with asyncio.timeout(timeout):
                    return await self._request(method, path, body)
            except TimeoutError:
                raise HTTPTransportError("timeout", f"timed out after {timeout:g} s") from None

    async def _request(self, method: str, path: str, body: bytes | None) -> Response:
        head = b"%s %s HTTP/1.1\r\nHost: %s\r\nAccept: application/json\r\n" % (
            method.encode("ascii"), path.encode("ascii"), self._host_header)
        if body is not None:
            head += b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
        message = head + b"\r\n" + (body or b"")
        conn = self._reuse()
        while True:
            reused = conn is not None
            if conn is None:
                conn = await self._connect()
            try:
                response, keep = await self._exchange(conn, message)
            except _Stale:
                conn.close()
                if not reused:
                    raise HTTPTransportError(
                        "dropped", "connection closed by the child before it answered"
                    ) from None
                conn = None  # the server timed the idle connection out: once more, afresh
                continue
            except BaseException:  # cancelled, timed out or failed: never reuse it
                conn.close()
                raise
            if keep and not self._closed:
                self._idle.append(conn)
            else:
                conn.close()
            return response

    def _reuse(self) -> _Connection | None:
        while self._idle:
            conn = self._idle.pop()
            if conn.usable():
                return conn
            conn.close()
        return None

    async def _connect(self) -> _Connection:
        try:
            async with asyncio.timeout(self._connect_timeout):
                reader, writer = await asyncio.open_connection(
                    self._host, self._port, limit=_LIMIT)
        except ConnectionRefusedError:
            raise HTTPTransportError(
                "refused", "connection refused (child not listening)") from None
        except TimeoutError:
            raise HTTPTransportError("timeout", "connecting timed out") from None
        except OSError as exc:
            raise HTTPTransportError(
                "refused", f"cannot connect: {exc.strerror or exc}") from None
        return _Connection(reader, writer)

    async def _exchange(self, conn: _Connection, message: bytes) -> tuple[Response, bool]:
        reader = conn.reader
        try:
            conn.writer.write(message)
            await conn.writer.drain()
            try:
                status_line = await reader.readuntil(b"\r\n")
            except asyncio.IncompleteReadError as exc:
                if not exc.partial:
                    raise _Stale from None
                raise
            version, status = _status(status_line)
            headers: dict[str, str] = {}
            for _ in range(MAX_HEADER_LINES):
                line = await reader.readuntil(b"\r\n")
                if line == b"\r\n":
                    break
                name, sep, value = line.decode("latin-1").partition(":")
                if not sep:
                    raise HTTPTransportError("protocol", f"malformed header line {line[:80]!r}")
                headers[name.strip().lower()] = value.strip()
            else:
                raise HTTPTransportError("protocol", f"more than {MAX_HEADER_LINES} headers")
            keep = version == b"HTTP/1.1" and headers.get("connection", "").lower() != "close"
            if "chunked" in headers.get("transfer-encoding", "").lower():
                body = await _chunked(reader)
            elif "content-length" in headers:
                body = await reader.readexactly(_length(headers["content-length"]))
            elif status in (204, 304) or 100 <= status < 200:
                body = b""
            else:  # the body ends when the server closes the connection
                body = await _until_eof(reader)
                keep = False
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            raise HTTPTransportError("dropped", "connection dropped by the child") from exc
        except asyncio.LimitOverrunError as exc:
            raise HTTPTransportError("protocol", "header line too long") from exc
        if keep:
            conn.expires = _expiry(headers.get("keep-alive", ""))
        return Response(status, headers, body), keep


def _status(line: bytes) -> tuple[bytes, int]:
    parts = line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise HTTPTransportError("protocol", f"not an HTTP answer: {line[:80]!r}")
    return parts[0], int(parts[1])


def _length(value: str) -> int:
    if not value.isdigit() or int(value) > MAX_BODY_BYTES:
        raise HTTPTransportError("protocol", f"bad Content-Length {value[:40]!r}")
    return int(value)


async def _chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    total = 0
    while True:
        size_line = (await reader.readuntil(b"\r\n")).split(b";", 1)[0].strip()
        try:
            size = int(size_line, 16)
        except ValueError:
            raise HTTPTransportError("protocol", f"bad chunk size {size_line[:40]!r}") from None
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers
                pass
            return b"".join(parts)
        total += size
        if total > MAX_BODY_BYTES:
            raise HTTPTransportError("protocol", "answer too large")
        parts.append(await reader.readexactly(size))
        if await reader.readexactly(2) != b"\r\n":
            raise HTTPTransportError("protocol", "chunk not followed by CRLF")


async def _until_eof(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    total = 0
    while chunk := await reader.read(65536):
        total += len(chunk)
        if total > MAX_BODY_BYTES:
            raise HTTPTransportError("protocol", "answer too large")
        parts.append(chunk)
    return b"".join(parts)


def _expiry(keep_alive: str) -> float:
    """When to stop reusing the connection: a second before the server's idle timeout."""
    for item in keep_alive.split(","):
        name, _, value = item.strip().partition("=")
        if name.strip().lower() == "timeout":
            with contextlib.suppress(ValueError):
                return time.monotonic() + max(0.0, float(value) - 1.0)
    return float("inf")
