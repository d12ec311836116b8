"""The steps of a make-before-break replacement, as :meth:`daemon.models.model.Model.replace`
runs them: the memory check, the validation, and the three ways a new child or endpoint
comes up — from nothing (:func:`load`), beside the serving one (:func:`beside`), or in
its place once it stopped (:func:`stop_first`).

They drive the model's supervisor for the model (only the model calls them, with its own
supervisor) and call the model back at the cut-over (``cut_over``): the one moment what
serves changes, which the model alone records. Nothing here holds state of its own.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from supervisor import (
    Clock,
    ExitCause,
    InvalidModelError,
    Launcher,
    ProcessLauncher,
    State,
    Supervisor,
    SwapFailedError,
    SwapProgress,
    SwapRefusedError,
    can_lower_niceness,
    drain,
    renice,
)

from ..config.inference_mode import InferenceMode, Mode
from . import memory
from .admission import Admission

if TYPE_CHECKING:
    from ..config import ChildConfig
    from .children import Setup

_log = structlog.get_logger("llamad.model")

ProgressSink = Callable[[SwapProgress], None]
Validator = Callable[[], None]
CutOver = Callable[[bool], None]
"""The model's cut-over; its argument says whether to resize the admission now."""


@dataclass(frozen=True)
class Handover:
    """How a replacement takes over (the ``[swap]`` options).

    Attributes:
        drain_timeout: seconds the old one's calls get to finish before it stops.
        hold: seconds new calls may wait, after a swap between two children switched, for
            the old child's calls to end (:meth:`daemon.models.admission.Admission.hand_over`).
        launch_nice: nice value added to an incoming child while it loads beside a
            serving child (0: none; also 0 when this process may not lower it again).
        base_nice: the daemon's own nice value, given back to the child at the switch.
    """

    drain_timeout: float = 30.0
    hold: float = 0.0
    launch_nice: int = 0
    base_nice: int = 0


@functools.cache
def handover_settings(drain_timeout: float, hold: float, launch_nice: int) -> Handover:
    """The :class:`Handover` of these options, with ``launch_nice`` dropped (and that said
    once) when this process may not lower a nice value again."""
    base = os.getpriority(os.PRIO_PROCESS, 0)
    usable = launch_nice if launch_nice and can_lower_niceness(base) else 0
    if launch_nice and not usable:
        _log.info("swap.launch_nice unused: this process may not lower a nice value "
                  "again (run with LimitNICE=+0 or CAP_SYS_NICE)", launch_nice=launch_nice)
    return Handover(drain_timeout, hold, usable, base)


@dataclass(frozen=True)
class Target:
    """What a replacement brings up.

    Attributes:
        mode: the mode it serves in.
        setup: the embedded setup it runs (None for an endpoint: the model keeps its
            setup for a later switch back).
        launcher: starts it (a child, or an endpoint's readiness gate).
        validate: checks its model file (None for an endpoint).
    """

    mode: Mode
    setup: Setup | None
    launcher: Launcher
    validate: Validator | None



def slots_for(mode: Mode, setup: Setup | None, cc: ChildConfig) -> int:
    """Calls served at once: the child's slots, or ``parallel`` for an endpoint."""
    if mode.kind is InferenceMode.EMBEDDED and setup is not None:
        return setup.runtime.max_concurrency(setup.spec)
    return max(1, cc.parallel)


def ahead_for(mode: Mode, setup: Setup | None, cc: ChildConfig) -> int:
    """Calls sent beyond the slots, to wait in the child's own queue: ``queue_ahead`` for
    a launched child whose runtime queues requests (llama-server); none otherwise (the
    bundled runtime serves one request at a time; of an endpoint llamad knows only
    ``parallel``)."""
    if (mode.kind is InferenceMode.EMBEDDED and setup is not None
            and setup.runtime.queues_requests):
        return cc.queue_ahead
    return 0


def fits(target: Target, *, role: str, swap: bool, stop_old_first: bool,
         available: int | None) -> bool:
    """The memory check, once: True to launch beside the old one, False to stop the old
    child first (asked for, and needed).

    Args:
        swap: the old one is a child (so stopping it first can make room).
        available: bytes the system can give a new child (None: unknown: it fits).

    Raises:
        SwapRefusedError: it does not fit, and stopping the old child first was not
            asked for or cannot help.
    """
    if target.setup is None:  # an endpoint: nothing launched here
        return True
    need = memory.memory_needed(target.setup)
    if available is None or need <= available:
        return True
    name = target.setup.spec.model.name
    if not swap:
        raise SwapRefusedError(
            f"{name} needs about {need >> 20} MiB and {available >> 20} MiB are "
            "available; free memory (or disable the other role) first")
    if stop_old_first:
        return False
    raise SwapRefusedError(
        f"{name} needs about {need >> 20} MiB and {available >> 20} MiB are available "
        "beside the running child; retry with stop_old_first to stop the old child "
        f"first (the {role} service is then unavailable until the new child is ready)")


