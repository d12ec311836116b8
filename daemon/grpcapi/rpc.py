"""Per-RPC plumbing: error mapping and the one summary log line per call."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeAlias, TypeVar

import grpc
import structlog

from ..errors import InvalidArgument, map_error
from ..models import lanes
from ..models.lanes import LANE_HEADER, Lane, parse_lane
from ..services import quotas
from ..telemetry.metrics import Metrics
from .wire import RPC_MARKER, Malformed

_log = structlog.get_logger("llamad.rpc")

_running: set[asyncio.Task[Any]] = set()
"""The tasks of the gRPC calls whose frame (:func:`_handled`) has not ended, in this
process: a call cut by the drain still runs its ending (a swap stopping the child it was
loading) after the server has stopped, and its summary line comes after that."""


async def calls_ended(timeout: float) -> int:
    """Wait, at most ``timeout`` seconds, for the calls still ending (:data:`_running`)
    and then for their summary lines (written on the next turn of the loop); return
    how many had not ended. The daemon's shutdown waits for them before its last line."""
    me, loop = asyncio.current_task(), asyncio.get_running_loop()
    # This loop's calls only: a task of a loop closed before it ended (a test's) never
    # ends, and asyncio cannot wait on another loop's tasks.
    waiting = {task for task in _running
               if task is not me and not task.done() and task.get_loop() is loop}
    if waiting:
        await asyncio.wait(waiting, timeout=timeout)
    await asyncio.sleep(0)  # the summaries scheduled by the calls' ends (call_soon)
    return sum(not task.done() for task in waiting)

Req = TypeVar("Req")
Resp = TypeVar("Resp")
Self = TypeVar("Self")


@dataclass
class Call:
    """What a handler records about its call for the summary line."""

    fields: dict[str, Any] = field(default_factory=dict)
    deadline: float | None = None  # time.monotonic() when the caller's deadline passes

    def note(self, **kw: Any) -> None:
        self.fields.update(kw)



Context: TypeAlias = grpc.aio.ServicerContext
# A handler as written (``call`` last) and as gRPC calls it, unary and server-streaming.
UnaryFn: TypeAlias = Callable[[Self, Req, Context, Call], Awaitable[Resp]]
Unary: TypeAlias = Callable[[Self, Req, Context], Awaitable[Resp]]
StreamFn: TypeAlias = Callable[[Self, Req, Context, Call], AsyncIterator[Resp]]
Stream: TypeAlias = Callable[[Self, Req, Context], AsyncIterator[Resp]]

def _code_on_cancel(call: Call) -> str:
    if call.deadline is not None and time.monotonic() >= call.deadline - 0.001:
        return "DEADLINE_EXCEEDED"
    return "CANCELLED"


async def _abort(context: grpc.aio.ServicerContext, exc: BaseException, call: Call) -> None:
    mapped = map_error(exc)
    call.note(code=mapped.code.name)
    if mapped.code is grpc.StatusCode.INTERNAL:
        _log.error("internal error", exc_info=exc, **call.fields)
    await context.abort(mapped.code, mapped.message, mapped.trailing_metadata())


def _start(context: grpc.aio.ServicerContext) -> Call:
    # Read the peer and deadline now: after a cancellation, the context can touch call state
    # grpc has already freed (a segfault seen here in context.peer(); grpc/grpc#29069).
    remaining = context.time_remaining()
    deadline = None if remaining is None else time.monotonic() + remaining
    return Call({"peer": context.peer()}, deadline)


def _lane(context: grpc.aio.ServicerContext) -> Lane:
    """The lane the call's metadata asks for (``x-llamad-lane``; none: interactive).

    Raises:
        InvalidArgument: a value that is not a lane a client may ask for.
    """
    for key, value in context.invocation_metadata() or ():
        if key == LANE_HEADER:
            return parse_lane(value if isinstance(value, str) else "")
    return Lane.INTERACTIVE


def _summary(method: str, started: float, call: Call, servicer: object) -> None:
    """Count the call and log its summary line, just after its answer is on its way.

    The duration is taken now; the line and the metrics are written on the event loop's
    next turn, after grpc has been handed the response, so they add nothing to the
    caller's latency (a line costs tens of microseconds, more with cold caches after a
    child request). Anything that arrives later (a metrics scrape, the next call) is
    handled after them: the loop runs its ready callbacks in order.
    """
    seconds = time.perf_counter() - started
    asyncio.get_running_loop().call_soon(_write_summary, method, seconds, call, servicer)


