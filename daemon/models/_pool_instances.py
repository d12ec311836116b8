"""The pool's side of the models' background instances (:mod:`daemon.models.lane_instance`):
which instance serves a model's lower lanes, whether one fits the memory budget beside
the resident models, its state in the metrics, and its idle stop. :class:`daemon.models.pool.Pool`
mixes :class:`PoolInstances` in."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from supervisor import State

from ..config._catalog import Catalog
from ..config._catalog_load import device_budgets
from ..config._sections import PoolSettings
from ._residency import Limits, Resident, fits
from .lane_instance import LaneInstance, system_room

if TYPE_CHECKING:
    from ..telemetry.metrics import Metrics
    from .model import Model

_MIB = 1024 * 1024


class PoolInstances:
    """The background instances of :class:`daemon.models.pool.Pool`'s models."""

    _catalog: Catalog
    _models: dict[str, Model]
    _settings: PoolSettings
    _metrics: Metrics | None

    if TYPE_CHECKING:
        def _residents(self, loading: str) -> list[Resident]: ...
        def _changed(self) -> None: ...

    def lane_instance(self, name: str) -> LaneInstance | None:
        """The background instance of the model ``name`` (None: it has none)."""
        model = self._models.get(name)
        return model.lane_instance if model is not None else None

    def _watch_instance(self, model: Model, name: str) -> None:
        """Give ``model``'s instance its catalog name and ttl, the pool's budget and the
        metrics."""
        instance = model.lane_instance
        if instance is None:
            return
        instance.name = name
        entry = self._catalog.find(name)
        if entry is not None and entry.ttl:
            instance.idle = entry.ttl
        instance.room = functools.partial(self._instance_room, name)
        # Its series appear with its first start: a model never served embedded (a
        # disabled role) exports none.
        instance.on_change = functools.partial(self._instance_changed, name)
        instance.on_exit = functools.partial(self._instance_exited, name)

    def _instance_room(self, name: str, need: int) -> str:
        """Why an instance of ``name`` needing ``need`` bytes does not fit beside the
        resident models (and instances) in the pool's budget or the system's memory ("":
        it fits). Unlike a model's load, it makes no room: it is refused instead."""
        entry = self._catalog.find(name)
        device = entry.device if entry is not None else ""
        limits = Limits(0, self._settings.memory_budget_mb * _MIB,
                        device_budgets(self._settings.device_budgets_mb))
        residents = self._residents("")
        if not fits(residents, need, limits, device):
            budget = limits.of(device)
            left = max(0, budget - sum(r.memory for r in residents if r.device == device))
            return (f"it needs {need // _MIB} MiB and the pool's memory budget "
                    f"({budget // _MIB} MiB) has {left // _MIB} MiB left")
        return system_room(need)

    def _instance_changed(self, name: str, instance: LaneInstance) -> None:
        if self._metrics is not None:
            sup = instance.supervisor
            state = sup.state.value if sup is not None else State.STOPPED.value
            self._metrics.lane_instance_state(instance.model.role, name, state)
        self._changed()

    def _instance_exited(self, name: str, instance: LaneInstance, kind: str) -> None:
        if self._metrics is not None:
            self._metrics.lane_instance_exit(instance.model.role, name, kind)

    async def expire_instances(self) -> list[str]:
        """Stop every background instance idle past its ttl; return their models' names."""
        stopped = []
        for name, model in list(self._models.items()):
            if model.lane_instance is not None and await model.lane_instance.expire():
                stopped.append(name)
        return stopped
