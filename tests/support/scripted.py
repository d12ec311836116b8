"""Scripted doubles of the supervisor's launcher and children, for unit tests of the
supervisor and of swaps: no processes, a manual clock, each launch's outcome decided by the
test."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Callable

from supervisor import (
    ApiShape,
    ExitCause,
    InferenceClient,
    ManualClock,
    RestartPolicy,
    StartFailure,
    State,
    StateChange,
    Supervisor,
)
from tests.support.load import patience

API = ApiShape("/health", "/tokenize", "content", "add_special")
TRANSIENT = ExitCause("crash", False, "segfault")
PERMANENT = ExitCause("model_error", True, "error loading model")


class ScriptedChild:
    """A ready child whose death the test decides."""

    _pids = itertools.count(100)

    def __init__(self) -> None:
        self.pid = next(self._pids)
        self.socket = "/run/llamad/children/scripted.sock"
        self.client = InferenceClient("http://127.0.0.1:9", model_id="x", api=API)
        self.dies: asyncio.Future[ExitCause] = asyncio.get_running_loop().create_future()
        self.stopped = False
        self.stop_gate: asyncio.Event | None = None

    async def watch(self) -> ExitCause:
        return await self.dies

    async def stop(self) -> None:
        if self.stop_gate is not None:
            await self.stop_gate.wait()
        self.stopped = True
        await self.client.aclose()


class ScriptedLauncher:
    """Each launch takes the next outcome: "ok", an ExitCause (start fails), or "hang"."""

    def __init__(self, outcomes: list[str | ExitCause]) -> None:
        self.outcomes = outcomes
        self.children: list[ScriptedChild] = []
        self.launches = 0
        self.hanging: asyncio.Future[None] | None = None

    async def launch(self, on_stage: Callable[[str], None] | None = None) -> ScriptedChild:
        self.launches += 1
        if on_stage is not None:
            on_stage("loading")
        outcome = self.outcomes.pop(0) if self.outcomes else "ok"
        if isinstance(outcome, ExitCause):
            raise StartFailure(outcome)
        if outcome == "hang":
            self.hanging = asyncio.get_running_loop().create_future()
            await self.hanging
        child = ScriptedChild()
        self.children.append(child)
        return child


def make(
    outcomes: list[str | ExitCause],
    *,
    policy: RestartPolicy | None = None,
    validate: Callable[[], None] | None = None,
) -> tuple[Supervisor, ScriptedLauncher, ManualClock, list[StateChange]]:
    clock = ManualClock()
    launcher = ScriptedLauncher(outcomes)
    sup = Supervisor("generation", launcher, validate=validate, policy=policy or RestartPolicy(),
                     clock=clock, rng=random.Random(7))
    changes: list[StateChange] = []
    sup.subscribe(changes.append)
    return sup, launcher, clock, changes


async def settle(sup: Supervisor, *states: State) -> None:
    await sup.wait_for(*states, timeout=patience(2))


async def started(
    outcomes: list[str | ExitCause],
    state: State,
    *,
    policy: RestartPolicy | None = None,
    validate: Callable[[], None] | None = None,
) -> tuple[Supervisor, ScriptedLauncher, ManualClock, list[StateChange]]:
    """What :func:`make` makes, started and settled in ``state``."""
    made = make(outcomes, policy=policy, validate=validate)
    made[0].start()
    await settle(made[0], state)
    return made


async def until(condition: Callable[[], bool]) -> None:
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never became true")
