"""The recent exits of each child, for the console's Overview: the supervisor keeps only
the last one (``Supervisor.last_exit``), so the console records each new one as the pool
reports a change (:meth:`daemon.models.pool.Pool.subscribe`), at most :data:`KEEP` per
model, newest first. A daemon's restart starts the record empty.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from supervisor import ExitCause

from ..models.pool import Pool

KEEP = 10
"""Exits kept per model."""


def cause_json(cause: ExitCause) -> dict[str, Any]:
    """An exit cause as the console shows it (ExitCause's fields, ``at`` in seconds)."""
    shown: dict[str, Any] = {"kind": cause.kind, "permanent": cause.permanent,
                             "message": cause.message, "at": cause.at}
    if cause.exit_code is not None:
        shown["exit_code"] = cause.exit_code
    if cause.signal:
        shown["signal"] = cause.signal
    return shown


class ExitLog:
    """Each model's recent exits, recorded from the pool's changes."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._exits: dict[str, deque[ExitCause]] = {}
        self._unsubscribe: Callable[[], None] | None = None

    def start(self) -> None:
        """Record from now on (and the last exit each child has had already)."""
        if self._unsubscribe is None:
            self._unsubscribe = self._pool.subscribe(self.record)
            self.record()

    def stop(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    def record(self) -> None:
        """Keep each serving model's last exit if it is new."""
        for name, model in self._pool.every_model().items():
            cause = model.supervisor.last_exit
            if cause is None:
                continue
            kept = self._exits.setdefault(name, deque(maxlen=KEEP))
            if not kept or kept[0] is not cause:
                kept.appendleft(cause)

    def of(self, name: str) -> list[dict[str, Any]]:
        """``name``'s recent exits, newest first."""
        return [cause_json(c) for c in self._exits.get(name, ())]
