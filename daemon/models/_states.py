"""A model's own state machine: named states, the legal transitions, and nothing else.

This is the model's residency and the operation it is in — what only the model object
decides — not its child's health, which the supervisor's machine
(:mod:`supervisor._states`: starting, running, backoff, failed) keeps, once. The two
together give what an operator sees (:attr:`daemon.models.model.Model.status`)::

    unloaded ──load──► loading ──ready──► serving ──replace──► swapping ──┐
        │  ▲              │                 ▲  │                          │
        │  └──not ready───┘                 │  └──unload──► draining ─────┼──► unloaded
        └──────────────start────────────────┘        cut over, or failed ─┘ (back to serving)
    any ──stop (daemon shutdown)──► stopped

Every change goes through :func:`check_transition`; a move not in :data:`TRANSITIONS`
raises :class:`~supervisor.IllegalTransitionError`, because it means an operation on the
model has a bug (llama-swap's ``Process.swapState`` with ``isValidTransition`` is the
anchor, and :mod:`supervisor._states` the house pattern).
"""

from __future__ import annotations

import enum

import structlog

from supervisor import IllegalTransitionError, State

_log = structlog.get_logger("llamad.model")


class ModelState(enum.Enum):
    """Where a model is in its life, as its owner (:class:`daemon.models.model.Model`) decides."""

    UNLOADED = "unloaded"
    """Nothing runs for it: disabled, not started yet, or unloaded."""
    LOADING = "loading"
    """Being brought up from unloaded behind a gate: it serves only once ready, and falls
    back to unloaded if it never gets there (enabling a disabled role)."""
    SERVING = "serving"
    """Its supervisor runs it: the child (or endpoint) serves, or is being restarted by
    the supervisor (whose state says which)."""
    SWAPPING = "swapping"
    """A replacement is launching beside the serving one (make-before-break), or has
    taken over while the old one drains; the old one serves until the cut-over."""
    DRAINING = "draining"
    """Going out of service: new calls are refused; running ones finish (bounded by the
    drain timeout); then it stops and is unloaded."""
    STOPPED = "stopped"
    """The daemon shut it down: final."""


TRANSITIONS: dict[ModelState, frozenset[ModelState]] = {
    ModelState.UNLOADED: frozenset({
        ModelState.LOADING,   # load behind a gate (a disabled role switched on)
        ModelState.SERVING,   # start: the supervisor runs it; callers get its retry hint
        ModelState.STOPPED,   # shutdown
    }),
    ModelState.LOADING: frozenset({
        ModelState.SERVING,   # ready: it serves from now on
        ModelState.UNLOADED,  # never ready (or invalid, or cancelled): nothing changed
        ModelState.STOPPED,   # shutdown while loading
    }),
    ModelState.SERVING: frozenset({
        ModelState.SWAPPING,  # a swap, mode switch, reload or recycle begins
        ModelState.DRAINING,  # unload (a switch to disabled)
        ModelState.STOPPED,   # shutdown
    }),
    ModelState.SWAPPING: frozenset({
        ModelState.SERVING,   # the new one took over, or failed and the old one serves on
        ModelState.STOPPED,   # shutdown mid-swap
    }),
    ModelState.DRAINING: frozenset({
        ModelState.UNLOADED,  # drained (or the bound passed) and stopped
        ModelState.STOPPED,   # shutdown mid-drain
    }),
    # Shut down with the daemon: nothing brings it back.
    ModelState.STOPPED: frozenset(),
}


def check_transition(old: ModelState, new: ModelState) -> None:
    """Raise :class:`~supervisor.IllegalTransitionError` unless ``old -> new`` is in the
    table."""
    if new not in TRANSITIONS[old]:
        raise IllegalTransitionError(f"illegal model transition {old.value} -> {new.value}")


def moved(role: str, old: ModelState, new: ModelState) -> ModelState:
    """``new``, once ``old -> new`` is checked against the table (an illegal move is
    logged as an error and raised) and logged: the one way a model's state changes."""
    try:
        check_transition(old, new)
    except IllegalTransitionError:
        _log.error("illegal model transition", role=role, old=old.value, new=new.value)
        raise
    _log.info("model state", role=role, old=old.value, new=new.value)
    return new


def status_of(state: ModelState, child: State) -> str:
    """What an operator is told of a model in ``state`` whose child is in ``child``:
    unloaded, loading, ready, draining or failed (while it serves, its child's state
    decides)."""
    if state in (ModelState.UNLOADED, ModelState.STOPPED):
        return "unloaded"
    if state is ModelState.LOADING:
        return "loading"
    if state is ModelState.DRAINING:
        return "draining"
    if child is State.RUNNING:
        return "ready"
    if child is State.FAILED:
        return "failed"
    return "unloaded" if child in (State.IDLE, State.STOPPED) else "loading"
