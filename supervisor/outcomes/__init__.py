"""Health from outcomes (issue 28): a child judged by what its calls come to, not only by
its ``/health``. :class:`Outcomes` records a child's calls, :func:`watch_outcomes` takes
it out of service when they fail in a row or its 1-token probe fails or stalls, and
:class:`WatchedClient` is the client of a launched child, whose calls it records (see
:mod:`supervisor.outcomes._watch`)."""

from ._client import WatchedClient
from ._watch import (
    CALLS_FAILING,
    OUTCOME_KINDS,
    PROBE_FAILED,
    PROBE_STALLED,
    OutcomePolicy,
    Outcomes,
    watch_outcomes,
)

__all__ = [
    "CALLS_FAILING",
    "OUTCOME_KINDS",
    "PROBE_FAILED",
    "PROBE_STALLED",
    "OutcomePolicy",
    "Outcomes",
    "WatchedClient",
    "watch_outcomes",
]
