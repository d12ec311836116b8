"""Health from outcomes (issue 28): a child is judged by what its calls come to, not only
by its ``/health``.

llama-server answers ``/health`` from its HTTP threads, so a child whose serving loop is
stuck inside one step (llama.cpp #27388: generation stops mid-decode, ``/health`` still
200, SIGTERM ignored), or whose completions all fail, stays "healthy" and keeps getting
calls. So, beside the ``/health`` liveness loop (:mod:`supervisor._liveness`):

* every call on a child is recorded (:class:`Outcomes`): ``failures`` calls in a row that
  fail (a 5xx, a dropped connection, a read timeout, a llama-server stream that ended with
  no token and no usage) take it out of service at once, once a 1-token probe confirms it
  (a probe it answers clears the count: calls a hostile client makes fail on purpose
  never get a child that computes replaced; with probes off, the count alone decides);
* :func:`watch_outcomes` looks every ``interval``: when calls on it are silent (a stream
  without a byte for ``interval``, a whole request without an answer for
  ``busy_silence``, and nothing else heard from the child meanwhile) or the last call
  failed, it sends a 1-token probe (a request of its own, outside the count). A probe
  that fails takes the child out of service; one that gets no answer within
  ``probe_timeout`` does too, unless the child was heard from meanwhile or its serving
  loop answered (then it is busy, not stuck: its probe waited behind other calls).

A child taken out of service is *condemned* (:meth:`Outcomes.condemn`): new calls on it
get :class:`~supervisor.errors.ChildUnresponsiveError` naming the cause (UNAVAILABLE at
the edge, with a retry hint); the supervisor marks it not ready, then stops it, which
first ends the calls waiting on it with the same error (:meth:`Outcomes.interrupt`: at
once, not at their deadlines), then sends SIGTERM, and SIGKILL after
``unresponsive_grace``; then it starts another. Time is the injected clock's.

The probe's allowance must outlast one step of a healthy child (a prompt batch): the
launcher adds ``token_probe_per_gib`` seconds per GiB of model file to ``probe_timeout``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from .._clock import Clock
from .._exits import ExitCause
from ..errors import ChildUnresponsiveError

CALLS_FAILING = "calls_failing"
PROBE_FAILED = "probe_failed"
PROBE_STALLED = "probe_stalled"
OUTCOME_KINDS = (CALLS_FAILING, PROBE_FAILED, PROBE_STALLED)
"""The :attr:`ExitCause.kind` of a child taken out of service by its outcomes."""


@dataclass(frozen=True)
class OutcomePolicy:
    """How outcomes judge a child.

    Attributes:
        failures: failed calls in a row that take it out of service (0: never).
        interval: seconds between looks; also how long a stream may be silent before the
            child is probed.
        probe_timeout: seconds a 1-token probe may take (0: no probes).
        busy_silence: seconds a whole (unstreamed) request may go unanswered before the
            child is probed (an embedding batch answers only at its end).
        busy_max: seconds a probe may go unanswered while the child's process gets CPU
            time (a long prompt step, a loaded machine) before it is judged stalled
            anyway (a child spinning in a stuck step burns CPU too).
    """

    failures: int = 3
    interval: float = 1.0
    probe_timeout: float = 4.0
    busy_silence: float = 120.0
    busy_max: float = 60.0


class _Call:
    """One call running on the child."""

    __slots__ = ("interrupted", "since", "stream", "task", "waiting")

    def __init__(self, task: asyncio.Task[object] | None, stream: bool, now: float) -> None:
        self.task = task
        self.stream = stream
        self.since = now  # its start
        self.waiting = False  # awaiting the child now (what condemn interrupts)
        self.interrupted = False


class Outcomes:
    """What the calls on one child came to, and the calls running on it.

    Args:
        now: the monotonic clock (the supervisor's).
    """

    def __init__(self, now: Callable[[], float]) -> None:
        self._now = now
        self.failures = 0
        """Calls in a row that failed."""
        self.last_failure = ""
        self.failed_since_probe = False
        self.beats = 0
        """Answers and stream chunks that came from the child (never a request sent):
        counted by the calls, cheaply (a stream's chunk is the relay's hot path); when the
        count last moved is read off it by :meth:`silent`, at each look."""
        self.last_beat = now()
        self._seen_beats = 0
        self.condemned: ExitCause | None = None
        self._calls: set[_Call] = set()
        self._failed = asyncio.Event()
        self._stirred = asyncio.Event()  # a call began or failed (see stirred())

    # -- calls --------------------------------------------------------------------------

    def begin(self, *, stream: bool) -> _Call:
        """A call starts (in the current task).

        Raises:
            ChildUnresponsiveError: the child was taken out of service.
        """
        if self.condemned is not None:
            raise self.error()
        call = _Call(_current_task(), stream, self._now())
        self._calls.add(call)
        self._stirred.set()
        return call

    def end(self, call: _Call) -> None:
        self._calls.discard(call)

    def heard(self) -> None:
        """Something came from the child (an answer, a stream's chunk)."""
        self.beats += 1

    def succeeded(self) -> None:
        self.failures = 0

    def failed(self, detail: str) -> None:
        """A call failed because of the child (not a refusal of the request itself)."""
        self.failures += 1
        self.last_failure = detail[:300]
        self.failed_since_probe = True
        self._failed.set()
        self._stirred.set()

    def interrupted(self, call: _Call) -> bool:
        """Whether the cancellation ``call`` got is ours (the child was condemned) and
        nobody else's: then it is taken back, and the caller gets :meth:`error`."""
        if not call.interrupted or call.task is None:
            return False
        return call.task.uncancel() == 0

    def error(self) -> ChildUnresponsiveError:
        """What a call on a condemned child gets."""
        cause = self.condemned
        reason = cause.message if cause is not None else "unknown"
        return ChildUnresponsiveError(
            f"the child serving this call was taken out of service ({reason}); it is being "
            "replaced: retry", kind=cause.kind if cause is not None else "")

    def condemn(self, cause: ExitCause) -> None:
        """Take the child out of service: every later call gets :meth:`error` (the
        calls waiting on it get it from :meth:`interrupt`). Idempotent."""
        if self.condemned is None:
            self.condemned = cause

    def interrupt(self) -> None:
        """End the calls waiting on a condemned child with :meth:`error` (the supervisor
        does this once it has marked the child not ready, so that a caller's retry finds
        it so). A no-op unless condemned."""
        if self.condemned is None:
            return
        for call in list(self._calls):
            if call.waiting and call.task is not None and not call.task.done():
                call.interrupted = True
                call.task.cancel()

    # -- what the watch reads --------------------------------------------------------------

    def silent(self, now: float, policy: OutcomePolicy) -> bool:
        """Whether calls are waiting on a child that has said nothing for a while: a
        stream silent for ``interval``, or a whole request for ``busy_silence``, and
        nothing heard from the child for as long (as seen at the watch's looks: one
        interval coarse)."""
        if self.beats != self._seen_beats:
            self._seen_beats = self.beats
            self.last_beat = now
        for call in self._calls:
            if not call.waiting:
                continue
            window = policy.interval if call.stream else policy.busy_silence
            if now - call.since >= window and now - self.last_beat >= window:
                return True
        return False

    @property
    def waiting(self) -> int:
        """Calls waiting on the child now."""
        return sum(1 for call in self._calls if call.waiting)

    async def stirred(self) -> None:
        """Return once there is something to look at: a call running on the child, or
        one failed since the last probe (at once if so now). Until then a look finds
        nothing, and the watch waits here instead of waking every interval: an idle
        daemon's wake-ups are most of its idle CPU (issue 27)."""
        while not self._calls and not self.failed_since_probe:
            self._stirred.clear()
            await self._stirred.wait()

    def take_failure(self) -> bool:
        """Whether a call failed since the last call of this or :meth:`failure`."""
        failed = self._failed.is_set()
        self._failed.clear()
        return failed

    async def failure(self) -> None:
        """Return once a call failed (at once if one failed since the last call)."""
        await self._failed.wait()
        self._failed.clear()


def _current_task() -> asyncio.Task[object] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:
        return None


Probe = Callable[[], Awaitable[str | None]]
"""A 1-token request of the watch's own: None when it was answered, else why it failed."""
LoopCheck = Callable[[float], Awaitable[bool]]
"""Whether the child's serving loop answers within the given seconds."""
CpuSeconds = Callable[[], float | None]
"""The CPU time the child's process has used so far (None: not known, e.g. it is gone)."""

BUSY_CPU = 0.05
"""CPU seconds a child must use during a probe's allowance to count as computing: far
above what a stopped or blocked process shows (its HTTP threads answering /health use
microseconds), far below a step of any model."""


async def watch_outcomes(outcomes: Outcomes, probe: Probe, *, clock: Clock,
                         policy: OutcomePolicy, loop_answers: LoopCheck | None = None,
                         cpu_seconds: CpuSeconds | None = None) -> ExitCause:
    """Return why the child must be taken out of service (see the module docstring);
    runs until then. Cancellable at any point (a probe running is cancelled with it).

    Args:
        loop_answers: asks the child's serving loop (llama-server's); None: the runtime
            has no such question, and a child with calls waiting is not probed.
        cpu_seconds: the child process's CPU time; a probe unanswered while it grows
            waits on, up to ``policy.busy_max`` (None: not known, no such allowance).
    """
    while True:
        await _pause(outcomes, clock, policy.interval)
        if policy.failures and outcomes.failures >= policy.failures:
            failing = (f"{outcomes.failures} calls in a row failed on it while its /health "
                       f"answered (last: {outcomes.last_failure})")
            if policy.probe_timeout <= 0:
                return ExitCause(CALLS_FAILING, False, failing, at=clock.wall())
            # Confirmed by a probe: calls a hostile client makes fail on purpose must not
            # get a child that computes replaced.
            outcomes.failed_since_probe = False
            cause = await _probe_once(outcomes, probe, clock, policy, loop_answers,
                                  cpu_seconds=cpu_seconds)
            if cause is not None and cause.kind == PROBE_FAILED:
                return ExitCause(CALLS_FAILING, False, f"{failing}; {cause.message}",
                                 at=clock.wall())
            if cause is not None:
                return cause
            continue
        if policy.probe_timeout <= 0:
            continue
        now = clock.monotonic()
        if not (outcomes.failed_since_probe or outcomes.silent(now, policy)):
            continue
        if loop_answers is None and outcomes.waiting:
            # A runtime without a serving-loop question (the bundled one serves one call
            # at a time): a probe behind a running call tells nothing.
            continue
        outcomes.failed_since_probe = False
        cause = await _probe_once(outcomes, probe, clock, policy, loop_answers,
                                  cpu_seconds=cpu_seconds)
        if cause is not None:
            return cause


async def _while_computing(asked: asyncio.Future[str | None], cpu_seconds: CpuSeconds,
                           last: float | None, clock: Clock, *, window: float,
                           busy_max: float) -> None:
    """Return once ``asked`` is answered, the child used less than :data:`BUSY_CPU` of
    CPU over the last window (``last``: its CPU time when the window already waited
    began), or ``busy_max`` seconds of waiting have passed (that window counted)."""
    waited = window
    now = cpu_seconds()
    if last is None or now is None or now - last < BUSY_CPU:
        return
    last = now
    while not asked.done() and waited < busy_max:
        step = min(window, busy_max - waited)
        timer = asyncio.ensure_future(clock.sleep(step))
        either: set[asyncio.Future[Any]] = {asked, timer}
        try:
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
        waited += step
        now = cpu_seconds()
        if now is None or now - last < BUSY_CPU * step / window:
            return
        last = now


async def _pause(outcomes: Outcomes, clock: Clock, seconds: float) -> None:
    """Sleep ``seconds``, or less if a call fails meanwhile; first, while no call runs on
    the child and none failed since the last probe, wait for one (nothing to look at)."""
    await outcomes.stirred()
    if outcomes.take_failure():
        return
    sleeper = asyncio.ensure_future(clock.sleep(seconds))
    failed = asyncio.ensure_future(outcomes.failure())
    try:
        await asyncio.wait({sleeper, failed}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        sleeper.cancel()
        failed.cancel()


async def _probe_once(outcomes: Outcomes, probe: Probe, clock: Clock, policy: OutcomePolicy,
                      loop_answers: LoopCheck | None, *,
                      cpu_seconds: CpuSeconds | None = None) -> ExitCause | None:
    """One probe: the cause to take the child out of service, or None."""
    beats = outcomes.beats
    timeout = policy.probe_timeout
    asked = asyncio.ensure_future(probe())
    # With other calls waiting, the probe may wait behind them: the serving loop, asked
    # at the same time, tells a busy child from a stuck one.
    loop = (asyncio.ensure_future(loop_answers(timeout))
            if loop_answers is not None and outcomes.waiting else None)
    timer = asyncio.ensure_future(clock.sleep(timeout))
    cpu_start = cpu_seconds() if cpu_seconds is not None else None
    try:
        await asyncio.wait({asked, timer}, return_when=asyncio.FIRST_COMPLETED)
        if not asked.done() and outcomes.beats == beats and cpu_seconds is not None:
            # Unanswered, but a child whose process computes is slow (a long prompt step
            # on a loaded machine), not stuck: wait on while its CPU time grows.
            await _while_computing(asked, cpu_seconds, cpu_start, clock, window=timeout,
                                   busy_max=policy.busy_max)
        if asked.done():
            failure = asked.result()
            if failure is None:
                outcomes.succeeded()  # it computes: the failed calls were theirs
                return None
            return ExitCause(PROBE_FAILED, False,
                             f"its 1-token probe failed while its /health answered ({failure})",
                             at=clock.wall())
        if outcomes.beats != beats:
            return None  # the child answered other calls meanwhile: busy, not stuck
        if loop is not None:
            # Started with the probe, so it has had the probe's whole allowance.
            await asyncio.wait({loop}, timeout=0.05)
            if loop.done() and not loop.cancelled() and loop.result():
                return None
        return ExitCause(
            PROBE_STALLED, False,
            f"its 1-token probe got no answer within {timeout:.1f} s while its /health "
            "answered" + (" and its calls waited in silence" if outcomes.waiting else ""),
            at=clock.wall())
    finally:
        for task in (asked, timer, loop):
            if task is not None:
                task.cancel()
