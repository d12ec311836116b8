"""The model pool, the daemon's one model registry: every model of the catalog by name,
each role's own model, and which of them are resident.

The pool owns one :class:`~daemon.models.model.Model` per catalog model: each role's default model
is the role's own (built by the server from ``[generation]``/``[embedding]``, which Swap,
SetMode, reload and recycle act on); every other model gets its own Model the first time
it is needed (its own supervisor, readiness gate, backoff and breaker: one model's
failures never touch another's), built by the server's ``build`` function and loaded
through the same make-before-break primitive (:meth:`daemon.models.model.Model.replace`, from
unloaded). The pool decides residency; the model carries it out.

What it offers:

* :meth:`Pool.models`: a view of every model (ControlService/ListModels, the HTTP API's
  ``GET /v1/models``);
* :meth:`Pool.entry`: a request's ``model`` name resolved (NOT_FOUND naming the models
  that exist; a model of another role is INVALID_ARGUMENT);
* :meth:`Pool.load` and :meth:`Pool.unload`: make a model resident (concurrent loads of
  one model share one start) or take it out of residency (its calls drain first);
* :meth:`Pool.roles` and :meth:`Pool.of_role`: the model serving a role (Swap, SetMode,
  Reset, TailLogs, Status, reload, recycling ask here);
* :meth:`Pool.every_model` (drain, the agent check, systemd's status line) and
  :meth:`Pool.built` (a reload's queue size, log rings at shutdown); the metrics of each
  model's queue (:meth:`Pool._admitted`); :meth:`Pool.stop` (shutdown, every model).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Mapping
from types import MappingProxyType

import structlog

from supervisor import (
    Clock,
    SwapInProgressError,
    SwapRefusedError,
    SystemClock,
    drain,
)

from ..config._catalog import Catalog, CatalogEntry
from ..config._catalog_load import device_budgets
from ..config._sections import PoolSettings
from ..config.inference_mode import InferenceMode
from ..errors import FailedPrecondition, InvalidArgument, Overloaded, UnknownModel
from ..telemetry.metrics import Metrics
from . import memory
from ._pool_instances import PoolInstances
from ._pool_reload import PoolReloads, pooled_config
from ._pool_view import ModelView, PoolViews
from ._residency import Limits, Resident, make_room
from ._states import ModelState
from .admission import Admission
from .lanes import Lane
from .model import Model

__all__ = ["ModelView", "Pool", "pooled_config"]

_log = structlog.get_logger("llamad.pool")

_OCCUPYING = (ModelState.LOADING, ModelState.SERVING, ModelState.SWAPPING,
              ModelState.DRAINING)
_RETRY_AFTER = 5.0
"""The retry hint of a call refused because nothing can make room for its model."""


class Pool(PoolViews, PoolReloads, PoolInstances):
    """Every model of ``catalog`` by name.

    Args:
        catalog: the models.
        defaults: role -> the role's Model (it serves the catalog's default of that role).
        build: makes the (unloaded, not started) Model of a catalog model.
        clock: time source (tests inject a manual one).
        settings: the residency policy (``[models]``: max resident, memory budget, how
            often idle models are checked against their ttl).
        metrics: counts loads and unloads by model (None: not counted).
    """

    def __init__(self, catalog: Catalog, defaults: Mapping[str, Model],
                 build: Callable[[CatalogEntry], Model], *, clock: Clock | None = None,
                 settings: PoolSettings | None = None,
                 metrics: Metrics | None = None) -> None:
        self._catalog = catalog
        self._metrics = metrics
        self._settings = settings or PoolSettings()
        self._room = asyncio.Lock()  # one residency decision (and its load) at a time
        self._build = build
        self._clock = clock or SystemClock()
        self._models: dict[str, Model] = {}
        self._defaults: set[str] = set()
        self._roles = dict(defaults)  # kept even when the catalog names no default for a role
        for role, model in defaults.items():
            name = catalog.defaults.get(role)
            if name is not None:
                self._models[name] = model
                self._defaults.add(name)
        self._loads: dict[str, asyncio.Task[Model]] = {}
        self._last_used: dict[str, float] = {}
        self._loaded_at: dict[str, float] = {}  # when each pool model last became resident
        self._load_seconds: dict[str, float] = {}  # how long each model's last load took
        self._loading_since: dict[str, float] = {}  # monotonic start of loads under way
        self._closed = False
        self._estimates: dict[str, int] = {}
        # Models being evicted: they serve the calls already queued, new ones wait for
        # their next load.
        self._closing: set[str] = set()
        # Calls waiting for each model's load, and those a finished load let through that
        # are not in its queue yet (:meth:`entered`): an eviction serves them first.
        self._joined: dict[str, int] = {}
        self._entering: dict[str, int] = {}
        self._listeners: list[Callable[[], None]] = []
        for role, model in self._roles.items():
            self._watch(model, catalog.defaults.get(role, role))

    def subscribe(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener`` (no arguments, on the event loop) whenever any model's state
        may have changed: a load, an unload, its child's state; return the unsubscribe."""
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)
        return unsubscribe

    def _watch(self, model: Model, name: str) -> None:
        self._watch_instance(model, name)
        model.subscribe(lambda _: self._changed())
        model.supervisor.subscribe(lambda _: self._changed())
        metrics = self._metrics
        if metrics is not None:
            model.admission.set_hooks(
                on_change=functools.partial(self._admitted, name),
                on_reject=lambda role, reason: metrics.rejected(role, reason, name))

    def built(self) -> list[Model]:
        """Every Model built: each role's (a role without a catalog default too), then
        each one the pool built on demand (resident or not), each once."""
        every = {id(m): m for m in (*self._roles.values(), *self._models.values())}
        return list(every.values())

    def _admitted(self, name: str, admission: Admission) -> None:
        """The queue of the model ``name`` changed: its gauges say so (issue 28; the
        role's totals are their sum by role)."""
        if self._metrics is None:
            return
        self._metrics.queue_depth(admission.role, admission.queued, name)
        for lane in Lane:
            self._metrics.lane_queue_depth(admission.role, name, lane.value,
                                           admission.queued_in(lane))
        self._metrics.in_flight(admission.role, admission.in_flight, name)

    def _changed(self) -> None:
        for listener in list(self._listeners):
            listener()

    @property
    def catalog(self) -> Catalog:
        return self._catalog

    def names(self) -> list[str]:
        """The catalog names, in declaration order."""
        return self._catalog.names()

    def entry(self, name: str, role: str | None = None) -> CatalogEntry:
        """The catalog model a request names (``""``: the role's default).

        Raises:
            UnknownModel: no model is called so (the message names those that exist).
            InvalidArgument: it is a model of another role than ``role``.
            FailedPrecondition: no name given and the role has no default model.
        """
        if not name:
            if role is None:
                raise InvalidArgument("model: a name is needed", field="model")
            entry = self._catalog.default(role)
            if entry is None:
                raise FailedPrecondition(f"the {role} role has no default model (disabled); "
                                         "name a model")
            return entry
        entry = self._catalog.find(name)
        if entry is None:
            raise UnknownModel(f"model {name!r} does not exist; the models are: "
                               f"{', '.join(self.names()) or 'none'}")
        if role is not None and entry.role != role:
            raise InvalidArgument(f"model {name!r} is a {entry.role} model, not a {role} "
                                  "model", field="model")
        return entry

    def roles(self) -> Mapping[str, Model]:
        """Each role's own model by role, whatever its mode (it serves the role's default,
        and is what Swap, SetMode, Reset, TailLogs, reload and recycling act on)."""
        return MappingProxyType(self._roles)

    def of_role(self, role: str) -> Model:
        """The model serving ``role``'s calls that name no model.

        Raises:
            KeyError: no such role.
        """
        return self._roles[role]

    def model(self, name: str) -> Model | None:
        """The Model of the catalog model ``name`` if one was built (None: never needed)."""
        return self._models.get(name)

    def every_model(self) -> dict[str, Model]:
        """Every model that may have calls: each role's by role, then each model the pool
        loaded on demand by name while it serves or still has calls (being unloaded). What
        drain, the agent check, in-flight counts and systemd's status line read, so none
        misses a model."""
        every = dict(self._roles)
        for name, model in self._models.items():
            if name in self._defaults:
                continue
            if (model.mode.kind is not InferenceMode.DISABLED or model.busy()
                    or model.admission.queued):
                every[name] = model
        return every

    def touch(self, name: str) -> None:
        """A call was given to ``name`` now (for last used, and later LRU and TTL)."""
        self._last_used[name] = self._clock.wall()

    def is_resident(self, name: str) -> bool:
        """``name``'s Model serves (or its supervisor is bringing its child back)."""
        model = self._models.get(name)
        return (model is not None and model.state in (ModelState.SERVING, ModelState.SWAPPING)
                and model.mode.kind is not InferenceMode.DISABLED
                and name not in self._closing)

    async def load(self, name: str, *, call: bool = False) -> Model:
        """Make ``name`` resident and return its Model once it serves. Concurrent loads of
        one model share one start; a caller cancelled while waiting does not cancel the
        start of the others.

        ``call``: the caller is a call that goes into the model's queue next and says so
        (:meth:`entered`): until it does, an eviction of the model waits for it.

        Raises:
            UnknownModel: no such model.
            FailedPrecondition: the pool is shut down, or a default model that is disabled
                (SetMode enables it).
            supervisor.SwapFailedError: it failed validation or never became ready (its
                breaker and last error say why).
            supervisor.SwapInProgressError: a swap, switch or unload of it is running.
        """
        entry = self.entry(name)
        if self._closed:
            raise FailedPrecondition("llamad is shutting down")
        if self.is_resident(entry.name):
            return self._models[entry.name]
        task = self._loads.get(entry.name)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._load(entry))
            self._loads[entry.name] = task
            task.add_done_callback(lambda _: self._loads.pop(entry.name, None))
        if not call:
            return await asyncio.shield(task)
        name = entry.name
        self._joined[name] = self._joined.get(name, 0) + 1
        try:
            return await asyncio.shield(task)
        except BaseException:
            if task.done() and not task.cancelled() and task.exception() is None:
                self.entered(name)  # counted on its way in, but it gave up
            raise
        finally:
            self._joined[name] -= 1

    @property
    def on_demand(self) -> bool:
        """Whether a call naming a model that is not resident loads it."""
        return self._settings.on_demand

    def expected_load(self, name: str) -> float | None:
        """Seconds until ``name`` is likely resident, from how long its last load took
        (what is left of it, if one is under way); None: never loaded here yet."""
        last = self._load_seconds.get(name)
        if last is None:
            return None
        since = self._loading_since.get(name)
        if since is None:
            return last
        return max(0.0, last - (self._clock.monotonic() - since))

    def _entering_calls(self, name: str) -> int:
        return self._entering.get(name, 0)

    def _work(self, name: str) -> int:
        """Calls running on ``name``, waiting in its queue, or on their way into it."""
        model = self._models[name]
        return model.busy() + model.admission.queued + self._entering_calls(name)

    def entered(self, name: str) -> None:
        """A call that :meth:`load` returned ``name`` to is in its queue now (or gave up):
        an eviction of ``name`` need no longer wait for it."""
        if self._entering.get(name, 0) > 0:
            self._entering[name] -= 1

    async def _load(self, entry: CatalogEntry) -> Model:
        outcome = ""
        try:
            async with self._room:
                # The catalog in force now (a reload may have changed it meanwhile).
                current = self._catalog.find(entry.name)
                if current is None:
                    raise UnknownModel(f"model {entry.name!r} was removed from the catalog "
                                       "by a reload")
                entry = current
                model = self._models.get(entry.name)
                if model is None:
                    model = self._models[entry.name] = self._build(entry)
                    self._watch(model, entry.name)
                if model.current is None:
                    raise FailedPrecondition(f"model {entry.name!r} has no model file")
                need = memory.memory_needed(model.setup)
                outcome = "failed"
                if self.is_resident(entry.name):  # an eviction of it gave up meanwhile
                    outcome = ""
                    self._entering[entry.name] = (self._entering.get(entry.name, 0)
                                                  + self._joined.get(entry.name, 0))
                    return model
                try:
                    await self._make_room(entry.name, need)
                except Overloaded:
                    outcome = "rejected"
                    raise
                _log.info("model load", model=entry.name, role=entry.role,
                          memory_estimate=need)
                began = self._clock.monotonic()
                self._loading_since[entry.name] = began
                try:
                    await model.replace(model.target_for(model.setup),
                                        reason=f"load {entry.name}")
                    # Every call waiting for this load is on its way into the queue.
                    self._entering[entry.name] = self._joined.get(entry.name, 0)
                    self._load_seconds[entry.name] = self._clock.monotonic() - began
                except SwapRefusedError as exc:  # the system has not the memory for it
                    outcome = "rejected"
                    raise Overloaded(f"model {entry.name!r} does not fit in memory now: "
                                     f"{exc}", _RETRY_AFTER) from None
                finally:
                    self._loading_since.pop(entry.name, None)
            outcome = "ok"
        finally:
            if self._metrics is not None and outcome:
                self._metrics.model_load(entry.name, outcome)
        self._loaded_at[entry.name] = self._clock.wall()
        return model

    def _unloaded(self, name: str, reason: str) -> None:
        if self._metrics is not None:
            self._metrics.model_unload(name, reason)

    def _residents(self, loading: str) -> list[Resident]:
        out = []
        for name, model in self._models.items():
            if name == loading or model.state not in _OCCUPYING:
                continue
            if model.mode.kind is InferenceMode.DISABLED and model.state is ModelState.SERVING:
                continue
            entry = self._catalog.find(name)
            evictable = (entry is not None and not entry.pin
                         and model.state is ModelState.SERVING)
            memory_held = memory.memory_needed(model.current) if model.current else 0
            if model.lane_instance is not None:  # its background instance, when started
                memory_held += model.lane_instance.memory()
            used = max(self._last_used.get(name, 0.0), self._loaded_at.get(name, 0.0))
            out.append(Resident(name, memory_held, used, model.busy(), evictable,
                                entry.device if entry is not None else ""))
        return out

    async def _make_room(self, name: str, need: int) -> None:
        """Unload what the policy says so that ``name`` fits (:mod:`daemon.models._residency`).

        Raises:
            Overloaded: nothing can make room (RESOURCE_EXHAUSTED, with a retry hint).
        """
        limits = Limits(self._settings.max_resident,
                        self._settings.memory_budget_mb * 1024 * 1024,
                        device_budgets(self._settings.device_budgets_mb))
        entry = self._catalog.find(name)
        device = entry.device if entry is not None else ""
        residents = self._residents(name)
        victims = make_room(residents, need, limits, device)
        if victims is None:
            held = ", ".join(r.name for r in residents) or "none"
            budget = limits.of(device) // (1024 * 1024)
            raise Overloaded(
                f"model {name!r} does not fit: {len(residents)} models resident ({held}; "
                f"max_resident {limits.max_resident or 'unlimited'}, memory budget "
                f"{f'of {device} ' if device else ''}{budget or 'unlimited'} MiB, this one "
                f"needs {need // (1024 * 1024)} MiB) and none of them can be unloaded (pinned, "
                "as a role's default is unless its table says pin = false, or busy "
                "loading)", _RETRY_AFTER)
        for victim in victims:
            _log.info("model evict", model=victim.name, for_model=name,
                      in_flight=victim.busy)
            # It serves the calls already queued for it, then drains, bounded; calls that
            # arrive meanwhile wait for its next load (a switch serves a batch, not one).
            if self._settings.turn:
                # Its turn: it keeps taking calls while it has work, up to the bound.
                await drain(functools.partial(self._work, victim.name), self._settings.turn,
                            self._clock)
            self._closing.add(victim.name)
            try:
                await self._models[victim.name].unload(
                    why=f"evicted to make room for {name!r}",
                    queued=functools.partial(self._entering_calls, victim.name))
            finally:
                self._closing.discard(victim.name)
                self._entering.pop(victim.name, None)
            self._unloaded(victim.name, "room")

    async def expire(self) -> list[str]:
        """Unload every idle model unused for longer than its ttl (not a role's default,
        not pinned); return their names."""
        now = self._clock.wall()
        expired = []
        for entry in self._catalog.entries:
            if not entry.ttl or entry.pin:
                continue
            model = self._models.get(entry.name)
            if model is None or not self.is_resident(entry.name) or model.busy():
                continue
            # Idle since its last call, or since it loaded if it served none since.
            last = max(self._last_used.get(entry.name, 0.0),
                       self._loaded_at.get(entry.name, now))
            if now - last < entry.ttl:
                continue
            _log.info("model idle past its ttl", model=entry.name, ttl=entry.ttl)
            with contextlib.suppress(SwapInProgressError):
                await model.unload(why=f"idle past its ttl of {entry.ttl:g} s")
                expired.append(entry.name)
                self._unloaded(entry.name, "ttl")
        return expired

    async def expire_loop(self) -> None:
        """Run :meth:`expire` every ``ttl_check_interval`` seconds, until cancelled."""
        while True:
            await self._clock.sleep(self._settings.ttl_check_interval)
            try:
                await self.expire()
                await self.expire_instances()
            except Exception as exc:  # a failure must not end the loop
                _log.warning("ttl check failed", error=str(exc))

    async def unload(self, name: str) -> Model | None:
        """Take ``name`` out of residency: new calls are refused at once, running ones
        finish (bounded by the drain timeout), then its child stops. Nothing to do if it
        is not resident.

        Raises:
            UnknownModel: no such model.
            supervisor.SwapInProgressError: a swap, switch, load or unload of it is
                running.
        """
        entry = self.entry(name)
        model = self._models.get(entry.name)
        if model is None or not self.is_resident(entry.name):
            return model
        _log.info("model unload", model=entry.name, in_flight=model.busy())
        await model.unload(why="UnloadModel")
        self._unloaded(entry.name, "admin")
        return model

    def preload(self) -> list[asyncio.Task[None]]:
        """Start loading every ``preload`` model that is not a role's (a role's starts
        with the daemon anyway); a failure is logged (the model's breaker and last error
        keep it)."""
        tasks = []
        for entry in self._catalog.entries:
            if entry.preload and entry.name not in self._defaults:
                tasks.append(asyncio.get_running_loop().create_task(
                    self._preload(entry.name), name=f"preload-{entry.name}"))
        return tasks

    async def _preload(self, name: str) -> None:
        try:
            await self.load(name)
        except Exception as exc:
            _log.warning("preload failed", model=name, error=str(exc))

    async def stop(self) -> None:
        """Shut down with the daemon: stop every model, those loaded on demand together,
        then each role's in role order (generation, then embedding), and reap their
        children. Idempotent."""
        self._closed = True
        for task in list(self._loads.values()):
            task.cancel()
        roles = list(self._roles.values())
        await asyncio.gather(*(m.stop() for m in self.built() if m not in roles),
                             return_exceptions=True)
        for model in roles:
            await model.stop()
