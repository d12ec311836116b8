"""The drain: let the calls running on something finish, up to a bound.

One loop for every drain llamad does — the old child after a swap's take-over
(:meth:`supervisor.Supervisor.swap`), and a model going out of service
(:meth:`daemon.models.model.Model.unload`) — so "bounded by the drain timeout" means the same
everywhere. Calls ending signal nothing, so it polls; time comes from the injected clock.
"""

from __future__ import annotations

from collections.abc import Callable

from ._clock import Clock

POLL_SECONDS = 0.01
"""How often a drain looks at the number of calls running: a model switch with room for
one waits for the outgoing model's drain, half a poll on average past its last call
(a look is a counter read, 100 a second only while something drains)."""


async def drain(in_flight: Callable[[], int], timeout: float, clock: Clock) -> int:
    """Wait until ``in_flight()`` is 0 or ``timeout`` seconds passed; return the calls
    still running (0: drained; more: the bound cut the drain short).

    Cancellation: cancelling the caller ends the wait at once (nothing is stopped here).
    """
    deadline = clock.monotonic() + timeout
    while (running := in_flight()) > 0 and clock.monotonic() < deadline:
        await clock.sleep(POLL_SECONDS)
    return running
