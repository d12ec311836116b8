"""Fixtures shared by unit-directory modules (the global ones are in tests/conftest.py): the
fake child spawner of the fake child's tests (process tier)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.fake_children import Spawner


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawner]:
    """Yield a Spawner whose children are killed and reaped whatever the test does."""
    spawner = Spawner(tmp_path)
    try:
        yield spawner
    finally:
        spawner.close()
