"""Make-before-break swaps: the vocabulary (stages, records, errors).

A swap replaces a running child with a new one (another model, other runtime arguments)
without a gap in service:

1. ``validating`` — the new model file is checked (and, by the caller, its memory need);
2. ``launching`` / ``loading`` / ``probing`` — the new child starts beside the old one
   on its own port and must pass the same readiness checks as any start;
3. ``swapping`` — the supervisor's current child becomes the new one, atomically: calls
   that ask for a client from now on get the new child's;
4. ``draining`` — calls already running on the old child finish (up to a bound), then
   the old child is stopped;
5. ``done`` — or ``failed`` with the cause, at any stage before ``swapping``; a failed
   swap leaves the old child serving, untouched.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ._exits import ExitCause
from .errors import SupervisorError

STAGES = ("validating", "launching", "loading", "probing", "swapping", "draining", "done",
          "failed")


@dataclass(frozen=True)
class SwapProgress:
    """One step of a swap, as reported to whoever asked for it."""

    stage: str
    message: str = ""
    cause: ExitCause | None = None


ProgressSink = Callable[[SwapProgress], None]


@dataclass(frozen=True)
class SwapRecord:
    """A completed swap, kept for Status and rollback."""

    role: str
    old: str
    new: str
    at: float
    reason: str
    seconds: float


class SwapError(SupervisorError):
    """Base of swap errors."""


class SwapInProgressError(SwapError):
    """Another swap of the same child is running; swaps never interleave."""


class SwapRefusedError(SwapError):
    """The swap cannot start: the child is stopped, or the new model does not fit."""


class SwapFailedError(SwapError):
    """The new child never became ready; the old one keeps serving.

    Attributes:
        cause: why the new child failed.
    """

    def __init__(self, cause: ExitCause) -> None:
        self.cause = cause
        super().__init__(f"swap failed ({cause.kind}): {cause.message}")
