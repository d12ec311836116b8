"""What the pool shows of its models: :class:`ModelView` (ListModels, Status, the HTTP
API's model list, health's per-model entries), apart from the residency decisions of
:class:`daemon.models.pool.Pool`, which mixes :class:`PoolViews` in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from supervisor import BreakerState, Clock, LlamaServerRuntime, LoadProgress

from ..config._catalog import Catalog, CatalogEntry
from . import memory
from .children import make_setup

if TYPE_CHECKING:
    from .model import Model


@dataclass(frozen=True)
class ModelView:
    """What an operator (or a client listing models) sees of one catalog model.

    Attributes:
        state: ``unloaded``, ``loading``, ``ready``, ``draining`` or ``failed``.
        memory_estimate: bytes it is estimated to hold resident (0: unknown).
        last_used: wall-clock time of the last call it was given (None: never).
        in_flight: calls running on it or waiting for its slots.
        breaker_open: its circuit breaker is open.
        loading: while it loads, how far (:class:`supervisor.LoadProgress`; None
            otherwise).
        lane_instance: its background instance (:mod:`daemon.models.lane_instance`):
            "" for none, else ``off``, ``refused: <why>``, ``failed: <why>`` or its
            child's state, pid and nice value.
    """

    name: str
    role: str
    aliases: tuple[str, ...]
    state: str
    memory_estimate: int
    last_used: float | None
    in_flight: int
    pinned: bool
    ttl: float
    breaker_open: bool
    last_error: str
    path: str
    is_default: bool
    preload: bool
    origin: str
    loading: LoadProgress | None = None
    lane_instance: str = ""


class PoolViews:
    """The views of :class:`daemon.models.pool.Pool` (the state they read is the pool's)."""

    _catalog: Catalog
    _models: dict[str, Model]
    _defaults: set[str]
    _closing: set[str]
    _last_used: dict[str, float]
    _estimates: dict[str, int]
    _loading_since: dict[str, float]
    _clock: Clock

    if TYPE_CHECKING:
        def entry(self, name: str, role: str | None = None) -> CatalogEntry: ...

    def views(self) -> list[ModelView]:
        """Every model, in catalog order (see :meth:`models`)."""
        return [self._view(e) for e in self._catalog.entries]

    def models(self) -> list[ModelView]:
        """Every catalog model with its residency and health: what ListModels answers and
        the HTTP API's model list shows (their ``name`` is what a request names)."""
        return self.views()

    def view(self, name: str) -> ModelView:
        """One model's view.

        Raises:
            UnknownModel: no such model.
        """
        return self._view(self.entry(name))

    def _view(self, entry: CatalogEntry) -> ModelView:
        model = self._models.get(entry.name)
        estimate = 0
        if model is not None and model.current is not None:
            estimate = memory.memory_needed(model.current)
        elif entry.path:
            if entry.name not in self._estimates:
                self._estimates[entry.name] = estimate_file(entry)
            estimate = self._estimates[entry.name]
        state, busy, breaker, error = "unloaded", 0, False, ""
        loading: LoadProgress | None = None
        instance = ""
        if model is not None:
            instance = model.lane_instance.status if model.lane_instance is not None else ""
            state = model.status
            if entry.name in self._closing and state == "ready":
                state = "draining"  # evicted: serving its last calls, taking no new ones
            busy = model.busy()
            breaker = model.supervisor.breaker.state is BreakerState.OPEN
            error = model.last_error
            loading = model.supervisor.load_progress()
        since = self._loading_since.get(entry.name)
        if state == "loading" and loading is None and since is not None:
            # Loading, its child not started yet (room being made, its file checked).
            loading = LoadProgress("launching", self._clock.monotonic() - since)
        return ModelView(
            name=entry.name, role=entry.role, aliases=entry.aliases, state=state,
            memory_estimate=estimate, last_used=self._last_used.get(entry.name),
            in_flight=busy, pinned=entry.pin, ttl=entry.ttl, breaker_open=breaker,
            last_error=error, path=entry.path, is_default=entry.name in self._defaults,
            preload=entry.preload, origin=entry.origin, loading=loading,
            lane_instance=instance)


def estimate_file(entry: CatalogEntry) -> int:
    """The memory estimate of a catalog model not built yet (0 if its header is
    unreadable)."""
    setup = make_setup(entry.role, entry.path, LlamaServerRuntime("llama-server"),
                       entry.child)
    return memory.memory_needed(setup)
