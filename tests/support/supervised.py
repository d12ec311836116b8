"""A supervised fake child (supervisor.testing's) in real processes, as the fault tests
(tests/integration/test_faults*.py) run it: fast start and probe deadlines, a quick restart
policy, and a :class:`Harness` that records every state change."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from supervisor import (
    LaunchSpec,
    LogRing,
    ProcessLauncher,
    RestartPolicy,
    StateChange,
    Supervisor,
    SystemClock,
    Timeouts,
)
from supervisor.testing.fake_runtime import FakeRuntime

FAST = Timeouts(start=2.0, start_cap=4.0, probe_interval=0.2, probe_timeout=0.3,
                probe_failures=2, stop_grace=1.0)
POLICY = RestartPolicy(base=0.05, cap=0.2, max_failures=3, stable_after=60.0, cooldown=None)


def fake_model(directory: Path) -> Path:
    """A file the fake child accepts as its model (``directory/fake.gguf``)."""
    path = directory / "fake.gguf"
    path.write_bytes(b"GGUF fake")
    return path


class Harness:
    """A supervisor of one generation child, its log ring, its runtime and the state
    changes it went through (``changes``)."""

    def __init__(self, sup: Supervisor, ring: LogRing, runtime: FakeRuntime) -> None:
        self.sup = sup
        self.ring = ring
        self.runtime = runtime
        self.changes: list[StateChange] = []
        sup.subscribe(self.changes.append)

    def states(self) -> list[str]:
        return [c.new.value for c in self.changes]

    async def until(self, predicate: str, timeout: float = 10.0) -> None:
        """Wait until the state sequence contains ``predicate`` (a comma-joined run)."""
        deadline = time.monotonic() + timeout
        while predicate not in ",".join(self.states()):
            if time.monotonic() > deadline:
                raise AssertionError(f"never saw {predicate!r}; saw {self.states()}")
            await asyncio.sleep(0.02)


def supervise(model: Path, runtime: FakeRuntime, *, timeouts: Timeouts = FAST,
              policy: RestartPolicy = POLICY, ring_lines: int = 200,
              **launcher: Any) -> Harness:
    """A harness of a supervisor (not started) launching ``runtime``'s child on ``model``;
    ``launcher`` goes to :class:`ProcessLauncher` (``socket_picker``)."""
    ring = LogRing(ring_lines)
    spec = LaunchSpec(role="generation", model=model)
    launch = ProcessLauncher(spec, runtime, clock=SystemClock(), ring=ring, timeouts=timeouts,
                             **launcher)
    return Harness(Supervisor("generation", launch, policy=policy), ring, runtime)
