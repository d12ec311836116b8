"""The supervisor's state machine, backoff and breaker, driven by a manual clock and a
scripted launcher (no processes, no real sleeping)."""

from __future__ import annotations

import asyncio
import functools
import random

import pytest

from supervisor import (
    TRANSITIONS,
    BreakerState,
    ExitCause,
    IllegalTransitionError,
    InvalidModelError,
    ManualClock,
    RestartPolicy,
    State,
    StateChange,
    check_transition,
)
from tests.support.scripted import (
    PERMANENT,
    TRANSIENT,
    ScriptedLauncher,
    make,
    settle,
    started,
    until,
)


def path(changes: list[StateChange]) -> list[str]:
    return [c.new.value for c in changes]


def backing_off(launcher: ScriptedLauncher, clock: ManualClock, launches: int) -> bool:
    """The n-th launch happened and its backoff sleep is registered."""
    return launcher.launches == launches and clock.sleepers > 0


def test_illegal_transitions_raise() -> None:
    """Moves missing from the table raise instead of silently happening."""
    for old, new in [(State.IDLE, State.RUNNING), (State.STOPPED, State.RUNNING),
                     (State.FAILED, State.RUNNING), (State.BACKOFF, State.RUNNING),
                     (State.RUNNING, State.STARTING), (State.STOPPED, State.FAILED)]:
        with pytest.raises(IllegalTransitionError):
            check_transition(old, new)


def test_every_state_has_a_way_out_and_in() -> None:
    """No state is a dead end, and every state but idle can be reached."""
    reachable = {s for targets in TRANSITIONS.values() for s in targets}
    assert reachable == set(State) - {State.IDLE}
    assert all(TRANSITIONS[s] for s in State)


async def test_start_to_running() -> None:
    """idle -> starting -> running, and the client is then available."""
    sup, launcher, _, changes = await started(["ok"], State.RUNNING)
    assert path(changes) == ["starting", "running"]
    assert sup.pid == launcher.children[0].pid
    assert sup.client is launcher.children[0].client
    await sup.stop()
    assert path(changes)[-1] == "stopped"
    assert launcher.children[0].stopped


async def test_crash_backs_off_then_restarts() -> None:
    """running -> backoff on a crash, and backoff -> starting -> running after the delay."""
    sup, launcher, clock, changes = await started(["ok", "ok"], State.RUNNING)
    launcher.children[0].dies.set_result(TRANSIENT)
    await settle(sup, State.BACKOFF)
    assert sup.last_exit == TRANSIENT
    assert launcher.children[0].stopped
    retry = sup.retry_after()
    assert retry is not None and retry > 0
    with pytest.raises(Exception, match="not running"):
        _ = sup.client
    await clock.advance(0.5)  # the first ceiling is base = 0.5 s
    await settle(sup, State.RUNNING)
    assert path(changes) == ["starting", "running", "backoff", "starting", "running"]
    assert sup.restarts == 1
    await sup.stop()


async def test_transient_start_failure_backs_off() -> None:
    """starting -> backoff when a start fails transiently."""
    sup, _, clock, changes = await started([TRANSIENT, "ok"], State.BACKOFF)
    await clock.advance(0.5)
    await settle(sup, State.RUNNING)
    assert path(changes) == ["starting", "backoff", "starting", "running"]
    await sup.stop()


async def test_permanent_failure_opens_breaker_at_once() -> None:
    """starting -> failed on a permanent cause: no retry loop, breaker open."""
    sup, launcher, clock, changes = await started([PERMANENT], State.FAILED)
    assert sup.breaker.state is BreakerState.OPEN
    assert sup.retry_after() is None
    await clock.advance(3600)  # permanent failures never cool down
    assert sup.state is State.FAILED
    assert launcher.launches == 1
    assert path(changes) == ["starting", "failed"]
    await sup.stop()
    assert path(changes)[-1] == "stopped"


async def test_invalid_model_fails_before_launch() -> None:
    """A model that fails validation is permanent, and nothing is launched."""
    def bad() -> None:
        raise InvalidModelError("/m.gguf", "not a GGUF file")

    sup, launcher, _, _ = await started(["ok"], State.FAILED, validate=bad)
    assert launcher.launches == 0
    assert sup.last_exit is not None
    assert sup.last_exit.kind == "invalid_model"
    assert "not a GGUF file" in sup.last_exit.message
    await sup.stop()


