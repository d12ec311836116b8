"""Failures a :class:`clients.testing.FakeLlamad` injects into its calls."""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from llamad_protocol.v1.wire import RETRY_AFTER_KEY


@dataclass
class Failure:
    """A failure injected with :meth:`FakeLlamad.fail`, for its next ``times`` calls."""

    code: grpc.StatusCode
    message: str
    times: int
    retry_after_ms: int | None
    after: int


@dataclass(frozen=True)
class Abort:
    """Yielded by a fake stream: end the call with this status."""

    code: grpc.StatusCode
    message: str


def abort(context: grpc.ServicerContext, failure: Failure) -> None:
    """End the call with ``failure``'s status (and retry hint, if any)."""
    if failure.retry_after_ms is not None:
        context.set_trailing_metadata(((RETRY_AFTER_KEY, str(failure.retry_after_ms)),))
    context.abort(failure.code, failure.message)
