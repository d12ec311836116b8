"""The inference router: which client serves a role right now.

Servicers never hold on to a client; they ask the router for each call, so when the
supervisor replaces what serves a role — a restart, a model swap, or a switch between a
supervised child and an external endpoint (:mod:`daemon.modes`) — the next call goes to
the new one and calls already running finish on the client they started with. The client
has one interface in every mode (:class:`supervisor.InferenceClient`; an endpoint's is a
subclass); a disabled role has none, and its calls are refused with FAILED_PRECONDITION.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping

from supervisor import InferenceClient

from .children import ManagedChild
from .errors import Disabled, Draining


class InferenceRouter:
    def __init__(self, children: Mapping[str, ManagedChild]) -> None:
        self._children = dict(children)
        self.draining = False

    def child(self, role: str) -> ManagedChild:
        return self._children[role]

    def client(self, role: str, *, in_flight: bool = False) -> InferenceClient:
        """The client serving ``role`` now (a child's, or an endpoint's).

        Args:
            in_flight: the request serves a call that was already running when the drain
                began (an ingest's or a search's embeddings), which the drain lets finish:
                not refused while draining.

        Raises:
            Draining: the daemon is shutting down (and ``in_flight`` is False).
            Disabled: the role's mode is "disabled".
            supervisor.ChildNotReadyError: the child or endpoint is not ready (with a
                retry hint).
        """
        if self.draining and not in_flight:
            raise Draining("llamad is shutting down; retry on another instance or later")
        child = self.child(role)
        if child.mode.kind == "disabled":
            raise Disabled(
                f"{role} is disabled ({role}.mode = disabled); ControlService/SetMode "
                "switches it to a supervised child or an endpoint"
            )
        return child.supervisor.client

    @contextlib.asynccontextmanager
    async def admit(
        self, role: str, time_remaining: float | None, *, in_flight: bool = False
    ) -> AsyncIterator[InferenceClient]:
        """Wait for a slot on ``role``, then yield its current client (``in_flight``: see
        :meth:`client`).

        Fails fast (before queueing) when the role is not ready; the client is taken
        after the wait, so a call queued across a swap or a mode switch goes to the new
        one (or is refused, if the role was disabled meanwhile).

        Raises:
            Draining, Disabled, supervisor.ChildNotReadyError: see :meth:`client`.
            Overloaded, DeadlineUnmeetable: see :class:`daemon.admission.Admission`.
        """
        self.client(role, in_flight=in_flight)
        child = self.child(role)
        async with child.admission.slot(time_remaining):
            pid = child.supervisor.pid
            yield self.client(role, in_flight=in_flight)
            child.admission.count_served(pid)
