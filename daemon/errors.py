"""The one place where domain errors become gRPC status codes.

The daemon's own errors::

    RequestError               the call cannot be served as asked
    ├── InvalidArgument        bad input: a clear message, nothing was done
    ├── Disabled               the role is switched off (its mode is "disabled")
    ├── FailedPrecondition     the daemon is not in a state to do it (e.g. no model set)
    ├── Draining               the daemon is shutting down (retry on another instance)
    ├── OutOfRange             even the question and templates exceed the token budget
    ├── Overloaded             the child's slots and wait queue are full
    ├── QuotaExceeded          the caller's token used its requests or tokens per window
    └── DeadlineUnmeetable     the expected queue wait exceeds the call's deadline

Mapping (everything else in :mod:`supervisor.errors` included):

============================  =====================  ==========
error                         status                 retry hint
============================  =====================  ==========
InvalidArgument               INVALID_ARGUMENT       no
UnsupportedParameterError     INVALID_ARGUMENT       no (names parameter, runtime)
Disabled                      FAILED_PRECONDITION    no
FailedPrecondition            FAILED_PRECONDITION    no
TokenizeUnavailableError      FAILED_PRECONDITION    no
EndpointError, permanent      FAILED_PRECONDITION    no
EndpointError, transient      UNAVAILABLE            yes
Draining                      UNAVAILABLE            yes
OutOfRange                    OUT_OF_RANGE           no
Overloaded                    RESOURCE_EXHAUSTED     yes
QuotaExceeded                 RESOURCE_EXHAUSTED     yes (when the window frees enough)
DeadlineUnmeetable            DEADLINE_EXCEEDED      no
ChildNotReadyError            UNAVAILABLE            when known
ChildBadRequestError          INVALID_ARGUMENT       no
ChildRequestError             UNAVAILABLE            yes
SwapInProgressError           FAILED_PRECONDITION    no
SwapRefusedError              FAILED_PRECONDITION    no
SwapFailedError               ABORTED                no
retrieval InvalidDocument     INVALID_ARGUMENT       no
retrieval ExtractionError     INVALID_ARGUMENT       no
retrieval NotFound            NOT_FOUND              no
UnknownModel                  NOT_FOUND              no (names the models that exist)
retrieval VectorUnavailable   FAILED_PRECONDITION    no (says why)
retrieval SourceDisabled      FAILED_PRECONDITION    no
retrieval WrongState          FAILED_PRECONDITION    no (names the state)
retrieval SourceNotAllowed    PERMISSION_DENIED      no
SourceNotAllowed, no roots    FAILED_PRECONDITION    no
retrieval SourceChanged       FAILED_PRECONDITION    no (names the source and its root)
retrieval StorageFull         RESOURCE_EXHAUSTED     no (space must be freed first)
retrieval Busy                RESOURCE_EXHAUSTED     yes
retrieval IndexCorrupt        INTERNAL, its message  no (an operator must act)
retrieval StoreUnavailable    UNAVAILABLE            yes (the PostgreSQL store; names it)
retrieval EmbeddingModel...   FAILED_PRECONDITION    no (Mismatch: names both models)
retrieval NotSupported        FAILED_PRECONDITION    no (names the store backend)
retrieval SchemaTooNew        FAILED_PRECONDITION    no (at start: llamad refuses to start)
any error of a full disk      RESOURCE_EXHAUSTED     no
anything else                 INTERNAL               no (no traceback is sent)
============================  =====================  ==========

A retry hint is sent twice, for rich and for simple clients: as a ``google.rpc.RetryInfo``
detail (``grpc-status-details-bin``) and as trailing metadata ``retry-after-ms``. An
invalid argument that names its field (:attr:`InvalidArgument.field`) carries it in a
``google.rpc.BadRequest`` detail (one field violation: the field, the message), so a
client reads the field from the status, never from the message's words.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from google.protobuf import duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

from llamad_protocol.v1.wire import RETRY_AFTER_KEY, STATUS_DETAILS_KEY
from retrieval import errors as store  # the store's errors, qualified in map_error
from supervisor import SwapFailedError, SwapInProgressError, SwapRefusedError
from supervisor.errors import (
    ChildBadRequestError,
    ChildNotReadyError,
    ChildRequestError,
    EndpointError,
    TokenizeUnavailableError,
    UnsupportedParameterError,
)

from .config import option

DEFAULT_RETRY_AFTER = 1.0


class RequestError(Exception):
    """Base of the daemon's own call errors."""


