"""The pool's residency policy: which resident models to unload so that another fits.

A pure decision (:func:`make_room`), apart from the pool that carries it out, so that it
is tested on its own: given the resident models (their memory estimate, when they were
last used, their calls in flight, whether they may be evicted) and the one to load,
choose the models to unload, least recently used first — idle ones before busy ones
(a busy one is drained, bounded, not killed) — or say that nothing can make room.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Resident:
    """A resident (or loading) model as the policy sees it.

    Attributes:
        evictable: neither pinned nor a role's default model, nor loading.
    """

    name: str
    memory: int
    last_used: float
    busy: int
    evictable: bool


@dataclass(frozen=True)
class Limits:
    """``max_resident`` models (0: no limit) and ``budget`` bytes (0: no budget)."""

    max_resident: int = 0
    budget: int = 0


def fits(residents: list[Resident], need: int, limits: Limits) -> bool:
    """Whether a model needing ``need`` bytes fits beside ``residents``."""
    if limits.max_resident and len(residents) + 1 > limits.max_resident:
        return False
    return not (limits.budget and sum(r.memory for r in residents) + need > limits.budget)


def make_room(residents: list[Resident], need: int, limits: Limits) -> list[Resident] | None:
    """The models to unload, in order, for a model needing ``need`` bytes to fit beside
    ``residents``: evictable ones, idle before busy, each group least recently used
    first, as few as will do. ``[]``: it fits as it is; None: even unloading every
    evictable model would not make it fit (or it is larger than the budget)."""
    if limits.budget and need > limits.budget:
        return None
    left = list(residents)
    chosen: list[Resident] = []
    order = sorted((r for r in residents if r.evictable),
                   key=lambda r: (r.busy > 0, r.last_used))
    for victim in order:
        if fits(left, need, limits):
            break
        left.remove(victim)
        chosen.append(victim)
    return chosen if fits(left, need, limits) else None
