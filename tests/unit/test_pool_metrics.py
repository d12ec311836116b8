"""The pool's metrics (issue 14): loads by outcome, unloads by reason and residency, one
series per catalog model name (never anything else)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from daemon.config._sections import PoolSettings
from daemon.errors import Overloaded
from daemon.models.router import InferenceRouter
from daemon.telemetry.metrics import Metrics
from supervisor import State
from tests.support.scripted import settle
from tests.support.scripted_pool import Rig, until


def value(metrics: Metrics, name: str, **labels: str) -> float:
    sample = metrics.registry.get_sample_value(name, labels)
    return 0.0 if sample is None else sample


async def test_loads_unloads_and_residency_are_counted_per_model(tmp_path: Path) -> None:
    metrics = Metrics(version="test", models=["gen-a", "gen-b", "gen-c", "emb"])
    rig = Rig(tmp_path, PoolSettings(max_resident=2), metrics=metrics, pinned=("gen-c",))
    rig.default.start()
    await settle(rig.default.supervisor, State.RUNNING)
    assert value(metrics, "llamad_model_resident", model="gen-b") == 0
    await rig.pool.load("gen-b")
    assert value(metrics, "llamad_model_loads_total", model="gen-b", outcome="ok") == 1
    assert value(metrics, "llamad_model_resident", model="gen-b") == 1
    await rig.pool.load("gen-c")  # evicts gen-b
    assert value(metrics, "llamad_model_unloads_total", model="gen-b", reason="room") == 1
    assert value(metrics, "llamad_model_resident", model="gen-b") == 0
    with pytest.raises(Overloaded):  # gen-c is pinned, gen-a the default: no room
        await rig.pool.load("emb")
    assert value(metrics, "llamad_model_loads_total", model="emb", outcome="rejected") == 1
    await rig.pool.unload("gen-c")
    assert value(metrics, "llamad_model_unloads_total", model="gen-c", reason="admin") == 1
    text = metrics.render().decode()
    names = {line.split('model="')[1].split('"')[0] for line in text.splitlines()
             if 'model="' in line}
    assert names == {"gen-a", "gen-b", "gen-c", "emb"}


async def test_in_flight_queue_depth_and_rejections_count_every_model_of_a_role(
        tmp_path: Path) -> None:
    """A call on a model loaded on demand is in flight (and one waiting for its slots is
    queued, one refused is counted) under its role, beside the calls on the role's
    default: the role's series add up every model of the role (issue 26)."""
    metrics = Metrics(version="test", models=["gen-a", "gen-b", "gen-c", "emb"])
    rig = Rig(tmp_path, metrics=metrics)
    rig.default.start()
    await settle(rig.default.supervisor, State.RUNNING)
    router = InferenceRouter({"generation": rig.default})
    router.attach(rig.pool)

    def gauges() -> tuple[float, float]:
        return (value(metrics, "llamad_requests_in_flight", role="generation"),
                value(metrics, "llamad_queue_depth", role="generation"))

    async with contextlib.AsyncExitStack() as calls:
        await calls.enter_async_context(router.admit("generation", None, model="b"))
        gen_b = rig.pool.model("gen-b")
        assert gen_b is not None and gen_b.admission.capacity > 1
        slots = gen_b.admission.capacity
        for _ in range(slots - 1):  # every slot of gen-b taken
            await calls.enter_async_context(router.admit("generation", None, model="b"))
        assert gauges() == (slots, 0)
        await calls.enter_async_context(router.admit("generation", None))  # gen-a's
        assert gauges() == (slots + 1, 0)
        waiting = asyncio.create_task(calls.enter_async_context(
            router.admit("generation", None, model="gen-b")))
        await until(lambda: gauges() == (slots + 1, 1))
        gen_b.set_queue_size(1)
        with pytest.raises(Overloaded):  # its queue is full
            async with router.admit("generation", None, model="gen-b"):
                pass
        assert value(metrics, "llamad_rejections_total", role="generation",
                     reason="queue_full") == 1
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
        assert gauges() == (slots + 1, 0)
    assert gauges() == (0, 0)
