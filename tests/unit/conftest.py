"""Fixtures shared by unit-directory modules (the global ones are in tests/conftest.py): the
fake child spawner of the fake child's tests (process tier), the logging configuration
put back after a test that configures it, and the fake daemon the client tests call with
the ``llamad`` command run in-process against it."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from clients.testing import FakeLlamad
from tests.support.cli_run import Run, runner
from tests.support.fake_children import Spawner


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawner]:
    """Yield a Spawner whose children are killed and reaped whatever the test does."""
    spawner = Spawner(tmp_path)
    try:
        yield spawner
    finally:
        spawner.close()


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """logs.configure changes process-wide state: put it back for the other tests."""
    saved = structlog.get_config()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    noisy = {n: logging.getLogger(n).level for n in ("httpx", "httpcore")}
    yield
    structlog.configure(**saved)
    root.handlers[:], root.level = handlers, level
    for name, lvl in noisy.items():
        logging.getLogger(name).setLevel(lvl)


@pytest.fixture
def fake() -> Iterator[FakeLlamad]:
    """A fake llamad (clients.testing) on a loopback port, stopped after the test."""
    with FakeLlamad() as server:
        yield server


@pytest.fixture
def llamad(fake: FakeLlamad, capsys: pytest.CaptureFixture[str],
           monkeypatch: pytest.MonkeyPatch) -> Run:
    """Run ``llamad ARGS`` in-process against :func:`fake` ($LLAMAD_ADDRESS); return
    (status, stdout, stderr)."""
    monkeypatch.setenv("LLAMAD_ADDRESS", fake.address)
    return runner(capsys, monkeypatch)
