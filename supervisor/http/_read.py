"""Reading HTTP/1.1 answers off a child's connection: the limits of the status line and
headers, the body by Content-Length, chunked (de-chunked as it comes for a stream; its
terminator and trailers read so that the connection can serve again) or until EOF, one read
timeout per stream, and the error a request without a (complete) answer ends with. Used by
:class:`supervisor.http._loopback.LoopbackHTTP`.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Callable

from ._socket import SocketStream

MAX_HEADER_LINES = 100
MAX_BODY_BYTES = 256 * 1024 * 1024  # an answer larger than this is not a child's JSON
LINE_LIMIT = 64 * 1024  # longest status or header line (readuntil's limit)
BACKLOG = 32 * 1024  # a piece this large: more is likely waiting, read on without pause
TOKENS_PER_EVENT = 2  # what a slow stream's pause grows to wait for (Silence's longest)


class HTTPTransportError(Exception):
    """A request that got no (complete) HTTP answer.

    ``kind`` is one of ``refused`` (nothing listens), ``timeout``, ``dropped`` (the server
    closed the connection mid-answer) or ``protocol`` (not an HTTP answer we can read).
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind




class Connection:
    def __init__(self, stream: SocketStream) -> None:
        self.stream = stream
        self.expires = float("inf")  # time.monotonic() after which the server may close it

    def usable(self) -> bool:
        return (time.monotonic() < self.expires and not self.stream.at_eof()
                and not self.stream.is_closing())

    def close(self) -> None:
        self.stream.close()


