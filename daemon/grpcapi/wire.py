"""Requests whose bytes cannot be decoded: INVALID_ARGUMENT naming what is wrong.

gRPC decodes a request before any handler runs, and grpcio answers a request it cannot
decode with UNKNOWN and a Python exception's repr ("Unexpected <class 'DecodeError'>...").
That says neither that the caller is at fault nor what to fix. :class:`DecodeGuard`, a
server interceptor, wraps every method's request deserializer: bytes that do not
decode become a :class:`Malformed` marker, and the method answers INVALID_ARGUMENT (mapped
by :mod:`daemon.errors`) with one line from :func:`diagnose`: the message type, the field
path and the byte offset of the first problem, e.g.::

    request is not a valid llamad.v1.ChatRequest: field messages[0].content is not
    valid UTF-8 (byte 0 of its 2-byte value); proto3 string fields must be UTF-8

Handlers wrapped by :mod:`daemon.grpcapi.rpc` refuse the marker themselves (mapped, logged and
counted like any other error); the others (health, and server reflection, whose requests
stream: the call is refused at the first undecodable message) are wrapped here.
"""

from __future__ import annotations

import abc
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import structlog
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError

from ..errors import InvalidArgument, map_error
from ..telemetry.metrics import Metrics

__all__ = ["RPC_MARKER", "DecodeGuard", "Malformed", "diagnose"]

RPC_MARKER = "_llamad_refuses_malformed"
"""Set by :mod:`daemon.grpcapi.rpc` on the handlers it wraps: they refuse a :class:`Malformed`
request themselves."""

_log = structlog.get_logger("llamad.rpc")

_VARINT, _FIXED64, _LENGTH, _START_GROUP, _END_GROUP, _FIXED32 = range(6)
_MAX_DEPTH = 100  # protobuf's own default recursion limit
_SHOWN = 200      # longest diagnosis, in characters, before "..."


@dataclass(frozen=True)
class Malformed:
    """Stands in for a request whose bytes did not decode."""

    message: str


class _Bad(Exception):
    """A problem found at a position of the wire bytes (internal to :func:`diagnose`)."""


def _varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    start = pos
    while pos < end:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift >= 70:
            raise _Bad(f"a varint longer than 10 bytes at byte {start}")
    raise _Bad(f"a varint cut off by the end of the data at byte {start}")


def _skip_scalar(wire: int, data: bytes, pos: int, end: int) -> int | None:
    """The position after a varint or fixed-size value; None for the other wire types."""
    if wire == _VARINT:
        return _varint(data, pos, end)[1]
    if wire == _FIXED64:
        return pos + 8
    if wire == _FIXED32:
        return pos + 4
    return None


