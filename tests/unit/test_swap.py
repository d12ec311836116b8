"""Make-before-break swaps in the supervisor, with scripted children and a manual clock."""

from __future__ import annotations

import asyncio

import pytest

from supervisor import (
    ExitCause,
    ManualClock,
    RestartPolicy,
    State,
    Supervisor,
    SwapFailedError,
    SwapInProgressError,
    SwapProgress,
    SwapRefusedError,
)
from tests.support.scripted import TRANSIENT, ScriptedLauncher, make, settle, started, until


def stages(events: list[SwapProgress]) -> list[str]:
    return [e.stage for e in events]


async def running(outcomes: list[str | ExitCause] | None = None) -> tuple[
    Supervisor, ScriptedLauncher, ManualClock
]:
    sup, launcher, clock, _ = await started(outcomes or ["ok"], State.RUNNING)
    return sup, launcher, clock


async def swapping_to_a_hung_child(sup: Supervisor) -> tuple[ScriptedLauncher, asyncio.Task[None]]:
    """Start a swap whose new child hangs while loading; return once it hangs (its
    launcher's ``hanging`` ends the load) with the swap's task."""
    slow = ScriptedLauncher(["hang"])
    swap = asyncio.create_task(sup.swap(slow))
    await until(lambda: slow.hanging is not None)
    return slow, swap


async def test_swap_installs_new_child_then_stops_old() -> None:
    """A swap makes the new child current, then stops the old one; stages in order."""
    sup, old_launcher, _ = await running()
    old = old_launcher.children[0]
    new_launcher = ScriptedLauncher(["ok"])
    events: list[SwapProgress] = []
    await sup.swap(new_launcher, progress=events.append)
    new = new_launcher.children[0]
    assert sup.client is new.client
    assert sup.pid == new.pid
    assert old.stopped
    assert not new.stopped
    # "validating" is the caller's stage (daemon.models.model.Model.replace checks the file once).
    assert stages(events) == ["launching", "loading", "swapping", "draining", "done"]
    assert sup.state is State.RUNNING
    assert sup.launcher is new_launcher
    await sup.stop()
    assert new.stopped


async def test_failed_swap_leaves_old_child_serving() -> None:
    """A new child that never becomes ready changes nothing; the cause is returned."""
    sup, old_launcher, _ = await running()
    old = old_launcher.children[0]
    events: list[SwapProgress] = []
    cause = ExitCause("model_error", True, "error loading model")
    with pytest.raises(SwapFailedError) as err:
        await sup.swap(ScriptedLauncher([cause]), progress=events.append)
    assert err.value.cause == cause
    assert stages(events)[-1] == "failed"
    assert events[-1].cause == cause
    assert sup.client is old.client
    assert not old.stopped
    assert sup.launcher is old_launcher
    await sup.stop()


async def test_concurrent_swaps_are_rejected() -> None:
    """A second swap while one is running fails at once; the first completes."""
    sup, _, _ = await running()
    slow, first = await swapping_to_a_hung_child(sup)
    with pytest.raises(SwapInProgressError):
        await sup.swap(ScriptedLauncher(["ok"]))
    assert slow.hanging is not None
    slow.hanging.set_result(None)
    await first
    assert sup.client is slow.children[0].client
    await sup.stop()


async def test_drain_waits_for_in_flight_calls_on_old_child() -> None:
    """The old child is stopped only when its running calls end (or the drain times out)."""
    sup, old_launcher, clock = await running()
    old = old_launcher.children[0]
    old.client.activity.in_flight = 1  # a call still streaming on the old child
    swap = asyncio.create_task(sup.swap(ScriptedLauncher(["ok"]), drain_timeout=30))
    await until(lambda: clock.sleepers > 0)
    assert sup.client is not old.client  # new calls already go to the new child
    await clock.advance(1.0)
    assert not old.stopped
    old.client.activity.in_flight = 0
    await clock.advance(0.1)
    await swap
    assert old.stopped
    await sup.stop()


async def test_drain_is_bounded() -> None:
    """A call that never ends on the old child does not hold the swap past the bound."""
    sup, old_launcher, clock = await running()
    old = old_launcher.children[0]
    old.client.activity.in_flight = 1
    swap = asyncio.create_task(sup.swap(ScriptedLauncher(["ok"]), drain_timeout=5))
    await until(lambda: clock.sleepers > 0)
    for _ in range(120):
        await clock.advance(0.05)
        if swap.done():
            break
    await swap
    assert old.stopped
    await sup.stop()


async def test_swap_after_old_child_crashed_adopts_new_child() -> None:
    """With the old child backing off, the ready new child simply takes over."""
    sup, old_launcher, _ = await running(["ok"])
    old_launcher.outcomes[:] = [TRANSIENT] * 10  # old config keeps failing from now on
    old_launcher.children[0].dies.set_result(TRANSIENT)
    await settle(sup, State.BACKOFF)
    new_launcher = ScriptedLauncher(["ok"])
    events: list[SwapProgress] = []
    await sup.swap(new_launcher, progress=events.append)
    await settle(sup, State.RUNNING)
    assert sup.client is new_launcher.children[0].client
    assert stages(events)[-1] == "done"
    assert "draining" not in stages(events)
    await sup.stop()


async def test_swap_racing_a_crash_ends_swapped() -> None:
    """The old child crashes while the new one loads: the swap still completes."""
    sup, old_launcher, _ = await running(["ok", "ok"])
    slow, swap = await swapping_to_a_hung_child(sup)
    old_launcher.children[0].dies.set_result(TRANSIENT)  # crash mid-swap
    await settle(sup, State.BACKOFF, State.STARTING, State.RUNNING)
    assert slow.hanging is not None
    slow.hanging.set_result(None)
    await swap
    await settle(sup, State.RUNNING)
    assert sup.client is slow.children[0].client
    assert all(c.stopped for c in old_launcher.children if c is not slow.children[0])
    await sup.stop()


async def test_cancelled_swap_stops_new_child_and_keeps_old() -> None:
    """Cancelling a swap before take-over leaves the old child serving."""
    sup, old_launcher, _ = await running()
    slow, swap = await swapping_to_a_hung_child(sup)
    swap.cancel()
    with pytest.raises(asyncio.CancelledError):
        await swap
    assert sup.client is old_launcher.children[0].client
    assert slow.children == []
    # The lock is free again.
    await sup.swap(ScriptedLauncher(["ok"]))
    await sup.stop()


async def test_swap_of_stopped_child_is_refused() -> None:
    """A child that is not supervised cannot be swapped."""
    sup, _, _, _ = make(["ok"])
    with pytest.raises(SwapRefusedError):
        await sup.swap(ScriptedLauncher(["ok"]))


async def test_swap_resets_breaker_and_counts_no_restart() -> None:
    """A new configuration starts with a clean breaker and is not counted as a restart."""
    policy = RestartPolicy(max_failures=5)
    sup, launcher, clock, _ = await started([TRANSIENT, "ok"], State.BACKOFF, policy=policy)
    await clock.advance(1.0)
    await settle(sup, State.RUNNING)
    assert sup.breaker.failures == 1
    restarts = sup.restarts
    await sup.swap(ScriptedLauncher(["ok"]))
    assert sup.restarts == restarts
    await sup.stop()
    assert launcher.children[0].stopped
