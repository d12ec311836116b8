"""One connection to a child, read and written on its non-blocking socket by the event loop:
the reads and writes :class:`~supervisor.http._loopback.LoopbackHTTP` makes (a stream's
``read``, a head's ``readuntil``, a body's ``readexactly``, a request's ``send``), and
holds, the reason it is not an asyncio transport.

A stream relayed at an interval (:class:`~supervisor.http._read.Silence`) leaves its child's
connection unread for the interval after each chunk, then reads all that came at once. On
a transport that is ``pause_reading`` (the socket taken out of epoll) and ``resume_reading``
(put back; the loop's next poll sees it readable, its callback reads into the stream's
buffer, wakes the reader, which runs on the poll after that): two ``epoll_ctl`` and three
turns of the loop for one chunk. A hold here is only a time: during it the socket is not
watched, and when it ends the waiting read calls ``recv`` at once, which finds what the
child sent meanwhile; the socket is watched only when a read finds nothing (a child slower
than the interval). Measured on this kind of machine, one chunk every 40 ms from a socket
the kernel held a token for: 340-510 us of CPU per chunk with a transport, 210-230 here
(issue 27).

Reading otherwise works as a transport does: while the socket is watched, the loop's
callback reads what comes into the buffer (up to ``HIGH_WATER``, then it stops watching
until the buffer is read), and wakes the read waiting for it.
"""

from __future__ import annotations

import asyncio
import socket

CHUNK = 256 * 1024  # the most one recv takes
HIGH_WATER = 1024 * 1024  # buffered beyond this: stop watching until read


