"""The one liveness loop, for a supervised child and an external endpoint alike.

Every ``probe_interval`` it asks the server whether it is alive, unless a call is running
and heard from the server within ``busy_silence`` (a busy llama.cpp server may not answer
a probe while it works on a long prompt: its progress is the proof of life). After
``probe_failures`` failed probes in a row it returns why, and the supervisor restarts or
reconnects. Time is the injected clock's, so the tests drive every edge without sleeping.

``/health`` is answered by llama-server's HTTP threads even while its serving loop is stuck:
a child's calls are judged too, by :mod:`supervisor.outcomes`, beside this loop.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ._clock import Clock
from ._exits import ExitCause
from ._transport import Activity


@dataclass(frozen=True)
class ProbeFailure:
    """A failed probe: the exit kind it would be, whether retrying is futile, and why."""

    kind: str
    permanent: bool
    detail: str


Probe = Callable[[], Awaitable[ProbeFailure | None]]
"""One liveness probe: None when the server is alive."""


@dataclass(frozen=True)
class ProbePolicy:
    """How often to probe, and how much failure or silence to accept."""

    interval: float
    failures: int
    busy_silence: float


async def watch_liveness(
    probe: Probe,
    *,
    activity: Activity,
    clock: Clock,
    policy: ProbePolicy,
    exited: Callable[[], ExitCause | None] = lambda: None,
    pause: Callable[[float], Awaitable[None]] | None = None,
) -> ExitCause:
    """Return why the server stopped serving: ``policy.failures`` probes failed in a row,
    or (checked around each probe) ``exited`` reports the process gone.

    Args:
        pause: waits between probes (default ``clock.sleep``); a child's also wakes the
            moment its process exits.
    """
    wait = clock.sleep if pause is None else pause
    failures = 0
    while True:
        await wait(policy.interval)
        if (gone := exited()) is not None:
            return gone
        if (activity.in_flight > 0
                and clock.monotonic() - activity.last_progress < policy.busy_silence):
            failures = 0
            continue
        failure = await probe()
        if (gone := exited()) is not None:
            return gone
        if failure is None:
            failures = 0
            continue
        failures += 1
        if failures >= policy.failures:
            return ExitCause(
                failure.kind, failure.permanent,
                f"{failures} liveness probes failed in a row ({failure.detail})",
                at=clock.wall())
