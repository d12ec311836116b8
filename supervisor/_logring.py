"""A bounded ring buffer of a child's output lines, with followers.

The child's stdout and stderr are drained continuously into this buffer: the child never
blocks on a full pipe, memory stays bounded (old lines fall off), and anyone can read the
latest lines or follow new ones.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator
from dataclasses import dataclass


@dataclass(frozen=True)
class LogLine:
    """One line of child output."""

    seq: int
    time: float
    pid: int
    stream: str
    text: str


class LogRing:
    """Keeps the last ``capacity`` lines; each line is cut at ``max_line`` characters."""

    def __init__(self, capacity: int = 2000, max_line: int = 4096) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self._lines: collections.deque[LogLine] = collections.deque(maxlen=capacity)
        self._max_line = max_line
        self._seq = 0
        self._changed = asyncio.Event()
        self._closed = False

    @property
    def last_seq(self) -> int:
        """Sequence number of the newest line (0 if none yet)."""
        return self._seq

    def append(self, time: float, pid: int, stream: str, text: str) -> LogLine:
        """Add a line (cut to ``max_line``) and wake followers."""
        if len(text) > self._max_line:
            text = text[: self._max_line] + " …[cut]"
        self._seq += 1
        line = LogLine(self._seq, time, pid, stream, text)
        self._lines.append(line)
        self._changed.set()
        self._changed = asyncio.Event()
        return line

    def tail(self, n: int = 0) -> list[LogLine]:
        """The latest ``n`` lines (all buffered lines when ``n`` is 0), oldest first."""
        lines = list(self._lines)
        return lines[-n:] if n > 0 else lines

    def since(self, seq: int) -> list[LogLine]:
        """Buffered lines newer than ``seq``."""
        return [line for line in self._lines if line.seq > seq]

    def close(self) -> None:
        """End every follower (the daemon is stopping)."""
        self._closed = True
        self._changed.set()

    async def follow(self, n: int = 0) -> AsyncIterator[LogLine]:
        """Yield the latest ``n`` lines, then every new line until :meth:`close`.

        Cancelling the consumer stops the iteration; nothing else is affected. A follower
        slower than the writers may miss lines that fell off the ring (visible as a gap
        in ``seq``).
        """
        last = 0
        for line in self.tail(n):
            last = line.seq
            yield line
        if not self.tail(n):
            last = self._seq
        while not self._closed:
            changed = self._changed
            fresh = self.since(last)
            if not fresh:
                await changed.wait()
                continue
            for line in fresh:
                last = line.seq
                yield line
