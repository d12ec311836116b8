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
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass

from ._read import (
    LINE_LIMIT,
    MAX_HEADER_LINES,
    Connection,
    HTTPTransportError,
    Silence,
    keep_alive_expiry,
    parse_length,
    parse_status,
    read_chunked,
    read_pieces,
    read_until_eof,
)
from ._socket import SocketStream


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]  # names lower-cased; a repeated header keeps its last value
    body: bytes


@dataclass(frozen=True)
class Streamed:
    """An answer whose body is read as it comes: ``body`` yields its bytes (de-chunked) in
    the pieces they arrived in; ``pace`` is told when the reader of its events handed a
    chunk on (and when the stream ends), for the stream's interval (:class:`Silence`)."""

    status: int
    headers: dict[str, str]
    body: AsyncIterator[bytes]
    pace: Silence | None = None

    async def read(self) -> bytes:
        """The whole (rest of the) body."""
        return b"".join([piece async for piece in self.body])


_Head = tuple[int, dict[str, str], bool]  # status, headers, keep-alive


class _Stale(Exception):
    """A reused connection was closed by the server before it answered (idle timeout)."""


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
        self._idle: list[Connection] = []
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
                     timeout: float | None, *, interval: float = 0.0, longest: float = 0.0
                     ) -> AsyncIterator[Streamed]:
        """Send one request; yield its answer once its head has come, the body to be read
        as it arrives. ``timeout`` bounds the wait for the head and then each silence
        between two pieces of the body (a server that stops sending), as httpx's read
        timeout does; one timer per stream, not one per read.

        The connection is closed when the body leaves, read to its end or not (a stream
        left early is how llama.cpp learns that nobody reads it any more): it holds one
        of the ``max_connections`` until then; one whose body was read to its end (the
        chunked terminator or the whole ``Content-Length``) goes back to the pool as the
        body ends, for the next request.

        ``interval`` (seconds, 0: none) paces the body's reading once its reader said it
        handed a chunk on (:attr:`Streamed.pace`), up to ``longest`` for a slow stream:
        see :class:`Silence`.

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
                conn.expires = keep_alive_expiry(headers.get("keep-alive", ""))
            watch = Silence(conn, timeout, self._keep if keep else None, interval, longest)
            try:
                pieces = watch.body(read_pieces(conn.stream, headers, watch))
                yield Streamed(status, headers, pieces, watch)
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

    async def _send(self, message: bytes) -> tuple[Connection, _Head]:
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

    def _keep(self, conn: Connection) -> bool:
        """Put ``conn``, its answer read to the end, in the pool if there is room."""
        if self._closed or len(self._idle) >= self._max_idle or not conn.usable():
            return False
        self._idle.append(conn)
        return True

    def _reuse(self) -> Connection | None:
        while self._idle:
            conn = self._idle.pop()
            if conn.usable():
                return conn
            conn.close()
        return None

    async def _connect(self) -> Connection:
        try:
            async with asyncio.timeout(self._connect_timeout):
                if self._unix_path is not None:
                    stream = await SocketStream.connect(socket.AF_UNIX, self._unix_path,
                                                        LINE_LIMIT)
                else:
                    stream = await self._connect_tcp()
        except (ConnectionRefusedError, FileNotFoundError):
            raise HTTPTransportError(
                "refused", "connection refused (child not listening)") from None
        except TimeoutError:
            raise HTTPTransportError("timeout", "connecting timed out") from None
        except OSError as exc:
            raise HTTPTransportError(
                "refused", f"cannot connect: {exc.strerror or exc}") from None
        return Connection(stream)

    async def _connect_tcp(self) -> SocketStream:
        """The first of the host's addresses that accepts (as asyncio.open_connection)."""
        infos = await asyncio.get_running_loop().getaddrinfo(
            self._host, self._port, type=socket.SOCK_STREAM)
        error: OSError = ConnectionRefusedError(f"no address for {self._host}")
        for family, _type, _proto, _name, address in infos:
            try:
                host_port = (str(address[0]), int(address[1]))
                return await SocketStream.connect(family, host_port, LINE_LIMIT)
            except OSError as exc:
                error = exc
        raise error

    async def _head(self, conn: Connection, message: bytes) -> _Head:
        """Send ``message``; the answer's status, headers and whether the connection may
        be kept."""
        reader = conn.stream
        try:
            try:
                await reader.send(message)
                status_line = await reader.readuntil(b"\r\n")
            except asyncio.IncompleteReadError as exc:
                if not exc.partial:
                    raise _Stale from None
                raise
            except ConnectionError:  # closed or reset before any answer: as EOF
                raise _Stale from None
            version, status = parse_status(status_line)
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

    async def _body(self, conn: Connection, head: _Head) -> tuple[Response, bool]:
        """The whole answer, its head read."""
        reader = conn.stream
        status, headers, keep = head
        try:
            if "chunked" in headers.get("transfer-encoding", "").lower():
                body = await read_chunked(reader)
            elif "content-length" in headers:
                body = await reader.readexactly(parse_length(headers["content-length"]))
            elif status in (204, 304) or 100 <= status < 200:
                body = b""
            else:  # the body ends when the server closes the connection
                body = await read_until_eof(reader)
                keep = False
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            raise HTTPTransportError("dropped", "connection dropped by the child") from exc
        except asyncio.LimitOverrunError as exc:
            raise HTTPTransportError("protocol", "header line too long") from exc
        if keep:
            conn.expires = keep_alive_expiry(headers.get("keep-alive", ""))
        return Response(status, headers, body), keep


