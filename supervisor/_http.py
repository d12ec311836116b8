"""A lean HTTP/1.1 client for the unary JSON requests llamad sends to its own children.

httpx spends about 1.5 ms of CPU on each request on these 2-core machines, measured on
one-sentence ``/v1/embeddings`` calls: 1.95 ms of CPU per call with httpx, 0.90 with
aiohttp, 0.50 with this client, JSON included. The call itself takes about 10 ms, so the
transport alone was a tenth of it, and CPU the child needs. This client does only what a
child llamad launched on loopback needs: plain HTTP/1.1 to a known server (llama.cpp's
cpp-httplib, uvicorn), requests with a ``Content-Length`` body, answers with a
``Content-Length`` or chunked body, keep-alive with the server's ``Connection: close``
and ``Keep-Alive: timeout=`` honoured. Streamed answers (:meth:`LoopbackHTTP.stream`) go
through it too: per streamed token httpx cost about 0.3 ms of CPU (its per-read cancel
scope, h11's parser, the pause and resume of the socket), as much as the rest of the relay.
Health probes and endpoints keep httpx.

A connection whose request was cancelled or failed is closed, never reused: closing it
is how llama.cpp learns that nobody waits for the answer any more. A streamed answer read
to its very end (the chunked body's terminator) gives its connection back to the pool like
a unary one: a new UNIX connection per stream cost the daemon ~15% of its CPU per request
(connect and close, issue 27). At most ``max_idle`` connections wait in the pool.

A child listens on a UNIX socket (``unix_path``) and wants its per-launch key: the
``Authorization`` header is built once, into the same bytes every request's head starts
from, so it costs nothing per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
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


@dataclass(frozen=True)
class Streamed:
    """An answer whose body is read as it comes: ``body`` yields its bytes (de-chunked) in
    the pieces they arrived in."""

    status: int
    headers: dict[str, str]
    body: AsyncIterator[bytes]

    async def read(self) -> bytes:
        """The whole (rest of the) body."""
        return b"".join([piece async for piece in self.body])


_Head = tuple[int, dict[str, str], bool]  # status, headers, keep-alive


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
    """Keep-alive connections to one ``host:port`` or UNIX socket, at most
    ``max_connections`` at once.

    Args:
        host: the server's host (with ``unix_path``: only the ``Host`` header's).
        port: its TCP port (ignored with ``unix_path``).
        unix_path: connect to this UNIX socket instead of ``host:port``.
        api_key: sent as ``Authorization: Bearer <key>`` with every request.
        max_idle: connections kept open for reuse between requests (0: none).
    """

    def __init__(self, host: str, port: int, *, connect_timeout: float = 2.0,
                 max_connections: int = 64, max_idle: int = 16,
                 unix_path: str | None = None, api_key: str | None = None) -> None:
        self._host = host
        self._port = port
        self._unix_path = unix_path
        # The Host header's value, and after it every fixed header of a request.
        self._host_header = (host.encode("ascii") if unix_path is not None
                             else f"{host}:{port}".encode("ascii"))
        if api_key is not None:
            if not api_key.isascii() or not api_key.isprintable():
                raise ValueError("api_key must be printable ASCII")
            self._host_header += b"\r\nAuthorization: Bearer " + api_key.encode("ascii")
        self._connect_timeout = connect_timeout
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: list[_Connection] = []
        self._max_idle = max_idle
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

    @contextlib.asynccontextmanager
    async def stream(self, method: str, path: str, body: bytes | None,
                     timeout: float | None) -> AsyncIterator[Streamed]:
        """Send one request; yield its answer once its head has come, the body to be read
        as it arrives. ``timeout`` bounds the wait for the head and then each silence
        between two pieces of the body (a server that stops sending), as httpx's read
        timeout does; one timer per stream, not one per read.

        The connection is closed when the body leaves, read to its end or not (a stream
        left early is how llama.cpp learns that nobody reads it any more): it holds one
        of the ``max_connections`` until then; one whose body was read to its end (the
        chunked terminator or the whole ``Content-Length``) goes back to the pool as the
        body ends, for the next request.

        Raises:
            HTTPTransportError: no (complete) head, or, while ``body`` is read, the body
                broke off (refused, timeout, dropped, protocol).
        """
        message = self._message(method, path, body, b"text/event-stream")
        async with self._slots:
            try:
                async with asyncio.timeout(timeout):
                    conn, (status, headers, keep) = await self._send(message)
            except TimeoutError:
                raise HTTPTransportError("timeout", f"timed out after {timeout:g} s") from None
            if keep:
                conn.expires = _expiry(headers.get("keep-alive", ""))
            watch = _Silence(conn, timeout, self._keep if keep else None)
            try:
                yield Streamed(status, headers, watch.body(_pieces(conn.reader, headers, watch)))
            finally:
                watch.stop()
                if not watch.kept:  # left early, failed or cancelled: never reused
                    conn.close()

    def _message(self, method: str, path: str, body: bytes | None,
                 accept: bytes = b"application/json") -> bytes:
        head = b"%s %s HTTP/1.1\r\nHost: %s\r\nAccept: %s\r\n" % (
            method.encode("ascii"), path.encode("ascii"), self._host_header, accept)
        if body is not None:
            head += b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
        return head + b"\r\n" + (body or b"")

    async def _send(self, message: bytes) -> tuple[_Connection, _Head]:
        """Send ``message`` on a reused connection (once more afresh if the server had
        closed it) or a new one; the connection and the answer's head."""
        conn = self._reuse()
        while True:
            reused = conn is not None
            if conn is None:
                conn = await self._connect()
            try:
                return conn, await self._head(conn, message)
            except _Stale:
                conn.close()
                if not reused:
                    raise HTTPTransportError(
                        "dropped", "connection closed by the child before it answered"
                    ) from None
                conn = None  # the server timed the idle connection out: once more, afresh
            except BaseException:  # cancelled, timed out or failed: never reuse it
                conn.close()
                raise

    async def _request(self, method: str, path: str, body: bytes | None) -> Response:
        conn, head = await self._send(self._message(method, path, body))
        try:
            response, keep = await self._body(conn, head)
        except BaseException:  # cancelled, timed out or failed: never reuse it
            conn.close()
            raise
        if not (keep and self._keep(conn)):
            conn.close()
        return response

    def _keep(self, conn: _Connection) -> bool:
        """Put ``conn``, its answer read to the end, in the pool if there is room."""
        if self._closed or len(self._idle) >= self._max_idle or not conn.usable():
            return False
        self._idle.append(conn)
        return True

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
                if self._unix_path is not None:
                    reader, writer = await asyncio.open_unix_connection(
                        self._unix_path, limit=_LIMIT)
                else:
                    reader, writer = await asyncio.open_connection(
                        self._host, self._port, limit=_LIMIT)
        except (ConnectionRefusedError, FileNotFoundError):
            raise HTTPTransportError(
                "refused", "connection refused (child not listening)") from None
        except TimeoutError:
            raise HTTPTransportError("timeout", "connecting timed out") from None
        except OSError as exc:
            raise HTTPTransportError(
                "refused", f"cannot connect: {exc.strerror or exc}") from None
        return _Connection(reader, writer)

    async def _head(self, conn: _Connection, message: bytes) -> _Head:
        """Send ``message``; the answer's status, headers and whether the connection may
        be kept."""
        reader = conn.reader
        try:
            try:
                conn.writer.write(message)
                await conn.writer.drain()
                status_line = await reader.readuntil(b"\r\n")
            except asyncio.IncompleteReadError as exc:
                if not exc.partial:
                    raise _Stale from None
                raise
            except ConnectionError:  # closed or reset before any answer: as EOF
                raise _Stale from None
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
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            raise HTTPTransportError("dropped", "connection dropped by the child") from exc
        except asyncio.LimitOverrunError as exc:
            raise HTTPTransportError("protocol", "header line too long") from exc
        keep = version == b"HTTP/1.1" and headers.get("connection", "").lower() != "close"
        return status, headers, keep

    async def _body(self, conn: _Connection, head: _Head) -> tuple[Response, bool]:
        """The whole answer, its head read."""
        reader = conn.reader
        status, headers, keep = head
        try:
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


