"""The pool's metrics (issue 14): loads by outcome, unloads by reason and residency, one
series per catalog model name (never anything else)."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.config._sections import PoolSettings
from daemon.errors import Overloaded
from daemon.telemetry.metrics import Metrics
from supervisor import State
from tests.support.scripted import settle
from tests.support.scripted_pool import Rig


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
