"""Errors of the HTTP API: OpenAI's error object, with the status gRPC's code maps to.

Every refusal is mapped by :func:`daemon.errors.map_error` first (the one table both APIs
share), then its gRPC code becomes an HTTP status as Google's API design guide pairs them
(and grpc-gateway does): INVALID_ARGUMENT, OUT_OF_RANGE and FAILED_PRECONDITION 400,
UNAUTHENTICATED 401, PERMISSION_DENIED 403, NOT_FOUND 404, ABORTED 409, RESOURCE_EXHAUSTED
429, CANCELLED 499, INTERNAL 500, UNIMPLEMENTED 501, UNAVAILABLE 503, DEADLINE_EXCEEDED
504. A retry hint becomes ``Retry-After`` (whole seconds, rounded up). The HTTP layer's own
refusals (a body too large: 413, too slow: 408, a route or method that does not exist)
are :class:`ApiError` s made here. The body is always::

    {"error": {"message": "...", "type": "...", "param": "..." | null, "code": "..." | null}}

``type`` is ``invalid_request_error`` for 400, 404, 408 and 413, ``authentication_error``
401, ``permission_error`` 403, ``rate_limit_error`` 429, ``server_error`` 5xx; ``code``
is the gRPC code in lower case, or a more precise one (``model_not_found``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import grpc
import orjson

from ..errors import InvalidArgument, map_error

_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "invalid_request_error", 405: "invalid_request_error",
          408: "invalid_request_error", 409: "invalid_request_error",
          413: "invalid_request_error", 415: "invalid_request_error",
          417: "invalid_request_error",
          429: "rate_limit_error"}
# gRPC's field -> chat completions' parameter, where the HTTP body nests or names it
# otherwise: a tool's name and parameters sit in its "function", as a history call's name
# and arguments do; logit_bias is an object keyed by token, not a list.
_RENAMED = (
    (re.compile(r"^texts(?=\[|$)"), "input"),
    (re.compile(r"^logit_bias\[\d+\].*"), "logit_bias"),
    (re.compile(r"^response_format\.name$"), "response_format.json_schema.name"),
    (re.compile(r"^tool_choice\.mode$"), "tool_choice"),
    (re.compile(r"^(tools\[\d+\])\.(name|description|parameters)$"), r"\1.function.\2"),
    (re.compile(r"^(messages\[\d+\]\.tool_calls\[\d+\])\.(name|arguments)$"),
     r"\1.function.\2"),
)


def http_param(field: str) -> str:
    """The HTTP parameter (as chat completions spells it) of a field the gRPC validation
    names (:attr:`daemon.errors.InvalidArgument.field`)."""
    param = field.removeprefix("sampling.")
    for pattern, replacement in _RENAMED:
        param = pattern.sub(replacement, param)
    return param


class ParamError(InvalidArgument):
    """A request parameter is invalid; ``param`` names it as OpenAI's API spells it."""

    def __init__(self, param: str, message: str) -> None:
        self.param = param
        super().__init__(message, field=param)


class ApiError(Exception):
    """An HTTP refusal: the status, OpenAI's error fields, and a retry hint (seconds)."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, retry_after: float | None = None,
                 grpc_code: str = "") -> None:
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.retry_after = retry_after
        self.grpc_code = grpc_code or _grpc_code_of(status)
        super().__init__(message)

    def body(self) -> bytes:
        kind = _TYPES.get(self.status, "server_error" if self.status >= 500
                          else "invalid_request_error")
        return orjson.dumps({"error": {"message": self.message, "type": kind,
                                       "param": self.param, "code": self.code}})

    def event(self, request: Mapping[Any, Any]) -> bytes:
        """The error as the last event of a stream that has begun (``request``: the
        request's values, for shapes that number their events)."""
        return b"data: " + self.body() + b"\n\n"

    def headers(self) -> dict[str, str]:
        if self.retry_after is None:
            return {}
        return {"Retry-After": str(max(1, math.ceil(self.retry_after)))}


_HTTP_LAYER_CODES = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
                     404: "NOT_FOUND", 405: "UNIMPLEMENTED", 408: "DEADLINE_EXCEEDED",
                     413: "RESOURCE_EXHAUSTED", 415: "INVALID_ARGUMENT",
                     429: "RESOURCE_EXHAUSTED", 431: "INVALID_ARGUMENT", 503: "UNAVAILABLE"}


def _grpc_code_of(status: int) -> str:
    """The gRPC code an HTTP-layer refusal is counted under (metrics, log line): a large
    body is RESOURCE_EXHAUSTED as gRPC's own message limit is."""
    return _HTTP_LAYER_CODES.get(status, "INTERNAL" if status >= 500 else "INVALID_ARGUMENT")


def same_style(error: ApiError) -> ApiError:
    """OpenAI's error object, as every route but those of other APIs' shapes answers."""
    return error


def api_error(exc: BaseException) -> ApiError:
    """``exc`` (a domain or supervisor error, or anything) as an :class:`ApiError`.

    The message is the one gRPC callers get; validation messages written for gRPC's
    ``sampling.`` prefix lose it, since HTTP parameters sit at the top of the body.
    ``param`` is the field the check itself named (:attr:`ParamError.param`, or
    :attr:`daemon.errors.InvalidArgument.field` in the HTTP API's naming), never read
    from the message; null when no one field is at fault.
    """
    if isinstance(exc, ApiError):
        return exc
    mapped = map_error(exc)
    status = _STATUS.get(mapped.code, 500)
    message = mapped.message
    param: str | None = None
    if isinstance(exc, ParamError):
        param = exc.param
    elif isinstance(exc, InvalidArgument):
        param = None if exc.field is None else http_param(exc.field)
    elif mapped.code is grpc.StatusCode.INVALID_ARGUMENT:
        params = getattr(exc, "params", None)  # UnsupportedParameterError
        if params:
            param = str(params[0]).removesuffix("_text")
    if mapped.code is grpc.StatusCode.INVALID_ARGUMENT:
        message = message.replace("sampling.", "")
    code = getattr(exc, "api_code", None) or mapped.code.name.lower()
    return ApiError(status, message, param=param, code=code,
                    retry_after=mapped.retry_after, grpc_code=mapped.code.name)