class _Silence:
    """The read timeout of one stream: the connection is aborted once a read waited
    ``timeout`` seconds, then the body raises HTTPTransportError("timeout"). One timer,
    re-armed when it fires early, instead of one per read; the time the consumer spends
    between pieces (a slow client downstream) is not a read's.

    Also the body's end: ``complete`` once it was read to its end (set by :func:`_pieces`),
    ``kept`` once its connection went back to the pool (``keep``, None: never).
    """

    def __init__(self, conn: _Connection, timeout: float | None,
                 keep: Callable[[_Connection], bool] | None = None) -> None:
        self._conn = conn
        self._keep = keep
        self.complete = False
        self.kept = False
        self._timeout = float("inf") if timeout is None else timeout
        self._loop = asyncio.get_running_loop()
        self.last = self._loop.time()
        self.expired = False
        self._timer = (None if timeout is None
                       else self._loop.call_at(self.last + timeout, self._check))

    def _check(self) -> None:
        now = self._loop.time()
        due = (now if self.last < 0 else self.last) + self._timeout  # < 0: not reading
        if now < due:
            self._timer = self._loop.call_at(due, self._check)
            return
        self.expired = True
        self._timer = None
        self._conn.writer.transport.abort()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def body(self, pieces: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """``pieces``, noting when each came; a failure named (HTTPTransportError)."""
        loop = self._loop
        try:
            async for piece in pieces:
                self.last = -1.0
                yield piece
                self.last = loop.time()
            self.stop()  # before the connection may serve another request
            if self.complete and not self.expired and self._keep is not None:
                self.kept = self._keep(self._conn)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            if self.expired:
                raise HTTPTransportError(
                    "timeout", f"nothing came for {self._timeout:g} s") from None
            raise HTTPTransportError("dropped", "connection dropped by the child") from exc
        except asyncio.LimitOverrunError as exc:
            raise HTTPTransportError("protocol", "chunk size line too long") from exc
        finally:
            self.stop()


async def _pieces(reader: asyncio.StreamReader, headers: dict[str, str], end: _Silence
                  ) -> AsyncIterator[bytes]:
    """A body's bytes as they arrive: de-chunked, up to its Content-Length, or to EOF;
    ``end.complete`` set once it was read to its end with nothing after it (then its
    connection may be reused). A body cut short raises IncompleteReadError."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        async for piece in _dechunk(reader, end):
            yield piece
        return
    left = _length(headers["content-length"]) if "content-length" in headers else -1
    end.complete = left == 0
    while left:
        piece = await reader.read(65536 if left < 0 else min(left, 65536))
        if not piece:
            if left < 0:
                return
            raise asyncio.IncompleteReadError(b"", left)
        left -= len(piece) if left > 0 else 0
        end.complete = left == 0
        yield piece


async def _dechunk(reader: asyncio.StreamReader, state: _Silence) -> AsyncIterator[bytes]:
    """A chunked body's data as it arrives: per read, the data of every chunk the read
    brought, as one piece, whatever the chunk boundaries (a token's event is usually one
    chunk in one segment; what a fast server sent while the consumer was busy is many,
    taken at once: issue 27)."""
    buf = b""
    pos = 0  # buf[pos:] is not parsed yet
    size = -1  # bytes left of the current chunk, its data's CRLF included (-1: a size line)
    while True:
        out: list[bytes] = []
        end = len(buf)
        while True:
            if size < 0:
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    if end - pos > _LIMIT:
                        raise asyncio.LimitOverrunError("chunk size line too long", end - pos)
                    break
                line = buf[pos:eol].split(b";", 1)[0].strip()
                try:
                    size = int(line, 16)
                except ValueError:
                    size = -1
                if size < 0:
                    raise HTTPTransportError("protocol", f"bad chunk size {line[:40]!r}")
                pos = eol + 2
                if size == 0:  # the last chunk, then trailers (ignored) up to a CRLF
                    if out:
                        yield b"".join(out)
                    state.complete = await _trailers(reader, buf[pos:])
                    return
                size += 2  # the data's CRLF
            if pos >= end:
                break
            if size > 2:
                taken = min(size - 2, end - pos)
                out.append(buf[pos:pos + taken])
                pos += taken
                size -= taken
                continue
            crlf = b"\r\n"[2 - size:]
            seen = buf[pos:pos + size]
            if not crlf.startswith(seen):
                raise HTTPTransportError("protocol", "chunk not followed by CRLF")
            pos += len(seen)
            size -= len(seen)
            if size == 0:
                size = -1
        if out:
            yield out[0] if len(out) == 1 else b"".join(out)
        buf = buf[pos:] + await _more(reader)
        pos = 0


async def _trailers(reader: asyncio.StreamReader, buf: bytes) -> bool:
    """Read a chunked body's trailer section (``buf``: what came of it already) to its
    empty line; whether nothing came after it (else the connection is not reusable)."""
    while True:
        eol = buf.find(b"\r\n")
        if eol < 0:
            if len(buf) > _LIMIT:
                raise asyncio.LimitOverrunError("trailer line too long", len(buf))
            buf += await _more(reader)
            continue
        if eol == 0:
            return len(buf) == 2
        buf = buf[eol + 2:]


async def _more(reader: asyncio.StreamReader) -> bytes:
    data = await reader.read(65536)
    if not data:
        raise asyncio.IncompleteReadError(b"", None)
    return data


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
