"""The plumbing under both clients: the constructor, the channel and its stubs, per-call
deadlines, error mapping and the health watch.

:class:`BaseClient` holds what neither blocks nor awaits, once; :class:`SyncBase` and
:class:`AsyncBase` add what does (unary calls, closing the channel, the context managers).
The calls themselves are in :mod:`clients._client` (with :mod:`clients._client_documents`)
and :mod:`clients._aio`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Self, Unpack

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from llamad_protocol.v1 import (
    answer_pb2_grpc,
    control_pb2_grpc,
    inference_pb2_grpc,
    retrieval_pb2_grpc,
)

from ._channel import ChannelSettings, ConnectionOptions, Timeout, _Default, settings
from .errors import Unavailable, from_rpc_error


class BaseClient:
    """One channel to llamad, its service stubs and default deadlines.

    Subclasses set :attr:`_grpc` to the module whose channels they open (``grpc`` or
    ``grpc.aio``); the arguments are :class:`clients.Client`'s (``connection``: TLS, token
    and channel options, :class:`~clients._channel.ConnectionOptions`).
    """

    _grpc: ClassVar[Any]
    """``grpc`` or ``grpc.aio``: the module whose ``secure_channel`` and
    ``insecure_channel`` this client opens."""

    def __init__(
        self,
        address: str | None = None,
        *,
        timeout: float | None = 30.0,
        stream_timeout: float | None = None,
        addresses: Sequence[str] | None = None,
        **connection: Unpack[ConnectionOptions],
    ) -> None:
        if addresses is not None and address is not None:
            raise ValueError("give address or addresses, not both")
        self._settings: ChannelSettings = settings(
            address if addresses is None else list(addresses), **connection)
        self.timeout = timeout
        self.stream_timeout = stream_timeout
        s = self._settings
        if s.secure:
            self._channel = self._grpc.secure_channel(s.target, s.credentials,
                                                      options=s.options)
        else:
            self._channel = self._grpc.insecure_channel(s.target, options=s.options)
        # The generated *_grpc modules carry no type hints.
        self._inference = inference_pb2_grpc.InferenceServiceStub(self._channel)
        self._control = control_pb2_grpc.ControlServiceStub(self._channel)
        self._retrieval = retrieval_pb2_grpc.RetrievalServiceStub(self._channel)
        self._answer = answer_pb2_grpc.AnswerServiceStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    @property
    def address(self) -> str:
        """The gRPC target this client talks to (``ipv4:a:p,b:q`` for several daemons)."""
        return self._settings.target

    @property
    def balanced(self) -> bool:
        """True when this client balances over several daemons."""
        return self._settings.balanced

    def _deadline(self, timeout: Timeout, stream: bool) -> float | None:
        if isinstance(timeout, _Default):
            return self.stream_timeout if stream else self.timeout
        return timeout

    def _call(self, method: Any, request: Any, timeout: Timeout) -> Any:
        """Start a streaming call (its errors are raised by the stream wrapping it)."""
        return method(request, timeout=self._deadline(timeout, True),
                      metadata=self._settings.metadata)

    def _watch_health(self, service: str, timeout: float) -> Any:
        """Start a health watch of ``service`` that waits for the daemon to come up."""
        request = health_pb2.HealthCheckRequest(service=service)
        return self._health.Watch(request, timeout=timeout, wait_for_ready=True,
                                  metadata=self._settings.metadata)


class SyncBase(BaseClient):
    """A :class:`BaseClient` on a blocking ``grpc`` channel."""

    _grpc = grpc

    def close(self) -> None:
        """Close the channel; running calls are cancelled."""
        self._channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _unary(self, method: Any, request: Any, timeout: Timeout) -> Any:
        try:
            return method(request, timeout=self._deadline(timeout, False),
                          metadata=self._settings.metadata)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from exc


class AsyncBase(BaseClient):
    """A :class:`BaseClient` on a ``grpc.aio`` channel."""

    _grpc = grpc.aio

    async def close(self) -> None:
        """Close the channel; running calls are cancelled."""
        await self._channel.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _unary(self, method: Any, request: Any, timeout: Timeout) -> Any:
        try:
            return await method(request, timeout=self._deadline(timeout, False),
                                metadata=self._settings.metadata)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from exc


def serving(msg: Any) -> bool | None:
    """A health watch's message mapped for a stream: True once SERVING, else skipped."""
    return True if msg.status == health_pb2.HealthCheckResponse.SERVING else None


def status_name(msg: Any) -> str:
    """A HealthCheckResponse's status: ``serving``, ``not_serving``, ..."""
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(msg.status)).lower()


def watch_ended() -> Unavailable:
    """The error of a health watch that ended before its service was serving."""
    return Unavailable("the health watch ended before the service was serving",
                       code="UNAVAILABLE")
