"""The errors the llamad client raises: gRPC status codes mapped at this boundary.

Callers never see ``grpc.RpcError``; every failed call raises one of these::

    LlamadError                 any failed call; .code, .details, .retry_after
    ├── Unavailable             UNAVAILABLE: daemon unreachable, draining, child not running
    ├── InvalidArgument         INVALID_ARGUMENT: the message names the field and the limit
    │   └── OutOfRange          OUT_OF_RANGE: e.g. a question that cannot fit the context
    ├── NotFound                NOT_FOUND: no such document or source
    ├── ResourceExhausted       RESOURCE_EXHAUSTED: every slot busy and the queue full
    ├── DeadlineExceeded        DEADLINE_EXCEEDED: the call's deadline passed (or would)
    ├── FailedPrecondition      FAILED_PRECONDITION: role disabled, swap already running
    ├── Aborted                 ABORTED: a swap failed; the old child keeps serving
    ├── Cancelled               CANCELLED: the call was cancelled
    ├── Unauthenticated         UNAUTHENTICATED: missing or wrong token
    ├── PermissionDenied        PERMISSION_DENIED
    ├── Unimplemented           UNIMPLEMENTED: the daemon does not serve this RPC
    └── Internal                INTERNAL, UNKNOWN, DATA_LOSS and anything else

``Unavailable`` and ``ResourceExhausted`` carry ``retry_after`` (seconds, or None) when
the daemon sent a hint: the trailing metadata ``retry-after-ms``, else the
``google.rpc.RetryInfo`` detail in ``grpc-status-details-bin``.
"""

from __future__ import annotations

from typing import Any

import grpc

from llamad_protocol.v1.wire import RETRY_AFTER_KEY, STATUS_DETAILS_KEY

__all__ = [
    "Aborted",
    "Cancelled",
    "DeadlineExceeded",
    "FailedPrecondition",
    "Internal",
    "InvalidArgument",
    "LlamadError",
    "NotFound",
    "OutOfRange",
    "PermissionDenied",
    "ResourceExhausted",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "from_rpc_error",
]



class LlamadError(Exception):
    """A call to llamad failed.

    Attributes:
        code: the gRPC status code's name, e.g. ``"INVALID_ARGUMENT"``.
        details: the daemon's message (or gRPC's, for transport failures).
        retry_after: seconds the daemon asked the caller to wait, or None.
    """

    def __init__(self, details: str, *, code: str = "UNKNOWN",
                 retry_after: float | None = None) -> None:
        super().__init__(details)
        self.code = code
        self.details = details
        self.retry_after = retry_after

    def __repr__(self) -> str:
        hint = "" if self.retry_after is None else f", retry_after={self.retry_after}"
        return f"{type(self).__name__}({self.details!r}{hint})"


class Unavailable(LlamadError):
    """The daemon cannot take the call now: unreachable, draining, or the child it needs is
    starting, backing off or failed. ``retry_after`` is set when the daemon knows."""


class InvalidArgument(LlamadError):
    """The request is invalid; nothing was done."""


class OutOfRange(InvalidArgument):
    """The request cannot fit (e.g. Ask's question and template exceed the context)."""


class NotFound(LlamadError):
    """No such document, source or object."""


class ResourceExhausted(LlamadError):
    """The child's slots and wait queue are full; retry after ``retry_after`` seconds."""


class DeadlineExceeded(LlamadError):
    """The call's deadline passed, or the daemon saw it would pass while queued."""


class FailedPrecondition(LlamadError):
    """The daemon's state refuses the call: role disabled, a swap already running, a model
    that does not fit beside the running one."""


class Aborted(LlamadError):
    """The operation was abandoned (a swapped-in child never became ready; the old child
    keeps serving)."""


class Cancelled(LlamadError):
    """The call was cancelled."""


class Unauthenticated(LlamadError):
    """The call carried no valid credentials."""


class PermissionDenied(LlamadError):
    """The credentials are valid but not allowed to do this."""


class Unimplemented(LlamadError):
    """The daemon does not serve this RPC (an older daemon, or the service is disabled)."""


class Internal(LlamadError):
    """The daemon failed unexpectedly (it logs the cause; no traceback is sent)."""


_BY_CODE: dict[grpc.StatusCode, type[LlamadError]] = {
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.OUT_OF_RANGE: OutOfRange,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.ABORTED: Aborted,
    grpc.StatusCode.CANCELLED: Cancelled,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNIMPLEMENTED: Unimplemented,
}


def _retry_after(metadata: Any) -> float | None:
    """The retry hint in seconds: ``retry-after-ms`` first, else a RetryInfo detail."""
    items: list[tuple[str, str | bytes]] = []
    for item in metadata or ():
        key, value = (item.key, item.value) if hasattr(item, "key") else item
        items.append((str(key).lower(), value))
    for key, value in items:
        if key == RETRY_AFTER_KEY:
            try:
                ms = float(value.decode() if isinstance(value, bytes) else value)
            except ValueError:
                continue
            if ms >= 0:
                return ms / 1000.0
    for key, value in items:
        if key == STATUS_DETAILS_KEY and isinstance(value, bytes):
            return _retry_info(value)
    return None


def _retry_info(blob: bytes) -> float | None:
    from google.protobuf.message import DecodeError  # noqa: PLC0415

    try:  # googleapis-common-protos (a grpcio-status dependency) defines these
        from google.rpc import error_details_pb2, status_pb2  # noqa: PLC0415
    except ImportError:
        return None

    try:
        status = status_pb2.Status.FromString(blob)
    except DecodeError:
        return None
    for detail in status.details:
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            return float(info.retry_delay.ToMilliseconds()) / 1000.0
    return None


def from_rpc_error(exc: grpc.RpcError) -> LlamadError:
    """The :class:`LlamadError` for a failed gRPC call (sync or asyncio).

    Args:
        exc: the error grpc raised; it must also be a ``grpc.Call`` (every error raised
            by a call is), else it maps to :class:`Internal`.

    Returns:
        An instance of the subclass for the status code, with the daemon's message and
        its retry hint (only kept for UNAVAILABLE and RESOURCE_EXHAUSTED).

    Example:
        >>> import grpc
        >>> class Failed(grpc.RpcError):
        ...     def code(self): return grpc.StatusCode.RESOURCE_EXHAUSTED
        ...     def details(self): return "queue full"
        ...     def trailing_metadata(self): return (("retry-after-ms", "1500"),)
        >>> err = from_rpc_error(Failed())
        >>> type(err).__name__, err.details, err.retry_after
        ('ResourceExhausted', 'queue full', 1.5)
    """
    code_fn = getattr(exc, "code", None)
    code = code_fn() if callable(code_fn) else None
    if not isinstance(code, grpc.StatusCode):
        return Internal(f"gRPC error without a status: {exc!r}", code="UNKNOWN")
    details_fn = getattr(exc, "details", None)
    details = (details_fn() if callable(details_fn) else None) or code.name.lower()
    details = " ".join(str(details).split())  # one line, whatever the transport said
    cls = _BY_CODE.get(code, Internal)
    retry_after = None
    if cls in (Unavailable, ResourceExhausted):
        trailing = getattr(exc, "trailing_metadata", None)
        retry_after = _retry_after(trailing() if callable(trailing) else None)
    return cls(details, code=code.name, retry_after=retry_after)