async def test_breaker_opens_after_max_failures_with_growing_backoff() -> None:
    """Five failed starts in a row open the breaker; ceilings double up to the cap."""
    policy = RestartPolicy(base=0.5, cap=4.0, max_failures=5)
    sup, launcher, clock, changes = make([TRANSIENT] * 5, policy=policy)
    sup.start()
    delays = []
    for attempt in range(4):
        await until(functools.partial(backing_off, launcher, clock, attempt + 1))
        assert sup.state is State.BACKOFF
        deadline = clock.next_deadline()
        assert deadline is not None
        delays.append(deadline - clock.monotonic())
        await clock.advance(deadline - clock.monotonic())
    await settle(sup, State.FAILED)
    assert launcher.launches == 5
    for attempt, delay in enumerate(delays):
        assert 0 <= delay <= min(4.0, 0.5 * 2**attempt)
    assert path(changes).count("backoff") == 4
    assert sup.breaker.state is BreakerState.OPEN
    await sup.stop()


def test_backoff_ceilings_and_full_jitter() -> None:
    """Ceilings go 0.5, 1, 2, ... capped at 30; delays spread over [0, ceiling]."""
    policy = RestartPolicy()
    assert [policy.ceiling(n) for n in range(8)] == [0.5, 1, 2, 4, 8, 16, 30, 30]
    assert policy.ceiling(10_000) == 30
    rng = random.Random(1)
    samples = [policy.delay(3, rng) for _ in range(2000)]
    assert min(samples) >= 0 and max(samples) <= 4.0
    assert min(samples) < 0.5 and max(samples) > 3.5  # jitter covers the range


async def test_crash_that_trips_breaker_goes_running_to_failed() -> None:
    """running -> failed when the crash is the failure that opens the breaker."""
    policy = RestartPolicy(max_failures=1)
    sup, launcher, _, changes = await started(["ok"], State.RUNNING, policy=policy)
    launcher.children[0].dies.set_result(TRANSIENT)
    await settle(sup, State.FAILED)
    assert path(changes) == ["starting", "running", "failed"]
    await sup.stop()


async def test_cooldown_half_opens_and_one_failure_reopens() -> None:
    """failed -> starting after the cool-down; the next failure reopens at once."""
    policy = RestartPolicy(max_failures=2, cooldown=100.0)
    sup, launcher, clock, changes = await started([TRANSIENT] * 3, State.BACKOFF,
                                                    policy=policy)
    await clock.advance(1.0)
    await settle(sup, State.FAILED)
    retry = sup.retry_after()
    assert retry is not None and 99 <= retry <= 101
    await clock.advance(100.0)
    await until(lambda: launcher.launches == 3 and sup.state is State.FAILED)
    assert launcher.launches == 3
    assert path(changes)[-3:] == ["failed", "starting", "failed"]
    await sup.stop()


async def test_reset_while_failed_restarts_now() -> None:
    """failed -> starting on reset, with the breaker closed and failures forgotten."""
    sup, _, _, changes = await started([PERMANENT, "ok"], State.FAILED)
    sup.reset()
    await settle(sup, State.RUNNING)
    assert sup.breaker.state is BreakerState.CLOSED
    assert sup.breaker.failures == 0
    assert path(changes) == ["starting", "failed", "starting", "running"]
    await sup.stop()


async def test_reset_while_retry_pending_cuts_the_backoff_short() -> None:
    """backoff -> starting at once on reset, without waiting out the delay."""
    policy = RestartPolicy(base=30.0, cap=30.0)
    sup, _, clock, _ = await started([TRANSIENT, "ok"], State.BACKOFF, policy=policy)
    before = clock.monotonic()
    sup.reset()
    await settle(sup, State.RUNNING)
    assert clock.monotonic() == before
    await sup.stop()


async def test_stable_running_forgets_past_failures() -> None:
    """A crash after running stable_after seconds counts as the first failure."""
    policy = RestartPolicy(max_failures=3, stable_after=60.0)
    sup, launcher, clock, _ = make([TRANSIENT, TRANSIENT, "ok", "ok"], policy=policy)
    sup.start()
    for attempt in range(2):
        await until(functools.partial(backing_off, launcher, clock, attempt + 1))
        deadline = clock.next_deadline()
        assert deadline is not None
        await clock.advance(deadline - clock.monotonic())
    await settle(sup, State.RUNNING)
    assert sup.breaker.failures == 2
    await clock.advance(61.0)
    launcher.children[0].dies.set_result(TRANSIENT)
    await settle(sup, State.BACKOFF)
    assert sup.breaker.failures == 1
    await sup.stop()


