"""Admission control: slots, a bounded FIFO queue, early refusal of unmeetable deadlines."""

from __future__ import annotations

import asyncio

import pytest

from daemon import load
from daemon.config.inference_mode import InferenceMode, Mode
from daemon.errors import DeadlineUnmeetable, Overloaded
from daemon.models.admission import Admission
from daemon.models.children import make_setup
from daemon.models.model import ahead_for
from supervisor import BundledRuntime, LlamaServerRuntime, Runtime
from tests.support.load import patience


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def hold(adm: Admission, release: asyncio.Event, log: list[str], name: str,
               remaining: float | None = None) -> None:
    async with adm.slot(remaining):
        log.append(name)
        await release.wait()


async def spin() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


async def holding(adm: Admission, n: int
                  ) -> tuple[asyncio.Event, list[str], list[asyncio.Task[None]]]:
    """Start calls c0..c<n-1> that hold their slot until the event is set, and let them
    take slots or queue; the log names the calls that got a slot, in order."""
    release = asyncio.Event()
    log: list[str] = []
    tasks = [asyncio.create_task(hold(adm, release, log, f"c{i}")) for i in range(n)]
    await spin()
    return release, log, tasks


async def test_calls_within_the_limit_run_at_once() -> None:
    """Up to `limit` calls hold slots together; the next one waits."""
    adm = Admission("generation", limit=2, queue_size=4)
    release, log, tasks = await holding(adm, 3)
    assert log == ["c0", "c1"]
    assert (adm.in_flight, adm.queued) == (2, 1)
    release.set()
    await asyncio.gather(*tasks)
    assert log == ["c0", "c1", "c2"]
    assert (adm.in_flight, adm.queued) == (0, 0)


async def test_waiters_are_served_in_order() -> None:
    """The queue is FIFO."""
    adm = Admission("generation", limit=1, queue_size=10)
    gates = [asyncio.Event() for _ in range(4)]
    log: list[str] = []
    tasks = [asyncio.create_task(hold(adm, gates[i], log, f"c{i}")) for i in range(4)]
    await spin()
    for gate in gates:
        gate.set()
        await spin()
    await asyncio.gather(*tasks)
    assert log == ["c0", "c1", "c2", "c3"]


async def test_full_queue_is_refused_with_retry_hint() -> None:
    """Past the queue, a call fails at once with Overloaded and a retry hint."""
    adm = Admission("generation", limit=1, queue_size=1)
    release, _, tasks = await holding(adm, 2)
    with pytest.raises(Overloaded) as err:
        async with adm.slot():
            pass
    assert err.value.retry_after > 0
    assert "queue_size = 1" in str(err.value)
    assert adm.rejected["queue_full"] == 1
    release.set()
    await asyncio.gather(*tasks)


async def test_unmeetable_deadline_is_refused_early() -> None:
    """A call whose deadline ends before its expected turn is refused without waiting."""
    clock = Clock()
    adm = Admission("generation", limit=1, queue_size=10, clock=clock)
    async with adm.slot():
        clock.now += 4.0  # calls hold a slot about 4 s
    release = asyncio.Event()
    log: list[str] = []
    busy = asyncio.create_task(hold(adm, release, log, "busy"))
    await spin()
    with pytest.raises(DeadlineUnmeetable, match="expected wait"):
        async with adm.slot(time_remaining=1.0):
            pass
    assert adm.rejected["deadline"] == 1
    waiter = asyncio.create_task(hold(adm, release, log, "patient", remaining=30.0))
    await spin()
    assert adm.queued == 1  # a deadline that can be met waits its turn
    release.set()
    await asyncio.gather(busy, waiter)
    assert log == ["busy", "patient"]


async def test_cancelled_waiter_leaves_the_queue() -> None:
    """Cancelling a waiting call removes it; the slot goes to the next one."""
    adm = Admission("generation", limit=1, queue_size=10)
    release = asyncio.Event()
    log: list[str] = []
    first = asyncio.create_task(hold(adm, release, log, "first"))
    await spin()
    doomed = asyncio.create_task(hold(adm, release, log, "doomed"))
    last = asyncio.create_task(hold(adm, release, log, "last"))
    await spin()
    doomed.cancel()
    await spin()
    assert adm.queued == 1
    release.set()
    await asyncio.gather(first, last)
    assert log == ["first", "last"]
    assert adm.in_flight == 0


async def test_slot_is_released_when_the_body_fails() -> None:
    """An exception inside the slot still frees it."""
    adm = Admission("generation", limit=1, queue_size=1)
    with pytest.raises(RuntimeError):
        async with adm.slot():
            raise RuntimeError("boom")
    assert adm.in_flight == 0
    async with adm.slot():
        assert adm.in_flight == 1


@pytest.mark.parametrize(("limit", "ahead"), [(3, None), (1, 2)], ids=["slots", "ahead"])
async def test_resize_admits_waiters(limit: int, ahead: int | None) -> None:
    """Raising the limit (after a swap to more slots) or the calls sent ahead (a reload of
    queue_ahead) lets waiting calls in."""
    adm = Admission("generation", limit=1, queue_size=10)
    release, log, tasks = await holding(adm, 3)
    assert log == ["c0"]
    adm.resize(limit, ahead)
    await spin()
    assert log == ["c0", "c1", "c2"]
    release.set()
    await asyncio.gather(*tasks)


