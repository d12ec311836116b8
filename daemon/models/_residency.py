"""The pool's residency policy: which resident models to unload so that another fits.

A pure decision (:func:`make_room`), apart from the pool that carries it out, so that it
is tested on its own: given the resident models (their memory estimate, when they were
last used, their calls in flight, whether they may be evicted) and the one to load,
choose the models to unload, least recently used first — idle ones before busy ones
(a busy one is drained, bounded, not killed) — or say that nothing can make room.

A model placed on a device (``[models.NAME] device``, for GPU offload) counts against
that device's budget instead of the RAM budget; unloading it makes room only there (or
under ``max_resident``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Resident:
    """A resident (or loading) model as the policy sees it.

    Attributes:
        evictable: not pinned (a role's default is unless its table says otherwise),
            and serving (not loading or swapping).
        device: the device its memory is on ("": RAM).
    """

    name: str
    memory: int
    last_used: float
    busy: int
    evictable: bool
    device: str = ""


@dataclass(frozen=True)
class Limits:
    """``max_resident`` models (0: no limit), ``budget`` bytes of RAM (0: no budget) and
    ``devices``: device -> bytes (a device not named has no budget)."""

    max_resident: int = 0
    budget: int = 0
    devices: Mapping[str, int] = field(default_factory=dict)

    def of(self, device: str) -> int:
        """The budget of ``device`` ("": RAM), 0 for none."""
        return self.devices.get(device, 0) if device else self.budget


def fits(residents: list[Resident], need: int, limits: Limits, device: str = "") -> bool:
    """Whether a model needing ``need`` bytes on ``device`` ("": RAM) fits beside
    ``residents``."""
    if limits.max_resident and len(residents) + 1 > limits.max_resident:
        return False
    budget = limits.of(device)
    held = sum(r.memory for r in residents if r.device == device)
    return not (budget and held + need > budget)


def make_room(residents: list[Resident], need: int, limits: Limits,
              device: str = "") -> list[Resident] | None:
    """The models to unload, in order, for a model needing ``need`` bytes on ``device``
    to fit beside ``residents``: evictable ones, idle before busy, each group least
    recently used first, as few as will do (a model on another device only when the
    number of models is what does not fit). ``[]``: it fits as it is; None: even
    unloading every evictable model would not make it fit (or it is larger than the
    budget)."""
    budget = limits.of(device)
    if budget and need > budget:
        return None
    left = list(residents)
    chosen: list[Resident] = []
    order = sorted((r for r in residents if r.evictable),
                   key=lambda r: (r.busy > 0, r.last_used))
    for victim in order:
        if fits(left, need, limits, device):
            break
        counted = bool(limits.max_resident and len(left) + 1 > limits.max_resident)
        if victim.device != device and not counted:
            continue  # unloading it frees another device's memory: no help here
        left.remove(victim)
        chosen.append(victim)
    return chosen if fits(left, need, limits, device) else None
