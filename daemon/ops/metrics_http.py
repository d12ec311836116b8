"""A tiny loopback-only HTTP endpoint serving :class:`daemon.telemetry.metrics.Metrics`.

Off unless the daemon asks for it (``metrics_listen``). It binds loopback addresses only
and speaks just enough HTTP/1.1 for a scraper: ``GET /metrics`` (and ``HEAD``), one
request per connection, bounded request size and read time.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re

import structlog
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from ..telemetry.metrics import Metrics

_log = structlog.get_logger("llamad.metrics")

# -- the HTTP endpoint -------------------------------------------------------------------

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
MAX_HEAD_BYTES = 8192
"""Request line plus headers; a scraper sends a few hundred bytes."""
MAX_HEADERS = 64
READ_TIMEOUT = 5.0
"""Seconds a client has to send its request head, and to take the response."""
MAX_CONNECTIONS = 16
"""Connections served at once (``connections.metrics_max``); more are closed unanswered."""

_REQUEST_LINE = re.compile(r"([A-Z]+) (/[!-~]*) HTTP/1\.[01]\r?\n")
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            500: "Internal Server Error"}


class _BadRequestError(Exception):
    pass


def _loopback_host(host: str) -> str:
    """The address to bind for ``host``; ValueError unless it is a loopback address."""
    if host == "localhost":
        # One address, not whatever "localhost" resolves to: with port 0 each resolved
        # address would get a different port.
        return "127.0.0.1"
    literal = host.removeprefix("[").removesuffix("]")
    try:
        loopback = ipaddress.ip_address(literal).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ValueError(
            f"metrics host {host!r} is not a loopback address; the metrics endpoint has no "
            "authentication and only listens on loopback"
        )
    return literal


class MetricsServer:
    """A running metrics endpoint (see :func:`serve_metrics`).

    Attributes:
        port: the bound port (the one picked by the system when 0 was asked for).
    """

    def __init__(self, metrics: Metrics, read_timeout: float,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        self.port = 0
        self._metrics = metrics
        self._read_timeout = read_timeout
        self._max_connections = max_connections
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._closing = False

    async def _start(self, host: str, port: int) -> None:
        # create_server yields only before binding (address resolution) and, with
        # start_serving=False, returns right after binding: a cancellation lands either
        # before anything is bound or in start_serving(), where the server is ours to close.
        server = await asyncio.start_server(
            self._connection, host, port, limit=MAX_HEAD_BYTES, start_serving=False)
        try:
            await server.start_serving()
        except BaseException:
            server.close()
            raise
        self._server = server
        self.port = server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        """Stop listening and drop open connections; idempotent.

        Connections are aborted, not finished: a scrape in progress fails, which a
        scraper handles as a missed scrape.
        """
        server, self._server = self._server, None
        if server is None:
            return
        self._closing = True
        server.close()
        # A connection accepted an instant ago may start its handler after this; it sees
        # _closing and aborts at once.
        tasks = list(self._connections)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()

    async def __aenter__(self) -> MetricsServer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve one request, then close; raises nothing but cancellation (asyncio would
        only log it)."""
        task = asyncio.current_task()
        if self._closing or task is None or len(self._connections) >= self._max_connections:
            writer.transport.abort()  # a scraper retries at its next interval
            return
        self._connections.add(task)
        try:
            await self._serve_one(reader, writer)
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            writer.transport.abort()  # the client went away, or was too slow
        except asyncio.CancelledError:
            writer.transport.abort()  # close(): shutting down
            raise
        except Exception as exc:
            _log.error("metrics connection failed", exc_info=exc)
            writer.transport.abort()
        finally:
            self._connections.discard(task)

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async with asyncio.timeout(self._read_timeout):
            try:
                method, path = await self._read_head(reader)
            except _BadRequestError as exc:
                status, body, head = 400, f"bad request: {exc}\n".encode(), False
            else:
                status, body, head = self._answer(method, path)
        content_type = CONTENT_TYPE if status == 200 else "text/plain; charset=utf-8"
        lines = [
            f"HTTP/1.1 {status} {_REASONS[status]}",
            f"Content-Type: {content_type}",
            f"Content-Length: {len(body)}",
            "Connection: close",
        ]
        if status == 405:
            lines.append("Allow: GET, HEAD")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("ascii"))
        if not head:
            writer.write(body)
        async with asyncio.timeout(self._read_timeout):
            await writer.drain()
            writer.close()
            await writer.wait_closed()

    async def _read_head(self, reader: asyncio.StreamReader) -> tuple[str, str]:
        """Read the request line and headers; return (method, path without query)."""
        total = 0

        async def line() -> bytes:
            nonlocal total
            try:
                data = await reader.readuntil(b"\n")
            except asyncio.LimitOverrunError:
                raise _BadRequestError(f"a line is longer than {MAX_HEAD_BYTES} bytes") from None
            except asyncio.IncompleteReadError as exc:
                if not exc.partial and total == 0:
                    raise  # connected and closed without a word: nothing to answer
                raise _BadRequestError("incomplete request") from None
            total += len(data)
            if total > MAX_HEAD_BYTES:
                raise _BadRequestError(f"request head is longer than {MAX_HEAD_BYTES} bytes")
            return data

        request_line = (await line()).decode("ascii", errors="replace")
        match = _REQUEST_LINE.fullmatch(request_line)
        if match is None:
            raise _BadRequestError("malformed request line")
        for _ in range(MAX_HEADERS + 1):
            header = await line()
            if header in (b"\r\n", b"\n"):
                return match[1], match[2].partition("?")[0]
            if b":" not in header or header[:1] in (b" ", b"\t"):
                raise _BadRequestError("malformed header")
        raise _BadRequestError(f"more than {MAX_HEADERS} headers")

    def _answer(self, method: str, path: str) -> tuple[int, bytes, bool]:
        """(status, body, head-only) for a well-formed request."""
        if path != "/metrics":
            return 404, b"not found; metrics are at /metrics\n", method == "HEAD"
        if method not in ("GET", "HEAD"):
            return 405, b"method not allowed\n", False
        try:
            body = self._metrics.render()
        except Exception as exc:
            _log.error("rendering metrics failed", exc_info=exc)
            return 500, b"rendering metrics failed; see the daemon's log\n", method == "HEAD"
        return 200, body, method == "HEAD"


