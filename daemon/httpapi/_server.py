"""The HTTP listener: aiohttp's low-level server in the daemon's event loop, beside
grpc.aio.

Every request goes through one frame (:meth:`HttpApi._dispatch`): its request id
(``x-request-id`` taken when it is 1 to 128 visible ASCII characters, else made; always
echoed), the route and its method, the bearer token checked by the gRPC interceptor's own
rules (:meth:`daemon.grpcapi.auth.AuthInterceptor.check`), the body read within
``http.body_timeout`` and ``http.max_body_bytes``, the handler, any error as OpenAI's error
object (:mod:`._errors`), and one summary line and the request metrics, as for gRPC
(:func:`daemon.grpcapi.rpc.write_summary`, ``protocol="http"``). Requests aiohttp itself cannot
parse (a malformed request line, a header past ``http.max_header_bytes``, more than
``http.max_headers`` headers) get the same JSON error object, never its text or HTML page.

A connection that sends no complete request head within ``http.idle_timeout`` is closed
(aiohttp's keep-alive timer runs from the connection's start: a slowloris head is cut
off like an idle connection). The listener holds at most ``connections.http_max``
connections, ``connections.per_peer_max`` of one address (:class:`daemon.grpcapi.connlimits.
ConnectionCap`): past either, a new connection is answered 503 (its JSON error naming the
option) and closed at once, so a flood cannot take the daemon's descriptors.

``GET /health`` (and HEAD) is answered before all of that, without a token (as gRPC
health is), a log line or metrics (a probe every few seconds): 200 ``{"status":
"serving"}`` while ``grpc.health.v1``'s overall entry is SERVING, else 503 ``{"status":
"not_serving"}`` (draining, drained by an admin, or a model of a role not ready).
"""

from __future__ import annotations

import asyncio
import secrets
import socket
import ssl
import time
from collections.abc import Callable, Mapping
from typing import Any

import structlog
from aiohttp import HttpVersion11, web, web_protocol
from aiohttp.http_parser import RawRequestMessage
from aiohttp.streams import StreamReader

from ..config import HttpSettings, Limits
from ..config.access import TlsMaterial, server_ssl_context
from ..grpcapi.auth import AuthInterceptor, Denial
from ..grpcapi.connlimits import ConnectionCap, counted_listeners
from ..grpcapi.rpc import Call, write_summary
from ..models import lanes
from ..models.lanes import LANE_HEADER, Lane, parse_lane
from ..models.pool import Pool
from ..models.router import InferenceRouter
from ..services import quotas
from ..services.ask import AskService
from ..services.knowledge import Knowledge
from ..telemetry.metrics import Metrics
from . import _parse
from ._context import CALLER, RAW_BODY, RECEIVED, REQUEST_ID, STREAM, Api
from ._errors import ApiError, api_error
from ._models import Catalog, Pooled, Served
from ._mount import Mount, owns
from ._routes import Route, methods_of, route_of
from ._stored import ResponseStore

_log = structlog.get_logger("llamad.http")

_MAX_REQUEST_ID = 128


def _request_id(given: str | None) -> str:
    if given and len(given) <= _MAX_REQUEST_ID and all(0x21 <= ord(c) <= 0x7E for c in given):
        return given
    return secrets.token_hex(8)


def _error_response(request_id: str, error: ApiError) -> web.Response:
    headers = {"x-request-id": request_id, **error.headers()}
    if error.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return web.Response(body=error.body(), status=error.status,
                        content_type="application/json", headers=headers)


def _refused(peer: str, reason: str) -> None:
    _log.warning("http connection refused", peer=peer, reason=reason)


def _refusal(reason: str) -> bytes:
    """The whole response to a connection over a cap: 503, then the connection closes."""
    body = ApiError(503, f"too many connections: {reason}; retry later",
                    code="too_many_connections").body()
    head = ("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n")
    return head.encode("ascii") + body


