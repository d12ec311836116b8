"""Switching between models when only some fit (issue 14): an evicted model first serves
the calls already queued for it and those its load let through, while calls arriving for
it meanwhile wait for its next load (a switch serves a batch, and no call is refused);
a role's default unpinned in its table is evicted and loaded on demand like any other.
Scripted models, no processes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from daemon.config._sections import PoolSettings
from daemon.errors import DeadlineUnmeetable, FailedPrecondition
from daemon.grpcapi.health import HealthReporter
from daemon.models.router import InferenceRouter
from llamad_protocol.v1.wire import HEALTH_GENERATION, HEALTH_MODEL_PREFIX
from supervisor import State
from tests.support.scripted import settle
from tests.support.scripted_pool import Rig, until

SERVING, NOT_SERVING = 1, 2


@contextlib.asynccontextmanager
async def ticking(rig: Rig) -> AsyncIterator[None]:
    """The drains poll on the rig's manual clock: let its time run meanwhile."""
    async def tick() -> None:
        while True:
            await asyncio.sleep(0.002)
            await rig.clock.advance(0.05)

    task = asyncio.create_task(tick())
    try:
        yield
    finally:
        task.cancel()


async def started(rig: Rig) -> InferenceRouter:
    rig.default.start()
    await settle(rig.default.supervisor, State.RUNNING)
    router = InferenceRouter({"generation": rig.default})
    router.attach(rig.pool)
    return router


async def test_an_evicted_model_serves_its_queue_and_later_calls_wait_for_it(
        tmp_path: Path) -> None:
    """gen-b's slots are all taken and one call waits in its queue when gen-c needs its
    room: the queued call is served by gen-b before gen-b stops, gen-c's call runs
    after, and a call for gen-b arriving meanwhile waits for gen-b's next load."""
    # gen-a (pinned) and one more; gen-b stops taking calls at once (no turn)
    rig = Rig(tmp_path, PoolSettings(max_resident=2, turn=0))
    router = await started(rig)
    events: list[str] = []
    release = asyncio.Event()

    async def call(model: str, tag: str, hold: bool = False) -> None:
        async with router.admit("generation", None, model=model):
            on = next(n for n in ("gen-b", "gen-c")
                      if rig.state(n) in ("ready", "draining"))
            events.append(f"{tag} on {on}")
            if hold:
                await release.wait()

    held = [asyncio.create_task(call("gen-b", "held", hold=True))]
    await until(lambda: len(events) == 1)
    gen_b = rig.pool.model("gen-b")
    assert gen_b is not None
    slots = gen_b.admission.capacity  # its slots and the calls it may send ahead
    held += [asyncio.create_task(call("gen-b", "held", hold=True)) for _ in range(slots - 1)]
    await until(lambda: len(events) == slots)
    queued = asyncio.create_task(call("gen-b", "queued"))
    await until(lambda: gen_b.admission.queued == 1)
    other = asyncio.create_task(call("gen-c", "other"))
    await until(lambda: not rig.pool.is_resident("gen-b"))  # closing: no new calls
    assert rig.state("gen-b") == "draining"
    late = asyncio.create_task(call("gen-b", "late"))
    await asyncio.sleep(0.05)
    assert gen_b.admission.queued == 1 and gen_b.admission.in_flight == slots
    release.set()
    async with ticking(rig):
        await asyncio.gather(*held, queued, other, late)  # none refused
    assert events[slots:] == ["queued on gen-b", "other on gen-c", "late on gen-b"]
    assert rig.launches("gen-b") == 2 and rig.launches("gen-c") == 1


async def test_calls_a_load_let_through_are_served_before_that_model_is_evicted(
        tmp_path: Path) -> None:
    """Calls waiting for gen-b's load, and a call for gen-c queued behind that load: once
    gen-b is ready, gen-c's load must not evict it before the waiting calls got in."""
    rig = Rig(tmp_path, PoolSettings(max_resident=2, turn=0))
    router = await started(rig)
    rig.outcomes["gen-b"] = ["hang"]
    served: list[str] = []

    async def call(model: str) -> None:
        async with router.admit("generation", None, model=model):
            served.append(model)
            await asyncio.sleep(0.01)

    waiting = [asyncio.create_task(call("gen-b")) for _ in range(3)]
    await until(lambda: bool(rig.launchers.get("gen-b"))
                and rig.launchers["gen-b"][-1].hanging is not None)
    other = asyncio.create_task(call("gen-c"))
    await asyncio.sleep(0.05)
    hanging = rig.launchers["gen-b"][-1].hanging
    assert hanging is not None
    hanging.set_result(None)
    async with ticking(rig):
        await asyncio.gather(*waiting, other)
    assert served == ["gen-b", "gen-b", "gen-b", "gen-c"]
    assert rig.launches("gen-b") == 1


