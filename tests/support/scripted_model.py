"""A :class:`daemon.models.model.Model` over the scripted supervisor doubles
(:mod:`tests.support.scripted`): no processes, a manual clock, each launch's outcome
decided by the test."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from daemon import load
from daemon.config.inference_mode import InferenceMode, Mode
from daemon.models.admission import Admission
from daemon.models.children import Setup, make_setup
from daemon.models.model import Handover, Model, Target
from supervisor import (
    ExitCause,
    GGUFInfo,
    LlamaServerRuntime,
    LogRing,
    ManualClock,
    RestartPolicy,
    State,
    Supervisor,
    SwapProgress,
)
from tests.support.scripted import ScriptedChild, ScriptedLauncher, settle

RUNTIME = LlamaServerRuntime("/usr/bin/llama-server")  # never run: launches are scripted


def setup_for(path: str, *, size: int = 0) -> Setup:
    """A setup of the (absent) file ``path``; ``size`` > 0 gives it GGUF facts of that
    many bytes, for the memory check."""
    cc = load(None, env={"LLAMAD_GENERATION_MODEL": path,
                         "LLAMAD_EMBEDDING_ENABLED": "false"}).generation
    setup = make_setup("generation", path, RUNTIME, cc)
    if size:
        setup.model.info = GGUFInfo(path, size, 3, "llama", "", 2048, 0, 1, "F16")
    return setup


@dataclass
class Rig:
    """A model, its supervisor, the old (first) launcher, and the stages reported."""

    model: Model
    supervisor: Supervisor
    launcher: ScriptedLauncher
    clock: ManualClock
    events: list[SwapProgress] = field(default_factory=list)

    @property
    def old(self) -> ScriptedChild:
        """The child the model served with first."""
        return self.launcher.children[0]

    def stages(self) -> list[str]:
        return [e.stage for e in self.events]

    def target(self, outcomes: list[str | ExitCause], path: str = "/models/new.gguf",
               *, size: int = 0, validate: Callable[[], None] | None = None) -> Target:
        """An embedded target whose launch takes ``outcomes`` (validation: ``validate``,
        none by default)."""
        return Target(Mode(InferenceMode.EMBEDDED), setup_for(path, size=size),
                      ScriptedLauncher(outcomes), validate)


async def rig(*, mode: InferenceMode = InferenceMode.EMBEDDED, start: bool = True,
              outcomes: list[str | ExitCause] | None = None, drain_timeout: float = 5.0,
              available: int | None = None) -> Rig:
    """A model of the old setup /models/old.gguf, started (and its child running) unless
    ``start`` is False; ``available``: the bytes the memory check sees (None: unknown)."""
    clock = ManualClock()
    launcher = ScriptedLauncher(outcomes or ["ok"])
    sup = Supervisor("generation", launcher, policy=RestartPolicy(), clock=clock,
                     rng=random.Random(7))
    setup = setup_for("/models/old.gguf")
    model = Model(
        "generation", load(None, env={"LLAMAD_GENERATION_MODEL": "/models/old.gguf",
                                      "LLAMAD_EMBEDDING_ENABLED": "false"}).generation,
        setup, LogRing(10), sup,
        launchers=lambda s: ScriptedLauncher(["ok"]),
        endpoints=lambda e: ScriptedLauncher(["ok"]),
        admission=Admission("generation", 2, 8), mode=Mode(mode),
        handover=Handover(drain_timeout=drain_timeout), clock=clock,
        available=lambda: available)
    if start:
        model.start()
        await settle(sup, State.RUNNING)
    return Rig(model, sup, launcher, clock)
