"""A model's background instance: a second child of the same model, at a lower CPU
priority, that serves its batch and background lanes (issue 28).

Admission orders whole calls; on a CPU host what is left after it is the decode: a query
embedding that shares a batch with one background text inside the one embedding child
waits for that text (79-94 ms against 22 idle, measured), and two children that share the
cores get them equally. With an instance, the interactive lane's child decodes alone,
and the instance, started with ``nice -n limits.background_instance_nice``, gets only the
cores the interactive child leaves: the kernel, not the queue, gives a person's call the
CPU. The main child then keeps no slot back for the lower lanes, and the instance serves
them with every slot and whole batches (an ingest alone runs at full speed).

Its life:

- started lazily, on the first lower-lane call while the model serves embedded (that call
  and those that come before it is ready run on the main child, in the reserved-slot way);
- supervised like any child (its own :class:`supervisor.Supervisor`: the readiness gate,
  backoff, breaker and health from outcomes);
- its memory is counted by the pool's budget (beside every resident model); when it does
  not fit it is not started, the lower lanes stay on the main child and :attr:`status`
  says why;
- stopped once the lower lanes were idle for ``idle`` seconds (the model's ttl, else
  ``limits.background_instance_ttl``), when what serves the model changes (a swap, a mode
  switch: it restarts with the new model on the next lower-lane call) or the model is
  unloaded, each time after its calls ended (bounded by the drain timeout).

While it is not running, lower-lane calls go to the main child: they never fail because
of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING

import structlog

from supervisor import (
    ChildNotReadyError,
    Clock,
    ProcessLauncher,
    State,
    StateChange,
    Supervisor,
    drain,
)

from ..config.inference_mode import InferenceMode
from . import memory
from ._replace import ahead_for, slots_for
from ._states import ModelState
from .admission import Admission
from .backend import ChildBackend, InferenceBackend
from .lanes import Lane, LanePolicy

if TYPE_CHECKING:
    from .children import Setup
    from .model import Model

_log = structlog.get_logger("llamad.lane_instance")

_LIVE = (State.IDLE, State.STARTING, State.RUNNING, State.BACKOFF)
_REFUSED_RETRY = 30.0
"""Seconds before an instance refused for memory is considered again."""


def instance_threads(model_threads: int, setting: int, cores: int | None = None) -> int:
    """The CPU threads of a model's background instance: ``setting`` when given, else half
    the cores (``cores``, default this machine's), at most the model's own threads, at
    least one.

    The instance runs beside the interactive lane's children by design, at a lower
    priority, and llama.cpp's threads are a team that meets at a barrier after every
    operation: a team as large as the cores waits, each operation, on whichever of its
    threads an interactive child preempted (measured on 2 cores, bench/RESULTS.md "Lanes":
    an ingest beside a chat client kept 0.47x of its speed alone with two threads, 0.71-0.76x
    with one). An embedding model left at its default threads gets the other half
    (daemon.config._catalog_load).
    """
    if setting > 0:
        return setting
    half = max(1, (cores if cores is not None else os.cpu_count() or 2) // 2)
    return max(1, min(model_threads, half))


def system_room(need: int) -> str:
    """Why a child needing ``need`` bytes does not fit in what the system has available
    ("" when it does, or when that is unknown)."""
    available = memory.memory_available()
    if available is not None and need > available:
        return (f"it needs {need // 2**20} MiB, the system has {available // 2**20} MiB "
                "available")
    return ""


class LaneInstance:
    """The background instance of one model (see the module docstring).

    Args:
        model: the model it serves the lower lanes of.
        name: the model's catalog name (logs, Status).
        nice: added to the instance's nice value at launch (1-19).
        threads: its CPU threads; 0: half the cores, at most the model's (see
            :func:`instance_threads`).
        idle: seconds without a lower-lane call after which it stops.
        room: says why a child needing the given bytes does not fit beside the resident
            models ("" when it does): the pool's budget.
        lanes: the lane options (the instance keeps no slot back: all its calls are
            lower-lane calls).
        clock: time source.
        drain_timeout: seconds its running calls get before it stops.
        on_change: called on each state change of its child (Status, metrics).
        on_exit: called with the classified cause (``ExitCause.kind``) of each exit or
            failed start of its child (metrics).
    """

    def __init__(self, model: Model, name: str, *, nice: int, idle: float,
                 lanes: LanePolicy, clock: Clock, drain_timeout: float = 30.0,
                 threads: int = 0,
                 room: Callable[[int], str] | None = None,
                 on_change: Callable[[LaneInstance], None] | None = None,
                 on_exit: Callable[[LaneInstance, str], None] | None = None) -> None:
        self.model = model
        self.name = name
        self.nice: int
        self.threads: int
        self.idle: float
        self.configure(nice=nice, threads=threads, idle=idle)
        self.room = room or system_room
        self._clock = clock
        self._drain_timeout = drain_timeout
        self.on_change = on_change
        self.on_exit = on_exit
        self._lanes = lanes  # the main admission's, whose reloads the instance follows
        self.admission = Admission(model.role, 1, 0, lanes=self._policy(lanes),
                                   clock=clock.monotonic)
        self.supervisor: Supervisor | None = None
        self._setup: Setup | None = None
        self.refused = ""  # why it was not started (memory), while that holds
        self._refused_at = float("-inf")
        self._last_used = self._up_at = clock.monotonic()
        self._retiring = False
        self._tasks: set[asyncio.Task[None]] = set()
        model.subscribe(self._on_model)

    def configure(self, *, nice: int, threads: int, idle: float) -> None:
        """A reload's ``[limits]``: ``idle`` at once, ``nice`` and ``threads`` from the
        instance's next start (a running one keeps its own)."""
        self.nice, self.threads, self.idle = min(19, max(1, nice)), threads, idle

    @staticmethod
    def _policy(lanes: LanePolicy) -> LanePolicy:
        return dataclasses.replace(lanes, reserve_interactive=False)


    # -- what the router asks ---------------------------------------------------------

    @property
    def running(self) -> bool:
        """It serves now: its child is running the model's current setup."""
        sup = self.supervisor
        return (sup is not None and sup.state is State.RUNNING and not self._retiring
                and self._setup is self.model.current and self._serving())

    @property
    def serving_pid(self) -> int:
        return self.supervisor.pid if self.supervisor is not None else 0

    def _serving(self) -> bool:
        model = self.model
        return (model.mode.kind is InferenceMode.EMBEDDED and model.current is not None
                and model.state in (ModelState.SERVING, ModelState.SWAPPING))

    def gate(self, lane: Lane) -> LaneInstance | None:
        """What a call in ``lane`` should queue at: this instance when it runs and the
        call is a batch or background one; None (the main child) otherwise, starting the
        instance for the next ones when it is not running."""
        if self.model.admission.lanes is not self._lanes:  # a reload changed them
            self._lanes = self.model.admission.lanes
            self.admission.configure(self._policy(self._lanes))
        if lane is Lane.INTERACTIVE or not self._lanes.enabled:
            return None
        if not self._serving() or self._retiring:
            return None
        self._last_used = self._clock.monotonic()
        if self.running:
            return self
        self._start()
        return None

    def backend(self) -> InferenceBackend:
        """The instance's child as a backend.

        Raises:
            supervisor.ChildNotReadyError: it is not running.
        """
        sup = self.supervisor
        if sup is None or not self.running:
            raise ChildNotReadyError(self.model.role, "stopped", None)
        return ChildBackend(sup.client, self._setup)

    def busy(self) -> int:
        """Calls running on it or waiting for its slots."""
        return self.admission.in_flight + self.admission.queued

    def memory(self) -> int:
        """Bytes it is estimated to hold (0 while it is not started)."""
        sup = self.supervisor
        if sup is None or sup.state not in _LIVE or self._setup is None:
            return 0
        return memory.memory_needed(self._setup)

    @property
    def status(self) -> str:
        """One line for Status: ``off``, ``refused: <why>``, or its child's state with
        its pid and nice value."""
        sup = self.supervisor
        if sup is not None and sup.state in _LIVE:
            pid = f" pid {sup.pid}" if sup.pid else ""
            return f"{sup.state.value}{pid} nice +{self.nice}"
        if self.refused:
            return f"refused: {self.refused}"
        if sup is not None and sup.state is State.FAILED:
            cause = sup.last_exit.message if sup.last_exit is not None else ""
            return f"failed: {cause}".rstrip(": ")
        return "off"

    # -- life ---------------------------------------------------------------------------

    def _start(self) -> None:
        sup = self.supervisor
        if sup is not None and sup.state in _LIVE and self._setup is self.model.current:
            return  # starting (or backing off): the calls go to the main child meanwhile
        if sup is not None and sup.state is State.FAILED and self._setup is self.model.current:
            return  # its breaker is open: it retries by itself (half-open)
        if sup is not None:
            self._spawn(self.stop())  # another setup's: retire it, start anew later
            return
        now = self._clock.monotonic()
        if now - self._refused_at < _REFUSED_RETRY:
            return
        setup = self.model.setup
        need = memory.memory_needed(setup)
        why = self.room(need)
        if why:
            if why != self.refused:
                _log.warning("background instance not started", model=self.name,
                             reason=why)
            self.refused, self._refused_at = why, now
            self._changed()
            return
        self.refused = ""
        own = dataclasses.replace(setup, spec=dataclasses.replace(
            setup.spec, threads=instance_threads(setup.spec.threads, self.threads)))
        launcher = self.model.target_for(own).launcher
        if isinstance(launcher, ProcessLauncher):
            launcher.launch_nice = self.nice
        sup = Supervisor(self.model.role, launcher, validate=setup.model.validate,
                         policy=self.model.supervisor.policy, clock=self._clock)
        sup.subscribe(self._on_child)
        self.supervisor, self._setup = sup, setup
        self.admission.resize(slots_for(self.model.mode, setup, self.model.config),
                              ahead_for(self.model.mode, setup, self.model.config))
        _log.info("background instance starting", model=self.name, nice=self.nice,
                  threads=own.spec.threads, memory_estimate=need)
        sup.start()

    async def expire(self) -> bool:
        """Stop it when the lower lanes were idle for :attr:`idle` seconds; whether it was
        stopped."""
        sup = self.supervisor
        if sup is None or self.busy() or self._retiring or sup.state is State.STARTING:
            return False
        # Idle since its last call, or since it came up if that was later (a slow start
        # is not idleness).
        if self._clock.monotonic() - max(self._last_used, self._up_at) < self.idle:
            return False
        _log.info("background instance idle", model=self.name, idle=self.idle)
        await self.stop()
        return True

    async def stop(self, *, wait: bool = True) -> None:
        """Take no new call, let the running ones end (bounded by the drain timeout;
        ``wait`` False: not at all), then stop and reap its child. Idempotent."""
        sup = self.supervisor
        if sup is None:
            return
        self._retiring = True
        try:
            left = await drain(self.busy, self._drain_timeout if wait else 0, self._clock)
            if left and wait:
                _log.warning("background instance drain timed out", model=self.name,
                             in_flight=left)
            await sup.stop()
        finally:
            if self.supervisor is sup:
                self.supervisor, self._setup = None, None
            self._retiring = False
            self._changed()

    async def close(self) -> None:
        """Shut down with the daemon (which drained its calls first): stop it now and
        wait for the stops under way."""
        await self.stop(wait=False)
        for task in list(self._tasks):
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await task

    # -- observation ------------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[object, object, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _on_model(self, _: Model) -> None:
        """What serves the model changed (a cut-over, an unload): an instance running
        another setup, or a model no longer served embedded, stops."""
        if self.supervisor is not None and not (self._serving()
                                                and self._setup is self.model.current):
            self._spawn(self.stop())

    def _on_child(self, change: StateChange) -> None:
        if change.new is State.RUNNING:
            self._up_at = self._clock.monotonic()
        if change.new in (State.RUNNING, State.FAILED):
            _log.info("background instance " + change.new.value, model=self.name,
                      pid=change.pid)
        if change.cause is not None and self.on_exit is not None:  # into backoff or failed
            self.on_exit(self, change.cause.kind)
        self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change(self)
