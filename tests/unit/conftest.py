"""Fixtures shared by unit-directory modules (the global ones are in tests/conftest.py): the
fake child spawner of the fake child's tests (process tier), and the logging configuration
put back after a test that configures it."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

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
