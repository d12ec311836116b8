"""The inference router: what serves a role right now.

Servicers never hold on to a backend; they ask the router for each call, so when the
supervisor replaces what serves a role — a restart, a model swap, or a switch between a
supervised child and an external endpoint (:mod:`daemon.models.modes`) — the next call goes to
the new one and calls already running finish on the backend they started with. Every
mode has the same interface (:class:`daemon.models.backend.InferenceBackend`); a disabled role's
backend refuses every call with FAILED_PRECONDITION before it queues.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Protocol

from supervisor import SwapFailedError

from ..errors import DeadlineUnmeetable, Draining, FailedPrecondition, UnknownModel
from ._states import ModelState
from .admission import Admission
from .backend import InferenceBackend
from .lanes import Lane

if TYPE_CHECKING:
    from ..telemetry.metrics import Metrics
    from .pool import Pool


class Role(Protocol):
    """What the router needs of a role (:class:`daemon.models.model.Model`)."""

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
        self._roles: Mapping[str, Role] = dict(roles)
        self._pool: Pool | None = None
        self.draining = False
        self.metrics: Metrics | None = None
        """Counts each admitted call (or refusal on its way in) by model and outcome."""
        self.on_cancelled: Callable[[Role, int], None] | None = None
        """Told of every admitted call cancelled (deadline, client gone) with the role and
        the child process it ran on (:class:`daemon.models.cancel_watch.CancelWatch`)."""

    def attach(self, pool: Pool) -> None:
        """Route calls that name a model through ``pool`` (issue 14), and ask it for the
        model serving a role (the registry's :meth:`~daemon.models.pool.Pool.roles`, the
        roles' models given here)."""
        self._pool = pool
        self._roles = pool.roles()

    def model_name(self, role: str, model: str = "") -> str:
        """The catalog name of the model a call of ``role`` naming ``model`` ("": the
        role's default) is served by; the role's name without a catalog.

        Raises:
            UnknownModel: no model is called ``model``.
            InvalidArgument: ``model`` is a model of another role.
        """
        return self._resolve(role, model)[0]

    def fixed(self, role: str, model: str) -> bool:
        """Whether a call of ``role`` naming ``model`` is served by the role's own model,
        always resident (no model named, or the role's default named, and that default
        pinned); otherwise the pool serves it, loading it first if it is not resident.

        Raises:
            UnknownModel, InvalidArgument: see :meth:`model_name`.
        """
        return self._resolve(role, model)[1]

    def _resolve(self, role: str, model: str) -> tuple[str, bool]:
        """:meth:`model_name` and :meth:`fixed` at once: what a call resolves, once."""
        pool = self._pool
        if pool is None:
            if model:
                raise UnknownModel(f"model {model!r} does not exist: this daemon serves "
                                   "only its roles' models")
            return role, True
        default = pool.catalog.defaults.get(role)
        if not model:  # disabled at start and switched on since: its own model
            return (role, True) if default is None else (default, pool.entry(default).pin)
        entry = pool.entry(model, role)
        return entry.name, entry.name == default and entry.pin

    def role_of(self, model: str) -> str:
        """The role of the catalog model ``model``.

        Raises:
            UnknownModel: no model is called so.
        """
        if self._pool is None:
            raise UnknownModel(f"model {model!r} does not exist: this daemon serves only "
                               "its roles' models")
        return self._pool.entry(model).role

    async def _served(self, role: str, name: str,
                      time_remaining: float | None) -> tuple[Role, float | None, bool]:
        """What serves a call of ``role`` that the pool serves (the resolved catalog
        ``name``), loaded first if it is not resident, the time left to the call's
        deadline after that, and whether it was loaded for the call (then the call tells
        the pool once it is in the model's queue: :meth:`daemon.models.pool.Pool.entered`)."""
        pool = self._pool
        if pool is None:  # never: only a call the pool serves comes here
            return self._roles[role], time_remaining, False
        served = pool.model(name)
        loaded = False
        if (name == pool.catalog.defaults.get(role) and served is not None
                and served.state is ModelState.UNLOADED and not served.unloaded_by_pool):
            self.backend(role)  # an unpinned default disabled by SetMode stays so: refused
        if served is None or not pool.is_resident(name):
            if not pool.on_demand and name != pool.catalog.defaults.get(role):
                raise FailedPrecondition(
                    f"model {name!r} is not loaded, and this daemon loads models only when "
                    "an admin asks ([models] on_demand = false): LoadModel loads it")
            expected = pool.expected_load(name)
            if (time_remaining is not None and expected is not None
                    and expected > time_remaining):
                raise DeadlineUnmeetable(
                    f"model {name!r} is not resident and takes about {expected:.1f} s to "
                    f"load (its last load), more than the call's deadline allows "
                    f"({time_remaining:.1f} s): retry with a longer deadline, or load it "
                    "first (LoadModel)")
            began = time.monotonic()
            try:
                served = await asyncio.wait_for(pool.load(name, call=True), time_remaining)
            except TimeoutError:
                progress = pool.view(name).loading
                how_far = ("" if progress is None else f" ({progress.describe()}; retry "
                           f"in about {progress.retry_after():.1f} s)")
                raise DeadlineUnmeetable(
                    f"model {name!r} was not loaded before the call's deadline; it goes on "
                    f"loading{how_far}: retry") from None
            except SwapFailedError as exc:
                raise FailedPrecondition(f"model {name!r} could not be loaded: "
                                         f"{exc.cause.message}") from None
            loaded = True
            if time_remaining is not None:
                time_remaining = max(0.0, time_remaining - (time.monotonic() - began))
        pool.touch(name)
        return served, time_remaining, loaded

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

    async def backend_of(self, role: str, model: str,
                         time_remaining: float | None) -> InferenceBackend:
        """The backend serving the model ``model`` of ``role`` now ("": the role's
        default), loaded first if it is not resident; without a slot (Tokenize).

        Raises:
            UnknownModel, InvalidArgument: see :meth:`model_name`.
            Draining, Disabled, supervisor.ChildNotReadyError: see :meth:`backend`.
        """
        name, fixed = self._resolve(role, model)
        if fixed:
            return self.backend(role)
        if self.draining:
            raise Draining("llamad is shutting down; retry on another instance or later")
        served, _, loaded = await self._served(role, name, time_remaining)
        if loaded and self._pool is not None:  # a call without a slot: in at once
            self._pool.entered(name)
        backend = served.backend()
        if (refusal := backend.refusal) is not None:
            raise refusal
        return backend

    @contextlib.asynccontextmanager
    async def admit(
        self, role: str, time_remaining: float | None, *, in_flight: bool = False,
        model: str = "", lane: Lane = Lane.INTERACTIVE,
    ) -> AsyncIterator[InferenceBackend]:
        """Wait for a slot on ``role``'s model ``model`` ("": the role's default; another
        is loaded first if it is not resident, within the call's deadline), then yield its
        current backend (``in_flight``: see :meth:`backend`), the call waiting in
        ``lane`` (:mod:`daemon.models.lanes`).

        Fails fast (before queueing) when the role is not ready; the backend is taken
        after the wait, so a call queued across a swap or a mode switch goes to the new
        one (or is refused, if the role was disabled meanwhile).

        Raises:
            Draining, Disabled, supervisor.ChildNotReadyError: see :meth:`backend`.
            Overloaded, DeadlineUnmeetable: see :class:`daemon.models.admission.Admission`.
        """
        name, fixed = self._resolve(role, model)  # once: a reload may change the catalog
        loaded = False
        outcome = "error"  # counted per model: a refusal on the way in is an error too
        try:
            if fixed:
                self.backend(role, in_flight=in_flight)
                served: Role = self._roles[role]
            else:
                if self.draining and not in_flight:
                    raise Draining("llamad is shutting down; retry on another instance or "
                                   "later")
                served, time_remaining, loaded = await self._served(role, name,
                                                                    time_remaining)
            if not fixed:
                self._check(served)
            async with self._slot(name, served, time_remaining, lane) as gate:
                if loaded:
                    loaded = False
                    self._entered(name)
                pid = gate.serving_pid
                try:
                    yield (self.backend(role, in_flight=in_flight)
                           if fixed and gate is served else self._check(gate))
                except asyncio.CancelledError:
                    if self.on_cancelled is not None and gate is served:
                        self.on_cancelled(served, pid)
                    raise
                gate.admission.count_served(pid)
                outcome = "ok"
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            if loaded:
                self._entered(name)
            if self.metrics is not None:
                self.metrics.call(role, name, outcome)

    @contextlib.asynccontextmanager
    async def _slot(self, name: str, served: Role, time_remaining: float | None,
                    lane: Lane) -> AsyncIterator[Role]:
        """A slot for a call in ``lane`` of the model ``name``: of its background instance
        when the call is a batch or background one and the instance runs
        (:mod:`daemon.models.lane_instance`), else of the model itself (also when the
        instance stopped while the call waited for it)."""
        instance = self._pool.lane_instance(name) if self._pool is not None else None
        gate = instance.gate(lane) if instance is not None else None
        if gate is not None:
            async with gate.admission.slot(time_remaining, lane):
                if gate.running:
                    yield gate
                    return
        async with served.admission.slot(time_remaining, lane):
            yield served

    def _entered(self, name: str) -> None:
        if self._pool is not None:
            self._pool.entered(name)

    @staticmethod
    def _check(served: Role) -> InferenceBackend:
        backend = served.backend()
        if (refusal := backend.refusal) is not None:
            raise refusal
        return backend
