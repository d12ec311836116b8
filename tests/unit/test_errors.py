"""Mapping of domain errors to gRPC status: each row of the table in ``daemon.errors``, the
retry hint in both forms, and no internal detail leaking through INTERNAL."""

from __future__ import annotations

import errno
import sqlite3

import grpc
import pytest
from google.rpc import code_pb2, error_details_pb2, status_pb2

from daemon.errors import (
    DEFAULT_RETRY_AFTER,
    Disabled,
    Draining,
    InvalidArgument,
    Mapped,
    RequestError,
    map_error,
)
from llamad_protocol.v1.wire import RETRY_AFTER_KEY
from retrieval import RetrievalError, StorageFull, is_storage_full
from supervisor import (
    ChildBadRequestError,
    ChildNotReadyError,
    ChildRequestError,
    IllegalTransitionError,
    InvalidModelError,
    SupervisorError,
)

DETAILS_KEY = "grpc-status-details-bin"


def decode_status(mapped: Mapped) -> status_pb2.Status:
    """The google.rpc.Status carried in the trailing metadata."""
    details = dict(mapped.trailing_metadata())[DETAILS_KEY]
    assert isinstance(details, bytes)
    return status_pb2.Status.FromString(details)


def retry_delay_ms(status: status_pb2.Status) -> int:
    """The RetryInfo delay of a Status, in milliseconds (it must have exactly one)."""
    infos = [d for d in status.details if d.Is(error_details_pb2.RetryInfo.DESCRIPTOR)]
    assert len(infos) == 1
    info = error_details_pb2.RetryInfo()
    assert infos[0].Unpack(info)
    return int(info.retry_delay.ToMilliseconds())


@pytest.mark.parametrize(
    ("exc", "code", "message", "retry_after"),
    [
        (InvalidArgument("prompt is empty"), grpc.StatusCode.INVALID_ARGUMENT,
         "prompt is empty", None),
        (Disabled("embedding is disabled"), grpc.StatusCode.FAILED_PRECONDITION,
         "embedding is disabled", None),
        (Draining("draining"), grpc.StatusCode.UNAVAILABLE, "draining", DEFAULT_RETRY_AFTER),
        (ChildNotReadyError("generation", "backoff", 2.5), grpc.StatusCode.UNAVAILABLE,
         "generation child is not running (state: backoff)", 2.5),
        (ChildNotReadyError("embedding", "failed", None), grpc.StatusCode.UNAVAILABLE,
         "embedding child is not running (state: failed)", None),
        (ChildBadRequestError("context too long", 400), grpc.StatusCode.INVALID_ARGUMENT,
         "the model refused the request: context too long", None),
        (ChildRequestError("connection reset", None), grpc.StatusCode.UNAVAILABLE,
         "inference child failed: connection reset", DEFAULT_RETRY_AFTER),
        (ChildRequestError("HTTP 500", 500), grpc.StatusCode.UNAVAILABLE,
         "inference child failed: HTTP 500", DEFAULT_RETRY_AFTER),
        (RuntimeError("boom"), grpc.StatusCode.INTERNAL,
         "internal error (RuntimeError)", None),
    ],
)
def test_mapping_table(
    exc: BaseException, code: grpc.StatusCode, message: str, retry_after: float | None
) -> None:
    """Each documented error maps to its status code, message and retry hint."""
    mapped = map_error(exc)
    assert mapped == Mapped(code, message, retry_after)


@pytest.mark.parametrize(
    "exc",
    [
        InvalidModelError("/m/x.gguf", "bad magic"),
        IllegalTransitionError("idle -> running"),
        SupervisorError("something"),
        RequestError("base class"),
        KeyError("k"),
        TimeoutError("t"),
    ],
)
def test_everything_else_is_internal(exc: BaseException) -> None:
    """Errors outside the table (the rest of supervisor.errors included) are INTERNAL."""
    mapped = map_error(exc)
    assert mapped.code is grpc.StatusCode.INTERNAL
    assert mapped.message == f"internal error ({type(exc).__name__})"
    assert mapped.retry_after is None
    assert mapped.trailing_metadata() == ()


def test_internal_never_includes_exception_text() -> None:
    """INTERNAL says only the exception type: no message, path or secret is sent."""
    mapped = map_error(RuntimeError("secret /etc/passwd"))
    assert mapped.code is grpc.StatusCode.INTERNAL
    assert "secret" not in mapped.message
    assert "/etc/passwd" not in mapped.message
    assert mapped.trailing_metadata() == ()