async def test_unstable_crash_keeps_counting() -> None:
    """A crash before stable_after adds to the failures in a row."""
    policy = RestartPolicy(max_failures=3, stable_after=60.0)
    sup, launcher, clock, _ = await started([TRANSIENT, "ok"], State.BACKOFF, policy=policy)
    await clock.advance(5.0)
    await settle(sup, State.RUNNING)
    await clock.advance(10.0)
    launcher.children[0].dies.set_result(TRANSIENT)
    await settle(sup, State.BACKOFF)
    assert sup.breaker.failures == 2
    await sup.stop()


@pytest.mark.parametrize("where", ["starting", "backoff", "failed", "idle"])
async def test_stop_from_every_state(where: str) -> None:
    """stop() reaches stopped from idle, starting, backoff and failed."""
    outcomes: dict[str, list[str | ExitCause]] = {
        "starting": ["hang"], "backoff": [TRANSIENT], "failed": [PERMANENT], "idle": [],
    }
    sup, launcher, _, changes = make(outcomes[where])
    if where != "idle":
        sup.start()
        await settle(sup, State(where) if where != "starting" else State.STARTING)
        if where == "starting":
            await asyncio.sleep(0)
            assert launcher.hanging is not None
    await sup.stop()
    assert sup.state is State.STOPPED
    assert path(changes)[-1] == "stopped"


async def test_stopped_can_start_again() -> None:
    """stopped -> starting when started again."""
    sup, _, _, changes = await started(["ok", "ok"], State.RUNNING)
    await sup.stop()
    sup.start()
    await settle(sup, State.RUNNING)
    assert path(changes) == ["starting", "running", "stopped", "starting", "running"]
    await sup.stop()


async def test_stop_is_idempotent_and_survives_caller_cancel() -> None:
    """Cancelling a stop() still stops the child; a second stop() is a no-op."""
    sup, launcher, _, _ = await started(["ok"], State.RUNNING)
    gate = launcher.children[0].stop_gate = asyncio.Event()
    task = asyncio.create_task(sup.stop())
    await until(lambda: sup._stopping)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not launcher.children[0].stopped
    gate.set()
    await settle(sup, State.STOPPED)
    assert launcher.children[0].stopped
    await sup.stop()
    assert sup.state is State.STOPPED


async def test_listeners_see_every_change_with_cause() -> None:
    """Subscribers get each transition with its cause; unsubscribing stops delivery."""
    sup, launcher, clock, changes = make(["ok", "ok"])
    seen: list[StateChange] = []
    unsubscribe = sup.subscribe(seen.append)
    sup.start()
    await settle(sup, State.RUNNING)
    launcher.children[0].dies.set_result(TRANSIENT)
    await settle(sup, State.BACKOFF)
    assert seen[-1].cause == TRANSIENT
    assert seen[-1].old is State.RUNNING
    unsubscribe()
    await clock.advance(1.0)
    await settle(sup, State.RUNNING)
    assert [c.new for c in seen] == [State.STARTING, State.RUNNING, State.BACKOFF]
    assert len(changes) == 5
    await sup.stop()


async def test_retry_hint_expects_a_start_as_long_as_the_last_one() -> None:
    """While starting, a caller is told to come back when the start should be over (the
    last start's duration, 1 s before any); in backoff, after the wait plus a start."""
    sup, launcher, clock, _ = make(["hang", "hang"])
    sup.start()
    await until(lambda: launcher.hanging is not None)
    assert sup.retry_after() == pytest.approx(1.0)  # nothing known yet
    await clock.advance(0.4)
    assert sup.retry_after() == pytest.approx(0.6)
    await clock.advance(2.6)  # this start took 3 s
    assert launcher.hanging is not None
    launcher.hanging.set_result(None)
    await settle(sup, State.RUNNING)
    launcher.hanging = None
    launcher.children[0].dies.set_result(TRANSIENT)
    await settle(sup, State.BACKOFF)
    assert sup.retry_at is not None
    assert sup.retry_after() == pytest.approx(sup.retry_at - clock.monotonic() + 3.0)
    await clock.advance(sup.retry_at - clock.monotonic())
    await until(lambda: launcher.hanging is not None)
    await clock.advance(2.0)
    assert sup.retry_after() == pytest.approx(1.0)  # 3 s expected, 2 s gone
    await clock.advance(5.0)
    assert sup.retry_after() == pytest.approx(0.1)  # late: a short hint, never 0
    hanging = launcher.hanging
    assert hanging is not None
    hanging.set_result(None)
    await settle(sup, State.RUNNING)
    await sup.stop()