async def validate(target: Target, report: ProgressSink, clock: Clock) -> None:
    """The one validation of a new model file, before anything starts or stops.

    Raises:
        SwapFailedError: the file is not a usable GGUF (cause ``invalid_model``).
    """
    report(SwapProgress("validating"))
    if target.validate is None:
        return
    try:
        await asyncio.to_thread(target.validate)
    except InvalidModelError as exc:
        cause = ExitCause("invalid_model", True, str(exc), at=clock.wall())
        report(SwapProgress("failed", str(exc), cause))
        raise SwapFailedError(cause) from exc


async def load(sup: Supervisor, target: Target, *, report: ProgressSink,
               cut_over: CutOver, clock: Clock) -> None:
    """From nothing (``sup`` stopped): start ``target``; cut over once it is ready; if it
    never is, stop ``sup`` again.

    Raises:
        SwapFailedError: it never became ready.
    """
    report(SwapProgress("launching"))
    sup.reconfigure(target.launcher, target.validate)
    sup.start()
    try:
        state = await sup.wait_for(State.RUNNING, State.BACKOFF, State.FAILED)
    except BaseException:
        await asyncio.shield(sup.stop())
        raise
    if state is State.RUNNING:
        report(SwapProgress("swapping", "ready; the role serves from now on"))
        cut_over(True)
        report(SwapProgress("done"))
        return
    cause = sup.last_exit or ExitCause("never_ready", False, "did not become ready",
                                       at=clock.wall())
    await sup.stop()
    report(SwapProgress("failed", f"{cause.message}; the role stays disabled", cause))
    raise SwapFailedError(cause)


async def beside(sup: Supervisor, admission: Admission, target: Target, *, local: bool,
                 handover: Handover, report: ProgressSink, cut_over: CutOver,
                 resize: Callable[[], None]) -> None:
    """Launch ``target`` beside the serving one (:meth:`supervisor.Supervisor.swap`); cut
    over once it is ready; drain the old one, bounded.

    Between two children (``local``) the incoming one loads niced, and new calls wait for
    the old child's calls at the switch (:class:`Handover`).

    Raises:
        SwapFailedError, SwapRefusedError: see :meth:`supervisor.Supervisor.swap`.
    """
    launcher = target.launcher
    nice = handover.launch_nice if local else 0
    if nice and isinstance(launcher, ProcessLauncher):
        launcher.launch_nice = nice
    hand_over: asyncio.Task[None] | None = None
    switched = False

    def relay(event: SwapProgress) -> None:
        nonlocal hand_over, switched
        if event.stage in ("draining", "done") and not switched:  # it took over
            switched = True
            _restore_priority(sup, nice, handover.base_nice)
            if local and event.stage == "draining":  # new calls: new child, soon
                hand_over = asyncio.create_task(admission.hand_over(handover.hold))
            # Resized after the drain when holding new calls back, so no queued call
            # slips in beside the old child's calls.
            cut_over(hand_over is None)
        report(event)

    try:
        await sup.swap(launcher, validate=target.validate,
                       drain_timeout=handover.drain_timeout, progress=relay)
    finally:
        if isinstance(launcher, ProcessLauncher):
            launcher.launch_nice = 0  # its restarts start at the normal priority
        _restore_priority(sup, nice, handover.base_nice)  # threads started since, too
        if hand_over is not None and not hand_over.done():
            hand_over.cancel()
        if hand_over is not None:
            resize()  # held back at the cut-over


async def stop_first(sup: Supervisor, target: Target, old_validate: Validator | None,
                         *, report: ProgressSink, cut_over: CutOver, clock: Clock) -> None:
    """Break-before-make, on request: stop the old child, start ``target``; on failure,
    start the old one again.

    Raises:
        SwapFailedError: the new child never became ready.
    """
    report(SwapProgress("draining", "stopping the old child first (asked for)"))
    old_launcher = sup.launcher
    await sup.stop()
    report(SwapProgress("launching"))
    sup.reconfigure(target.launcher, target.validate)
    sup.start()
    state = await sup.wait_for(State.RUNNING, State.FAILED, State.BACKOFF)
    if state is State.RUNNING:
        cut_over(True)
        report(SwapProgress("done"))
        return
    cause = sup.last_exit or ExitCause("never_ready", False, "did not start", at=clock.wall())
    await sup.stop()
    sup.reconfigure(old_launcher, old_validate)
    sup.start()
    report(SwapProgress("failed", f"{cause.message}; restarting the old model", cause))
    raise SwapFailedError(cause)


def _restore_priority(sup: Supervisor, nice: int, base: int) -> None:
    pid = sup.pid
    if nice and pid and not renice(pid, base):
        _log.warning("could not restore the child's priority", role=sup.role, pid=pid)


async def serve_waiting(busy: Callable[[], int], admission: Admission,
                        more: Callable[[], int], report: ProgressSink, *, timeout: float,
                        clock: Clock) -> None:
    """Before an eviction takes a model out of service: let it serve, within ``timeout``,
    the calls running (``busy``), waiting in its queue and the ``more()`` on their way
    into it (a woken waiter counts as running at once)."""
    def waiting() -> int:
        return busy() + admission.queued + more()

    if waiting():
        report(SwapProgress("draining", f"{waiting()} calls to serve"))
        await drain(waiting, timeout, clock)