class Silence:
    """The read timeout of one stream: the connection is aborted once a read waited
    ``timeout`` seconds, then the body raises HTTPTransportError("timeout"). One timer,
    re-armed when it fires early, instead of one per read; the time the consumer spends
    between pieces (a slow client downstream) is not a read's.

    Also the body's end: ``complete`` once it was read to its end (set by :func:`read_pieces`),
    ``kept`` once its connection went back to the pool (``keep``, None: never).

    And its pace (``interval`` seconds, 0: none): once the reader of the events handed a
    chunk on (:meth:`flushed`), the connection is not read again until ``interval`` has
    passed since then (its reading paused: the kernel holds what comes meanwhile), then
    all that came is read at once, and relayed as one chunk. At a model's pace a token
    comes at a time, and each read of one is a wake-up of the whole relay, which costs
    more than the relay's own work (issue 27): every ``interval`` one wake-up for all.
    Nothing waits before the first chunk (time to first token), once the events said the
    stream ends (:meth:`ending`), nor after a read that found a backlog; leaving the
    stream (a cancel) ends a pause at once. Pauses end on a grid of a quarter interval
    (the loop's clock), so that concurrent streams are read in the same wake-up.

    A slow stream (many streams sharing a child: each gets a token every 60-80 ms on these
    machines) would be relayed one token per read at any interval shorter than its pace,
    and the relay's CPU per token is its CPU per event. With ``longest`` above
    ``interval``, the pause grows with the stream's token rate, seen at each chunk handed
    on, to about :data:`TOKENS_PER_EVENT` tokens' time, at most ``longest`` seconds; a
    fast stream keeps ``interval``.
    """

    def __init__(self, conn: Connection, timeout: float | None,
                 keep: Callable[[Connection], bool] | None = None,
                 interval: float = 0.0, longest: float = 0.0) -> None:
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
        self._interval = interval
        self._longest = max(interval, longest)
        self._flushed = -1.0  # loop time of the last chunk handed on (< 0: none yet)
        self._rate = 0.0  # the stream's tokens per second, smoothed (0: not known yet)

    def flushed(self, tokens: int = 1) -> None:
        """A chunk of ``tokens`` tokens was handed on just now: the next read waits for
        the interval (a slow stream's longer: see the class)."""
        if self._interval > 0:
            now = self._loop.time()
            if self._longest > self._interval and self._flushed >= 0:
                self._rate = token_rate(self._rate, tokens, now - self._flushed)
            self._flushed = now

    def pause_length(self) -> float:
        """Seconds from a chunk handed on to the next read."""
        return pause_length(self._interval, self._longest, self._rate)

    def ending(self) -> None:
        """The stream's end (its finish reason, ``[DONE]``) came: read on without pause."""
        self._interval = 0.0

    def _check(self) -> None:
        now = self._loop.time()
        due = (now if self.last < 0 else self.last) + self._timeout  # < 0: not reading
        if now < due:
            self._timer = self._loop.call_at(due, self._check)
            return
        self.expired = True
        self._timer = None
        self._conn.stream.close()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def body(self, pieces: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """``pieces``, noting when each came, paced; a failure named (HTTPTransportError)."""
        loop = self._loop
        try:
            async for piece in pieces:
                self.last = -1.0
                yield piece
                self.last = now = loop.time()
                if self._interval > 0 and self._flushed >= 0 and len(piece) < BACKLOG:
                    # On a grid of a quarter interval: the pauses of concurrent streams
                    # end together, all their reads in one wake-up of the loop.
                    grid = self._interval / 4
                    until = math.ceil((self._flushed + self.pause_length()) / grid) * grid
                    if until > now:
                        self._pause(until)
            self.stop()  # before the connection may serve another request
            self._unpause()  # its end may have been read during a pause
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
            self._unpause()

    def _pause(self, until: float) -> None:
        """Make no read of the connection before ``until`` (loop time): the next read of
        the body waits until then and takes all that came meanwhile (one wake-up, one
        step of the generators above; a cancel ends the wait at once and the stream then
        closes the connection). What was read already is not held."""
        self._conn.stream.hold(until)

    def _unpause(self) -> None:
        """End a pause now: what came before it may hold the body's end, and the
        connection's next answer must not wait."""
        self._conn.stream.release()


def token_rate(rate: float, tokens: int, seconds: float) -> float:
    """A stream's tokens per second, smoothed: ``rate`` so far (<= 0: none yet) and
    ``tokens`` that came in the ``seconds`` since the previous chunk."""
    if seconds <= 0:
        return rate
    seen = tokens / seconds
    return seen if rate <= 0 else (rate + seen) / 2


def pause_length(interval: float, longest: float, rate: float) -> float:
    """Seconds a stream of ``rate`` tokens per second (<= 0: not known) waits from one
    chunk handed on to its next read: ``interval``, or for a slow stream the time of
    :data:`TOKENS_PER_EVENT` tokens, at most ``longest``."""
    if rate <= 0 or longest <= interval:
        return interval
    return min(longest, max(interval, TOKENS_PER_EVENT / rate))


def read_pieces(reader: SocketStream, headers: dict[str, str], end: Silence
                ) -> AsyncIterator[bytes]:
    """A body's bytes as they arrive: de-chunked, up to its Content-Length, or to EOF;
    ``end.complete`` set once it was read to its end with nothing after it (then its
    connection may be reused). A body cut short raises IncompleteReadError.

    The reader itself, not a generator around it: every piece of a stream passes each
    layer of generators on a cold process (issue 27)."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return dechunk(reader, end)
    return _read_sized(reader, headers, end)


async def _read_sized(reader: SocketStream, headers: dict[str, str], end: Silence
                      ) -> AsyncIterator[bytes]:
    """A body up to its Content-Length, or to EOF without one."""
    left = parse_length(headers["content-length"]) if "content-length" in headers else -1
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


async def dechunk(reader: SocketStream, state: Silence) -> AsyncIterator[bytes]:
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
                    if end - pos > LINE_LIMIT:
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
                    state.complete = await read_trailers(reader, buf[pos:])
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
        buf = buf[pos:] + await read_more(reader)
        pos = 0


async def read_trailers(reader: SocketStream, buf: bytes) -> bool:
    """Read a chunked body's trailer section (``buf``: what came of it already) to its
    empty line; whether nothing came after it (else the connection is not reusable)."""
    while True:
        eol = buf.find(b"\r\n")
        if eol < 0:
            if len(buf) > LINE_LIMIT:
                raise asyncio.LimitOverrunError("trailer line too long", len(buf))
            buf += await read_more(reader)
            continue
        if eol == 0:
            return len(buf) == 2
        buf = buf[eol + 2:]


async def read_more(reader: SocketStream) -> bytes:
    data = await reader.read(65536)
    if not data:
        raise asyncio.IncompleteReadError(b"", None)
    return data


def parse_status(line: bytes) -> tuple[bytes, int]:
    parts = line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise HTTPTransportError("protocol", f"not an HTTP answer: {line[:80]!r}")
    return parts[0], int(parts[1])


def parse_length(value: str) -> int:
    if not value.isdigit() or int(value) > MAX_BODY_BYTES:
        raise HTTPTransportError("protocol", f"bad Content-Length {value[:40]!r}")
    return int(value)


async def read_chunked(reader: SocketStream) -> bytes:
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


async def read_until_eof(reader: SocketStream) -> bytes:
    parts: list[bytes] = []
    total = 0
    while chunk := await reader.read(65536):
        total += len(chunk)
        if total > MAX_BODY_BYTES:
            raise HTTPTransportError("protocol", "answer too large")
        parts.append(chunk)
    return b"".join(parts)


def keep_alive_expiry(keep_alive: str) -> float:
    """When to stop reusing the connection: a second before the server's idle timeout."""
    for item in keep_alive.split(","):
        name, _, value = item.strip().partition("=")
        if name.strip().lower() == "timeout":
            with contextlib.suppress(ValueError):
                return time.monotonic() + max(0.0, float(value) - 1.0)
    return float("inf")
