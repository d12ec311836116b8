"""The inference router: which client serves a role right now.

Servicers never hold on to a child's client; they ask the router for each call, so when
the supervisor replaces a child (a restart, or a swap) the next call goes to the new one
and calls already running finish on the client they started with.
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
        try:
            return self._children[role]
        except KeyError:
            raise Disabled(
                f"the {role} child is disabled in configuration ({role}.enabled = false)"
            ) from None

    def client(self, role: str) -> InferenceClient:
        """The client of the running child for ``role``.

        Raises:
            Draining: the daemon is shutting down.
            Disabled: the role is not configured.
            supervisor.ChildNotReadyError: the child is not running (with a retry hint).
        """
        if self.draining:
            raise Draining("llamad is shutting down; retry on another instance or later")
        return self.child(role).supervisor.client

    @contextlib.asynccontextmanager
    async def admit(
        self, role: str, time_remaining: float | None
    ) -> AsyncIterator[InferenceClient]:
        """Wait for a slot on ``role``'s child, then yield its current client.

        Fails fast (before queueing) when the child is not running; the client is taken
        after the wait, so a call queued across a swap goes to the new child.

        Raises:
            Draining, Disabled, supervisor.ChildNotReadyError: see :meth:`client`.
            Overloaded, DeadlineUnmeetable: see :class:`daemon.admission.Admission`.
        """
        self.client(role)
        child = self.child(role)
        async with child.admission.slot(time_remaining):
            pid = child.supervisor.pid
            yield self.client(role)
            child.admission.count_served(pid)

    def model_name(self, role: str) -> str:
        return self.child(role).spec.model.name
