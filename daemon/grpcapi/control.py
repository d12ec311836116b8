"""gRPC servicer of ControlService: Status, TailLogs, Swap, SetMode, Reset and SetDraining.

Swap and SetMode stream the stages of their make-before-break switch as they happen; the
work runs in a task of its own, so a client that goes away mid-swap cancels it (before
the take-over: nothing changed; after: only the old one's drain is cut short).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc

from llamad_protocol.v1 import control_pb2, control_pb2_grpc
from supervisor import (
    ArgumentRefused,
    BreakerState,
    EndpointClient,
    EndpointError,
    EndpointSpec,
    ExitCause,
    LogLine,
    State,
    SwapInProgressError,
    SwapProgress,
    SwapRefusedError,
    check_api_args,
    choose_chat_template,
    normalise_url,
    read_api_key,
)

from ..config import Config, Role
from ..config.inference_mode import InferenceMode
from ..errors import FailedPrecondition, InvalidArgument
from ..models._key_sources import check_key_source
from ..models.model import Model
from ..models.modes import ModeManager, ModeRequest
from ..models.pool import Pool
from ..models.swaps import SwapManager, SwapPlan, check_plan_model
from ..ops.balancing import Drainer
from ..services import residency
from ..telemetry.metrics import Metrics
from . import rpc
from ._pool_wire import load_progress, model_info
from .inference import ROLE_ENUMS, _role, _timestamp

_STATES = {
    State.IDLE: control_pb2.CHILD_STATE_IDLE,
    State.STARTING: control_pb2.CHILD_STATE_STARTING,
    State.RUNNING: control_pb2.CHILD_STATE_RUNNING,
    State.BACKOFF: control_pb2.CHILD_STATE_BACKOFF,
    State.FAILED: control_pb2.CHILD_STATE_FAILED,
    State.STOPPED: control_pb2.CHILD_STATE_STOPPED,
}
_SWAP_STAGES = {
    "validating": control_pb2.SWAP_STAGE_VALIDATING,
    "launching": control_pb2.SWAP_STAGE_LAUNCHING,
    "loading": control_pb2.SWAP_STAGE_LOADING,
    "probing": control_pb2.SWAP_STAGE_PROBING,
    "swapping": control_pb2.SWAP_STAGE_SWAPPING,
    "draining": control_pb2.SWAP_STAGE_DRAINING,
    "done": control_pb2.SWAP_STAGE_DONE,
    "failed": control_pb2.SWAP_STAGE_FAILED,
}
MODES = {m: control_pb2.InferenceMode.Value(f"INFERENCE_MODE_{m.name}") for m in InferenceMode}
"""Each :class:`~daemon.config.InferenceMode` as the wire's."""
_MODE_NAMES = {v: k for k, v in MODES.items()}


def _exit_cause(cause: ExitCause | None) -> control_pb2.ExitCause | None:
    if cause is None:
        return None
    msg = control_pb2.ExitCause(
        kind=cause.kind, signal=cause.signal, permanent=cause.permanent,
        message=cause.message, at=_timestamp(cause.at),
    )
    if cause.exit_code is not None:
        msg.exit_code = cause.exit_code
    return msg


def _log_line(role: str, line: LogLine) -> control_pb2.LogLine:
    return control_pb2.LogLine(
        role=ROLE_ENUMS[role], pid=line.pid, stream=line.stream, text=line.text,
        time=_timestamp(line.time), seq=line.seq,
    )