def _walk(data: bytes, pos: int, end: int, desc: Descriptor | None, *, path: str,
          depth: int) -> None:
    """Raise :class:`_Bad` at the first problem in ``data[pos:end]``, read as ``desc``."""
    if depth > _MAX_DEPTH:
        raise _Bad(f"messages nested deeper than {_MAX_DEPTH} levels at {path or 'the top'}")
    seen: dict[int, int] = {}
    while pos < end:
        at = pos
        key, pos = _varint(data, pos, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise _Bad(f"field number 0 at byte {at}")
        field = desc.fields_by_number.get(number) if desc is not None else None
        index = seen.get(number, 0)
        seen[number] = index + 1
        name = f"#{number}" if field is None else field.name
        if field is not None and field.is_repeated:
            name += f"[{index}]"
        where = f"{path}.{name}" if path else name
        if (after := _skip_scalar(wire, data, pos, end)) is not None:
            pos = after
        elif wire == _LENGTH:
            length, pos = _varint(data, pos, end)
            if length > end - pos:
                raise _Bad(f"field {where} at byte {at} claims {length} bytes but only "
                           f"{end - pos} remain")
            if field is not None and field.type == FieldDescriptor.TYPE_STRING:
                try:
                    data[pos:pos + length].decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise _Bad(f"field {where} is not valid UTF-8 (byte {exc.start} of its "
                               f"{length}-byte value); proto3 string fields must be "
                               "UTF-8") from None
            elif field is not None and field.type == FieldDescriptor.TYPE_MESSAGE:
                _walk(data, pos, pos + length, field.message_type, path=where, depth=depth + 1)
            pos += length
        elif wire == _START_GROUP:
            pos = _skip_group(data, pos, end, number, where=where, depth=depth + 1)
        else:
            raise _Bad(f"field {where} at byte {at} has wire type {wire}, which does not exist")
        if pos > end:
            raise _Bad(f"field {where} at byte {at} is cut off by the end of the data")


def _skip_group(data: bytes, pos: int, end: int, number: int, *, where: str,
                depth: int) -> int:
    """Skip a (deprecated) group's fields up to its END_GROUP tag; the position after it."""
    if depth > _MAX_DEPTH:
        raise _Bad(f"groups nested deeper than {_MAX_DEPTH} levels in field {where}")
    while pos < end:
        at = pos
        key, pos = _varint(data, pos, end)
        inner, wire = key >> 3, key & 7
        if wire == _END_GROUP:
            if inner != number:
                raise _Bad(f"field {where}: group end tag {inner} at byte {at} does not match")
            return pos
        if (after := _skip_scalar(wire, data, pos, end)) is not None:
            pos = after
        elif wire == _LENGTH:
            length, pos = _varint(data, pos, end)
            pos += length
        elif wire == _START_GROUP:
            pos = _skip_group(data, pos, end, inner, where=where, depth=depth + 1)
        else:
            raise _Bad(f"field {where} at byte {at} has wire type {wire}, which does not exist")
    raise _Bad(f"field {where}: a group is not closed before the end of the data")


def diagnose(desc: Descriptor | None, data: bytes, error: str = "") -> str:
    """One line saying why ``data`` is not a valid ``desc`` message.

    Args:
        desc: the expected message type (None: unknown, only the wire format is checked).
        data: the bytes that failed to decode.
        error: the decoder's own message, used when the walk finds nothing more precise.
    """
    type_name = desc.full_name if desc is not None else "message"
    fallback = error.rsplit(": ", 1)[-1] if error else "it does not decode"
    try:
        _walk(data, 0, len(data), desc, path="", depth=0)
    except _Bad as bad:
        reason = str(bad)
    except Exception:  # the diagnosis must never turn a refusal into a crash
        reason = fallback
    else:
        reason = fallback
    if len(reason) > _SHOWN:
        reason = reason[:_SHOWN] + "..."
    return f"request is not a valid {type_name}: {reason}"


def _guard_deserializer(deserialize: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    message_class = getattr(deserialize, "__self__", None)
    desc: Descriptor | None = getattr(message_class, "DESCRIPTOR", None)

    def guarded(data: bytes) -> Any:
        try:
            return deserialize(data)
        except DecodeError as exc:
            return Malformed(diagnose(desc, data, str(exc)))

    return guarded


class HandlerInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """A server interceptor that may put another handler in place of a method's own (the
    same shape: unary or streaming on each side)."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        return None if handler is None else self.handler_for(handler, details)

    @abc.abstractmethod
    def handler_for(self, handler: grpc.RpcMethodHandler,
                    details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        """The handler to serve the call with (``handler`` itself to let it through)."""


class DecodeGuard(HandlerInterceptor):
    """Answer undecodable requests with INVALID_ARGUMENT and a precise reason."""

    def __init__(self, metrics: Metrics | None = None) -> None:
        self._metrics = metrics
        # method -> (the service's handler, its guarded form): built once per method.
        self._guarded: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def handler_for(self, handler: grpc.RpcMethodHandler,
                    details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        if handler.request_deserializer is None:
            return handler
        cached = self._guarded.get(details.method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        guarded = self._guard(handler, details)
        self._guarded[details.method] = (handler, guarded)
        return guarded

    def _guard(self, handler: grpc.RpcMethodHandler,
               details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        deserializer = _guard_deserializer(handler.request_deserializer)
        slot = ("stream" if handler.request_streaming else "unary") + "_" + (
            "stream" if handler.response_streaming else "unary")
        behavior = getattr(handler, slot)
        if getattr(behavior, RPC_MARKER, False):
            # Wrapped by daemon.grpcapi.rpc, which refuses a Malformed request itself (mapped,
            # logged and counted like any other error): no extra layer per response.
            return handler._replace(request_deserializer=deserializer)
        method = str(details.method).rsplit("/", 1)[-1]
        if inspect.isasyncgenfunction(behavior):
            wrapped = self._generator(method, behavior, handler.request_streaming)
        elif inspect.iscoroutinefunction(behavior):
            wrapped = self._coroutine(method, behavior, handler.request_streaming)
        else:  # a synchronous handler: none here; left to grpcio
            return handler
        return handler._replace(request_deserializer=deserializer, **{slot: wrapped})

    async def _refuse(self, method: str, request: Malformed,
                      context: grpc.aio.ServicerContext) -> None:
        mapped = map_error(InvalidArgument(request.message))
        _log.info("rpc", method=method, code=mapped.code.name, error=request.message)
        if self._metrics is not None:
            self._metrics.request(method, mapped.code.name, 0.0)
        await context.abort(mapped.code, mapped.message)

    async def _checked(self, method: str, requests: AsyncIterator[Any],
                       context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        """A request stream that refuses the call at its first undecodable message."""
        async for request in requests:
            if isinstance(request, Malformed):
                await self._refuse(method, request, context)
            yield request

    async def _first(self, method: str, request: Any, streaming: bool,
                     context: grpc.aio.ServicerContext) -> Any:
        """The request (or request stream) to hand to the handler."""
        if streaming:
            return self._checked(method, request, context)
        if isinstance(request, Malformed):
            await self._refuse(method, request, context)
        return request

    def _coroutine(self, method: str, behavior: Callable[..., Any],
                   streaming: bool) -> Callable[..., Any]:
        """A unary-response handler, or a streaming one that writes with
        ``context.write``."""
        async def coroutine(request: Any, context: grpc.aio.ServicerContext) -> Any:
            return await behavior(await self._first(method, request, streaming, context),
                                  context)

        return coroutine

    def _generator(self, method: str, behavior: Callable[..., Any],
                   streaming: bool) -> Callable[..., Any]:
        """A streaming handler that yields its responses."""
        async def generator(request: Any, context: grpc.aio.ServicerContext
                            ) -> AsyncIterator[Any]:
            request = await self._first(method, request, streaming, context)
            async for item in behavior(request, context):
                yield item

        return generator
