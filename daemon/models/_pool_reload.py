"""What a reload changes in the model pool's catalog (SIGHUP): a pure comparison of the
catalog in force with the new one, apart from the pool that carries it out
(:meth:`daemon.models.pool.Pool.reconfigure`).

The roles' default models are not compared here: they follow their ``[generation]`` /
``[embedding]`` sections through the roles' own reload (a swap or a mode switch), as
before the pool existed. A reload that would rename a role's default needs a restart.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..config._catalog import Catalog, CatalogEntry


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