class InvalidArgument(RequestError):
    """The request is invalid; the message says which field and why.

    Attributes:
        field: the field at fault as the gRPC request names it (``sampling.max_tokens``,
            ``messages[1].content``), set where the check is made; None when no one field
            is at fault. The HTTP API names its parameter from it, never from the text.
    """

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class Disabled(RequestError):
    """The role needed by the call is disabled in configuration."""


class FailedPrecondition(RequestError):
    """The daemon is not in a state to serve the call (the message says what is missing)."""


class UnknownModel(RequestError):
    """The call names a model the catalog does not have (the message lists those it has)."""


class Draining(RequestError):
    """The daemon is draining for shutdown and takes no new calls."""


class ModelUnloaded(RequestError):
    """The model a call waited for was taken out of residency meanwhile (evicted for
    room, its ttl, or UnloadModel): calling again loads it."""


class OutOfRange(RequestError):
    """The request cannot fit the model's context, even at its minimum."""


class Overloaded(RequestError):
    """Every slot is busy and the wait queue is full."""

    def __init__(self, message: str, retry_after: float) -> None:
        self.retry_after = retry_after
        super().__init__(message)


class QuotaExceeded(RequestError):
    """The caller's token used its requests or tokens of the quota window
    (:mod:`daemon.services.quotas`).

    Attributes:
        retry_after: seconds until the window frees enough for one more call.
        limit: which limit: ``requests`` or ``tokens``.
    """

    api_code = "rate_limit_exceeded"  # OpenAI's code for a rate limit (the HTTP body)

    def __init__(self, message: str, *, retry_after: float, limit: str) -> None:
        self.retry_after = retry_after
        self.limit = limit
        super().__init__(message)


class DeadlineUnmeetable(RequestError):
    """The call would wait in the queue past its deadline: refused early."""


@dataclass(frozen=True)
class Mapped:
    """A status: its code, message, retry hint (seconds) and the field at fault."""

    code: grpc.StatusCode
    message: str
    retry_after: float | None = None
    field: str | None = None  # an invalid argument's field, as the request names it

    def trailing_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        """Metadata for ``context.abort``: the status details (a retry hint, a field
        violation) when there are any, and the retry hint for simple clients."""
        if self.retry_after is None and self.field is None:
            return ()
        status = status_pb2.Status(code=_RPC_CODES[self.code], message=self.message)
        if self.field is not None:
            status.details.add().Pack(error_details_pb2.BadRequest(field_violations=[
                error_details_pb2.BadRequest.FieldViolation(field=self.field,
                                                            description=self.message)]))
        metadata: list[tuple[str, str | bytes]] = []
        if self.retry_after is not None:
            delay = duration_pb2.Duration()
            delay.FromMilliseconds(int(self.retry_after * 1000))
            status.details.add().Pack(error_details_pb2.RetryInfo(retry_delay=delay))
            metadata.append((RETRY_AFTER_KEY, str(int(self.retry_after * 1000))))
        return ((STATUS_DETAILS_KEY, status.SerializeToString()), *metadata)


_RPC_CODES = {
    grpc.StatusCode.INVALID_ARGUMENT: code_pb2.INVALID_ARGUMENT,
    grpc.StatusCode.UNAVAILABLE: code_pb2.UNAVAILABLE,
    grpc.StatusCode.RESOURCE_EXHAUSTED: code_pb2.RESOURCE_EXHAUSTED,
}


def _how_to_allow_roots() -> str:
    """How an operator turns directory sources on. The retrieval core names only the
    option; its flag and variable are the daemon's (one registry, :mod:`daemon.config`).
    A reload re-reads the file: the flags and environment of a running daemon are fixed."""
    opt = option("retrieval.allowed_roots")
    section, _, name = opt.key.partition(".")
    return (f"start the daemon with {opt.flag} DIR[:DIR...] (or {opt.env}=DIR), or set "
            f'{name} = ["DIR"] under [{section}] in its config file and reload it (SIGHUP: '
            "systemctl reload llamad)")