def child_status(child: Model) -> control_pb2.ChildStatus:
    """One role's snapshot: its mode, and what serves it."""
    sup, mode = child.supervisor, child.mode.kind
    status = control_pb2.ChildStatus(
        role=ROLE_ENUMS[child.role],
        mode=MODES[mode],
        enabled=mode is not InferenceMode.DISABLED,
        state=(_STATES[sup.state] if mode is not InferenceMode.DISABLED
               else control_pb2.CHILD_STATE_STOPPED),
        pid=sup.pid,
        socket=sup.socket,
        uptime_seconds=sup.uptime(),
        restarts=sup.restarts,
        breaker=(control_pb2.BREAKER_STATE_OPEN if sup.breaker.state is BreakerState.OPEN
                 else control_pb2.BREAKER_STATE_CLOSED),
        consecutive_failures=sup.breaker.failures,
        in_flight=child.admission.in_flight,
        queued=child.admission.queued,
        slots=child.admission.limit,
        queue_ahead=child.admission.ahead,
        last_error=child.last_error,
    )
    setup = child.current
    if mode is InferenceMode.EMBEDDED and setup is not None:
        info = setup.model.info
        status.model_path = str(setup.spec.model)
        status.model_sha256 = setup.model.sha256
        status.runtime = setup.runtime.name
        status.model_architecture = info.architecture if info else ""
        status.model_context_length = info.context_length if info else 0
        if info is not None and not setup.spec.embedding:
            status.chat_template = choose_chat_template(
                info, child.config.chat_template).describe()
    elif mode is InferenceMode.ENDPOINT and child.mode.endpoint is not None:
        status.runtime = "endpoint"
        status.endpoint_url = child.mode.endpoint.display_url
        status.endpoint_model = child.mode.endpoint.model
        if sup.state is State.RUNNING:
            client = sup.client
            if isinstance(client, EndpointClient):
                status.endpoint_model = client.model_id
                status.model_context_length = client.context_length
    progress = sup.load_progress()
    if progress is not None:
        status.loading.CopyFrom(load_progress(progress))
    cause = _exit_cause(sup.last_exit)
    if cause is not None:
        status.last_exit.CopyFrom(cause)
    if child.previous is not None:
        status.previous_model_path = str(child.previous.spec.model)
    if child.last_swap is not None:
        swap = child.last_swap
        status.last_swap.CopyFrom(control_pb2.SwapInfo(
            from_model=swap.old, to_model=swap.new, at=_timestamp(swap.at),
            reason=swap.reason, duration_seconds=swap.seconds,
        ))
    return status


def status_response(pool: Pool, version: str, started: float, *, draining: bool,
                    drainer: Drainer | None) -> control_pb2.StatusResponse:
    """Status's answer: each role's child, each catalog model, the node's drain state
    (the operator console shows it too: :mod:`daemon.console`)."""
    return control_pb2.StatusResponse(
        children=[child_status(pool.of_role(r)) for r in Role if r in pool.roles()],
        version=version, daemon_uptime_seconds=time.monotonic() - started,
        draining=draining, drained=drainer is not None and drainer.drained,
        models=[model_info(v) for v in pool.models()])


def mode_request(child: Model, request: control_pb2.SetModeRequest,
                 config: Config) -> ModeRequest:
    """Check a SetMode request before anything starts (INVALID_ARGUMENT otherwise): an
    API key only from where ``config`` allows
    (:func:`daemon.models._key_sources.check_key_source`)."""
    kind = _MODE_NAMES.get(request.mode)
    if kind is None:
        raise InvalidArgument("mode must be INFERENCE_MODE_EMBEDDED, INFERENCE_MODE_ENDPOINT "
                              "or INFERENCE_MODE_DISABLED")
    e = request.endpoint
    given = any((e.url, e.model, e.api_key_file, e.api_key_env))
    if kind is not InferenceMode.ENDPOINT and given:
        raise InvalidArgument("endpoint settings are for INFERENCE_MODE_ENDPOINT only")
    if kind is not InferenceMode.EMBEDDED and request.model_path:
        raise InvalidArgument("model_path is for INFERENCE_MODE_EMBEDDED only")
    check_plan_model(request.model_path)
    endpoint: EndpointSpec | None = None
    if kind is InferenceMode.ENDPOINT:
        if given and not e.url:
            raise InvalidArgument("endpoint.url is required when other endpoint fields are set")
        endpoint = (EndpointSpec(e.url, e.model, e.api_key_file, e.api_key_env) if e.url
                    else child.config.endpoint())
        if endpoint is None:
            raise InvalidArgument(f"no endpoint.url given and {child.role}.endpoint_url is not "
                                  "configured")
        try:
            normalise_url(endpoint.url)
        except ValueError as exc:
            raise InvalidArgument(f"endpoint.url: {exc}") from None
        check_key_source(endpoint, config)
        try:  # the file or variable is read again at the switch; this names a bad one now
            read_api_key(endpoint.api_key_file, endpoint.api_key_env)
        except EndpointError as exc:
            raise InvalidArgument(str(exc)) from None
    return ModeRequest(kind, endpoint, model=request.model_path, reason=request.reason[:200])


