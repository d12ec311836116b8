"""The one make-before-break primitive (daemon.models.model.Model.replace) and the drain of an
unload, on scripted children and a manual clock: a new model that fails validation or
readiness leaves the old one serving, untouched; success cuts over, then drains the old
one (bounded), then stops it."""

from __future__ import annotations

import asyncio

import pytest

from daemon.config.inference_mode import InferenceMode, Mode
from daemon.models._replace import ProgressSink
from daemon.models._states import ModelState
from daemon.models.backend import DisabledBackend
from daemon.models.model import Target
from supervisor import (
    State,
    SwapFailedError,
    SwapInProgressError,
    SwapRecord,
    SwapRefusedError,
)
from tests.support.scripted import PERMANENT, ScriptedLauncher, settle, until
from tests.support.scripted_model import Rig, rig, setup_for


def untouched(r: Rig) -> None:
    """The old child still serves, as before: same client, setup, mode, no swap record."""
    assert r.supervisor.client is r.old.client
    assert not r.old.stopped
    assert r.model.current is not None and r.model.current.spec.model.name == "old.gguf"
    assert r.model.mode.kind is InferenceMode.EMBEDDED
    assert (r.model.previous, r.model.last_swap) == (None, None)
    assert r.model.state is ModelState.SERVING


async def hung_replace(r: Rig, progress: ProgressSink | None = None
                       ) -> tuple[asyncio.Task[SwapRecord | None], ScriptedLauncher]:
    """Start replacing ``r``'s child with one whose launch hangs; once it hangs, return the
    replace's task and that child's launcher (``launcher.hanging`` lets it go on)."""
    slow = r.target(["hang"])
    assert isinstance(slow.launcher, ScriptedLauncher)
    launcher = slow.launcher
    task = asyncio.create_task(r.model.replace(slow, progress=progress))
    await until(lambda: launcher.hanging is not None)
    return task, launcher


async def test_new_model_failing_validation_leaves_old_untouched() -> None:
    """A file that is not a GGUF is refused before anything launches; the cause is the
    model's last error."""
    r = await rig()
    target = r.model.target_for(setup_for("/nonexistent/new.gguf"))
    assert isinstance(target.launcher, ScriptedLauncher)
    with pytest.raises(SwapFailedError) as err:
        await r.model.replace(target, progress=r.events.append)
    assert err.value.cause.kind == "invalid_model"
    assert target.launcher.launches == 0
    assert r.stages() == ["validating", "failed"]
    assert "new.gguf" in r.model.last_error
    untouched(r)
    await r.model.stop()


async def test_new_model_failing_readiness_keeps_old_serving() -> None:
    """A new child that never becomes ready changes nothing; the old one serves on."""
    r = await rig()
    with pytest.raises(SwapFailedError) as err:
        await r.model.replace(r.target([PERMANENT]), progress=r.events.append)
    assert err.value.cause == PERMANENT
    assert r.stages()[-1] == "failed"
    untouched(r)
    assert r.model.last_error == PERMANENT.message
    assert r.model.backend().model_name == r.old.client.model_name
    await r.model.stop()


async def test_success_cuts_over_then_drains_then_stops_old() -> None:
    """New calls go to the new child at once; the old one stops only when its running
    call ended; the swap is recorded with the previous setup."""
    r = await rig(drain_timeout=30)
    r.old.client.activity.in_flight = 1  # a call still streaming on the old child
    target = r.target(["ok"])
    swap = asyncio.create_task(r.model.replace(target, reason="upgrade",
                                               progress=r.events.append))
    await until(lambda: r.clock.sleepers > 0)  # draining
    assert isinstance(target.launcher, ScriptedLauncher)
    new = target.launcher.children[0]
    assert r.supervisor.client is new.client
    assert r.model.current is target.setup
    assert r.model.state is ModelState.SWAPPING  # until the old one is gone
    await r.clock.advance(1.0)
    assert not r.old.stopped
    r.old.client.activity.in_flight = 0
    await r.clock.advance(0.1)
    record = await swap
    assert r.old.stopped and not new.stopped
    assert r.stages() == ["validating", "launching", "loading", "swapping", "draining", "done"]
    assert record is not None and record.reason == "upgrade"
    assert (record.old, record.new) == ("/models/old.gguf", "/models/new.gguf")
    assert r.model.last_swap is record
    assert r.model.previous is not None and r.model.previous.spec.model.name == "old.gguf"
    assert r.model.state is ModelState.SERVING
    await r.model.stop()
    assert new.stopped


async def test_drain_that_exceeds_its_timeout_is_bounded() -> None:
    """A call that never ends on the old child holds the swap only as long as the drain
    timeout; then the old child is stopped anyway."""
    r = await rig(drain_timeout=5)
    r.old.client.activity.in_flight = 1  # never ends
    began = r.clock.monotonic()
    swap = asyncio.create_task(r.model.replace(r.target(["ok"])))
    await until(lambda: r.clock.sleepers > 0)
    while not swap.done():
        await r.clock.advance(0.5)
    await swap
    assert r.old.stopped
    assert 5 <= r.clock.monotonic() - began < 6
    await r.model.stop()


async def test_concurrent_replace_is_rejected() -> None:
    """A second operation while one runs fails at once; the first completes."""
    r = await rig()
    first, launcher = await hung_replace(r)
    assert r.model.switching
    with pytest.raises(SwapInProgressError):
        await r.model.replace(r.target(["ok"]))
    with pytest.raises(SwapInProgressError):
        await r.model.unload()
    assert launcher.hanging is not None
    launcher.hanging.set_result(None)
    await first
    assert r.supervisor.client is launcher.children[0].client
    await r.model.stop()


