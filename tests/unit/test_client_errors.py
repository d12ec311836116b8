"""The client's error boundary: every gRPC status code becomes its LlamadError subclass,
with the daemon's message and its retry hint; the CLI turns them into exit codes."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

from clients import Client, errors
from clients.cli._commands import describe, exit_code
from clients.testing import FakeLlamad


class Failed(grpc.RpcError):  # type: ignore[misc]  # grpc ships no type hints
    """What a failed call raises: an RpcError that is also a grpc.Call (code, details,
    trailing metadata)."""

    def __init__(self, code: grpc.StatusCode, details: str | None = "why",
                 trailing: tuple[tuple[str, str | bytes], ...] = ()) -> None:
        super().__init__()
        self._code, self._details, self._trailing = code, details, trailing

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str | None:
        return self._details

    def trailing_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return self._trailing


def retry_info(ms: int) -> bytes:
    """A grpc-status-details-bin value carrying a RetryInfo of ``ms`` milliseconds."""
    delay = duration_pb2.Duration()
    delay.FromMilliseconds(ms)
    status = status_pb2.Status(code=code_pb2.UNAVAILABLE, message="x")
    status.details.add().Pack(error_details_pb2.RetryInfo(retry_delay=delay))
    blob: bytes = status.SerializeToString()
    return blob


@pytest.mark.parametrize(("code", "cls"), [
    (grpc.StatusCode.UNAVAILABLE, errors.Unavailable),
    (grpc.StatusCode.INVALID_ARGUMENT, errors.InvalidArgument),
    (grpc.StatusCode.OUT_OF_RANGE, errors.OutOfRange),
    (grpc.StatusCode.NOT_FOUND, errors.NotFound),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, errors.ResourceExhausted),
    (grpc.StatusCode.DEADLINE_EXCEEDED, errors.DeadlineExceeded),
    (grpc.StatusCode.FAILED_PRECONDITION, errors.FailedPrecondition),
    (grpc.StatusCode.ABORTED, errors.Aborted),
    (grpc.StatusCode.CANCELLED, errors.Cancelled),
    (grpc.StatusCode.UNAUTHENTICATED, errors.Unauthenticated),
    (grpc.StatusCode.PERMISSION_DENIED, errors.PermissionDenied),
    (grpc.StatusCode.UNIMPLEMENTED, errors.Unimplemented),
    (grpc.StatusCode.INTERNAL, errors.Internal),
    (grpc.StatusCode.UNKNOWN, errors.Internal),
    (grpc.StatusCode.DATA_LOSS, errors.Internal),
])
def test_each_code_maps_to_its_class(code: grpc.StatusCode,
                                     cls: type[errors.LlamadError]) -> None:
    """Each status code becomes its own subclass, keeping the code name and message."""
    err = errors.from_rpc_error(Failed(code, "the reason"))
    assert type(err) is cls
    assert isinstance(err, errors.LlamadError)
    assert err.code == code.name
    assert err.details == "the reason"
    assert str(err) == "the reason"


def test_out_of_range_is_an_invalid_argument() -> None:
    """OUT_OF_RANGE (a question that cannot fit) is caught as InvalidArgument too."""
    assert isinstance(errors.from_rpc_error(Failed(grpc.StatusCode.OUT_OF_RANGE)),
                      errors.InvalidArgument)


@pytest.mark.parametrize(("trailing", "expected"), [
    ((("retry-after-ms", "1500"),), 1.5),
    ((("Retry-After-Ms", b"250"),), 0.25),
    ((("retry-after-ms", "0"),), 0.0),
    ((("retry-after-ms", "soon"),), None),
    ((("retry-after-ms", "-5"),), None),
    ((("grpc-status-details-bin", retry_info(2500)),), 2.5),
    ((("retry-after-ms", "700"), ("grpc-status-details-bin", retry_info(2500))), 0.7),
    ((("grpc-status-details-bin", b"\xff\x00not a status"),), None),
    ((), None),
])
def test_retry_after_is_parsed(trailing: tuple[tuple[str, str | bytes], ...],
                               expected: float | None) -> None:
    """The hint comes from retry-after-ms, else from a RetryInfo detail; garbage is none."""
    for code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED):
        assert errors.from_rpc_error(Failed(code, trailing=trailing)).retry_after == expected


def test_retry_after_only_on_retryable_codes() -> None:
    """A hint on a final error (INVALID_ARGUMENT) is not passed on as a reason to retry."""
    err = errors.from_rpc_error(Failed(grpc.StatusCode.INVALID_ARGUMENT,
                                       trailing=(("retry-after-ms", "100"),)))
    assert err.retry_after is None


def test_message_is_one_line_and_never_empty() -> None:
    """Transport messages spanning lines are joined; a missing one names the code."""
    assert errors.from_rpc_error(Failed(grpc.StatusCode.UNAVAILABLE,
                                        "failed to connect\n  last error: refused")).details \
        == "failed to connect last error: refused"
    assert errors.from_rpc_error(Failed(grpc.StatusCode.NOT_FOUND, None)).details \
        == "not_found"


def test_an_rpc_error_without_a_status_is_internal() -> None:
    """An RpcError that is not a Call (no code) still maps, to Internal."""
    assert isinstance(errors.from_rpc_error(grpc.RpcError()), errors.Internal)


def test_real_server_errors_with_hint(fake: FakeLlamad) -> None:
    """Through a real gRPC server: the code, the message and the trailing hint arrive."""
    fake.fail("InferenceService/Generate", grpc.StatusCode.RESOURCE_EXHAUSTED,
              "every slot is busy", retry_after_ms=1200)
    fake.fail("RetrievalService/GetDocument", grpc.StatusCode.PERMISSION_DENIED, "no")
    with Client(fake.address) as client:
        with pytest.raises(errors.ResourceExhausted) as busy:
            list(client.generate("hi"))
        assert busy.value.details == "every slot is busy"
        assert busy.value.retry_after == 1.2
        with pytest.raises(errors.PermissionDenied):
            client.get_document("x")
        with pytest.raises(errors.NotFound, match="no document 'x'"):
            client.get_document("x")
        with pytest.raises(errors.InvalidArgument, match="query is empty"):
            client.search("")


def test_swap_failure_yields_the_failed_stage_then_raises_aborted(fake: FakeLlamad) -> None:
    """A failed swap streams its FAILED stage (with the cause), then raises Aborted."""
    stages = []
    with Client(fake.address) as client, pytest.raises(errors.Aborted, match="keeps serving"):
        for progress in client.swap("generation", "/nonexistent.gguf"):
            stages.append(progress)
    assert [p.stage for p in stages] == ["validating", "failed"]
    assert stages[-1].cause is not None
    assert stages[-1].cause.kind == "invalid_model"


@pytest.mark.parametrize(("exc", "status"), [
    (errors.Unavailable("draining"), 3),
    (errors.NotFound("no document"), 4),
    (errors.InvalidArgument("query is empty"), 5),
    (errors.OutOfRange("question too long"), 5),
    (errors.ResourceExhausted("busy"), 6),
    (errors.DeadlineExceeded("deadline"), 1),
    (errors.FailedPrecondition("swap running"), 1),
    (errors.Aborted("swap failed"), 1),
    (errors.Internal("oops"), 1),
])
def test_cli_exit_codes(exc: errors.LlamadError, status: int) -> None:
    """The CLI's documented exit status for each error class."""
    assert exit_code(exc) == status


def test_cli_describes_connect_failures_and_hints() -> None:
    """A refused connection names the address; a retry hint is shown."""
    refused = errors.Unavailable("failed to connect to all addresses; last error: refused")
    assert describe(refused, "127.0.0.1:1").startswith(
        "cannot reach the daemon at 127.0.0.1:1: failed to connect")
    busy = errors.ResourceExhausted("queue full", retry_after=1.5)
    assert describe(busy, "x") == "busy: queue full (retry in 1.5s)"