class ControlServicer(control_pb2_grpc.ControlServiceServicer):
    """Status, TailLogs, Swap, SetMode, Reset, SetDraining, and the model pool's
    ListModels, LoadModel and UnloadModel."""

    def __init__(
        self,
        pool: Pool,
        version: str,
        started: float,
        draining: Callable[[], bool],
        *,
        swaps: SwapManager,
        modes: ModeManager,
        metrics: Metrics | None = None,
        drainer: Drainer | None = None,
    ) -> None:
        self._pool = pool  # the model registry: the roles' models and every other
        self._drainer = drainer
        self._version = version
        self._started = started
        self._draining = draining
        self._swaps = swaps
        self._modes = modes
        self.metrics = metrics

    @rpc.unary("Status")
    async def Status(
        self,
        request: control_pb2.StatusRequest,
        context: grpc.aio.ServicerContext,
        call: rpc.Call,
    ) -> control_pb2.StatusResponse:
        return status_response(self._pool, self._version, self._started,
                               draining=self._draining(), drainer=self._drainer)

    @rpc.unary("SetDraining")
    async def SetDraining(
        self,
        request: control_pb2.SetDrainingRequest,
        context: grpc.aio.ServicerContext,
        call: rpc.Call,
    ) -> control_pb2.SetDrainingResponse:
        if self._drainer is None:
            raise FailedPrecondition("this daemon has no drain control")
        self._drainer.set(request.draining, request.reason[:200])
        call.note(draining=request.draining)
        return control_pb2.SetDrainingResponse(draining=self._drainer.drained,
                                               in_flight=self._drainer.in_flight())

    @rpc.unary("ListModels")
    async def ListModels(
        self,
        request: control_pb2.ListModelsRequest,
        context: grpc.aio.ServicerContext,
        call: rpc.Call,
    ) -> control_pb2.ListModelsResponse:
        pool = self._pool
        return control_pb2.ListModelsResponse(
            models=[model_info(v) for v in pool.models()],
            skipped=[f"{path}: {why}" for path, why in pool.catalog.skipped])

    @rpc.unary("LoadModel")
    async def LoadModel(
        self,
        request: control_pb2.LoadModelRequest,
        context: grpc.aio.ServicerContext,
        call: rpc.Call,
    ) -> control_pb2.LoadModelResponse:
        name = self._pool.entry(request.name).name
        call.note(model=name)
        return control_pb2.LoadModelResponse(
            model=model_info(await residency.load(self._pool, name)))

    @rpc.unary("UnloadModel")
    async def UnloadModel(
        self,
        request: control_pb2.UnloadModelRequest,
        context: grpc.aio.ServicerContext,
        call: rpc.Call,
    ) -> control_pb2.UnloadModelResponse:
        name = self._pool.entry(request.name).name
        call.note(model=name, reason=request.reason[:200])
        return control_pb2.UnloadModelResponse(
            model=model_info(await residency.unload(self._pool, name)))

    async def _progress(
        self, role: str, work: Callable[[Callable[[SwapProgress], None]], Awaitable[object]],
    ) -> AsyncIterator[control_pb2.SwapProgress]:
        """Run ``work`` in a task, streaming the stages it reports; then its outcome (an
        error is raised here, for the RPC wrapper to map)."""
        began = time.monotonic()
        queue: asyncio.Queue[SwapProgress | None] = asyncio.Queue()

        async def run() -> None:
            outcome = "failed"
            try:
                await work(queue.put_nowait)
                outcome = "ok"
            except (SwapInProgressError, SwapRefusedError, InvalidArgument, FailedPrecondition):
                outcome = "rejected"
                raise
            finally:
                if self.metrics is not None:
                    self.metrics.swap(role, outcome, time.monotonic() - began)
                queue.put_nowait(None)

        task = asyncio.create_task(run(), name=f"switch-{role}")
        try:
            while (event := await queue.get()) is not None:
                msg = control_pb2.SwapProgress(
                    stage=_SWAP_STAGES.get(event.stage, control_pb2.SWAP_STAGE_UNSPECIFIED),
                    message=event.message,
                    elapsed_seconds=time.monotonic() - began,
                )
                cause = _exit_cause(event.cause)
                if cause is not None:
                    msg.cause.CopyFrom(cause)
                yield msg
            await task  # raises the work's error, mapped by the wrapper
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    @rpc.stream("Swap")
    async def Swap(
        self,
        request: control_pb2.SwapRequest,
        context: grpc.aio.ServicerContext,
        call: rpc.Call,
    ) -> AsyncIterator[control_pb2.SwapProgress]:
        role = _role(request.role)
        pooled: Model | None = None
        if request.model:
            pool = self._pool
            entry = pool.entry(request.model)
            role = entry.role
            if entry.name != pool.catalog.defaults.get(role):
                pooled = pool.model(entry.name)
                if pooled is None or not pool.is_resident(entry.name):
                    raise FailedPrecondition(
                        f"model {entry.name!r} is not resident: Swap replaces what serves "
                        "a resident model (LoadModel first, or change its [models."
                        f"{entry.name}] table and reload)")
        check_plan_model(request.model_path)
        if request.HasField("ctx_size") and request.ctx_size > 1 << 20:
            raise InvalidArgument("ctx_size must be at most 1048576")
        extra_args: tuple[str, ...] | None = None
        if request.HasField("extra_args"):
            try:  # an admin token is an API role, not a shell: an allow-list only
                extra_args = check_api_args(tuple(request.extra_args.split()))
            except ArgumentRefused as exc:
                raise InvalidArgument(f"extra_args: {exc}") from None
        plan = SwapPlan(
            model=request.model_path,
            extra_args=extra_args,
            ctx_size=request.ctx_size if request.HasField("ctx_size") else None,
            rollback=request.rollback,
            stop_old_first=request.stop_old_first,
            reason=request.reason[:200],
        )
        call.note(role=role, rollback=plan.rollback, model=request.model or None)
        async for msg in self._progress(
                role, lambda report: self._swaps.swap(role, plan, report, model=pooled)):
            yield msg

    @rpc.stream("SetMode")
    async def SetMode(
        self,
        request: control_pb2.SetModeRequest,
        context: grpc.aio.ServicerContext,
        call: rpc.Call,
    ) -> AsyncIterator[control_pb2.SwapProgress]:
        role = _role(request.role)
        wanted = mode_request(self._pool.of_role(role), request, self._modes.config())
        call.note(role=role, mode=wanted.kind,
                  endpoint=wanted.endpoint.display_url if wanted.endpoint else None)
        async for msg in self._progress(
                role, lambda report: self._modes.set_mode(role, wanted, report)):
            yield msg

    @rpc.unary("Reset")
    async def Reset(
        self,
        request: control_pb2.ResetRequest,
        context: grpc.aio.ServicerContext,
        call: rpc.Call,
    ) -> control_pb2.ResetResponse:
        role = _role(request.role)
        child = self._pool.of_role(role)
        child.reset()  # Disabled when the role is disabled
        call.note(role=role)
        return control_pb2.ResetResponse(state=_STATES[child.supervisor.state])

    @rpc.stream("TailLogs")
    async def TailLogs(
        self,
        request: control_pb2.TailLogsRequest,
        context: grpc.aio.ServicerContext,
        call: rpc.Call,
    ) -> AsyncIterator[control_pb2.LogLine]:
        role = _role(request.role)
        child = self._pool.of_role(role)
        call.note(role=role, follow=request.follow)
        if request.follow:
            async for line in child.ring.follow(request.lines):
                yield _log_line(role, line)
        else:
            for line in child.ring.tail(request.lines):
                yield _log_line(role, line)
