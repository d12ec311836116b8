"""Test tiers (a pytest plugin, loaded by ``tests/conftest.py``).

Every test is in exactly one tier, marked so that ``-m`` selects it:

* ``unit``: in-process only (fakes, tmp files, loopback servers in this process); the
  default for ``tests/unit``, and refused elsewhere in ``tests/`` (``make check`` collects
  ``tests/unit`` alone). It may start no OS process: one that does fails and is told
  to mark itself ``process``. ``make check`` runs this tier.
* ``process``: starts real OS processes that are not llama.cpp (the fake child, ``python
  -c`` snippets, the PDF worker, openssl, pip); the default for ``tests/integration``
  files without ``integration``, and explicit (``@pytest.mark.process``) in ``tests/unit``.
* ``integration``: real GGUF models, mostly served by real llama.cpp children (explicit).

Each tier has its own timeout, applied unless the test (or its module) sets one, so that
a hung unit test fails sooner than after the integration tier's; each is scaled by the load
factor of ``tests/support/load.py`` (a busy machine is not a hang).
"""

from __future__ import annotations

import _posixsubprocess
import os
import subprocess
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import pytest

from tests.support.load import patience

UNIT, PROCESS, INTEGRATION = "unit", "process", "integration"
TIERS = (UNIT, PROCESS, INTEGRATION)
# Seconds on a quiet 2-core machine, where the slowest unit test takes ~7 s
# (test_extract_html.py::test_gigantic_html_within_max_bytes) and the slowest process test ~2 s
# (the fake child's slow start), integration 300 s (a model's load); times LOAD (10 unless
# $LLAMAD_TEST_LOAD says otherwise), so that a machine with 20 runnable threads on its 2
# cores passes and a hang still fails.
TIMEOUTS = {UNIT: patience(20), PROCESS: patience(60), INTEGRATION: patience(300)}

_TESTS_DIR = Path(__file__).resolve().parent
_UNIT_DIR = _TESTS_DIR / "unit"
_STARTED = pytest.StashKey[list[str]]()


def tier(item: pytest.Item) -> str:
    """The item's tier: its marker, else its directory's default."""
    marked = [name for name in (INTEGRATION, PROCESS, UNIT) if item.get_closest_marker(name)]
    if len(marked) > 1:
        raise pytest.UsageError(f"{item.nodeid} is marked {' and '.join(marked)}: one tier")
    in_unit_dir = _UNIT_DIR in item.path.parents
    if marked == [UNIT] and not in_unit_dir and _TESTS_DIR in item.path.parents:
        # `make check` collects tests/unit alone, and `make test` runs every tier but unit:
        # a unit test elsewhere in tests/ would run in neither.
        raise pytest.UsageError(f"{item.nodeid} is marked unit outside tests/unit: move it "
                                "there, or mark it process")
    if marked:
        return marked[0]
    return UNIT if in_unit_dir else PROCESS


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        name = tier(item)
        item.add_marker(name)
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(TIMEOUTS[name]))


# --- no processes in the unit tier -----------------------------------------------------------

# Every way a test could start a process: subprocess and asyncio's subprocesses go through
# Popen._execute_child; multiprocessing through _posixsubprocess.fork_exec or os.fork.
_SPAWNERS: list[tuple[Any, str]] = [
    (subprocess.Popen, "_execute_child"), (_posixsubprocess, "fork_exec"), (os, "fork"),
    (os, "forkpty"), (os, "posix_spawn"), (os, "posix_spawnp"), (os, "system"),
]


def _refusing(item: pytest.Item, name: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        argv = next((a for a in args if isinstance(a, (list, tuple, str, bytes))), "")
        what = f"{name}({argv!r})"[:200]
        item.stash[_STARTED].append(what)
        raise RuntimeError(f"a unit test started a process ({what}): mark the test "
                           "@pytest.mark.process (tests/tiers.py)")
    return refuse


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    if not item.get_closest_marker(UNIT):
        return (yield)
    item.stash[_STARTED] = []
    saved = [(owner, name, getattr(owner, name)) for owner, name in _SPAWNERS]
    for owner, name, _ in saved:
        setattr(owner, name, _refusing(item, name))
    try:
        return (yield)
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
        item: pytest.Item) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A unit test that started a process fails even if the code under test swallowed the
    refusal."""
    report = yield
    started = item.stash.get(_STARTED, [])
    if started and report.passed:
        report.outcome = "failed"
        report.longrepr = (f"a unit test started a process: {'; '.join(started)}; mark it "
                           "@pytest.mark.process (tests/tiers.py)")
    started.clear()
    return report
