"""The model pool (issue 14): requests' model names resolved, models loaded on demand
under their own Model (concurrent loads share one start), unloaded with their calls
drained, and listed with their residency; scripted children and a manual clock."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from daemon import errors
from daemon.config._catalog import Catalog, CatalogEntry
from daemon.config.inference_mode import InferenceMode
from daemon.errors import FailedPrecondition, InvalidArgument, ModelUnloaded, UnknownModel
from daemon.models.model import Model
from daemon.models.pool import Pool
from supervisor import (
    State,
    StateChange,
    SwapFailedError,
)
from tests.support.scripted import PERMANENT
from tests.support.scripted_pool import Rig, until


@pytest.fixture
async def rig(tmp_path: Path) -> Rig:
    return await Rig(tmp_path).started()


async def test_names_resolve_to_catalog_models(rig: Rig) -> None:
    pool = rig.pool
    assert pool.entry("", "generation").name == "gen-a"
    assert pool.entry("b", "generation").name == "gen-b"
    with pytest.raises(UnknownModel, match="'nope' does not exist; the models are: "
                                           "gen-a, gen-b, gen-c, emb"):
        pool.entry("nope", "generation")
    with pytest.raises(InvalidArgument, match="'gen-b' is a generation model, not a "
                                              "embedding model"):
        pool.entry("gen-b", "embedding")
    with pytest.raises(FailedPrecondition, match="embedding role has no default"):
        pool.entry("", "embedding")


async def test_models_lists_every_catalog_model(rig: Rig) -> None:
    views = {v.name: v for v in rig.pool.models()}
    assert list(views) == ["gen-a", "gen-b", "gen-c", "emb"]
    assert views["gen-a"].state == "ready" and views["gen-a"].is_default
    assert views["gen-b"].state == "unloaded" and not views["gen-b"].is_default
    assert views["gen-b"].aliases == ("b",)
    assert views["gen-b"].memory_estimate > 0  # estimated from the file, not built
    assert rig.built == []  # listing builds nothing
    await rig.clock.advance(5)
    rig.pool.touch("gen-a")
    assert rig.pool.view("gen-a").last_used == rig.clock.wall()
    assert rig.pool.view("gen-b").last_used is None


async def loads_of_one_hanging_start(rig: Rig, *names: str) -> list[asyncio.Task[Model]]:
    """Loads of gen-b, one per name (or alias) in ``names``, started at once; returned once
    gen-b's one launch hangs."""
    rig.outcomes["gen-b"] = ["hang"]
    loads = [asyncio.create_task(rig.pool.load(name)) for name in names]
    await until(lambda: rig.launches("gen-b") == 1 and
                rig.launchers["gen-b"][-1].hanging is not None)
    return loads


async def test_concurrent_first_loads_share_one_start(rig: Rig) -> None:
    first, second = await loads_of_one_hanging_start(rig, "gen-b", "b")
    assert rig.state("gen-b") == "loading"
    hanging = rig.launchers["gen-b"][-1].hanging
    assert hanging is not None
    hanging.set_result(None)
    a, b = await asyncio.gather(first, second)
    assert a is b
    assert rig.launches("gen-b") == 1 and rig.built == ["gen-b"]
    assert rig.state("gen-b") == "ready"
    assert rig.pool.is_resident("gen-b")
    assert await rig.pool.load("gen-b") is a  # resident: no new start
    assert rig.launches("gen-b") == 1


async def test_a_cancelled_waiter_does_not_cancel_the_shared_start(rig: Rig) -> None:
    impatient, patient = await loads_of_one_hanging_start(rig, "gen-b", "gen-b")
    impatient.cancel()
    hanging = rig.launchers["gen-b"][-1].hanging
    assert hanging is not None
    hanging.set_result(None)
    assert (await patient).mode.kind is InferenceMode.EMBEDDED
    assert impatient.cancelled()


async def test_a_broken_model_fails_alone(rig: Rig) -> None:
    rig.outcomes["gen-c"] = [PERMANENT]
    with pytest.raises(SwapFailedError):
        await rig.pool.load("gen-c")
    view = rig.pool.view("gen-c")
    assert view.state == "unloaded"
    assert "error loading model" in view.last_error
    # The others are untouched: the default serves, another model still loads.
    assert rig.state("gen-a") == "ready"
    assert (await rig.pool.load("gen-b")).mode.kind is InferenceMode.EMBEDDED


async def test_unload_then_load_again(rig: Rig) -> None:
    await rig.pool.load("gen-b")
    model = rig.pool.model("gen-b")
    assert model is not None
    await rig.pool.unload("b")
    assert rig.state("gen-b") == "unloaded"
    assert not rig.pool.is_resident("gen-b")
    # New calls (and any still waiting for it) are refused, retryable, saying why.
    refusal = model.backend().refusal
    assert isinstance(refusal, ModelUnloaded) and "UnloadModel" in str(refusal)
    assert errors.map_error(refusal).code is grpc.StatusCode.UNAVAILABLE
    assert await rig.pool.unload("gen-b") is model  # not resident: nothing to do
    assert await rig.pool.load("gen-b") is model  # the same Model, a second start
    assert rig.launches("gen-b") == 2
    assert rig.state("gen-b") == "ready"
    assert model.backend().refusal is None


async def test_unknown_model_cannot_be_loaded(rig: Rig) -> None:
    with pytest.raises(UnknownModel):
        await rig.pool.load("nope")


async def test_stop_stops_every_model_the_roles_last(rig: Rig) -> None:
    """Shutdown goes through the registry (issue 26): the models loaded on demand stop,
    then the role's own model; nothing loads after."""
    model = await rig.pool.load("gen-b")
    stopped: list[str] = []

    def watch(name: str, watched: Model) -> None:
        def heard(change: StateChange) -> None:
            if change.new is State.STOPPED:
                stopped.append(name)
        watched.supervisor.subscribe(heard)

    watch("gen-a", rig.default)
    watch("gen-b", model)
    await rig.pool.stop()
    assert model.supervisor.state is State.STOPPED
    assert rig.default.supervisor.state is State.STOPPED
    assert stopped == ["gen-b", "gen-a"]
    with pytest.raises(FailedPrecondition, match="shutting down"):
        await rig.pool.load("gen-c")
    await rig.pool.stop()  # idempotent


async def test_preload_starts_the_preload_models(tmp_path: Path) -> None:
    r = Rig(tmp_path)
    entries = tuple(e if e.name != "gen-c" else CatalogEntry(
        e.name, e.role, e.child, preload=True, origin=e.origin) for e in r.catalog.entries)
    r.catalog = Catalog(entries, {"generation": "gen-a"})
    r.pool = Pool(r.catalog, {"generation": r.default}, r.build_pooled, clock=r.clock)
    tasks = r.pool.preload()
    assert [t.get_name() for t in tasks] == ["preload-gen-c"]
    await asyncio.gather(*tasks)
    assert r.state("gen-c") == "ready"


def test_a_new_pool_lists_its_models_before_anything_happened(tmp_path: Path) -> None:
    """The first model list (health's, at start-up) comes before any load or state
    change."""
    rig = Rig(tmp_path)
    assert [v.state for v in rig.pool.models()] == ["unloaded"] * 4