async def test_an_unpinned_default_is_evicted_and_loaded_on_demand(tmp_path: Path) -> None:
    """With room for one model and the default unpinned, a call for gen-b evicts gen-a; a
    call naming no model then loads gen-a again; health keeps the role serving while the
    pool has it unloaded (it loads on demand), its model entry says it is not resident."""
    rig = Rig(tmp_path, PoolSettings(max_resident=1), default_pinned=False)
    router = await started(rig)
    health = HealthReporter(rig.pool)
    assert not router.fixed("generation", "")
    async with ticking(rig), router.admit("generation", None, model="gen-b"):
        assert rig.state("gen-a") == "unloaded"
    statuses = health.statuses()
    assert statuses[HEALTH_GENERATION] == SERVING
    assert statuses[HEALTH_MODEL_PREFIX + "gen-a"] == NOT_SERVING
    async with ticking(rig), router.admit("generation", None):
        assert rig.default.admission.in_flight == 1
        assert rig.state("gen-a") == "ready" and rig.state("gen-b") == "unloaded"
    assert rig.launches("gen-a") == 2


async def test_a_pinned_default_stays(tmp_path: Path) -> None:
    rig = Rig(tmp_path, PoolSettings(max_resident=1))
    router = await started(rig)
    assert router.fixed("generation", "") and router.fixed("generation", "gen-a")
    assert not router.fixed("generation", "gen-b")
    # A role without a default in the catalog (disabled at start, switched on later by
    # SetMode) is served by its own model, not looked up in the pool.
    assert "embedding" not in rig.catalog.defaults and router.fixed("embedding", "")


async def test_a_turn_lets_a_busy_model_take_calls_before_it_makes_room(
        tmp_path: Path) -> None:
    """With ``turn``, gen-b (busy) keeps taking new calls for that long while gen-c waits
    for its room; once it has no work left, it goes and gen-c loads."""
    rig = Rig(tmp_path, PoolSettings(max_resident=2, turn=60))
    router = await started(rig)
    release = asyncio.Event()
    order: list[str] = []

    async def call(model: str, tag: str) -> None:
        async with router.admit("generation", None, model=model):
            order.append(tag)
            await release.wait()

    first = asyncio.create_task(call("gen-b", "b1"))
    await until(lambda: order == ["b1"])
    other = asyncio.create_task(call("gen-c", "c"))
    await asyncio.sleep(0.05)
    assert rig.pool.is_resident("gen-b")  # its turn: still taking calls
    second = asyncio.create_task(call("gen-b", "b2"))
    await until(lambda: order == ["b1", "b2"])
    assert rig.launches("gen-c") == 0
    release.set()
    async with ticking(rig):
        await asyncio.gather(first, second, other)
    assert order == ["b1", "b2", "c"] and rig.launches("gen-b") == 1


async def test_a_deadline_shorter_than_the_models_load_is_refused_at_once(
        tmp_path: Path) -> None:
    """gen-b's load took 5 s: unloaded again, a call for it with 2 s left is refused at
    once (DEADLINE class, naming the expected load) and starts nothing; with 10 s left it
    loads it."""
    rig = Rig(tmp_path, PoolSettings(max_resident=3))
    router = await started(rig)
    rig.outcomes["gen-b"] = ["hang"]
    load = asyncio.create_task(rig.pool.load("gen-b"))
    await until(lambda: bool(rig.launchers.get("gen-b"))
                and rig.launchers["gen-b"][-1].hanging is not None)
    await rig.clock.advance(5)
    hanging = rig.launchers["gen-b"][-1].hanging
    assert hanging is not None
    hanging.set_result(None)
    await load
    assert rig.pool.expected_load("gen-b") == pytest.approx(5, abs=0.5)
    async with ticking(rig):
        await rig.pool.unload("gen-b")
    with pytest.raises(DeadlineUnmeetable, match=r"takes about 5\.\d s to load"):
        async with router.admit("generation", 2.0, model="gen-b"):
            pass
    assert rig.launches("gen-b") == 1
    async with router.admit("generation", 10.0, model="gen-b"):
        pass
    assert rig.launches("gen-b") == 2


async def test_without_on_demand_only_an_admin_loads_a_model(tmp_path: Path) -> None:
    rig = Rig(tmp_path, PoolSettings(on_demand=False))
    router = await started(rig)
    with pytest.raises(FailedPrecondition, match="LoadModel loads it"):
        async with router.admit("generation", None, model="gen-b"):
            pass
    assert rig.launches("gen-b") == 0
    await rig.pool.load("gen-b")  # LoadModel's way
    async with router.admit("generation", None, model="gen-b"):
        pass
    assert rig.launches("gen-b") == 1
