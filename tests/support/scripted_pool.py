"""A :class:`daemon.models.pool.Pool` over scripted models (:mod:`tests.support.scripted`): no
processes, a manual clock, each model's launches decided by the test."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from pathlib import Path

from daemon import load
from daemon.config._catalog import Catalog, CatalogEntry
from daemon.config._catalog_load import child_config
from daemon.config._sections import PoolSettings
from daemon.config.inference_mode import InferenceMode, Mode
from daemon.config.role import Role
from daemon.models.admission import Admission
from daemon.models.children import make_setup
from daemon.models.model import Handover, Model
from daemon.models.pool import Pool
from daemon.telemetry.metrics import Metrics
from supervisor import ExitCause, LogRing, ManualClock, RestartPolicy, State, Supervisor
from tests.support.models import write_model
from tests.support.scripted import ScriptedLauncher, settle
from tests.support.scripted_model import RUNTIME


class Rig:
    """A pool over a catalog of gen-a (the generation default, started; pinned as
    build_catalog pins a role's default, unless ``default_pinned`` is False), gen-b, gen-c
    and emb; every launch of a model takes the next of its scripted outcomes."""

    def __init__(self, folder: Path, settings: PoolSettings | None = None, *,
                 pinned: tuple[str, ...] = (), ttl: float = 0.0,
                 metrics: Metrics | None = None, default_pinned: bool = True) -> None:
        self.clock = ManualClock()
        self.outcomes: dict[str, list[str | ExitCause]] = {}
        self.launchers: dict[str, list[ScriptedLauncher]] = {}
        base = load(None, env={"LLAMAD_GENERATION_MODEL": "/m/gen.gguf",
                               "LLAMAD_EMBEDDING_MODEL": "/m/emb.gguf",
                               "LLAMAD_MODELS_DIR": "/nonexistent"}).settings
        entries = []
        for name, role in (("gen-a", Role.GENERATION), ("gen-b", Role.GENERATION),
                           ("gen-c", Role.GENERATION), ("emb", Role.EMBEDDING)):
            path = write_model(folder / f"{name}.gguf")
            section = base.generation if role is Role.GENERATION else base.embedding
            entries.append(CatalogEntry(name, role, child_config(section, role, str(path)),
                                        aliases=("b",) if name == "gen-b" else (),
                                        pin=name in pinned or (name == "gen-a"
                                                               and default_pinned),
                                        ttl=ttl, origin="models_dir"))
        self.catalog = Catalog(tuple(entries), {"generation": "gen-a"})
        self.default = self.build(entries[0], InferenceMode.EMBEDDED)
        self.built: list[str] = []
        self.pool = Pool(self.catalog, {"generation": self.default},
                         self.build_pooled, clock=self.clock, settings=settings,
                         metrics=metrics)

    async def started(self) -> Rig:
        """This rig once its generation default serves (started, and running)."""
        self.default.start()
        await settle(self.default.supervisor, State.RUNNING)
        return self

    def launcher(self, name: str) -> ScriptedLauncher:
        launcher = ScriptedLauncher(self.outcomes.setdefault(name, []))
        self.launchers.setdefault(name, []).append(launcher)
        return launcher

    def launches(self, name: str) -> int:
        return sum(launcher.launches for launcher in self.launchers.get(name, []))

    def build_pooled(self, entry: CatalogEntry) -> Model:
        self.built.append(entry.name)
        return self.build(entry, InferenceMode.DISABLED)

    def build(self, entry: CatalogEntry, mode: InferenceMode) -> Model:
        setup = make_setup(entry.role, entry.path, RUNTIME, entry.child)
        sup = Supervisor(entry.role, self.launcher(entry.name), policy=RestartPolicy(),
                         clock=self.clock, rng=random.Random(7))
        return Model(entry.role, entry.child, setup, LogRing(10), sup,
                     launchers=lambda s: self.launcher(entry.name),
                     endpoints=lambda e: self.launcher(entry.name),
                     admission=Admission(entry.role, 2, 8), mode=Mode(mode),
                     handover=Handover(drain_timeout=5.0), clock=self.clock,
                     available=lambda: None)

    def state(self, name: str) -> str:
        return self.pool.view(name).state


async def until(condition: Callable[[], bool]) -> None:
    """Wait for ``condition`` (a load validates its file in a thread: more than a few
    loop turns on a busy machine), for at most 10 s."""
    for _ in range(2000):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition never became true")
