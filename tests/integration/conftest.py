"""Fixtures shared by integration modules (the global ones are in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from tests.support.daemon_process import DaemonProcess


@pytest.fixture
def processes() -> Iterator[Callable[..., DaemonProcess]]:
    """Starts daemon processes; kills any still running at the end (never leaks one)."""
    started: list[DaemonProcess] = []

    def start(tmp: Path, env: dict[str, str], prefix: Sequence[str] = ()) -> DaemonProcess:
        d = DaemonProcess(tmp, env, prefix)
        started.append(d)
        return d

    yield start
    for d in started:
        d.kill()
