"""How busy a machine the tests allow for: one factor that every wall-clock bound of a test
scales by, so that ``make test`` passes on a loaded machine and still fails on a hang.

A test's wall-clock bound waits for an event (a child's readiness, a process's exit, a
watcher's scan); it is not a speed check. Speed is measured in ``bench/``; growth (linear
time) is checked in CPU time (:mod:`tests.support.scaling`) or by counting steps. A bound
is written as what a quiet machine needs with its usual headroom, times :data:`LOAD`, the
slowdown of a busy one: with 20 runnable threads on 2 cores each gets a tenth of a core.
"""

from __future__ import annotations

import os

LOAD = float(os.environ.get("LLAMAD_TEST_LOAD") or 10.0)
"""How many times slower than a quiet machine a test may run before a wait counts as a
hang ($LLAMAD_TEST_LOAD; 1 makes hangs fail fastest on a quiet machine)."""
if not LOAD >= 1.0:
    raise ValueError(f"LLAMAD_TEST_LOAD must be a number >= 1, not {LOAD}")


def patience(seconds: float) -> float:
    """A wait of ``seconds`` on a quiet machine, stretched for a loaded one."""
    return seconds * LOAD
