"""Health entries per catalog model (issue 14): ``model/<name>`` is SERVING while that
model is resident and ready, NOT_SERVING otherwise and while the node drains; a load or
an unload re-evaluates health; scripted models, no processes."""

from __future__ import annotations

from pathlib import Path

from daemon.grpcapi.health import NOT_SERVING, SERVING, HealthReporter
from llamad_protocol.v1.wire import HEALTH_MODEL_PREFIX
from supervisor import State
from tests.support.scripted import settle
from tests.support.scripted_pool import Rig


def _models(statuses: dict[str, int]) -> dict[str, int]:
    return {name.removeprefix(HEALTH_MODEL_PREFIX): status
            for name, status in statuses.items() if name.startswith(HEALTH_MODEL_PREFIX)}


async def test_one_entry_per_catalog_model_follows_its_residency(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.default.start()
    await settle(rig.default.supervisor, State.RUNNING)
    health = HealthReporter(rig.pool)
    queued = health._queue  # re-evaluations asked for, applied by its loop once started
    assert _models(health.statuses()) == {"gen-a": SERVING, "gen-b": NOT_SERVING,
                                          "gen-c": NOT_SERVING, "emb": NOT_SERVING}
    await rig.pool.load("gen-b")
    assert queued.qsize() > 0  # the load told health to look again
    assert _models(health.statuses())["gen-b"] == SERVING
    while not queued.empty():
        queued.get_nowait()
    await rig.pool.unload("gen-b")
    assert queued.qsize() > 0
    assert _models(health.statuses())["gen-b"] == NOT_SERVING
    health.set_drained(True)
    assert set(_models(health.statuses()).values()) == {NOT_SERVING}


def test_without_a_pool_there_are_no_model_entries() -> None:
    assert _models(HealthReporter().statuses()) == {}