@pytest.mark.parametrize(
    ("exc", "delay_ms"),
    [
        (ChildNotReadyError("generation", "backoff", 2.5), 2500),
        (ChildNotReadyError("generation", "starting", 0.25), 250),
        (Draining("draining"), int(DEFAULT_RETRY_AFTER * 1000)),
        (ChildRequestError("HTTP 503", 503), int(DEFAULT_RETRY_AFTER * 1000)),
    ],
)
def test_retry_hint_in_both_forms(exc: BaseException, delay_ms: int) -> None:
    """A retry hint is sent as retry-after-ms and as a RetryInfo in the status details."""
    mapped = map_error(exc)
    metadata = dict(mapped.trailing_metadata())
    assert set(metadata) == {DETAILS_KEY, RETRY_AFTER_KEY}
    assert metadata[RETRY_AFTER_KEY] == str(delay_ms)
    status = decode_status(mapped)
    assert retry_delay_ms(status) == delay_ms


def test_status_details_agree_with_the_call_status() -> None:
    """The detailed Status has the call's code and message (grpc-status checks they match)."""
    mapped = map_error(ChildNotReadyError("generation", "backoff", 1.5))
    status = decode_status(mapped)
    assert status.code == code_pb2.UNAVAILABLE == mapped.code.value[0]
    assert status.message == mapped.message


@pytest.mark.parametrize(
    "exc",
    [
        InvalidArgument("x"),
        Disabled("x"),
        ChildBadRequestError("x", 400),
        ChildNotReadyError("generation", "failed", None),
    ],
)
def test_no_retry_hint_without_a_delay(exc: BaseException) -> None:
    """Errors without a retry hint carry no retry metadata at all."""
    assert map_error(exc).trailing_metadata() == ()


def test_metadata_keys_are_valid_grpc_keys() -> None:
    """Binary values use a -bin key and text values are ASCII strings, as gRPC requires."""
    for key, value in map_error(Draining("d")).trailing_metadata():
        assert key == key.lower()
        if key.endswith("-bin"):
            assert isinstance(value, bytes)
        else:
            assert isinstance(value, str)
            assert value.isascii()


@pytest.mark.parametrize("exc", [
    StorageFull("no space left on the disk holding the indexes"),
    sqlite3.OperationalError("database or disk is full"),
    OSError(errno.ENOSPC, "No space left on device"),
    RetrievalError(
        "text index /x: commit failed: An IO error occurred: 'No space left on device "
        "(os error 28)'"),
])
def test_full_disk_is_resource_exhausted(exc: Exception) -> None:
    """A full disk, however it is raised, is RESOURCE_EXHAUSTED with a message saying so
    (not INTERNAL), and no retry hint: retrying before space is freed cannot help."""
    mapped = map_error(exc)
    assert mapped.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "no space left" in mapped.message
    assert mapped.retry_after is None


def test_full_disk_found_behind_another_error() -> None:
    """A full disk hidden behind the error raised while handling it is still found."""
    try:
        try:
            raise sqlite3.OperationalError("database or disk is full")
        except sqlite3.Error:
            raise RuntimeError("cleanup failed too") from None
    except RuntimeError as exc:
        hidden = exc
    assert hidden.__context__ is not None
    assert is_storage_full(hidden)
    assert not is_storage_full(RuntimeError("disk is fine"))
    assert not is_storage_full(OSError(errno.EACCES, "Permission denied"))


def test_index_corrupt_keeps_its_actionable_message() -> None:
    """A damaged index is INTERNAL, but with the message naming the index and the damage,
    not a bare "internal error"; no retry hint."""
    from retrieval.errors import IndexCorrupt

    mapped = map_error(IndexCorrupt("vector index /var/lib/llamad/vectors.hnsw is truncated "
                                    "(12 bytes)"))
    assert mapped.code is grpc.StatusCode.INTERNAL
    assert mapped.message == ("retrieval index damaged: vector index "
                              "/var/lib/llamad/vectors.hnsw is truncated (12 bytes)")
    assert mapped.retry_after is None


def test_no_allowed_roots_says_how_to_set_them() -> None:
    """Directory sources refused for want of allowed roots: FAILED_PRECONDITION, the core's
    message, then the option's flag, variable and TOML key and how a running daemon takes
    a new value (its config file, on SIGHUP); outside the roots stays PERMISSION_DENIED with
    the core's message alone."""
    from retrieval import SourceNotAllowed, check_root

    with pytest.raises(SourceNotAllowed) as refused:
        check_root("/srv/docs", ())
    mapped = map_error(refused.value)
    assert mapped.code is grpc.StatusCode.FAILED_PRECONDITION
    assert mapped.message.startswith(f"{refused.value}: ")
    for words in ("--retrieval-allowed-roots DIR", "LLAMAD_RETRIEVAL_ALLOWED_ROOTS",
                  'allowed_roots = ["DIR"] under [retrieval]', "systemctl reload llamad",
                  "SIGHUP"):
        assert words in mapped.message
    outside = SourceNotAllowed("/etc is outside retrieval.allowed_roots (/srv)",
                               configured=True)
    assert map_error(outside) == Mapped(grpc.StatusCode.PERMISSION_DENIED, str(outside))