async def test_calls_ahead_go_through_beyond_the_slots() -> None:
    """`ahead` more calls than slots are let through (to wait in the child's own queue);
    the next one waits in llamad; the expected wait counts them as capacity."""
    adm = Admission("embedding", limit=2, queue_size=10, ahead=2)
    release, log, tasks = await holding(adm, 5)
    assert log == ["c0", "c1", "c2", "c3"]
    assert (adm.limit, adm.capacity, adm.in_flight, adm.queued) == (2, 4, 4, 1)
    adm.hold_seconds = 1.0
    assert [adm.expected_wait(p) for p in (0, 3, 4)] == [1.0, 1.0, 2.0]
    adm.resize(2, ahead=0)  # fewer ahead: running calls finish, no new one goes through
    release.set()
    await asyncio.gather(*tasks)
    assert log == ["c0", "c1", "c2", "c3", "c4"]
    assert (adm.capacity, adm.in_flight, adm.queued) == (2, 0, 0)
    adm.resize(3)  # a swap to another slot count keeps the calls ahead
    assert (adm.limit, adm.ahead) == (3, 0)
    with pytest.raises(ValueError, match="ahead >= 0"):
        Admission("embedding", limit=1, queue_size=1, ahead=-1)


async def test_on_change_reports_depth() -> None:
    """The change hook sees queue depth and in-flight counts move."""
    seen: list[tuple[int, int]] = []
    adm = Admission("generation", limit=1, queue_size=5,
                    on_change=lambda a: seen.append((a.in_flight, a.queued)))
    release, _, tasks = await holding(adm, 2)
    assert (1, 1) in seen
    release.set()
    await asyncio.gather(*tasks)
    assert seen[-1] == (0, 0)


async def test_hand_over_holds_new_calls_until_the_running_ones_end() -> None:
    """After a swap switches, new calls wait (though slots are free) for the old child's
    calls to end, then start together; hand_over returns as the last old call ends."""
    adm = Admission("generation", limit=4, queue_size=8)
    old = [asyncio.Event(), asyncio.Event()]
    log: list[str] = []
    olds = [asyncio.create_task(hold(adm, old[i], log, f"old{i}")) for i in range(2)]
    await spin()
    handover = asyncio.create_task(adm.hand_over(30))
    await spin()
    new_release = asyncio.Event()
    news = [asyncio.create_task(hold(adm, new_release, log, f"new{i}")) for i in range(3)]
    await spin()
    assert log == ["old0", "old1"] and (adm.in_flight, adm.queued) == (2, 3)
    old[0].set()
    await spin()
    assert log == ["old0", "old1"] and adm.in_flight == 1  # one old call still runs
    old[1].set()
    await spin()
    assert handover.done()
    assert log == ["old0", "old1", "new0", "new1", "new2"]
    assert (adm.in_flight, adm.queued) == (3, 0)
    new_release.set()
    await asyncio.gather(*olds, *news)


async def held_back(adm: Admission, hold_seconds: float, log: list[str]
                    ) -> tuple[asyncio.Task[None], asyncio.Task[None], asyncio.Task[None]]:
    """An old call that never ends, a hand-over of ``hold_seconds``, then a new call:
    the tasks (old, hand-over, new)."""
    old = asyncio.create_task(hold(adm, asyncio.Event(), log, "old"))
    await spin()
    handover = asyncio.create_task(adm.hand_over(hold_seconds))
    await spin()
    new = asyncio.create_task(hold(adm, asyncio.Event(), log, "new"))
    await spin()
    return old, handover, new


async def test_hand_over_is_bounded_and_a_no_op_when_idle() -> None:
    adm = Admission("generation", limit=2, queue_size=8)
    await asyncio.wait_for(adm.hand_over(30), patience(1))  # nothing runs: returns at once
    log: list[str] = []
    old, handover, new = await held_back(adm, 0.2, log)
    assert log == ["old"]
    await asyncio.wait_for(handover, patience(2))  # the old call never ends: the hold does
    await spin()
    assert log == ["old", "new"] and adm.in_flight == 2
    for task in (old, new):
        task.cancel()
    await asyncio.gather(old, new, return_exceptions=True)
    assert adm.in_flight == 0


async def test_a_cancelled_hand_over_releases_the_hold() -> None:
    adm = Admission("generation", limit=2, queue_size=8)
    log: list[str] = []
    old, handover, new = await held_back(adm, 30, log)
    assert log == ["old"]
    handover.cancel()  # the swap failed or ended
    await spin()
    assert log == ["old", "new"]
    for task in (old, new):
        task.cancel()
    await asyncio.gather(old, new, return_exceptions=True)


@pytest.mark.parametrize(("runtime", "mode", "expected"), [
    (LlamaServerRuntime("/usr/bin/llama-server"), Mode(InferenceMode.EMBEDDED), 3),
    (BundledRuntime(), Mode(InferenceMode.EMBEDDED), 0),  # serves one request at a time
    (LlamaServerRuntime("/usr/bin/llama-server"), Mode(InferenceMode.ENDPOINT), 0),
], ids=["llama-server", "bundled", "endpoint"])
def test_calls_ahead_only_for_a_runtime_that_queues(runtime: Runtime, mode: Mode,
                                                    expected: int) -> None:
    """queue_ahead applies to a launched child whose runtime queues requests."""
    cc = load(None, env={"LLAMAD_GENERATION_ENABLED": "false",
                         "LLAMAD_EMBEDDING_MODEL": "/nonexistent.gguf",
                         "LLAMAD_EMBEDDING_QUEUE_AHEAD": "3"}).embedding
    setup = make_setup("embedding", "/nonexistent.gguf", runtime, cc)
    assert cc.queue_ahead == 3
    assert ahead_for(mode, setup, cc) == expected