async def serve_metrics(
    metrics: Metrics, host: str, port: int, *, read_timeout: float = READ_TIMEOUT,
    max_connections: int = MAX_CONNECTIONS,
) -> MetricsServer:
    """Serve ``metrics`` at ``http://host:port/metrics`` until the server is closed.

    ``GET /metrics`` (or ``HEAD``) answers 200 in the text exposition format 0.0.4; other
    paths 404, other methods 405, malformed or oversized requests 400. Each connection
    serves one request and is closed. A client gets ``read_timeout`` seconds to send its
    request head and again to take the response; then it is dropped without an answer.
    Past ``max_connections`` open at once, a new connection is closed unanswered.

    Args:
        metrics: what to serve.
        host: a loopback address (``127.0.0.1``, ``::1``, ``localhost``).
        port: the port; 0 picks a free one (see :attr:`MetricsServer.port`).
        read_timeout: seconds, see above.
        max_connections: connections served at once, see above.

    Returns:
        The listening server; ``await server.close()`` stops it.

    Raises:
        ValueError: ``host`` is not a loopback address, or ``port`` is out of range.
        OSError: the address cannot be bound (for example, the port is in use).

    Cancelling it leaves nothing listening.
    """
    bind = _loopback_host(host)
    if not 0 <= port <= 65535:
        raise ValueError(f"metrics port {port} is out of range 0..65535")
    server = MetricsServer(metrics, read_timeout, max_connections)
    await server._start(bind, port)
    return server
