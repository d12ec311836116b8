"""The inference router: what serves a role right now.

Servicers never hold on to a backend; they ask the router for each call, so when the
supervisor replaces what serves a role — a restart, a model swap, or a switch between a
supervised child and an external endpoint (:mod:`daemon.modes`) — the next call goes to
the new one and calls already running finish on the backend they started with. Every
mode has the same interface (:class:`daemon.backend.InferenceBackend`); a disabled role's
backend refuses every call with FAILED_PRECONDITION before it queues.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Protocol

from .admission import Admission
from .backend import InferenceBackend
from .errors import Draining


class Role(Protocol):
    """What the router needs of a role (:class:`daemon.model.Model`)."""

    @property
    def admission(self) -> Admission: ...

    @property
    def serving_pid(self) -> int:
        """The process serving now (0 for none or an endpoint)."""
        ...

    def backend(self) -> InferenceBackend:
        """What serves the role now.

        Raises:
            supervisor.ChildNotReadyError: it is not ready (with a retry hint).
        """
        ...


class InferenceRouter:
    def __init__(self, roles: Mapping[str, Role]) -> None:
        self._roles = dict(roles)
        self.draining = False

    def backend(self, role: str, *, in_flight: bool = False) -> InferenceBackend:
        """The backend serving ``role`` now.

        Args:
            in_flight: the request serves a call that was already running when the drain
                began (an ingest's or a search's embeddings), which the drain lets finish:
                not refused while draining.

        Raises:
            Draining: the daemon is shutting down (and ``in_flight`` is False).
            Disabled: the role is disabled.
            supervisor.ChildNotReadyError: the child or endpoint is not ready (with a
                retry hint).
        """
        if self.draining and not in_flight:
            raise Draining("llamad is shutting down; retry on another instance or later")
        backend = self._roles[role].backend()
        if (refusal := backend.refusal) is not None:
            raise refusal
        return backend

    @contextlib.asynccontextmanager
    async def admit(
        self, role: str, time_remaining: float | None, *, in_flight: bool = False
    ) -> AsyncIterator[InferenceBackend]:
        """Wait for a slot on ``role``, then yield its current backend (``in_flight``: see
        :meth:`backend`).

        Fails fast (before queueing) when the role is not ready; the backend is taken
        after the wait, so a call queued across a swap or a mode switch goes to the new
        one (or is refused, if the role was disabled meanwhile).

        Raises:
            Draining, Disabled, supervisor.ChildNotReadyError: see :meth:`backend`.
            Overloaded, DeadlineUnmeetable: see :class:`daemon.admission.Admission`.
        """
        self.backend(role, in_flight=in_flight)
        served = self._roles[role]
        async with served.admission.slot(time_remaining):
            pid = served.serving_pid
            yield self.backend(role, in_flight=in_flight)
            served.admission.count_served(pid)
