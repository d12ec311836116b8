"""The pool's residency policy (issue 14): max resident models, a memory budget, least
recently used idle models unloaded first, busy ones drained (never cut) and only when no
idle one will do, pinned models and the roles' defaults never evicted, RESOURCE_EXHAUSTED
with a retry hint when nothing can make room, and ttl unloads; the pure decision
(daemon/models/_residency.py) and the pool carrying it out, on scripted models and the manual
clock (no real sleeping)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from daemon.config._catalog_load import device_budgets
from daemon.config._sections import PoolSettings
from daemon.errors import Overloaded
from daemon.models._residency import Limits, Resident, make_room
from daemon.models.model import Model
from supervisor import State
from tests.support.scripted import settle
from tests.support.scripted_pool import Rig, until

MIB = 1024 * 1024


def r(name: str, last_used: float, *, busy: int = 0, evictable: bool = True,
      memory: int = 100, device: str = "") -> Resident:
    return Resident(name, memory, last_used, busy, evictable, device)


def test_make_room_chooses_least_recently_used_idle_first() -> None:
    residents = [r("a", 3), r("b", 1), r("c", 2), r("d", 0, busy=1)]
    assert make_room(residents, 100, Limits(max_resident=5)) == []
    assert [v.name for v in make_room(residents, 100, Limits(max_resident=4)) or []] == ["b"]
    assert [v.name for v in make_room(residents, 100, Limits(max_resident=3)) or []] == \
        ["b", "c"]
    # A busy one goes only after every idle one.
    assert [v.name for v in make_room(residents, 100, Limits(max_resident=1)) or []] == \
        ["b", "c", "a", "d"]


def test_make_room_by_memory_and_what_cannot_go() -> None:
    residents = [r("big", 1, memory=500), r("small", 0, memory=100),
                 r("pinned", 0, memory=300, evictable=False)]
    # 900 held; 300 more within 1000: the oldest (small) is not enough, big goes too.
    assert [v.name for v in make_room(residents, 300, Limits(budget=1000)) or []] == \
        ["small", "big"]
    assert [v.name for v in make_room(residents, 100, Limits(budget=1000)) or []] == []
    assert make_room(residents, 800, Limits(budget=1000)) is None  # pinned holds 300
    assert make_room(residents, 1200, Limits(budget=1000)) is None  # larger than it all
    assert make_room([r("p", 0, evictable=False)], 1, Limits(max_resident=1)) is None


def test_a_device_has_its_own_budget() -> None:
    """Models on a GPU count against its budget, not the RAM budget: a model for the GPU
    evicts only GPU models (the older RAM model stays), and the other way round; with the
    number of models the binding limit, any evictable model may go."""
    residents = [r("ram-old", 0, memory=500), r("gpu-a", 1, memory=600, device="cuda0"),
                 r("gpu-b", 2, memory=300, device="cuda0")]
    limits = Limits(budget=1000, devices={"cuda0": 1000})
    assert make_room(residents, 400, limits) == []  # RAM: 500 + 400
    assert [v.name for v in make_room(residents, 600, limits) or []] == ["ram-old"]
    assert [v.name for v in make_room(residents, 200, limits, "cuda0") or []] == ["gpu-a"]
    assert make_room(residents, 1100, limits, "cuda0") is None  # larger than the GPU
    assert make_room(residents, 10, limits, "cuda1") == []  # no budget for cuda1
    assert [v.name for v in make_room(residents, 10, Limits(max_resident=3,
                                                            devices={"cuda0": 1000}),
                                      "cuda0") or []] == ["ram-old"]


@pytest.mark.parametrize(("text", "message"), [
    ("cuda0", "not NAME=MiB"), ("cuda0=0", "not NAME=MiB"), ("=5", "not NAME=MiB"),
    ("cuda0=5,cuda0=6", "given twice"), ("cuda0=lots", "not NAME=MiB"),
])
def test_device_budgets_are_checked(text: str, message: str) -> None:
    assert device_budgets("cuda0=7500, cuda1=100") == {"cuda0": 7500 * MIB,
                                                        "cuda1": 100 * MIB}
    assert device_budgets("") == {}
    with pytest.raises(ValueError, match=message):
        device_budgets(text)


@pytest.fixture
async def two(tmp_path: Path) -> Rig:
    """Room for two resident models: the default gen-a (started) and one more; a busy
    model makes room at once (no turn)."""
    rig = Rig(tmp_path, PoolSettings(max_resident=2, turn=0))
    rig.default.start()
    await settle(rig.default.supervisor, State.RUNNING)
    return rig


async def test_a_new_model_evicts_the_least_recently_used_idle_one(tmp_path: Path) -> None:
    rig = Rig(tmp_path, PoolSettings(max_resident=3))
    rig.default.start()
    await settle(rig.default.supervisor, State.RUNNING)
    await rig.pool.load("gen-b")
    rig.pool.touch("gen-b")
    await rig.clock.advance(1)
    await rig.pool.load("gen-c")
    rig.pool.touch("gen-c")
    await rig.clock.advance(1)
    rig.pool.touch("gen-a")
    await rig.pool.load("emb")
    assert {n: rig.state(n) for n in ("gen-a", "gen-b", "gen-c", "emb")} == {
        "gen-a": "ready", "gen-b": "unloaded", "gen-c": "ready", "emb": "ready"}
    evicted = rig.pool.model("gen-b")
    assert evicted is not None  # a call still waiting for it hears why, retryable
    assert "evicted to make room for 'emb'" in str(evicted.backend().refusal)
    # The evicted one comes back on demand, evicting the next least recently used.
    await rig.pool.load("gen-b")
    assert rig.state("gen-c") == "unloaded" and rig.state("gen-b") == "ready"


async def test_the_roles_default_is_never_evicted(two: Rig) -> None:
    await two.pool.load("gen-b")
    await two.pool.load("gen-c")  # gen-a is older, but the role's default
    assert two.state("gen-a") == "ready"
    assert two.state("gen-b") == "unloaded" and two.state("gen-c") == "ready"


async def test_pinned_is_never_evicted_and_the_call_gets_a_retry_hint(tmp_path: Path) -> None:
    rig = Rig(tmp_path, PoolSettings(max_resident=2), pinned=("gen-b",))
    rig.default.start()
    await settle(rig.default.supervisor, State.RUNNING)
    await rig.pool.load("gen-b")
    with pytest.raises(Overloaded, match="'gen-c' does not fit") as refused:
        await rig.pool.load("gen-c")
    assert refused.value.retry_after > 0
    assert rig.state("gen-b") == "ready" and rig.state("gen-c") == "unloaded"
    assert rig.launches("gen-c") == 0


async def test_memory_budget(tmp_path: Path) -> None:
    """Each test model is estimated at about 512 MiB (the runtime overhead and the
    llama-server prompt cache, cache_ram = 256 MiB, dominate): an 1100 MiB budget holds
    two."""
    rig = Rig(tmp_path, PoolSettings(memory_budget_mb=1100))
    rig.default.start()
    await settle(rig.default.supervisor, State.RUNNING)
    assert 506 * MIB < rig.pool.view("gen-b").memory_estimate < 556 * MIB
    await rig.pool.load("gen-b")
    await rig.pool.load("gen-c")
    assert rig.state("gen-b") == "unloaded" and rig.state("gen-c") == "ready"


async def _hold(model: Model, release: asyncio.Event) -> None:
    async with model.admission.slot(None):
        await release.wait()


async def test_a_busy_model_goes_after_idle_ones(tmp_path: Path) -> None:
    rig = Rig(tmp_path, PoolSettings(max_resident=3))
    rig.default.start()
    await settle(rig.default.supervisor, State.RUNNING)
    busy = await rig.pool.load("gen-b")  # the least recently used, but busy
    await rig.clock.advance(1)
    await rig.pool.load("gen-c")
    rig.pool.touch("gen-c")
    release = asyncio.Event()
    call = asyncio.create_task(_hold(busy, release))
    await until(lambda: busy.busy() == 1)
    await rig.pool.load("emb")
    assert rig.state("gen-c") == "unloaded" and rig.state("gen-b") == "ready"
    release.set()
    await call


async def test_a_busy_model_is_drained_not_cut(two: Rig) -> None:
    """The only model that can make room has a call running: it is drained first (no
    new calls: they wait for its next load), stopped once its call ends, and the new
    model loads after."""
    busy = await two.pool.load("gen-b")
    child = two.launchers["gen-b"][-1].children[-1]
    release = asyncio.Event()
    call = asyncio.create_task(_hold(busy, release))
    await until(lambda: busy.busy() == 1)
    load = asyncio.create_task(two.pool.load("gen-c"))
    await until(lambda: two.state("gen-b") == "draining")
    assert not two.pool.is_resident("gen-b")  # takes no new call
    assert not child.stopped and not load.done()
    await two.clock.advance(1)  # the drain polls on the clock: still waiting for the call
    assert not child.stopped and not load.done()
    release.set()
    await call
    while not load.done():
        await two.clock.advance(0.05)
    await load
    assert child.stopped
    assert two.state("gen-b") == "unloaded" and two.state("gen-c") == "ready"


async def test_ttl_unloads_idle_models(tmp_path: Path) -> None:
    rig = Rig(tmp_path, PoolSettings(ttl_check_interval=5), ttl=30, pinned=("gen-c",))
    rig.default.start()
    await settle(rig.default.supervisor, State.RUNNING)
    loop = asyncio.create_task(rig.pool.expire_loop())
    b = await rig.pool.load("gen-b")
    await rig.pool.load("gen-c")
    rig.pool.touch("gen-b")
    rig.pool.touch("gen-c")
    await advance(rig, 25)
    assert rig.state("gen-b") == "ready"  # idle 25 s < 30 s
    release = asyncio.Event()
    call = asyncio.create_task(_hold(b, release))
    await until(lambda: b.busy() == 1)
    await advance(rig, 10)
    assert rig.state("gen-b") == "ready"  # past its ttl, but busy
    release.set()
    await call
    await advance(rig, 5)
    await until(lambda: rig.state("gen-b") == "unloaded")
    assert rig.state("gen-c") == "ready"  # pinned
    assert rig.state("gen-a") == "ready"  # the role's default
    loop.cancel()
    await asyncio.gather(loop, return_exceptions=True)


async def advance(rig: Rig, seconds: float) -> None:
    """Advance the manual clock a second at a time (each check of the ttl loop runs)."""
    for _ in range(int(seconds)):
        await rig.clock.advance(1)