class _JsonErrors(web_protocol.RequestHandler):
    """aiohttp's connection handler, answering what it cannot parse with OpenAI's error
    object instead of its text or HTML page."""

    def handle_error(self, request: web.BaseRequest, status: int = 500,
                     exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if request.writer.output_size > 0:  # as aiohttp: the response has begun
            raise ConnectionError("response already started")
        if status >= 500:  # not a parse error: nothing of it is shown
            error = ApiError(status, "internal error")
        else:
            reason = (message or (type(exc).__name__ if exc else "")).strip()
            error = ApiError(status, f"malformed HTTP request: {reason[:200]}")
        _log.info("http", method="other", code=error.grpc_code, status=status,
                  peer=request.remote, error=error.message)
        response = _error_response(_request_id(None), error)
        response.force_close()
        return response


class _Server(web.Server):
    """:class:`aiohttp.web.Server` whose connections answer parse errors in JSON."""

    def __call__(self) -> web_protocol.RequestHandler:
        return _JsonErrors(self, loop=self._loop, **self._kwargs)


class _Site(web.SockSite):
    """aiohttp's site on our listening socket, with a TLS handshake timeout (aiohttp's
    sites leave asyncio's 60 s)."""

    __slots__ = ("_handshake_timeout",)

    def __init__(self, runner: web.BaseRunner, sock: socket.socket, *,
                 ssl_context: ssl.SSLContext | None, handshake_timeout: float) -> None:
        super().__init__(runner, sock, ssl_context=ssl_context)
        self._handshake_timeout = handshake_timeout

    async def start(self) -> None:
        # SockSite.start, but for the handshake timeout (aiohttp 3.14's attributes).
        await web.BaseSite.start(self)
        server = self._runner.server
        if server is None:  # as SockSite: set up by runner.setup(), before any site
            raise RuntimeError("the runner is not set up")
        self._server = await asyncio.get_running_loop().create_server(
            server, sock=self._sock, ssl=self._ssl_context, backlog=self._backlog,
            ssl_handshake_timeout=self._handshake_timeout if self._ssl_context else None)


class HttpApi:
    """The OpenAI-compatible HTTP API of one daemon.

    Args:
        router: the daemon's router (admission, drain).
        served: role -> model (:class:`daemon.models.model.Model`), for the catalog without a
            pool.
        pool: the model pool (:class:`daemon.models.pool.Pool`): the catalog, and where a named
            model is routed.
        limits: the request limits in force (a reload changes them).
        settings: ``[http]``, fixed at start.
        auth: the gRPC auth interceptor (its tokens follow reloads).
        metrics: the daemon's metrics.
        tls: the TLS material (None: plaintext).
        drain_grace: seconds running requests get at :meth:`stop`.
        serving: whether the daemon serves (``GET /health``: gRPC health's overall).
        answer: the Ask service (gRPC's AnswerService adapts it too), which answers
            ``/v1/llamad/ask``.
        connections: the listener's connection caps (default: 1024 in total, 128 per
            peer).
        handshake_timeout: seconds a TLS connection has to finish its handshake.
        knowledge: the knowledge base (``/v1/llamad/search``, documents, sources...;
            None: those routes answer 404).
        mount: pages and routes served under a path of their own (the operator console:
            :mod:`._mount`); started and stopped with the listener.
    """

    def __init__(self, *, router: InferenceRouter, served: Mapping[str, Served],
                 limits: Callable[[], Limits], settings: HttpSettings,
                 auth: AuthInterceptor, metrics: Metrics | None,
                 tls: TlsMaterial | None = None, drain_grace: float = 30.0,
                 answer: AskService | None = None, pool: Pooled | None = None,
                 connections: ConnectionCap | None = None,
                 handshake_timeout: float = 10.0,
                 serving: Callable[[], bool] = lambda: True,
                 knowledge: Knowledge | None = None, mount: Mount | None = None) -> None:
        self._serving = serving
        self._api = Api(router, Catalog(served, int(time.time()), pool), limits, metrics,
                        answer, knowledge=knowledge,
                        pool=pool if isinstance(pool, Pool) else None,
                        responses=ResponseStore(settings.responses_stored,
                                                settings.responses_ttl))
        self._settings = settings
        self._auth = auth
        self._metrics = metrics
        self._tls = server_ssl_context(tls) if tls is not None else None
        self._serving_tls = self._tls
        self._grace = drain_grace
        self._runner: web.ServerRunner | None = None
        self.connections = connections or ConnectionCap(1024, 128)
        self._handshake_timeout = handshake_timeout
        self._mount = mount
        self.port = 0

    async def start(self, listen: str) -> int:
        """Listen on ``listen`` (``host:port``; checked by the configuration); return the
        port.

        Raises:
            OSError: the address cannot be bound.
        """
        host, _, port = listen.rpartition(":")
        host = host.removeprefix("[").removesuffix("]")
        s = self._settings
        loop = asyncio.get_running_loop()
        max_body = s.max_body_bytes

        def request_factory(message: RawRequestMessage, payload: StreamReader,
                            protocol: web_protocol.RequestHandler, writer: Any,
                            task: asyncio.Task[None]) -> web.BaseRequest:
            return web.BaseRequest(message, payload, protocol, writer, task, loop,
                                   client_max_size=max_body)

        server = _Server(self._dispatch, request_factory=request_factory,
                         handler_cancellation=True, max_line_size=s.max_header_bytes,
                         max_field_size=s.max_header_bytes, max_headers=s.max_headers,
                         keepalive_timeout=s.idle_timeout, access_log=None)
        runner = web.ServerRunner(server, shutdown_timeout=self._grace)
        await runner.setup()
        context = self._tls
        if context is not None:
            # Called at every handshake (with None when the client sends no server name):
            # it hands over the certificate of the last reload.
            context.sni_callback = self._sni
        socks: list[socket.socket] = []
        try:
            # Counted as they are accepted (connections.http_max, per_peer_max).
            socks += counted_listeners(host, int(port), self.connections,
                                      refusal=_refusal if context is None else None,
                                      on_refuse=_refused)
            for sock in socks:
                await _Site(runner, sock, ssl_context=context,
                            handshake_timeout=self._handshake_timeout).start()
        except OSError as exc:
            await runner.cleanup()
            for sock in socks:  # those no site took
                sock.close()
            raise OSError(f"cannot serve the HTTP API on {listen}: {exc.strerror or exc}"
                          ) from None
        self._runner = runner
        if self._mount is not None:
            await self._mount.start()
        sockets = server_sockets(runner)
        self.port = sockets[0] if sockets else int(port)
        return self.port

    def _sni(self, sock: ssl.SSLObject, name: str | None, context: ssl.SSLContext) -> None:
        if self._serving_tls is not None and sock.context is not self._serving_tls:
            sock.context = self._serving_tls

    def update_tls(self, material: TlsMaterial) -> None:
        """Serve ``material`` from the next TLS handshake on (a reload)."""
        if self._tls is not None:
            self._serving_tls = server_ssl_context(material)

    async def stop(self) -> None:
        """Stop listening, give running requests the drain grace, then cancel them."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
            if self._mount is not None:
                await self._mount.stop()

    async def _dispatch(self, request: web.BaseRequest) -> web.StreamResponse:
        received = time.perf_counter()
        request_id = _request_id(request.headers.get("x-request-id"))
        request[REQUEST_ID] = request_id
        request[RECEIVED] = received
        if request.path == "/health" and request.method in ("GET", "HEAD"):
            return self._health(request_id)
        mount = self._mount
        if mount is not None and owns(mount, request.path):
            page = mount.page(request)
            if page is not None:  # the same static files for everyone: no token, no line
                return page
            route = mount.route(request.path, request.method)
        else:
            route = route_of(request.path, request.method)
        call = Call({"peer": request.remote or "", "request_id": request_id,
                     "route": request.path[:100], "http_method": request.method})
        label = route.label if route is not None else "other"
        ticket: quotas.Ticket | None = None
        try:
            if route is None:
                raise ApiError(404, f"no route {request.method} {request.path[:100]}; llamad "
                               "serves /v1/models, /v1/chat/completions, /v1/completions, "
                               "/v1/responses, /v1/messages, /v1/embeddings, "
                               "/v1/llamad/ask and GET /health; GET /openapi.json lists "
                               "every route", code="not_found")
            if request.method != route.http_method:
                raise ApiError(405, f"{request.path} takes "
                               f"{' or '.join(self._methods_of(request.path))}, not "
                               f"{request.method[:20]}", code="method_not_allowed")
            authorization = request.headers.get("Authorization")
            if authorization is None and route.api_key:  # Anthropic's SDKs send x-api-key
                key = request.headers.get("x-api-key")
                authorization = None if key is None else f"Bearer {key}"
            found = self._auth.resolve(route.grpc_method, [("authorization", authorization)]
                                       if authorization is not None else [])
            if isinstance(found, Denial):
                self._auth.denied(route.grpc_method, call.fields["peer"], found,
                                  protocol="http")
                return _error_response(request_id,
                                       route.restyle(api_error_for_denial(found)))
            request[CALLER] = found.fingerprint if found is not None else ""
            timeout = _timeout(request.headers.get("x-request-timeout"))
            # The token's quota and lane (daemon.services.quotas): a 429 here when past it.
            lane, ticket = quotas.enter(self._auth.quotas, found, route.grpc_method,
                                        parse_lane(request.headers.get(LANE_HEADER, "")),
                                        call.note)
            if lane is not Lane.INTERACTIVE:
                call.note(lane=lane.value)
            body = await self._body(request, route) if route.reads_body else {}
            if timeout is not None:
                call.deadline = time.monotonic() + timeout
            try:
                async with asyncio.timeout(timeout):
                    with lanes.asking(lane):
                        response = await route.handler(self._api, request, call, body)
            except TimeoutError:
                response = await _deadline_passed(request, call, timeout, route.restyle)
            call.note(status=response.status)
            return response
        except asyncio.CancelledError:
            call.note(code="CANCELLED", status=499)
            raise
        except ConnectionResetError:  # the client went away while a stream was written
            call.note(code="CANCELLED", status=499)
            return request.get(STREAM) or web.Response(status=499)
        except Exception as exc:
            error = api_error(exc)
            if route is not None:
                error = route.restyle(error)
            if error.grpc_code == "INTERNAL":
                _log.error("internal error", exc_info=exc, **call.fields)
            call.note(code=error.grpc_code, status=error.status, error=error.message[:200])
            return await _answer_error(request, error)
        finally:
            if ticket is not None:  # its tokens count when it ends
                ticket.finish(call.fields)
            if "code" in call.fields or "status" in call.fields:
                write_summary(label, time.perf_counter() - received, call.fields,
                              self._metrics, protocol="http")

    def _methods_of(self, path: str) -> tuple[str, ...]:
        if self._mount is not None and owns(self._mount, path):
            return self._mount.methods(path)
        return methods_of(path)

    def _health(self, request_id: str) -> web.Response:
        """``GET /health``: 200 while the daemon serves, else 503 (module docstring)."""
        serving = self._serving()
        return web.Response(
            status=200 if serving else 503,
            body=b'{"status":"serving"}' if serving else b'{"status":"not_serving"}',
            content_type="application/json",
            headers={"Cache-Control": "no-store", "x-request-id": request_id})

    async def _body(self, request: web.BaseRequest, route: Route) -> _parse.Body:
        s = self._settings
        expect = request.headers.get("Expect")
        if expect is not None and request.version == HttpVersion11:
            # curl sends this for bodies over 1 KiB and waits a second for the answer.
            if expect.lower() != "100-continue":
                raise ApiError(417, f"unknown Expect: {expect[:40]!r}")
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            request.writer.output_size = 0  # the response proper has not begun
        try:
            async with asyncio.timeout(s.body_timeout):
                raw = await request.read()
        except TimeoutError:
            raise ApiError(408, f"the request body did not arrive within "
                           f"{s.body_timeout:g} s (http.body_timeout)") from None
        except web.HTTPRequestEntityTooLarge:
            raise ApiError(413, f"the request body is larger than {s.max_body_bytes} bytes "
                           "(http.max_body_bytes)", code="request_too_large") from None
        if route.raw_body:  # the handler reads the bytes themselves
            request[RAW_BODY] = raw
            return {}
        return _parse.json_body(raw)


def _timeout(header: str | None) -> float | None:
    """``x-request-timeout``: the seconds the caller gives the request (llamad's extension,
    gRPC's deadline: a call that would wait past it is refused at once, one that runs
    past it is stopped)."""
    if header is None:
        return None
    try:
        seconds = float(header)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds <= 86400:  # NaN fails too
        raise ApiError(400, "the x-request-timeout header must be a number of seconds in "
                       f"(0, 86400], not {header[:40]!r}", param="x-request-timeout")
    return seconds


async def _deadline_passed(request: web.BaseRequest, call: Call, timeout: float | None,
                           restyle: Callable[[ApiError], ApiError]) -> web.StreamResponse:
    """The answer of a request stopped at its deadline: a 504, or, once a stream has
    begun, its error event."""
    error = ApiError(504, f"the request ran past its deadline (x-request-timeout: "
                     f"{timeout:g} s)", code="deadline_exceeded")
    error = restyle(error)
    call.note(code=error.grpc_code, error=error.message)
    return await _answer_error(request, error)


async def _answer_error(request: web.BaseRequest, error: ApiError) -> web.StreamResponse:
    """``error`` as the response; once a stream has sent its headers, as its last event
    (``data: {"error": ...}``, no ``[DONE]``: the OpenAI SDKs raise it)."""
    stream: web.StreamResponse | None = request.get(STREAM)
    if stream is None:
        return _error_response(request[REQUEST_ID], error)
    await stream.write(error.event(request))
    await stream.write_eof()
    return stream


def api_error_for_denial(denial: Any) -> ApiError:
    status = 401 if denial.code.name == "UNAUTHENTICATED" else 403
    message = denial.message.replace("metadata 'authorization: Bearer <token>'",
                                     "header 'Authorization: Bearer <token>'")
    return ApiError(status, message, code=denial.code.name.lower())


def server_sockets(runner: web.ServerRunner) -> list[int]:
    """The ports ``runner``'s sites listen on."""
    ports: list[int] = []
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            ports.append(int(address[1]))
    return ports