class SocketStream:
    """A connected socket, set non-blocking, for one reader and one writer at a time.

    Args:
        sock: connected; this object owns it from now on (closes it).
        limit: the longest ``readuntil`` may look for its separator (as StreamReader's).
    """

    def __init__(self, sock: socket.socket, limit: int) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._fd = sock.fileno()
        self._limit = limit
        self._loop = asyncio.get_running_loop()
        self._buf = bytearray()
        self._eof = False
        self._error: OSError | None = None
        self._closed = False
        self._watching = False
        self._waiter: asyncio.Future[None] | None = None
        self._hold = 0.0  # loop time before which no read is made (0: none)

    @classmethod
    async def connect(cls, family: int, address: str | tuple[str, int], limit: int
                      ) -> SocketStream:
        """A new connection to ``address`` (a UNIX path or a TCP host and port); OSError
        (ConnectionRefusedError, FileNotFoundError, ...) when there is none."""
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            if family != socket.AF_UNIX:  # as asyncio's TCP transports: no Nagle delay
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await asyncio.get_running_loop().sock_connect(sock, address)
        except BaseException:
            sock.close()
            raise
        return cls(sock, limit)

    # -- state ----------------------------------------------------------------------------

    def at_eof(self) -> bool:
        """The peer closed its side and everything it sent was read."""
        return self._eof and not self._buf

    @property
    def buffered(self) -> int:
        """Bytes read off the socket and not yet taken by a read."""
        return len(self._buf)

    def is_closing(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Close the socket now; a read waiting meanwhile raises ConnectionAbortedError."""
        if self._closed:
            return
        self._closed = True
        self._unwatch()
        # A send cancelled just now (a request's deadline) leaves its writer registered
        # until the loop's next turn: never a closed descriptor in the selector.
        self._loop.remove_writer(self._fd)
        self._wake(ConnectionAbortedError("connection closed"))
        self._sock.close()

    def hold(self, until: float) -> None:
        """Make no read before ``until`` (loop time): the next read waits until then, then
        takes what came meanwhile with one ``recv``. :meth:`close` ends the wait, and so
        does cancelling the read's task."""
        self._hold = until
        self._unwatch()

    def release(self) -> None:
        """End a hold now."""
        self._hold = 0.0

    # -- writing --------------------------------------------------------------------------

    async def send(self, data: bytes) -> None:
        """Send all of ``data`` (ConnectionError if the peer is gone)."""
        if self._closed:
            raise ConnectionAbortedError("connection closed")
        await self._loop.sock_sendall(self._sock, data)

    # -- reading --------------------------------------------------------------------------

    async def read(self, n: int) -> bytes:
        """Up to ``n`` bytes, once there are some; b"" at the end of the stream."""
        if not self._buf:
            if self._eof:
                return b""
            data = await self._fill(n)
            if data is not None:
                return data
            if not self._buf:
                return b""
        if len(self._buf) <= n:
            data = bytes(self._buf)
            self._buf.clear()
        else:
            data = bytes(self._buf[:n])
            del self._buf[:n]
        return data

    async def readexactly(self, n: int) -> bytes:
        """Exactly ``n`` bytes; IncompleteReadError if the stream ends before them."""
        while len(self._buf) < n:
            if self._eof:
                partial = bytes(self._buf)
                self._buf.clear()
                raise asyncio.IncompleteReadError(partial, n)
            await self._fill_buffer()
        data = bytes(self._buf[:n])
        del self._buf[:n]
        return data

    async def readuntil(self, separator: bytes) -> bytes:
        """Up to and including ``separator``; IncompleteReadError if the stream ends
        before it, LimitOverrunError if it is not within the limit's bytes."""
        start = 0
        while True:
            at = self._buf.find(separator, start)
            if at >= 0:
                end = at + len(separator)
                if end > self._limit:
                    raise asyncio.LimitOverrunError(
                        "separator found, but the chunk is longer than the limit", at)
                data = bytes(self._buf[:end])
                del self._buf[:end]
                return data
            if len(self._buf) > self._limit:
                raise asyncio.LimitOverrunError(
                    "separator not found, and the buffer exceeds the limit", len(self._buf))
            if self._eof:
                partial = bytes(self._buf)
                self._buf.clear()
                raise asyncio.IncompleteReadError(partial, None)
            start = max(0, len(self._buf) - len(separator) + 1)
            await self._fill_buffer()

    async def _fill_buffer(self) -> None:
        data = await self._fill(CHUNK)
        if data is not None:
            self._buf += data

    async def _fill(self, n: int) -> bytes | None:
        """Wait for data (the buffer is empty or too short): what one ``recv`` took at
        once (returned, not buffered; b"" at the end), or None once the watch put data in
        the buffer or saw the end. Raises what the socket failed with."""
        until, self._hold = self._hold, 0.0
        if until > self._loop.time():
            await self._wait(self._loop.call_at(until, self._wake))
        self._check()
        if not self._watching:
            data = self._recv(min(n, CHUNK))
            if data is not None:
                return data
            self._watch()
        await self._wait(None)
        self._check()
        return None

    async def _wait(self, timer: asyncio.TimerHandle | None) -> None:
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    def _check(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise ConnectionAbortedError("connection closed")

    def _wake(self, exc: BaseException | None = None) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            if exc is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(exc)

    def _watch(self) -> None:
        if not self._watching and not self._closed:
            self._loop.add_reader(self._fd, self._readable)
            self._watching = True

    def _unwatch(self) -> None:
        if self._watching:
            self._loop.remove_reader(self._fd)
            self._watching = False

    def _recv(self, n: int) -> bytes | None:
        """What one ``recv`` takes now: None if nothing came yet, b"" at the end (noted).
        A failure is kept (every later read raises it) and raised."""
        try:
            data = self._sock.recv(n)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError as exc:
            self._error = exc
            raise
        if not data:
            self._eof = True
        return data

    def _readable(self) -> None:
        """The loop saw the socket readable: take what came into the buffer."""
        try:
            data = self._recv(CHUNK)
        except OSError:
            data = b""  # the error is kept for the waiting read
        if data is None:
            return
        self._buf += data
        if not data or len(self._buf) >= HIGH_WATER:
            self._unwatch()
        self._wake()
