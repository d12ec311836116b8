"""Admission control: how many calls a child serves at once, and how many may wait.

Each role has a concurrency limit that fits its runtime (llama-server's slots, plus
``ahead`` calls left to wait in the child's own queue; one for the bundled runtime, which
serves one request at a time) and a bounded FIFO wait queue. A call
past the queue is refused at once with RESOURCE_EXHAUSTED and a retry hint; a call whose
deadline would pass while it waits is refused at once with DEADLINE_EXCEEDED instead of
timing out in the queue. The expected wait comes from an exponentially weighted moving
average of how long calls hold a slot.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import AsyncIterator, Callable

from ..errors import DeadlineUnmeetable, Overloaded

_EWMA_WEIGHT = 0.2


class Admission:
    """Slots and a wait queue for one role."""

    def __init__(self, role: str, limit: int, queue_size: int, *,
                 ahead: int = 0,
                 clock: Callable[[], float] = time.monotonic,
                 on_change: Callable[[Admission], None] | None = None,
                 on_reject: Callable[[str, str], None] | None = None) -> None:
        if limit < 1 or queue_size < 0 or ahead < 0:
            raise ValueError("limit must be >= 1, queue_size and ahead >= 0")
        self.role = role
        self.limit = limit  # the child's slots
        self.ahead = ahead  # calls let through beyond them, to wait inside the child
        self.queue_size = queue_size
        self.in_flight = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._clock = clock
        self._on_change = on_change
        self._on_reject = on_reject
        self.hold_seconds = 0.0  # EWMA of slot hold time; 0 until a call finished
        self._served: tuple[int, int] = (0, 0)  # (child pid, calls it completed)
        self.rejected = collections.Counter[str]()
        # While a hand-over holds new calls back: set when in_flight drops to 0.
        self._idle: asyncio.Event | None = None

    def set_hooks(self, on_change: Callable[[Admission], None] | None,
                  on_reject: Callable[[str, str], None] | None) -> None:
        """Observe depth changes and rejections (metrics)."""
        self._on_change = on_change
        self._on_reject = on_reject

    def count_served(self, pid: int) -> None:
        """Count a call completed by the child ``pid`` (a new pid starts from zero)."""
        current, n = self._served
        self._served = (pid, n + 1 if pid == current else 1)

    def served_by(self, pid: int) -> int:
        """Calls completed by the child ``pid``."""
        current, n = self._served
        return n if pid == current else 0

    @property
    def queued(self) -> int:
        return len(self._waiters)

    @property
    def capacity(self) -> int:
        """Calls let through at once: the slots and the calls sent ahead."""
        return self.limit + self.ahead

    def resize(self, limit: int, ahead: int | None = None) -> None:
        """Change the limit (after a swap to another runtime or slot count) and, unless
        None, the calls sent ahead."""
        self.limit = max(1, limit)
        if ahead is not None:
            self.ahead = max(0, ahead)
        self._wake()

    def expected_wait(self, position: int) -> float:
        """Seconds a call at queue ``position`` (0-based) should expect to wait."""
        return (position // self.capacity + 1) * self.hold_seconds

    def _reject(self, reason: str) -> None:
        self.rejected[reason] += 1
        if self._on_reject is not None:
            self._on_reject(self.role, reason)
        self._changed()

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change(self)

    async def hand_over(self, limit_seconds: float) -> None:
        """Grant no new slot until the calls running now have ended, or ``limit_seconds``.

        Used when a swap switches to the new child: the old child's calls still hold
        their slots, and a new call started beside them would put the two children on
        the same cores at once. Both models then step at about half speed (each pass is
        as costly for one sequence as for several), so the old calls end later and the
        new ones gain nothing. Held back, new calls wait in the queue as they would for
        any busy slot, then start together on the new child.
        """
        if self.in_flight == 0 or limit_seconds <= 0 or self._idle is not None:
            return
        self._idle = asyncio.Event()
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(limit_seconds):
                    await self._idle.wait()
        finally:
            self._idle = None
            self._wake()

    def _released(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0 and self._idle is not None:
            self._idle.set()
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self.in_flight < self.capacity and self._idle is None:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self.in_flight += 1
                waiter.set_result(None)
        self._changed()

    @contextlib.asynccontextmanager
    async def slot(self, time_remaining: float | None = None) -> AsyncIterator[None]:
        """Hold a slot for the body of the ``async with``.

        Args:
            time_remaining: seconds left before the caller's deadline, or None.

        Raises:
            Overloaded: the wait queue is full (carries a retry hint).
            DeadlineUnmeetable: the expected wait exceeds ``time_remaining``.

        Cancellation while waiting leaves the queue; a slot is always released.
        """
        if self.in_flight < self.capacity and not self._waiters and self._idle is None:
            self.in_flight += 1
        else:
            position = len(self._waiters)
            if position >= self.queue_size:
                self._reject("queue_full")
                raise Overloaded(
                    f"the {self.role} child is busy ({self.in_flight} running, {position} "
                    f"waiting; limits.queue_size = {self.queue_size})",
                    retry_after=max(0.5, self.expected_wait(0)),
                )
            wait = self.expected_wait(position)
            if time_remaining is not None and self.hold_seconds and wait > time_remaining:
                self._reject("deadline")
                raise DeadlineUnmeetable(
                    f"the {self.role} child is busy: the expected wait ({wait:.1f}s) is "
                    f"longer than the call's deadline ({time_remaining:.1f}s)"
                )
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            self._changed()
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._released()  # granted just as we were cancelled: give it back
                else:
                    with contextlib.suppress(ValueError):
                        self._waiters.remove(waiter)
                    self._changed()
                raise
        self._changed()
        began = self._clock()
        try:
            yield
        finally:
            held = self._clock() - began
            self.hold_seconds = (held if not self.hold_seconds
                                 else (1 - _EWMA_WEIGHT) * self.hold_seconds + _EWMA_WEIGHT * held)
            self._released()
