"""Inference modes, switched live: a supervised child, an external endpoint, or disabled.

A role's mode changes through the same make-before-break path as a model swap; a failed
switch leaves the old mode serving:

=====================  ==============================================================
from → to              what happens
=====================  ==============================================================
embedded or endpoint   the new launcher — a child starting, or the endpoint's readiness
→ the other, or        gate (models listed, the model offered, one real request) — runs
endpoint → endpoint    beside the old one (:meth:`supervisor.Supervisor.swap`); only
                       once ready does the router's client switch, atomically. Calls on
                       the old one finish (bounded by ``swap.drain_timeout``), then the
                       old child stops, or the old endpoint's connections close.
disabled → embedded    the supervisor starts the child or the endpoint; calls are still
or endpoint            refused (FAILED_PRECONDITION) until it passed readiness; if it
                       does not, the supervisor stops again and the role stays disabled.
embedded or endpoint   new calls are refused at once (FAILED_PRECONDITION); calls already
→ disabled             running finish (bounded by ``swap.drain_timeout``); then the child
                       stops (or the endpoint's connections close).
=====================  ==============================================================

Changing the embedded model is :mod:`daemon.swaps`' job (``Swap``); a switch and a swap of
the same role never run at once (:attr:`ManagedChild.switching`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from supervisor import (
    ChildNotReadyError,
    EndpointSpec,
    ExitCause,
    InvalidModelError,
    Launcher,
    State,
    SwapFailedError,
    SwapInProgressError,
    SwapProgress,
    SwapRefusedError,
    pick_runtime,
)

from .children import ManagedChild, Setup, ahead_for, make_setup, slots_for
from .config import Config
from .errors import FailedPrecondition, InvalidArgument
from .inference_mode import InferenceMode, Mode
from .swaps import memory_available, memory_needed

_log = structlog.get_logger("llamad.modes")

ProgressSink = Callable[[SwapProgress], None]
Validator = Callable[[], None]


@dataclass(frozen=True)
class ModeRequest:
    """A switch, as asked for.

    Attributes:
        kind: where inference is to run.
        endpoint: where, for endpoint mode.
        model: for embedded mode, a GGUF path to run instead of the configured one.
        setup: for embedded mode, the whole setup to run (a reload builds it).
        reason: why, in words (logged).
    """

    kind: InferenceMode
    endpoint: EndpointSpec | None = None
    model: str = ""
    setup: Setup | None = None
    """For embedded mode: the whole setup to run (a reload builds it from new settings)."""
    reason: str = ""


class ModeManager:
    """Switches roles between modes.

    Args:
        children: every role, by name.
        config: the configuration in force (re-read at each switch: a reload may change
            the drain timeout or the llama-server binary).
        on_change: called after a role's mode changed (health, metrics, systemd status).
    """

    def __init__(self, children: dict[str, ManagedChild], config: Callable[[], Config],
                 on_change: Callable[[ManagedChild], None] | None = None) -> None:
        self._children = children
        self._config = config
        self._on_change = on_change or (lambda _: None)

    async def set_mode(self, role: str, request: ModeRequest,
                       progress: ProgressSink | None = None) -> None:
        """Switch ``role`` to ``request``; report stages (as a swap does) to ``progress``.

        Cancellation: before the switch, the new child or endpoint is dropped and the old
        mode keeps serving; after it, only the wait for the old one's calls is cut short
        (it is still stopped, in the background).

        Raises:
            InvalidArgument: the request is inconsistent.
            FailedPrecondition: embedded mode with no model configured or given.
            supervisor.SwapInProgressError: a swap or switch of the role is running.
            supervisor.SwapRefusedError: the new child does not fit in memory.
            supervisor.SwapFailedError: the new mode never became ready; nothing changed.
        """
        report = progress or (lambda _: None)
        child = self._children[role]
        if child.switching.locked():
            raise SwapInProgressError(f"a swap or mode switch of the {role} role is already "
                                      "running")
        async with child.switching:
            old = child.mode
            began = time.monotonic()
            try:
                await self._switch(child, request, report)
            except SwapFailedError as exc:
                child.last_error = exc.cause.message
                _log.warning("mode switch failed; the old mode keeps serving", role=role,
                             old=old.kind, new=request.kind, cause=exc.cause.kind,
                             error=exc.cause.message)
                raise
            _log.info("mode switched", role=role, old=old.kind, new=child.mode.kind,
                      endpoint=child.mode.endpoint.display_url if child.mode.endpoint else None,
                      reason=request.reason or None, seconds=round(time.monotonic() - began, 3))

    async def _switch(self, child: ManagedChild, request: ModeRequest,
                      report: ProgressSink) -> None:
        old = child.mode
        if request.kind is InferenceMode.DISABLED:
            if old.kind is InferenceMode.DISABLED:
                report(SwapProgress("done", f"the {child.role} role is already disabled"))
                return
            await self._disable(child, report)
            return
        if request.kind is InferenceMode.EMBEDDED and old.kind is InferenceMode.EMBEDDED:
            if request.model:
                raise InvalidArgument(f"the {child.role} role is already embedded; Swap "
                                      "changes its model")
            report(SwapProgress("done", f"the {child.role} role is already embedded"))
            return
        setup: Setup | None = None
        launcher: Launcher
        validate: Validator | None = None
        if request.kind is InferenceMode.EMBEDDED:
            setup = request.setup or self._setup(child, request.model)
            self._check_fits(setup)
            launcher, validate = child.launcher_factory(setup), setup.model.validate
        elif request.kind is InferenceMode.ENDPOINT and request.endpoint is not None:
            launcher = child.endpoint_factory(request.endpoint)
        else:
            raise InvalidArgument(f"unknown mode {request.kind!r}")
        new = Mode(request.kind,
                   request.endpoint if request.kind is InferenceMode.ENDPOINT else None)

        def switched() -> None:
            if child.mode is new:
                return
            child.mode = new
            if setup is not None and setup is not child.current:
                child.current = setup
            child.admission.resize(slots_for(new, child.current, child.config),
                                   ahead_for(new, child.current, child.config))
            child.last_error = ""
            self._on_change(child)

        if old.kind is InferenceMode.DISABLED:
            await self._enable(child, launcher, validate, report)
            switched()
            report(SwapProgress("done"))
            return

        def relay(event: SwapProgress) -> None:
            if event.stage in ("draining", "done"):  # the new one took over
                switched()
            report(event)

        await child.supervisor.swap(launcher, validate=validate,
                                    drain_timeout=self._config().swap_drain_timeout,
                                    progress=relay)
        switched()

    def _setup(self, child: ManagedChild, model: str) -> Setup:
        if not model:
            return child.setup  # raises FailedPrecondition when none is configured
        if child.current is not None:
            runtime = child.current.runtime
        else:
            try:
                runtime = pick_runtime(child.config.runtime, self._config().llama_bin or None)
            except FileNotFoundError as exc:
                raise FailedPrecondition(str(exc)) from None
        return make_setup(child.role, model, runtime, child.config)

    @staticmethod
    def _check_fits(setup: Setup) -> None:
        need, available = memory_needed(setup), memory_available()
        if available is not None and need > available:
            raise SwapRefusedError(
                f"{setup.spec.model.name} needs about {need >> 20} MiB and {available >> 20} "
                "MiB are available; free memory (or disable the other role) first")

    async def _enable(self, child: ManagedChild, launcher: Launcher,
                      validate: Validator | None, report: ProgressSink) -> None:
        """Disabled → a mode: start, and keep the role disabled unless it becomes ready."""
        sup = child.supervisor
        report(SwapProgress("validating"))
        if validate is not None:
            try:
                await asyncio.to_thread(validate)
            except InvalidModelError as exc:
                cause = ExitCause("invalid_model", True, str(exc), at=time.time())
                report(SwapProgress("failed", str(exc), cause))
                raise SwapFailedError(cause) from exc
        report(SwapProgress("launching"))
        sup.reconfigure(launcher, validate)
        sup.start()
        try:
            state = await sup.wait_for(State.RUNNING, State.BACKOFF, State.FAILED)
        except BaseException:
            await asyncio.shield(sup.stop())
            raise
        if state is State.RUNNING:
            report(SwapProgress("swapping", "ready; the role serves from now on"))
            return
        cause = sup.last_exit or ExitCause("never_ready", False, "did not become ready",
                                           at=time.time())
        await sup.stop()
        report(SwapProgress("failed", f"{cause.message}; the role stays disabled", cause))
        raise SwapFailedError(cause)

    async def _disable(self, child: ManagedChild, report: ProgressSink) -> None:
        """A mode → disabled: refuse new calls now, let running ones finish, then stop."""
        child.mode = Mode(InferenceMode.DISABLED)
        child.last_error = ""
        self._on_change(child)
        report(SwapProgress("swapping", "new calls are refused from now on"))
        report(SwapProgress("draining", f"{busy(child)} calls running"))
        await asyncio.shield(self._drain_and_stop(child))
        self._on_change(child)
        report(SwapProgress("done"))

    async def _drain_and_stop(self, child: ManagedChild) -> None:
        deadline = time.monotonic() + self._config().swap_drain_timeout
        while time.monotonic() < deadline:  # calls finishing signal nothing: poll
            if not busy(child):
                break
            await asyncio.sleep(0.05)
        if busy(child):
            _log.warning("drain timed out; stopping anyway", role=child.role,
                         in_flight=busy(child))
        await child.supervisor.stop()


def busy(child: ManagedChild) -> int:
    """Calls running on the role: admitted ones, or HTTP requests on its client."""
    sup = child.supervisor
    requests = 0
    if sup.state is State.RUNNING:
        try:
            requests = sup.client.in_flight
        except ChildNotReadyError:  # it stopped in between: nothing running
            requests = 0
    return max(child.admission.in_flight, requests)


def request_from_config(child: ManagedChild) -> ModeRequest:
    """The mode the role's configuration asks for."""
    cc = child.config
    return ModeRequest(cc.mode, cc.endpoint() if cc.mode is InferenceMode.ENDPOINT else None,
                       reason="configuration")
