"""Time, injected.

Supervision code never calls ``time`` or ``asyncio.sleep`` directly: it asks a
:class:`Clock`, so tests drive backoff, breaker and deadline edges with
:class:`ManualClock` and no real waiting.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Protocol


class Clock(Protocol):
    """Monotonic time and sleeping."""

    def monotonic(self) -> float:
        """Seconds on a monotonic clock."""
        ...

    def wall(self) -> float:
        """Seconds since the epoch (for timestamps shown to people)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Sleep; cancellable like :func:`asyncio.sleep`."""
        ...


class SystemClock:
    """The real clock."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class ManualClock:
    """A clock that moves only when a test calls :meth:`advance`.

    Sleepers wake in deadline order as time passes them. ``advance`` yields to the event
    loop after waking each sleeper so the code they resume runs before time moves on.
    """

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._epoch_offset = 1_700_000_000.0 - start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def monotonic(self) -> float:
        return self._now

    def wall(self) -> float:
        return self._now + self._epoch_offset

    async def sleep(self, seconds: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + max(0.0, seconds), next(self._seq), fut))
        await fut

    @property
    def sleepers(self) -> int:
        """How many sleeps are pending."""
        return sum(1 for _, _, f in self._sleepers if not f.done())

    def next_deadline(self) -> float | None:
        """When the earliest pending sleep ends, or None."""
        live = [d for d, _, f in self._sleepers if not f.done()]
        return min(live) if live else None

    async def advance(self, seconds: float) -> None:
        """Move time forward, waking every sleeper whose deadline passes, in order."""
        target = self._now + seconds
        while self._sleepers and self._sleepers[0][0] <= target:
            deadline, _, fut = heapq.heappop(self._sleepers)
            if fut.done():
                continue
            self._now = max(self._now, deadline)
            fut.set_result(None)
            for _ in range(5):
                await asyncio.sleep(0)
        self._now = target
        for _ in range(5):
            await asyncio.sleep(0)
