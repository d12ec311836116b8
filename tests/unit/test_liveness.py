"""The one liveness loop (a child's and an endpoint's), on the injected clock: probes every
interval, a busy server that keeps talking is left alone, N failures in a row end it, a
success resets the count, and an exit is noticed around each probe."""

from __future__ import annotations

import asyncio

from supervisor import ManualClock
from supervisor._exits import ExitCause
from supervisor._liveness import ProbeFailure, ProbePolicy, watch_liveness
from supervisor._transport import Activity
from tests.support.load import patience

POLICY = ProbePolicy(interval=5.0, failures=3, busy_silence=120.0)
DOWN = ProbeFailure("hung", False, "down")


class Server:
    """Answers probes from a script (None: alive); counts them."""

    def __init__(self, answers: list[ProbeFailure | None]) -> None:
        self.answers = answers
        self.probes = 0

    async def probe(self) -> ProbeFailure | None:
        self.probes += 1
        return self.answers.pop(0) if self.answers else None


async def start(server: Server, clock: ManualClock, activity: Activity,
                exited: ExitCause | None = None) -> asyncio.Task[ExitCause]:
    """The watch, running and asleep until its first probe."""
    watch = asyncio.ensure_future(watch_liveness(
        server.probe, activity=activity, clock=clock, policy=POLICY,
        exited=lambda: exited))
    await asyncio.sleep(0)
    assert clock.sleepers == 1
    return watch


async def test_three_failed_probes_in_a_row_end_the_watch() -> None:
    """Probes come every interval; the third failure in a row returns the failure's kind,
    permanence and a message that counts them, stamped with the clock's wall time."""
    clock = ManualClock()
    server = Server([DOWN, DOWN, DOWN])
    watch = await start(server, clock, Activity(clock.monotonic))
    await clock.advance(4.9)
    assert server.probes == 0
    await clock.advance(0.1)
    assert server.probes == 1
    await clock.advance(10.0)
    cause = await asyncio.wait_for(watch, patience(1))
    assert (cause.kind, cause.permanent) == ("hung", False)
    assert cause.message == "3 liveness probes failed in a row (down)"
    assert cause.at == clock.wall()
    assert server.probes == 3


async def test_a_success_resets_the_count() -> None:
    """Failures must be in a row: one good answer between them starts the count again."""
    clock = ManualClock()
    server = Server([DOWN, DOWN, None, DOWN, DOWN])
    watch = await start(server, clock, Activity(clock.monotonic))
    await clock.advance(25.0)
    assert not watch.done()
    assert server.probes == 5
    server.answers = [DOWN]
    await clock.advance(5.0)
    assert (await asyncio.wait_for(watch, patience(1))).message.startswith("3 liveness probes")


async def test_a_busy_server_that_keeps_talking_is_not_probed() -> None:
    """While a call runs and the server sent a byte within busy_silence, no probe is
    sent and failures are forgotten; once it has been silent that long, probing resumes."""
    clock = ManualClock()
    activity = Activity(clock.monotonic)
    server = Server([DOWN, DOWN, DOWN, DOWN, DOWN])
    watch = await start(server, clock, activity)
    await clock.advance(10.0)
    assert server.probes == 2
    activity.in_flight = 1
    for _ in range(20):  # 100 s of streaming, a byte every 5 s
        activity.heard()
        await clock.advance(5.0)
    assert server.probes == 2
    assert not watch.done()
    await clock.advance(125.0)  # silent past busy_silence: probed again, from zero
    assert server.probes == 5
    cause = await asyncio.wait_for(watch, patience(1))
    assert cause.kind == "hung"


async def test_an_exit_is_returned_instead_of_probing() -> None:
    """A server whose process is gone is not probed: the exit is the cause."""
    clock = ManualClock()
    server = Server([])
    crash = ExitCause("crash", False, "segfault")
    watch = await start(server, clock, Activity(clock.monotonic), exited=crash)
    await clock.advance(5.0)
    assert await asyncio.wait_for(watch, patience(1)) is crash
    assert server.probes == 0


async def test_a_permanent_failure_stays_permanent() -> None:
    """An endpoint that stopped offering the model (permanent) ends the watch as such."""
    clock = ManualClock()
    gone = ProbeFailure("unknown_model", True, "model m is no longer offered")
    watch = await start(Server([gone] * 3), clock, Activity(clock.monotonic))
    await clock.advance(15.0)
    cause = await asyncio.wait_for(watch, patience(1))
    assert (cause.kind, cause.permanent) == ("unknown_model", True)
    assert "no longer offered" in cause.message
