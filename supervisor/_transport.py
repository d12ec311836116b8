"""How the inference client reaches a server: the activity record its liveness loop reads,
and the one seam a whole JSON request and its answer pass through
(:class:`UnaryTransport`): httpx for endpoints, the lean loopback client for children
(over their private UNIX sockets, with their keys: :class:`ChildAddress`), whose streams go
through it too (:meth:`LoopbackTransport.stream`)."""

from __future__ import annotations

import contextlib
import math
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
import orjson

from .errors import ChildRequestError
from .http import HTTPTransportError, LoopbackHTTP, Response, Streamed


@dataclass
class Activity:
    """Calls running on a client, and when it last heard from the server: what the
    liveness loop (:mod:`supervisor._liveness`) reads to leave a busy server alone."""

    now: Callable[[], float] = time.monotonic
    in_flight: int = 0
    last_progress: float = 0.0

    def __post_init__(self) -> None:
        self.last_progress = self.now()

    def heard(self) -> None:
        """Something came from the server (or a request went to it) just now."""
        self.last_progress = self.now()


class UnaryTransport(Protocol):
    """Carries one whole JSON request and its whole answer: the client's one seam."""

    async def request(self, method: str, path: str, body: dict[str, Any] | None,
                      timeout: float) -> Response:
        """The answer, whatever its status.

        Raises:
            ChildRequestError: no (complete) answer came.
        """
        ...

    async def aclose(self) -> None: ...


class HttpxTransport:
    """Unary requests through the client's httpx pool (an endpoint: TLS, proxies' absence,
    authorization headers); transport failures are named by ``describe``."""

    def __init__(self, http: httpx.AsyncClient,
                 describe: Callable[[str, str, httpx.HTTPError], ChildRequestError]) -> None:
        self._http = http
        self._describe = describe

    async def request(self, method: str, path: str, body: dict[str, Any] | None,
                      timeout: float) -> Response:
        try:
            resp = await self._http.request(method, path, json=body, timeout=timeout)
        except httpx.HTTPError as exc:
            raise self._describe(method, path, exc) from exc
        return Response(resp.status_code, dict(resp.headers), resp.content)

    async def aclose(self) -> None:
        pass  # the pool is the client's: it closes it


@dataclass(frozen=True)
class ChildAddress:
    """Where a child llamad launched listens, and the key it wants (both per launch).

    Attributes:
        socket: its UNIX socket's path, in the daemon's private runtime directory.
        key: its API key, sent as ``Authorization: Bearer``.
    """

    socket: str
    key: str = field(repr=False)  # never in a log line or a repr

    BASE_URL = "http://localhost"
    """The base URL a child's clients use: the ``Host`` header; the socket is the way."""


class LoopbackTransport:
    """Unary requests to a child llamad launched, through the lean
    :class:`supervisor.http._loopback.LoopbackHTTP` (a third of httpx's CPU per call): to its
    :class:`ChildAddress`, or to ``http://host:port`` (a test's server) without one."""

    def __init__(self, base_url: str, *, connect_timeout: float, max_connections: int,
                 max_idle: int = 16, child: ChildAddress | None = None) -> None:
        url = urllib.parse.urlsplit(base_url)
        if child is not None:
            self._http = LoopbackHTTP(url.hostname or "localhost", 0,
                                      connect_timeout=connect_timeout,
                                      max_connections=max_connections, max_idle=max_idle,
                                      unix_path=child.socket, api_key=child.key)
            return
        if url.scheme != "http" or not url.hostname or not url.port:
            raise ValueError(f"loopback needs http://host:port: {base_url}")
        self._http = LoopbackHTTP(url.hostname, url.port, connect_timeout=connect_timeout,
                                  max_connections=max_connections, max_idle=max_idle)

    async def request(self, method: str, path: str, body: dict[str, Any] | None,
                      timeout: float) -> Response:
        payload = None if body is None else _encode(body)
        try:
            return await self._http.request(method, path, payload, timeout)
        except HTTPTransportError as exc:
            raise ChildRequestError(f"{method} {path}: {exc}") from exc

    @contextlib.asynccontextmanager
    async def stream(self, path: str, body: dict[str, Any], timeout: float,
                     interval: float = 0.0, longest: float = 0.0) -> AsyncIterator[Streamed]:
        """POST ``body``; yield the answer once its head has come, its body read as it
        arrives (a transport failure while reading it raises HTTPTransportError: the
        reader names it, see :meth:`supervisor.InferenceClient._stream`; no generator
        around every piece, issue 27), paced by ``interval`` and a slow stream's
        ``longest`` (seconds: see :class:`supervisor.http._read.Silence`).

        Raises:
            ChildRequestError: no answer came.
        """
        try:
            async with self._http.stream("POST", path, _encode(body), timeout,
                                         interval=interval, longest=longest) as answer:
                yield answer
        except HTTPTransportError as exc:
            raise ChildRequestError(f"POST {path}: {exc}") from exc

    async def aclose(self) -> None:
        await self._http.aclose()


def _encode(body: dict[str, Any]) -> bytes:
    """A request body as compact UTF-8 JSON, as httpx would send it: a NaN or an infinity
    is refused (ValueError) rather than sent as invalid JSON (orjson would write null)."""
    _refuse_non_finite(body)
    try:
        return orjson.dumps(body)
    except orjson.JSONEncodeError as exc:  # e.g. an integer past 64 bits
        raise ValueError(f"request body is not JSON: {exc}") from exc


def _refuse_non_finite(value: object) -> None:
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value} is not a JSON number")
    elif isinstance(value, dict):
        for item in value.values():
            _refuse_non_finite(item)
    elif isinstance(value, list | tuple):
        for item in value:
            _refuse_non_finite(item)