def map_error(exc: BaseException) -> Mapped:
    """The status code, message and retry hint for ``exc``."""
    if isinstance(exc, InvalidArgument):
        return Mapped(grpc.StatusCode.INVALID_ARGUMENT, str(exc), field=exc.field)
    if isinstance(exc, UnsupportedParameterError):
        return Mapped(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
    if isinstance(exc, store.InvalidDocument | store.ExtractionError):
        return Mapped(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
    if isinstance(exc, store.NotFound | UnknownModel):
        return Mapped(grpc.StatusCode.NOT_FOUND, str(exc))
    if isinstance(exc, store.VectorUnavailable | store.SourceDisabled | store.SourceChanged
                  | store.WrongState):
        return Mapped(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
    if isinstance(exc, store.EmbeddingModelMismatch | store.NotSupported | store.SchemaTooNew):
        return Mapped(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
    if isinstance(exc, store.StoreUnavailable):
        # The shared store's server is down or unreachable: it may come back.
        return Mapped(grpc.StatusCode.UNAVAILABLE, str(exc), DEFAULT_RETRY_AFTER)
    if isinstance(exc, store.SourceNotAllowed):
        if exc.configured:
            return Mapped(grpc.StatusCode.PERMISSION_DENIED, str(exc))
        return Mapped(grpc.StatusCode.FAILED_PRECONDITION, f"{exc}: {_how_to_allow_roots()}")
    if isinstance(exc, Disabled | FailedPrecondition | TokenizeUnavailableError):
        return Mapped(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
    if isinstance(exc, OutOfRange):
        return Mapped(grpc.StatusCode.OUT_OF_RANGE, str(exc))
    if isinstance(exc, Overloaded | QuotaExceeded):
        return Mapped(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc), exc.retry_after)
    if isinstance(exc, DeadlineUnmeetable):
        return Mapped(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc))
    if isinstance(exc, (Draining, ModelUnloaded)):
        return Mapped(grpc.StatusCode.UNAVAILABLE, str(exc), DEFAULT_RETRY_AFTER)
    if isinstance(exc, ChildNotReadyError):
        return Mapped(grpc.StatusCode.UNAVAILABLE, str(exc), exc.retry_after)
    if isinstance(exc, ChildBadRequestError):
        return Mapped(grpc.StatusCode.INVALID_ARGUMENT, f"the model refused the request: {exc}")
    if isinstance(exc, SwapInProgressError | SwapRefusedError):
        return Mapped(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
    if isinstance(exc, SwapFailedError):
        return Mapped(grpc.StatusCode.ABORTED, f"{exc}; the old child keeps serving")
    if isinstance(exc, EndpointError):
        # A wrong key or a vanished model needs an operator; a refused connection or a
        # 5xx may pass.
        if exc.permanent:
            return Mapped(grpc.StatusCode.FAILED_PRECONDITION,
                          f"inference endpoint failed ({exc.kind}): {exc}")
        return Mapped(grpc.StatusCode.UNAVAILABLE, f"inference endpoint failed ({exc.kind}): "
                      f"{exc}", DEFAULT_RETRY_AFTER)
    if isinstance(exc, ChildRequestError):
        return Mapped(grpc.StatusCode.UNAVAILABLE, f"inference child failed: {exc}",
                      DEFAULT_RETRY_AFTER)
    if isinstance(exc, store.StorageFull):
        return Mapped(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
    if isinstance(exc, store.Busy):
        return Mapped(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc), DEFAULT_RETRY_AFTER)
    if isinstance(exc, store.IndexCorrupt):
        # Internal, but not unexplained: the message names the index and what is wrong
        # with it, which is what the operator needs to act on.
        return Mapped(grpc.StatusCode.INTERNAL, f"retrieval index damaged: {exc}")
    if store.is_storage_full(exc):  # a write outside ingest (add a source, delete, ...)
        return Mapped(grpc.StatusCode.RESOURCE_EXHAUSTED,
                      "no space left on the disk holding llamad's state: free space, "
                      "then retry")
    return Mapped(grpc.StatusCode.INTERNAL, f"internal error ({type(exc).__name__})")
