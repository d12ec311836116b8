"""gRPC health (``grpc.health.v1``): one entry per service, plus the overall "".

=============================  ==============================================
service name                   SERVING when
=============================  ==============================================
``generation``                 generation is ready (its child runs, or its endpoint
                               passed readiness and answers liveness probes)
``embedding``                  embedding is ready (same)
``llamad.v1.InferenceService`` generation is ready
``llamad.v1.ControlService``   the daemon is up (not draining)
``llamad.v1.RetrievalService`` the daemon is up and retrieval is enabled (BM25 works
                               without embedding; vectors follow ``embedding``)
``""`` (overall)               not draining and every role not disabled is ready
                               (a role whose default is unpinned also while the
                               pool has unloaded it: it loads on demand)
``model/<name>``               the catalog model ``<name>`` is resident and ready
                               (the model pool; one entry per catalog model)
=============================  ==============================================

While the node is drained (ControlService SetDraining) or draining for shutdown, every
entry is NOT_SERVING (docs/scale-out.md).

A disabled role's entry is NOT_SERVING. Updates follow supervisor state changes and mode
switches, in order, through one queue, so Watch streams never see a stale status win a
race.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from grpc_health.v1 import health_pb2
from grpc_health.v1.health import aio as health_aio

from llamad_protocol.v1.wire import (
    CONTROL_SERVICE,
    HEALTH_EMBEDDING,
    HEALTH_GENERATION,
    HEALTH_MODEL_PREFIX,
    HEALTH_OVERALL,
    INFERENCE_SERVICE,
    RETRIEVAL_SERVICE,
)
from supervisor import State

from ..config import Role
from ..config.inference_mode import InferenceMode
from ..models.model import Model
from ..models.pool import ModelView

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class Pooled(Protocol):
    """What health needs of the model registry (:class:`daemon.models.pool.Pool`)."""

    def roles(self) -> Mapping[str, Model]: ...

    def models(self) -> Sequence[ModelView]: ...

    def subscribe(self, listener: Callable[[], None]) -> Callable[[], None]: ...


class HealthReporter:
    """The health entries, from the model registry ``pool`` (None: no models at all)."""

    def __init__(self, pool: Pooled | None = None, *, retrieval: bool = False) -> None:
        self.servicer = health_aio.HealthServicer()
        self._retrieval = retrieval
        self._pool = pool
        self._draining = False
        self._drained = False  # by an admin (SetDraining)
        self._set: set[str] = set()  # the service names given a status so far
        self._queue: asyncio.Queue[None] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        # The registry tells of every model's child state and of what serves it.
        self._unsubscribe = [pool.subscribe(self.refresh)] if pool is not None else []

    def refresh(self) -> None:
        """Re-evaluate every status soon (after a mode switch)."""
        self._queue.put_nowait(None)

    def statuses(self) -> dict[str, int]:
        """The status each service name should have now."""
        views = list(self._pool.models()) if self._pool is not None else []
        roles = self._pool.roles() if self._pool is not None else {}
        on_demand = {v.role for v in views if v.is_default and not v.pinned}

        def running(role: str) -> bool:
            child = roles.get(role)
            if child is None:
                return False
            if role in on_demand and child.unloaded_by_pool:
                return True  # an unpinned default the pool unloaded: loads on demand
            return (child.mode.kind is not InferenceMode.DISABLED
                    and child.supervisor.state is State.RUNNING)

        up = not self.draining
        all_running = all(running(role) for role, c in roles.items()
                          if c.mode.kind is not InferenceMode.DISABLED)
        flag = {True: SERVING, False: NOT_SERVING}
        statuses = {
            HEALTH_GENERATION: flag[up and running(Role.GENERATION)],
            HEALTH_EMBEDDING: flag[up and running(Role.EMBEDDING)],
            INFERENCE_SERVICE: flag[up and running(Role.GENERATION)],
            CONTROL_SERVICE: flag[up],
            RETRIEVAL_SERVICE: flag[up and self._retrieval],
            HEALTH_OVERALL: flag[up and all_running],
        }
        for view in views:
            statuses[HEALTH_MODEL_PREFIX + view.name] = flag[up and view.state == "ready"]
        return statuses

    def serving(self) -> bool:
        """Whether the overall entry is SERVING now (the HTTP listener's ``/health``)."""
        return bool(self.statuses()[HEALTH_OVERALL] == SERVING)

    async def _apply(self) -> None:
        statuses = self.statuses()
        for name in self._set - statuses.keys():  # a model a reload took out of the catalog
            statuses[name] = NOT_SERVING
        for name, status in statuses.items():
            await self.servicer.set(name, status)
        self._set = set(statuses)

    async def start(self) -> None:
        await self._apply()
        self._task = asyncio.create_task(self._loop(), name="health")

    async def _loop(self) -> None:
        while True:
            await self._queue.get()
            while not self._queue.empty():  # coalesce bursts
                self._queue.get_nowait()
            await self._apply()

    @property
    def draining(self) -> bool:
        """Drained by an admin, or draining for shutdown: every entry NOT_SERVING."""
        return self._draining or self._drained

    def set_drained(self, drained: bool) -> None:
        """Drain for an admin (every entry NOT_SERVING, soon) or end that."""
        self._drained = drained
        self.refresh()

    async def drain(self) -> None:
        """Report NOT_SERVING everywhere (shutdown has begun)."""
        self._draining = True
        await self._apply()

    async def close(self) -> None:
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        if self._task is not None:
            self._task.cancel()
        await self._apply()
        await self.servicer.enter_graceful_shutdown()
