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

This module checks the request and decides the target; the model carries the switch out
through the same primitive as a swap (:meth:`daemon.models.model.Model.replace`), or goes out of
service (:meth:`daemon.models.model.Model.unload`). Changing the embedded model is
:mod:`daemon.models.swaps`' job (``Swap``); a switch and a swap of the same role never run at
once (:attr:`daemon.models.model.Model.switching`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from supervisor import (
    EndpointSpec,
    SwapFailedError,
    SwapInProgressError,
    SwapProgress,
    pick_runtime,
)

from ..config import Config
from ..config.inference_mode import InferenceMode
from ..errors import FailedPrecondition, InvalidArgument
from ._replace import ProgressSink
from .children import Setup, make_setup
from .model import Model, Target

if TYPE_CHECKING:
    from .pool import Pool

_log = structlog.get_logger("llamad.modes")


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
        registry: the model registry, asked for the model serving a role at each switch.
        config: the configuration in force (re-read at each switch: a reload may change
            the llama-server binary).
    """

    def __init__(self, registry: Pool, config: Callable[[], Config]) -> None:
        self._registry = registry
        self._config = config

    def config(self) -> Config:
        """The configuration in force."""
        return self._config()

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
        model = self._registry.of_role(role)
        if model.switching:
            raise SwapInProgressError(f"a swap or mode switch of the {role} role is already "
                                      "running")
        old = model.mode
        began = time.monotonic()
        try:
            await self._switch(model, request, report)
        except SwapFailedError as exc:
            _log.warning("mode switch failed; the old mode keeps serving", role=role,
                         old=old.kind, new=request.kind, cause=exc.cause.kind,
                         error=exc.cause.message)
            raise
        _log.info("mode switched", role=role, old=old.kind, new=model.mode.kind,
                  endpoint=model.mode.endpoint.display_url if model.mode.endpoint else None,
                  reason=request.reason or None, seconds=round(time.monotonic() - began, 3))

    async def _switch(self, model: Model, request: ModeRequest,
                      report: ProgressSink) -> None:
        old = model.mode
        if request.kind is InferenceMode.DISABLED:
            if old.kind is InferenceMode.DISABLED:
                report(SwapProgress("done", f"the {model.role} role is already disabled"))
                return
            await model.unload(report)
            return
        if request.kind is InferenceMode.EMBEDDED and old.kind is InferenceMode.EMBEDDED:
            if request.model:
                raise InvalidArgument(f"the {model.role} role is already embedded; Swap "
                                      "changes its model")
            report(SwapProgress("done", f"the {model.role} role is already embedded"))
            return
        target: Target
        if request.kind is InferenceMode.EMBEDDED:
            target = model.target_for(request.setup or self._setup(model, request.model))
        elif request.kind is InferenceMode.ENDPOINT and request.endpoint is not None:
            target = model.target_endpoint(request.endpoint)
        else:
            raise InvalidArgument(f"unknown mode {request.kind!r}")
        await model.replace(target, reason=request.reason, progress=report)

    def _setup(self, model: Model, path: str) -> Setup:
        if not path:
            return model.setup  # raises FailedPrecondition when none is configured
        if model.current is not None:
            runtime = model.current.runtime
        else:
            try:
                config = self._config()
                runtime = pick_runtime(model.config.runtime, config.settings.llama_bin or None,
                                       slots=config.settings.child.slots)
            except FileNotFoundError as exc:
                raise FailedPrecondition(str(exc)) from None
        return make_setup(model.role, path, runtime, model.config)


def request_from_config(model: Model) -> ModeRequest:
    """The mode the role's configuration asks for."""
    cc = model.config
    return ModeRequest(cc.mode, cc.endpoint() if cc.mode is InferenceMode.ENDPOINT else None,
                       reason="configuration")
