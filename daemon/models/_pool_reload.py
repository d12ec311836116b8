"""What a reload changes in the model pool's catalog (SIGHUP): a pure comparison of the
catalog in force with the new one, apart from the pool that carries it out
(:meth:`PoolReloads.reconfigure`, mixed into :class:`daemon.models.pool.Pool`).

The roles' default models are not compared here: they follow their ``[generation]`` /
``[embedding]`` sections through the roles' own reload (a swap or a mode switch), as
before the pool existed. A reload that would rename a role's default needs a restart.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog

from ..config import ChildConfig
from ..config._catalog import Catalog, CatalogEntry
from ..config.inference_mode import InferenceMode
from ._states import ModelState

if TYPE_CHECKING:
    from .children import Setup
    from .model import Model

_log = structlog.get_logger("llamad.pool")


@dataclass
class CatalogChange:
    """How the new catalog differs from the one in force, by model name.

    Attributes:
        added: models that are new (nothing starts for them: they load on demand, or now
            if they have ``preload``).
        removed: models that are gone (a resident one is drained and stopped).
        relaunch: models whose file or child settings changed (a resident one gets a new
            child, make-before-break; another loads the new settings when next needed).
        updated: models whose aliases, pin, ttl, preload or device changed (in force at
            once).
        defaults_renamed: a role's default is another model now (a restart applies it).
        kept: models whose new child did not start, with why (their old entry stays).
    """

    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    relaunch: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    defaults_renamed: bool = False
    kept: dict[str, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.relaunch or self.updated
                    or self.defaults_renamed)


def _launch(entry: CatalogEntry) -> tuple[object, ...]:
    """What a launched child of ``entry`` runs with: a change needs a new child."""
    c = entry.child
    return (entry.role, c.model, c.runtime, c.ctx_size, c.threads, c.parallel, c.batch,
            c.extra_args, c.spin_count, c.env)


def _residency(entry: CatalogEntry) -> tuple[object, ...]:
    return (entry.aliases, entry.pin, entry.ttl, entry.preload, entry.device)


def compare(current: Catalog, new: Catalog) -> CatalogChange:
    """How ``new`` differs from ``current``, the roles' defaults left out."""
    change = CatalogChange(defaults_renamed=dict(current.defaults) != dict(new.defaults))
    defaults = set(current.defaults.values()) | set(new.defaults.values())
    old = {e.name: e for e in current.entries if e.name not in defaults}
    fresh = {e.name: e for e in new.entries if e.name not in defaults}
    for name, entry in fresh.items():
        before = old.get(name)
        if before is None:
            change.added.append(name)
        elif _launch(before) != _launch(entry):
            change.relaunch.append(name)
        elif _residency(before) != _residency(entry) or before.origin != entry.origin:
            change.updated.append(name)
    change.removed = [name for name in old if name not in fresh]
    return change


def pooled_config(entry: CatalogEntry) -> ChildConfig:
    """The configuration the Model of a pool model holds: its entry's, unloaded until the
    pool loads it (the pool's ``build`` and a reload's relaunch both use it)."""
    return dataclasses.replace(entry.child, mode=InferenceMode.DISABLED, enabled=False)


class PoolReloads:
    """A reload's catalog applied to :class:`daemon.models.pool.Pool` (its state)."""

    _catalog: Catalog
    _models: dict[str, Model]
    _room: asyncio.Lock

    if TYPE_CHECKING:
        def is_resident(self, name: str) -> bool: ...

        def _unloaded(self, name: str, reason: str) -> None: ...

        def _changed(self) -> None: ...

    async def reconfigure(self, catalog: Catalog,
                          setup_for: Callable[[CatalogEntry], Setup]) -> CatalogChange:
        """Take the catalog of a reload (:mod:`daemon.models._pool_reload`): removed models are
        unloaded (drained) and forgotten; a resident model whose file or settings changed
        gets a new child make-before-break (``setup_for`` makes its setup), and keeps its
        old entry if that fails (``kept`` of the change says why); other changes are in
        force at once. Runs between loads, never during one.
        """
        change = compare(self._catalog, catalog)
        if change.defaults_renamed:  # the roles' defaults stay until a restart
            catalog = Catalog(catalog.entries, self._catalog.defaults, catalog.skipped)
        kept: dict[str, CatalogEntry] = {}
        async with self._room:
            for name in change.removed:
                model = self._models.pop(name, None)
                if model is not None and model.state is not ModelState.UNLOADED:
                    _log.info("model removed by a reload", model=name)
                    await model.unload(why="removed from the catalog by a reload")
                    self._unloaded(name, "admin")
            for name in change.relaunch:
                model = self._models.get(name)
                entry = catalog.find(name)
                if model is None or entry is None:
                    continue
                if not self.is_resident(name):
                    self._models.pop(name)  # rebuilt from the new entry when next loaded
                    continue
                try:
                    await model.replace(model.target_for(setup_for(entry)),
                                        reason="reload")
                    model.configure(pooled_config(entry))
                except Exception as exc:  # the old child serves on, as for a role
                    _log.warning("reload kept the running model", model=name,
                                 error=str(exc))
                    change.kept[name] = str(exc)
                    old = self._catalog.find(name)
                    if old is not None:
                        kept[name] = old
            entries = tuple(kept.get(e.name, e) for e in catalog.entries)
            self._catalog = Catalog(entries, catalog.defaults, catalog.skipped)
        self._changed()
        return change