def _write_summary(method: str, seconds: float, call: Call, servicer: object) -> None:
    write_summary(method, seconds, call.fields, getattr(servicer, "metrics", None))


def write_summary(method: str, seconds: float, fields: dict[str, Any],
                  metrics: Metrics | None, *, protocol: str = "grpc") -> None:
    """Count a finished call (``fields["code"]``, its gRPC code name; OK when absent) and
    log its one summary line: event ``rpc`` for gRPC, ``http`` for the HTTP API (same
    fields, plus what that API notes)."""
    code = fields.pop("code", "OK")
    if metrics is not None:
        metrics.request(method, code, seconds, protocol)
    duration_ms = round(seconds * 1000, 2)
    level = "info" if code in ("OK", "CANCELLED", "INVALID_ARGUMENT") else "warning"
    event = "rpc" if protocol == "grpc" else protocol
    getattr(_log, level)(event, method=method, code=code, duration_ms=duration_ms, **fields)


@contextlib.asynccontextmanager
async def _handled(method: str, servicer: object, request: object,
                   context: grpc.aio.ServicerContext) -> AsyncIterator[Call]:
    """One call's frame: refuse a malformed request, map an error to its status (the
    abort raises), note a cancellation's code, and write the summary line at the end."""
    call = _start(context)
    started = time.perf_counter()
    task = asyncio.current_task()
    if task is not None:
        _running.add(task)
    try:
        if isinstance(request, Malformed):  # see daemon.grpcapi.wire
            raise InvalidArgument(request.message)
        # A token's quota and lane (daemon.services.quotas): refused here when past it.
        lane, ticket = quotas.enter_current(_lane(context), call.note)
        if lane is not Lane.INTERACTIVE:
            call.note(lane=lane.value)
        try:
            with lanes.asking(lane):
                yield call
        finally:
            if ticket is not None:
                ticket.finish(call.fields)
    except asyncio.CancelledError:
        call.note(code=_code_on_cancel(call))
        raise
    except Exception as exc:
        if isinstance(exc, grpc.aio.AbortError):
            raise
        await _abort(context, exc, call)
        raise AssertionError("unreachable: abort raises") from exc
    finally:
        _summary(method, started, call, servicer)
        if task is not None:
            _running.discard(task)


def unary(method: str) -> Callable[[UnaryFn[Self, Req, Resp]], Unary[Self, Req, Resp]]:
    """Wrap a unary handler ``(self, request, context, call)``."""

    def wrap(fn: UnaryFn[Self, Req, Resp]) -> Unary[Self, Req, Resp]:
        @functools.wraps(fn)
        async def handler(self: Self, request: Req, context: Context) -> Resp:
            async with _handled(method, self, request, context) as call:
                return await fn(self, request, context, call)
            raise AssertionError("unreachable: an error aborts the call")

        setattr(handler, RPC_MARKER, True)
        return handler

    return wrap


def writes(method: str) -> Callable[[UnaryFn[Self, Req, None]], Unary[Self, Req, None]]:
    """Wrap a server-streaming handler that sends its messages itself (a coroutine
    ``(self, request, context, call)`` awaiting ``context.write`` per message).

    The same frame as :func:`unary`: grpc.aio takes a coroutine as a streaming handler
    that writes. A relay written so runs no generator per message (an async generator
    handler is driven by grpc's own ``async for``, a layer per message, on a process
    that is cold at every token at a model's pace: issue 27)."""
    return unary(method)


def stream(method: str) -> Callable[[StreamFn[Self, Req, Resp]], Stream[Self, Req, Resp]]:
    """Wrap a server-streaming handler (an async generator ``(self, request, context, call)``)."""

    def wrap(fn: StreamFn[Self, Req, Resp]) -> Stream[Self, Req, Resp]:
        @functools.wraps(fn)
        async def handler(self: Self, request: Req, context: Context) -> AsyncIterator[Resp]:
            async with _handled(method, self, request, context) as call:
                gen = fn(self, request, context, call)
                try:
                    async for item in gen:
                        yield item
                finally:
                    await gen.aclose()  # type: ignore[attr-defined]

        setattr(handler, RPC_MARKER, True)
        return handler

    return wrap
