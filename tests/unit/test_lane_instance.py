"""The background instance's decisions that need no child (issue 28): which models get
one, and that interactive calls, lanes off, or a model not serving never start one (the
calls then go to the model's own child)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from daemon.config.role import background_instance_wanted as wanted
from daemon.models._states import ModelState
from daemon.models.lane_instance import instance_threads
from daemon.models.lanes import Lane, LanePolicy
from tests.support.daemon import make_daemon
from tests.support.models import write_model


@pytest.fixture
def models(tmp_path: Path) -> dict[str, str]:
    """The environment of a daemon whose two models are synthetic GGUF files (the unit tier
    runs before ``make models``; nothing here starts a child)."""
    folder = tmp_path / "models"
    folder.mkdir()
    write_model(folder / "gen.gguf")
    write_model(folder / "emb.gguf", architecture="bert", pooling=1)
    state = tmp_path / "state"
    state.mkdir()
    return {"LLAMAD_LISTEN": "127.0.0.1:0", "LLAMAD_STATE_DIR": str(state),
            "LLAMAD_MODELS_DIR": str(folder),
            "LLAMAD_GENERATION_MODEL": str(folder / "gen.gguf"),
            "LLAMAD_EMBEDDING_MODEL": str(folder / "emb.gguf"),
            "LLAMAD_RETRIEVAL_WATCH": "false"}


def test_auto_is_on_for_embedding_models_and_off_for_generation_models() -> None:
    assert wanted("auto", "embedding") and not wanted("auto", "generation")
    assert wanted("true", "generation") and not wanted("false", "embedding")


def test_generation_models_get_none_by_default_and_one_when_asked(
        models: dict[str, str]) -> None:
    daemon = make_daemon(models)
    assert daemon.children["generation"].lane_instance is None
    assert daemon.children["embedding"].lane_instance is not None
    asked = make_daemon({**models, "LLAMAD_GENERATION_BACKGROUND_INSTANCE": "true",
                         "LLAMAD_EMBEDDING_BACKGROUND_INSTANCE": "false"})
    assert asked.children["generation"].lane_instance is not None
    assert asked.children["embedding"].lane_instance is None


async def test_nothing_starts_one_but_a_lower_lane_call_to_a_serving_model(
        models: dict[str, str]) -> None:
    """Not started (the model is not serving yet), whatever the lane; with the model
    serving, an interactive call or lanes off still start nothing."""
    daemon = make_daemon(models)
    model = daemon.children["embedding"]
    instance = model.lane_instance
    assert instance is not None
    for lane in Lane:
        assert instance.gate(lane) is None
    assert instance.supervisor is None and instance.status == "off"
    model._move(ModelState.SERVING)  # serving, as start() makes it (no child needed)
    assert instance.gate(Lane.INTERACTIVE) is None
    model.admission.configure(dataclasses.replace(LanePolicy(), enabled=False))
    assert instance.gate(Lane.BACKGROUND) is None
    assert instance.supervisor is None


def test_the_instance_gets_half_the_cores_unless_told() -> None:
    """``limits.background_instance_threads`` 0: half the cores, at most the model's own
    threads, at least one (it runs beside the interactive children); a positive value as
    given."""
    assert [instance_threads(n, 0, cores=2) for n in (1, 2)] == [1, 1]
    assert [instance_threads(n, 0, cores=16) for n in (4, 8, 16)] == [4, 8, 8]
    assert instance_threads(1, 0, cores=1) == 1
    assert instance_threads(2, 2, cores=2) == 2 and instance_threads(8, 3, cores=16) == 3


def test_an_embedding_model_with_an_instance_gets_half_the_cores(
        models: dict[str, str]) -> None:
    """Its threads left at the default, an embedding model with a background instance
    gets half the cores (the instance the other half); lanes off, no instance, or threads
    set: its threads as configured."""
    cores = os.cpu_count() or 2
    half = max(1, cores // 2)
    assert make_daemon(models).children["embedding"].setup.spec.threads == half
    for more in ({"LLAMAD_LIMITS_LANES": "false"},
                 {"LLAMAD_EMBEDDING_BACKGROUND_INSTANCE": "false"}):
        assert make_daemon({**models, **more}).children["embedding"].setup.spec.threads == cores
    told = make_daemon({**models, "LLAMAD_EMBEDDING_THREADS": "3"})
    assert told.children["embedding"].setup.spec.threads == 3
    assert make_daemon(models).children["generation"].setup.spec.threads == cores
