"""Calls that name a model (issue 14): the router resolves the name through the pool,
loads a model that is not resident within the call's deadline, and admits the call on
that model's own slots; scripted models, no processes."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from daemon.config._catalog import Catalog
from daemon.errors import DeadlineUnmeetable, FailedPrecondition, InvalidArgument, UnknownModel
from daemon.models.children import make_setup
from daemon.models.router import InferenceRouter
from tests.support.scripted import PERMANENT
from tests.support.scripted_model import RUNTIME
from tests.support.scripted_pool import Rig, until


@pytest.fixture
async def rig(tmp_path: Path) -> Rig:
    return await Rig(tmp_path).started()


def router_of(rig: Rig) -> InferenceRouter:
    router = InferenceRouter({"generation": rig.default})
    router.attach(rig.pool)
    return router


async def test_a_named_model_is_loaded_and_admitted_on_its_own_slots(rig: Rig) -> None:
    router = router_of(rig)
    assert router.model_name("generation") == "gen-a"
    assert router.model_name("generation", "b") == "gen-b"
    async with router.admit("generation", None, model="b"):
        model = rig.pool.model("gen-b")
        assert model is not None
        assert model.admission.in_flight == 1
        assert rig.default.admission.in_flight == 0
    assert rig.launches("gen-b") == 1
    assert rig.pool.view("gen-b").last_used is not None
    # Resident now: the next call starts nothing.
    async with router.admit("generation", None, model="gen-b"):
        pass
    assert rig.launches("gen-b") == 1
    # The default by name, and by no name, is the role's model.
    async with router.admit("generation", None, model="gen-a"):
        assert rig.default.admission.in_flight == 1
    assert rig.launches("gen-a") == 1


async def test_concurrent_first_calls_share_one_start(rig: Rig) -> None:
    router = router_of(rig)
    rig.outcomes["gen-c"] = ["hang"]
    entered = 0

    async def call() -> None:
        nonlocal entered
        async with router.admit("generation", None, model="gen-c"):
            entered += 1

    calls = [asyncio.create_task(call()) for _ in range(3)]
    await until(lambda: rig.launchers.get("gen-c") is not None
                and rig.launchers["gen-c"][-1].hanging is not None)
    hanging = rig.launchers["gen-c"][-1].hanging
    assert hanging is not None
    hanging.set_result(None)
    await asyncio.gather(*calls)
    assert entered == 3
    assert rig.launches("gen-c") == 1


async def test_names_that_cannot_serve_are_refused(rig: Rig) -> None:
    router = router_of(rig)
    with pytest.raises(UnknownModel, match="the models are: gen-a, gen-b, gen-c, emb"):
        async with router.admit("generation", None, model="nope"):
            pass
    with pytest.raises(InvalidArgument, match="'emb' is a embedding model"):
        async with router.admit("generation", None, model="emb"):
            pass
    assert router.role_of("emb") == "embedding"
    rig.outcomes["gen-c"] = [PERMANENT]
    with pytest.raises(FailedPrecondition, match="'gen-c' could not be loaded: error "
                                                 "loading model"):
        async with router.admit("generation", None, model="gen-c"):
            pass
    assert rig.built == ["gen-c"]  # nothing else was started


async def test_a_load_longer_than_the_deadline_is_refused_and_goes_on(rig: Rig) -> None:
    router = router_of(rig)
    rig.outcomes["gen-b"] = ["hang"]
    with pytest.raises(DeadlineUnmeetable, match="not loaded before the call's deadline"):
        async with router.admit("generation", 0.05, model="gen-b"):
            pass
    await until(lambda: rig.launchers.get("gen-b") is not None
                and rig.launchers["gen-b"][-1].hanging is not None)
    hanging = rig.launchers["gen-b"][-1].hanging
    assert hanging is not None
    hanging.set_result(None)  # the load the refused call began goes on
    await until(lambda: rig.pool.is_resident("gen-b"))


async def test_without_a_pool_only_the_roles_serve(rig: Rig) -> None:
    router = InferenceRouter({"generation": rig.default})
    assert router.model_name("generation") == "generation"
    with pytest.raises(UnknownModel):
        router.model_name("generation", "gen-b")


async def test_a_call_resolves_its_model_once_a_reload_meanwhile_changes_nothing(
        rig: Rig) -> None:
    """Calls naming gen-b by its alias wait for its load, a reload takes the alias away
    meanwhile: every call is still served by gen-b, and the pool knows each entered its
    queue (issue 26: the router named the model again on the way in, and those calls
    failed with NOT_FOUND)."""
    router = router_of(rig)
    rig.outcomes["gen-b"] = ["hang"]
    release = asyncio.Event()
    served: list[str] = []

    async def call() -> None:
        async with router.admit("generation", None, model="b") as backend:
            served.append(backend.model_name)
            await release.wait()

    calls = [asyncio.create_task(call()) for _ in range(6)]  # more than gen-b's slots
    await until(lambda: rig.launchers.get("gen-b") is not None
                and rig.launchers["gen-b"][-1].hanging is not None)
    entries = tuple(dataclasses.replace(e, aliases=()) if e.name == "gen-b" else e
                    for e in rig.catalog.entries)
    reload = asyncio.create_task(rig.pool.reconfigure(
        Catalog(entries, rig.catalog.defaults),
        lambda e: make_setup(e.role, e.path, RUNTIME, e.child)))
    hanging = rig.launchers["gen-b"][-1].hanging
    assert hanging is not None
    hanging.set_result(None)
    assert (await reload).updated == ["gen-b"]
    gen_b = rig.pool.model("gen-b")
    assert gen_b is not None
    await until(lambda: len(served) > 0 and len(served) + gen_b.admission.queued == 6)
    assert gen_b.admission.queued  # some wait their turn, after the reload
    release.set()
    await asyncio.gather(*calls)
    assert len(served) == 6 and gen_b.admission.served_by(gen_b.serving_pid) == 6
    with pytest.raises(UnknownModel):  # the alias is gone for the calls after the reload
        router.model_name("generation", "b")
    assert rig.pool._entering_calls("gen-b") == 0
