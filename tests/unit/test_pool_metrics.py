"""The pool's metrics (issue 14): loads by outcome, unloads by reason and residency, one
series per catalog model name (never anything else); each model's slots, queue,
refusals and calls under its own name (issue 28)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from daemon.config._sections import PoolSettings
from daemon.errors import Overloaded
from daemon.telemetry.metrics import Metrics
from tests.support.model_metrics import RIG_MODELS, routed
from tests.support.scripted_pool import Rig, until


def value(metrics: Metrics, name: str, **labels: str) -> float:
    sample = metrics.registry.get_sample_value(name, labels)
    return 0.0 if sample is None else sample


async def test_loads_unloads_and_residency_are_counted_per_model(tmp_path: Path) -> None:
    metrics = Metrics(version="test", models=RIG_MODELS)
    rig = await Rig(tmp_path, PoolSettings(max_resident=2), metrics=metrics,
                    pinned=("gen-c",)).started()
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


async def test_slots_queue_rejections_and_calls_are_counted_per_model(
        tmp_path: Path) -> None:
    """A call on a model loaded on demand is in flight (one waiting for its slots queued,
    one refused counted, each call counted by outcome) under that model's name, apart
    from the calls on the role's default; the role's totals are the sum by role."""
    metrics = Metrics(version="test", models=RIG_MODELS)
    rig = Rig(tmp_path, metrics=metrics)
    router = await routed(rig, metrics)

    def gauges(model: str) -> tuple[float, float]:
        return (value(metrics, "llamad_requests_in_flight", role="generation", model=model),
                value(metrics, "llamad_queue_depth", role="generation", model=model))

    def role_totals() -> tuple[float, float]:
        each = [gauges(name) for name, role in RIG_MODELS.items() if role == "generation"]
        return (sum(busy for busy, _ in each), sum(queued for _, queued in each))

    def calls(model: str, outcome: str) -> float:
        return value(metrics, "llamad_model_calls_total", role="generation", model=model,
                     outcome=outcome)

    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(router.admit("generation", None, model="b"))
        gen_b = rig.pool.model("gen-b")
        assert gen_b is not None and gen_b.admission.capacity > 1
        slots = gen_b.admission.capacity
        for _ in range(slots - 1):  # every slot of gen-b taken
            await stack.enter_async_context(router.admit("generation", None, model="b"))
        assert gauges("gen-b") == (slots, 0)
        assert gauges("gen-a") == (0, 0)
        await stack.enter_async_context(router.admit("generation", None))  # gen-a's
        assert gauges("gen-a") == (1, 0)
        assert role_totals() == (slots + 1, 0)
        waiting = asyncio.create_task(stack.enter_async_context(
            router.admit("generation", None, model="gen-b")))
        await until(lambda: gauges("gen-b") == (slots, 1))
        gen_b.set_queue_size(1)
        with pytest.raises(Overloaded):  # its queue is full
            async with router.admit("generation", None, model="gen-b"):
                pass
        assert value(metrics, "llamad_rejections_total", role="generation", model="gen-b",
                     reason="queue_full") == 1
        assert value(metrics, "llamad_rejections_total", role="generation", model="gen-a",
                     reason="queue_full") == 0
        assert calls("gen-b", "error") == 1
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
        assert calls("gen-b", "cancelled") == 1
        assert gauges("gen-b") == (slots, 0)
    assert role_totals() == (0, 0)
    assert (calls("gen-b", "ok"), calls("gen-a", "ok"), calls("gen-c", "ok")) == (slots, 1, 0)