async def test_cancelled_replace_keeps_old() -> None:
    """Cancelling before the cut-over drops the new child; the old one serves on."""
    r = await rig()
    task, _ = await hung_replace(r)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    untouched(r)
    await r.model.stop()


async def test_too_big_for_memory_is_refused_before_anything() -> None:
    """A new child that does not fit beside the old one is refused at once (no stage, no
    launch) unless the caller asked to stop the old child first."""
    r = await rig(available=64 << 20)
    big = r.target(["ok"], size=1 << 30)
    with pytest.raises(SwapRefusedError, match="stop_old_first"):
        await r.model.replace(big, progress=r.events.append)
    assert r.events == []
    assert isinstance(big.launcher, ScriptedLauncher) and big.launcher.launches == 0
    untouched(r)
    await r.model.stop()


async def test_stop_old_first_when_it_does_not_fit() -> None:
    """Asked to, the old child stops first and the new one starts in its place."""
    r = await rig(available=64 << 20)
    big = r.target(["ok"], size=1 << 30)
    record = await r.model.replace(big, stop_old_first=True, progress=r.events.append)
    assert r.old.stopped
    assert isinstance(big.launcher, ScriptedLauncher)
    assert r.supervisor.client is big.launcher.children[0].client
    assert record is not None and r.model.current is big.setup
    assert r.stages()[:2] == ["validating", "draining"]
    await r.model.stop()


async def test_stop_old_first_failure_restarts_the_old_model() -> None:
    """A new child that fails after the old one stopped: the old setup starts again."""
    r = await rig(available=64 << 20, outcomes=["ok", "ok"])
    with pytest.raises(SwapFailedError):
        await r.model.replace(r.target([PERMANENT], size=1 << 30), stop_old_first=True)
    assert r.old.stopped
    assert r.supervisor.launcher is r.launcher  # supervised again, with the old launcher
    # The old file is absent here, so the restart's own validation opens the breaker; with
    # a real file it would be running again.
    await settle(r.supervisor, State.FAILED)
    assert "old.gguf" in r.model.last_error
    assert r.model.current is not None and r.model.current.spec.model.name == "old.gguf"
    assert r.model.state is ModelState.SERVING
    await r.model.stop()


async def test_load_from_unloaded_serves_only_once_ready() -> None:
    """A disabled model switched on refuses calls while it loads, then serves."""
    r = await rig(mode=InferenceMode.DISABLED, start=False)
    task, launcher = await hung_replace(r, progress=r.events.append)
    assert r.model.state is ModelState.LOADING
    assert isinstance(r.model.backend(), DisabledBackend)
    assert launcher.hanging is not None
    launcher.hanging.set_result(None)
    assert await task is None  # a mode switch: no swap record
    assert (r.model.state, r.model.mode.kind) == (ModelState.SERVING, InferenceMode.EMBEDDED)
    assert r.model.backend().model_name == launcher.children[0].client.model_name
    assert r.stages()[-2:] == ["swapping", "done"]
    await r.model.stop()


async def test_load_that_never_gets_ready_stays_unloaded() -> None:
    """A failed load leaves the model disabled and its supervisor stopped."""
    r = await rig(mode=InferenceMode.DISABLED, start=False)
    with pytest.raises(SwapFailedError):
        await r.model.replace(r.target([PERMANENT]))
    assert (r.model.state, r.model.mode.kind) == (ModelState.UNLOADED, InferenceMode.DISABLED)
    assert r.supervisor.state is State.STOPPED
    assert r.model.last_error == PERMANENT.message


async def test_unload_refuses_new_calls_then_drains_bounded() -> None:
    """Unload disables at once; a call that never ends is waited for only up to the
    drain timeout; then the child stops and the model is unloaded."""
    r = await rig(drain_timeout=5)
    r.old.client.activity.in_flight = 1
    task = asyncio.create_task(r.model.unload(r.events.append))
    await until(lambda: r.clock.sleepers > 0)
    assert r.model.state is ModelState.DRAINING
    assert isinstance(r.model.backend(), DisabledBackend)
    assert not r.old.stopped
    while not task.done():
        await r.clock.advance(0.5)
    await task
    assert r.old.stopped
    assert (r.model.state, r.supervisor.state) == (ModelState.UNLOADED, State.STOPPED)
    assert r.stages() == ["swapping", "draining", "done"]


async def test_shutdown_mid_swap_leaves_the_model_stopped() -> None:
    """The daemon stopping a model while a swap loads: the swap fails and the model stays
    stopped (no illegal transition back to serving)."""
    r = await rig()
    swap, launcher = await hung_replace(r)
    await r.model.stop()
    assert launcher.hanging is not None
    launcher.hanging.set_result(None)
    with pytest.raises(SwapRefusedError):
        await swap
    assert r.model.state is ModelState.STOPPED
    assert launcher.children[0].stopped


async def test_recycle_keeps_the_rollback_target() -> None:
    """Replacing a child with its own setup (a planned recycle) is recorded as a swap but
    keeps the previous setup a rollback returns to."""
    r = await rig()
    await r.model.replace(r.target(["ok"]))
    previous, current = r.model.previous, r.model.current
    assert previous is not None and current is not None
    same = Target(Mode(InferenceMode.EMBEDDED), current, ScriptedLauncher(["ok"]), None)
    record = await r.model.replace(same, reason="recycle: served 5 requests")
    assert record is not None and record.old == record.new == "/models/new.gguf"
    assert (r.model.previous, r.model.current) == (previous, current)
    await r.model.stop()
