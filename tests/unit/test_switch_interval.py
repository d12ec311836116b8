"""``[limits] switch_interval_ms``: how long a daemon thread may keep the interpreter while
another waits (a search's thread behind an ingest's chunking); set when the daemon is made
and again by a reload."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon.config import ConfigError, load
from daemon.server import Daemon
from tests.support.models import write_model


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A daemon's environment on synthetic GGUF files (nothing here starts a child); the
    process's switch interval restored after."""
    folder = tmp_path / "models"
    folder.mkdir()
    write_model(folder / "gen.gguf")
    write_model(folder / "emb.gguf", architecture="bert", pooling=1)
    before = sys.getswitchinterval()
    yield {"LLAMAD_LISTEN": "127.0.0.1:0", "LLAMAD_STATE_DIR": str(tmp_path / "state"),
           "LLAMAD_MODELS_DIR": str(folder),
           "LLAMAD_GENERATION_MODEL": str(folder / "gen.gguf"),
           "LLAMAD_EMBEDDING_MODEL": str(folder / "emb.gguf"),
           "LLAMAD_RETRIEVAL_WATCH": "false"}
    sys.setswitchinterval(before)


def test_the_daemon_sets_the_switch_interval(env: dict[str, str]) -> None:
    sys.setswitchinterval(0.005)  # Python's default
    Daemon(load(None, env=env))
    assert sys.getswitchinterval() == pytest.approx(0.001)  # the default, 1 ms
    Daemon(load(None, env={**env, "LLAMAD_LIMITS_SWITCH_INTERVAL_MS": "2.5"}))
    assert sys.getswitchinterval() == pytest.approx(0.0025)


def test_a_value_under_a_tenth_of_a_millisecond_is_refused(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="switch_interval_ms"):
        load(None, env={**env, "LLAMAD_LIMITS_SWITCH_INTERVAL_MS": "0.01"})
