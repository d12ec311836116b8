"""Admission control: how many calls a child serves at once, and how many may wait.

Each role has a concurrency limit that fits its runtime (llama-server's slots, plus
``ahead`` calls left to wait in the child's own queue; one for the bundled runtime, which
serves one request at a time) and a bounded FIFO wait queue per lane (interactive, batch,
background: :mod:`daemon.models.lanes` says which goes first). A call past its lane's
queue is refused at once with RESOURCE_EXHAUSTED and a retry hint; a call whose
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
from .lanes import Lane, LanePolicy, sharing

_EWMA_WEIGHT = 0.2


class _Waiter:
    """A call waiting in a lane: its future, when it came and the interactive admissions
    counted then (both for ageing)."""

    __slots__ = ("future", "lane", "passed_at", "since")

    def __init__(self, future: asyncio.Future[None], lane: Lane, since: float,
                 passed_at: int) -> None:
        self.future = future
        self.lane = lane
        self.since = since
        self.passed_at = passed_at


class Admission:
    """Slots and a wait queue for one role."""

    def __init__(self, role: str, limit: int, queue_size: int, *,
                 ahead: int = 0,
                 clock: Callable[[], float] = time.monotonic,
                 on_change: Callable[[Admission], None] | None = None,
                 on_reject: Callable[[str, str], None] | None = None,
                 lanes: LanePolicy | None = None) -> None:
        if limit < 1 or queue_size < 0 or ahead < 0:
            raise ValueError("limit must be >= 1, queue_size and ahead >= 0")
        self.role = role
        self.limit = limit  # the child's slots
        self.ahead = ahead  # calls let through beyond them, to wait inside the child
        self.queue_size = queue_size  # the interactive lane's; the others' are in lanes
        self.lanes = lanes or LanePolicy()
        self.in_flight = 0
        self._lower_in_flight = 0  # batch and background calls among in_flight
        self._waiters: dict[Lane, collections.deque[_Waiter]] = {
            lane: collections.deque() for lane in Lane}
        self._interactive_admitted = 0  # ever; a waiter's share of it ages it
        # Per lane, (_interactive_admitted, clock) when it last let a call in: a waiter ages
        # from then at the earliest, so one promotion lets one call in, not the queue.
        self._lane_mark: dict[Lane, tuple[int, float]] = {
            lane: (0, float("-inf")) for lane in Lane}
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
        """Calls waiting, every lane."""
        return sum(len(q) for q in self._waiters.values())

    def queued_in(self, lane: Lane) -> int:
        """Calls waiting in ``lane``."""
        return len(self._waiters[lane])

    def configure(self, lanes: LanePolicy) -> None:
        """Take new lane options (a reload); calls waiting keep their place."""
        self.lanes = lanes
        self._wake()

    def _queue_size(self, lane: Lane) -> int:
        if lane is Lane.INTERACTIVE:
            return self.queue_size
        return (self.lanes.batch_queue if lane is Lane.BATCH
                else self.lanes.background_queue)

    def _may_enter(self, lane: Lane) -> bool:
        """Whether a call of ``lane`` may take a slot now (capacity, the reserved slot)."""
        if self._idle is not None or self.in_flight >= self.capacity:
            return False
        return (lane is Lane.INTERACTIVE
                or self._lower_in_flight < self.lanes.lower_limit(self.limit, self.capacity))

    def _promoted(self, waiter: _Waiter, now: float) -> bool:
        """Whether ``waiter`` (a lower lane's head) has aged enough to go first: counted
        from when it came or its lane last let a call in, whichever is later."""
        admitted, at = self._lane_mark[waiter.lane]
        passed = self._interactive_admitted - max(waiter.passed_at, admitted)
        return (passed >= self.lanes.promote_after
                or now - max(waiter.since, at) >= self.lanes.promote_seconds)

    def _next(self) -> _Waiter | None:
        """The waiter to let in next, or None: a promoted lower-lane head (the one waiting
        longest), else the interactive head, else batch's, else background's; each only
        if it may enter now."""
        now = self._clock()
        heads = [q[0] for q in self._waiters.values() if q]
        promoted = [w for w in heads
                    if w.lane is not Lane.INTERACTIVE and self._promoted(w, now)]
        for waiter in sorted(promoted, key=lambda w: w.since) + heads:
            if self._may_enter(waiter.lane):
                return waiter
        return None

    def _enter(self, lane: Lane) -> None:
        self.in_flight += 1
        if lane is Lane.INTERACTIVE:
            self._interactive_admitted += 1
        else:
            self._lower_in_flight += 1
            self._lane_mark[lane] = (self._interactive_admitted, self._clock())

    def _position(self, lane: Lane) -> int:
        """Calls that would go before a new call of ``lane`` (ageing aside)."""
        ahead = 0
        for other in Lane:  # highest priority first
            ahead += len(self._waiters[other])
            if other is lane:
                break
        return ahead

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

    def _released(self, lane: Lane) -> None:
        self.in_flight -= 1
        if lane is not Lane.INTERACTIVE:
            self._lower_in_flight -= 1
        if self.in_flight == 0 and self._idle is not None:
            self._idle.set()
        self._wake()

    def _wake(self) -> None:
        while (waiter := self._next()) is not None:
            self._waiters[waiter.lane].popleft()
            if not waiter.future.done():
                self._enter(waiter.lane)
                waiter.future.set_result(None)
        self._changed()

    @contextlib.asynccontextmanager
    async def slot(self, time_remaining: float | None = None,
                   lane: Lane = Lane.INTERACTIVE) -> AsyncIterator[None]:
        """Hold a slot for the body of the ``async with``.

        Args:
            time_remaining: seconds left before the caller's deadline, or None.
            lane: the call's lane (interactive when lanes are off).

        Raises:
            Overloaded: the lane's wait queue is full (carries a retry hint).
            DeadlineUnmeetable: the expected wait exceeds ``time_remaining``.

        Cancellation while waiting leaves the queue; a slot is always released.
        """
        lane = self.lanes.lane_of(lane)
        # No waiter may enter now (every change wakes them), so a call that may enter now
        # passes none of them by entering.
        if self._may_enter(lane):
            self._enter(lane)
        else:
            await self._wait(lane, time_remaining)
        self._changed()
        began = self._clock()
        try:
            with sharing(self.lanes.texts_per_request(lane, self.limit)):
                yield
        finally:
            held = self._clock() - began
            self.hold_seconds = (held if not self.hold_seconds
                                 else (1 - _EWMA_WEIGHT) * self.hold_seconds + _EWMA_WEIGHT * held)
            self._released(lane)

    async def _wait(self, lane: Lane, time_remaining: float | None) -> None:
        """Wait in ``lane`` until :meth:`_wake` lets the call in (it counts the slot)."""
        queue = self._waiters[lane]
        size = self._queue_size(lane)
        if len(queue) >= size:
            self._reject("queue_full")
            option = ("queue_size" if lane is Lane.INTERACTIVE
                      else f"{lane.value}_queue_size")
            raise Overloaded(
                f"the {self.role} child is busy ({self.in_flight} running, {self.queued} "
                f"waiting; {lane.value} lane full: limits.{option} = {size})",
                retry_after=max(0.5, self.expected_wait(self._position(lane))),
            )
        wait = self.expected_wait(self._position(lane))
        if time_remaining is not None and self.hold_seconds and wait > time_remaining:
            self._reject("deadline")
            raise DeadlineUnmeetable(
                f"the {self.role} child is busy: the expected wait ({wait:.1f}s) is "
                f"longer than the call's deadline ({time_remaining:.1f}s)"
            )
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(future, lane, self._clock(), self._interactive_admitted)
        queue.append(waiter)
        self._changed()
        try:
            await future
        except BaseException:
            if future.done() and not future.cancelled():
                self._released(lane)  # granted just as we were cancelled: give it back
            else:
                with contextlib.suppress(ValueError):
                    queue.remove(waiter)
                self._changed()
            raise
