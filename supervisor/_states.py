"""The child state machine: named states, the legal transitions, and nothing else.

Every transition the supervisor makes goes through :func:`check_transition`; a move that
is not in :data:`TRANSITIONS` raises :class:`IllegalTransitionError`, because it means the
supervision loop has a bug, and a bug in a state machine hidden by a silent fix-up is how
daemons end up "running" a dead child.
"""

from __future__ import annotations

import enum

from .errors import IllegalTransitionError


class State(enum.Enum):
    """Where a supervised child is in its life."""

    IDLE = "idle"
    STARTING = "starting"
    RUNNING = "running"
    BACKOFF = "backoff"
    FAILED = "failed"
    STOPPED = "stopped"


TRANSITIONS: dict[State, frozenset[State]] = {
    # Configured, never started: start it, or stop before it ever ran.
    State.IDLE: frozenset({State.STARTING, State.STOPPED}),
    State.STARTING: frozenset({
        State.RUNNING,   # health answered and a tiny real request succeeded
        State.BACKOFF,   # transient start failure, breaker still closed
        State.FAILED,    # permanent failure (bad model, bad arguments) or breaker tripped
        State.STOPPED,   # stop requested while starting
    }),
    State.RUNNING: frozenset({
        State.BACKOFF,   # crashed or hung; will restart after a delay
        State.FAILED,    # crashed and that failure tripped the breaker
        State.STOPPED,   # stop requested
    }),
    State.BACKOFF: frozenset({
        State.STARTING,  # the delay elapsed, or a reset cut it short
        State.STOPPED,   # stop requested while waiting
    }),
    State.FAILED: frozenset({
        State.STARTING,  # reset by an operator, or the breaker's cool-down passed
        State.STOPPED,   # stop requested
    }),
    # Stopped on purpose: only an explicit start brings it back.
    State.STOPPED: frozenset({State.STARTING}),
}


def check_transition(old: State, new: State) -> None:
    """Raise :class:`IllegalTransitionError` unless ``old -> new`` is in the table."""
    if new not in TRANSITIONS[old]:
        raise IllegalTransitionError(f"illegal transition {old.value} -> {new.value}")
