"""Who may call what: bearer tokens with roles, checked on every RPC; TLS credentials that
follow the certificate files across SIGHUP reloads.

Roles. Every RPC of every service is mapped, explicitly, to the role it needs
(:data:`METHOD_ROLES`; tests/unit/test_auth.py fails when an RPC of the protos is
missing, so a new RPC cannot slip through unguarded):

* ``read``: generation, chat, embeddings, tokenize, search, ask, status and the read-only
  listings (documents, sources, retrieval status, models), and server reflection.
* ``admin``: everything that changes state or shows a child's raw output — Swap, Reset,
  SetMode, SetDraining, LoadModel, UnloadModel, TailLogs, document upsert and delete,
  source add, remove and disable, Reindex, Reprocess, ApproveDocument and RejectDocument.
  ``admin`` implies ``read``.
* ``grpc.health.v1.Health`` needs no token (probes and load balancers).

With ``auth.token_file`` unset, no token is asked for (the default, on loopback). With it,
a call without a valid ``authorization: Bearer <token>`` ends ``UNAUTHENTICATED``; a read
token on an admin RPC ends ``PERMISSION_DENIED``; a method with no role is refused
(``PERMISSION_DENIED``), never let through. Each denial is logged — method, peer,
reason, the token's fingerprint (:func:`daemon.config.access.fingerprint`) — never the token;
at most :data:`DENIAL_LOG_BURST` lines per :data:`DENIAL_LOG_WINDOW` seconds, the rest
counted. The tokens are swapped in atomically on reload (:meth:`AuthInterceptor.set_tokens`).

Quotas. A call of a method that spends model time
(:data:`daemon.services.quotas.QUOTA_METHODS`) by a token runs under its quotas and lane
(:func:`daemon.services.quotas.calling`): the handler's frame
(:mod:`daemon.grpcapi.rpc`) admits it or refuses it with RESOURCE_EXHAUSTED and a retry
hint, and counts its tokens when it ends.

TLS. :class:`TlsCredentials` makes ``grpc.dynamic_ssl_server_credentials`` whose fetcher,
called by gRPC before each new handshake, hands over the certificate loaded by the last
reload. Connections already open keep the certificate they were made with.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
import structlog

from llamad_protocol.v1.wire import AUTHORIZATION_KEY, BEARER_SCHEME, HEALTH_SERVICE

from ..config import AuthSettings
from ..config.access import ADMIN, READ, TlsMaterial, TokenEntry, TokenTable, fingerprint
from ..services.quotas import QUOTA_METHODS, Quotas, calling
from ..telemetry.metrics import Metrics
from .wire import HandlerInterceptor

_log = structlog.get_logger("llamad.auth")

PUBLIC_SERVICES = (HEALTH_SERVICE,)
"""Services served without a token."""

METHOD_ROLES: Mapping[str, str] = {
    # llamad.v1.InferenceService
    "/llamad.v1.InferenceService/Generate": READ,
    "/llamad.v1.InferenceService/Chat": READ,
    "/llamad.v1.InferenceService/Embed": READ,
    "/llamad.v1.InferenceService/Tokenize": READ,
    "/llamad.v1.InferenceService/Detokenize": READ,
    # llamad.v1.ControlService
    "/llamad.v1.ControlService/Status": READ,
    "/llamad.v1.ControlService/TailLogs": ADMIN,  # child output may hold prompts
    "/llamad.v1.ControlService/Swap": ADMIN,
    "/llamad.v1.ControlService/Reset": ADMIN,
    "/llamad.v1.ControlService/SetMode": ADMIN,
    "/llamad.v1.ControlService/SetDraining": ADMIN,  # takes the node out of balancing
    "/llamad.v1.ControlService/ListModels": READ,
    "/llamad.v1.ControlService/LoadModel": ADMIN,
    "/llamad.v1.ControlService/UnloadModel": ADMIN,
    # llamad.v1.RetrievalService
    "/llamad.v1.RetrievalService/UpsertDocument": ADMIN,
    "/llamad.v1.RetrievalService/DeleteDocument": ADMIN,
    "/llamad.v1.RetrievalService/GetDocument": READ,
    "/llamad.v1.RetrievalService/ListDocuments": READ,
    "/llamad.v1.RetrievalService/AddSource": ADMIN,
    "/llamad.v1.RetrievalService/RemoveSource": ADMIN,
    "/llamad.v1.RetrievalService/ListSources": READ,
    "/llamad.v1.RetrievalService/SetSourceDisabled": ADMIN,
    "/llamad.v1.RetrievalService/Reindex": ADMIN,
    "/llamad.v1.RetrievalService/Search": READ,
    "/llamad.v1.RetrievalService/Status": READ,
    "/llamad.v1.RetrievalService/Reprocess": ADMIN,
    "/llamad.v1.RetrievalService/ApproveDocument": ADMIN,
    "/llamad.v1.RetrievalService/RejectDocument": ADMIN,
    # llamad.v1.AnswerService
    "/llamad.v1.AnswerService/Ask": READ,
    # Server reflection: the API's shape, for grpcurl.
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": READ,
}
"""The role each RPC needs, by full method name."""

DENIAL_LOG_BURST = 20
DENIAL_LOG_WINDOW = 10.0

_PUBLIC_PREFIXES = tuple(f"/{s}/" for s in PUBLIC_SERVICES)
_MISSING = ("this daemon requires a bearer token: send the metadata 'authorization: Bearer "
            "<token>' (llamad CLI: --token-file or LLAMAD_TOKEN_FILE)")


def _short(method: str) -> str:
    """``/llamad.v1.ControlService/Swap`` -> ``ControlService/Swap``."""
    service, _, name = method.lstrip("/").rpartition("/")
    return f"{service.rpartition('.')[2]}/{name}"


def bearer(metadata: Any) -> tuple[str | None, str]:
    """The bearer token in call metadata, and why there is none ("" when there is one)."""
    for key, value in metadata or ():
        if key != AUTHORIZATION_KEY:
            continue
        text = value.decode("latin-1") if isinstance(value, bytes) else str(value)
        scheme, _, token = text.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != BEARER_SCHEME.lower() or not token:
            return None, "malformed authorization"
        return token, ""
    return None, "no token"


@dataclass(frozen=True)
class Denial:
    """Why a call is refused: its status, the message the caller gets, the reason logged,
    and the token's fingerprint (None when no valid-looking token was sent)."""

    code: grpc.StatusCode
    message: str
    reason: str
    token: str | None = None


class _DenialLog:
    """Rate-limited denial lines: a flood of bad calls cannot flood the journal."""

    def __init__(self) -> None:
        self._window_start = 0.0
        self._lines = 0
        self._suppressed = 0

    def log(self, **fields: Any) -> None:
        now = time.monotonic()
        if now - self._window_start >= DENIAL_LOG_WINDOW:
            if self._suppressed:
                _log.warning("access denials not logged", count=self._suppressed,
                             window_s=DENIAL_LOG_WINDOW)
            self._window_start, self._lines, self._suppressed = now, 0, 0
        if self._lines >= DENIAL_LOG_BURST:
            self._suppressed += 1
            return
        self._lines += 1
        _log.warning("access denied", **fields)


class AuthInterceptor(HandlerInterceptor):
    """Checks every call's bearer token against :data:`METHOD_ROLES` (module docstring).

    With no tokens configured, every call passes untouched.
    """

    def __init__(self, tokens: TokenTable | None, metrics: Metrics | None = None,
                 settings: AuthSettings | None = None) -> None:
        self._tokens = tokens
        self._metrics = metrics
        self._denials = _DenialLog()
        s = settings or AuthSettings()
        self.quotas = Quotas(s.quota_mode, s.quota_window, metrics=metrics)
        self.quotas.keep(tokens.entries if tokens is not None else ())

    @property
    def tokens(self) -> TokenTable | None:
        return self._tokens

    def set_tokens(self, tokens: TokenTable | None,
                   settings: AuthSettings | None = None) -> None:
        """Use these tokens (and, given, these quota settings) from the next call on (a
        reload): the quota windows of tokens still configured go on."""
        self._tokens = tokens
        if settings is not None:
            self.quotas.configure(settings.quota_mode, settings.quota_window)
        self.quotas.keep(tokens.entries if tokens is not None else ())

    def handler_for(self, handler: grpc.RpcMethodHandler,
                    details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        found = self.resolve(details.method, details.invocation_metadata)
        if isinstance(found, Denial):
            return self._deny(handler, details.method, found)
        if found is not None and details.method in QUOTA_METHODS:
            return self._under_quota(handler, details.method, found)
        return handler

    def check(self, method: str, metadata: Any) -> Denial | None:
        """Why a call of ``method`` (a full gRPC method name) with ``metadata`` (its
        ``(key, value)`` pairs: ``authorization`` is read) is refused; None when it may
        go on."""
        found = self.resolve(method, metadata)
        return found if isinstance(found, Denial) else None

    def resolve(self, method: str, metadata: Any) -> Denial | TokenEntry | None:
        """As :meth:`check`, but a call that may go on gets its token's line (class,
        lane, quotas); None when no token is needed. The HTTP API asks the same, naming
        the method its route stands for."""
        tokens = self._tokens
        if tokens is None or method.startswith(_PUBLIC_PREFIXES):
            return None
        token, why = bearer(metadata)
        if token is None:
            message = _MISSING if why == "no token" else (
                "malformed authorization metadata: expected 'Bearer <token>'")
            return Denial(grpc.StatusCode.UNAUTHENTICATED, message, why)
        entry = tokens.entry_of(token)
        if entry is None:
            return Denial(grpc.StatusCode.UNAUTHENTICATED, "the bearer token is not valid",
                          "unknown token", fingerprint(token))
        role = entry.role
        needed = METHOD_ROLES.get(method)
        if needed is None:
            return Denial(grpc.StatusCode.PERMISSION_DENIED,
                          f"{_short(method)} has no access role; refused",
                          "method without a role", fingerprint(token))
        if needed == ADMIN and role != ADMIN:
            return Denial(grpc.StatusCode.PERMISSION_DENIED,
                          f"{_short(method)} needs a token with the admin role; this "
                          f"token has the {role} role", "needs admin", fingerprint(token))
        return entry

    def denied(self, method: str, peer: str, denial: Denial, *,
               protocol: str = "grpc") -> None:
        """Log a denial (rate-limited) and count the refused call."""
        fields: dict[str, Any] = {"method": _short(method), "peer": peer,
                                  "code": denial.code.name, "reason": denial.reason}
        if protocol != "grpc":
            fields["protocol"] = protocol
        if denial.token is not None:
            fields["token"] = denial.token
        self._denials.log(**fields)
        if self._metrics is not None:
            self._metrics.request(method.rpartition("/")[2], denial.code.name, 0.0, protocol)

    def _under_quota(self, handler: grpc.RpcMethodHandler, method: str,
                     entry: TokenEntry) -> grpc.RpcMethodHandler:
        """``handler`` (unary or server-streaming) run under ``entry``'s quota and lane."""
        quotas = self.quotas
        shapes = {"request_deserializer": handler.request_deserializer,
                  "response_serializer": handler.response_serializer}
        if handler.unary_unary is not None:
            inner = handler.unary_unary

            return grpc.unary_unary_rpc_method_handler(
                _coroutine_under(quotas, entry, method, inner), **shapes)
        if handler.unary_stream is not None and inspect.iscoroutinefunction(
                handler.unary_stream):
            # A streaming handler that writes its messages (rpc.writes): no generator
            # layer per message here either.
            return grpc.unary_stream_rpc_method_handler(
                _coroutine_under(quotas, entry, method, handler.unary_stream), **shapes)
        if handler.unary_stream is not None:
            streamed = handler.unary_stream

            async def stream(request: object,
                             context: grpc.aio.ServicerContext) -> AsyncIterator[object]:
                with calling(quotas, entry, method):
                    async for item in streamed(request, context):
                        yield item

            return grpc.unary_stream_rpc_method_handler(stream, **shapes)
        return handler

    def _deny(self, handler: grpc.RpcMethodHandler, method: str,
              denial: Denial) -> grpc.RpcMethodHandler:
        """A handler of the same shape that refuses the call (requests are not parsed)."""

        async def refuse(request: object, context: grpc.aio.ServicerContext) -> None:
            self.denied(method, context.peer(), denial)
            await context.abort(denial.code, denial.message)

        if handler.request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(refuse)
        if handler.request_streaming:
            return grpc.stream_unary_rpc_method_handler(refuse)
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(refuse)
        return grpc.unary_unary_rpc_method_handler(refuse)


def _coroutine_under(quotas: Quotas, entry: TokenEntry, method: str,
                     inner: Callable[[object, grpc.aio.ServicerContext], Awaitable[object]]
                     ) -> Callable[[object, grpc.aio.ServicerContext], Awaitable[object]]:
    """A coroutine handler (unary, or streaming by ``context.write``) run under
    ``entry``'s quota and lane."""

    async def handler(request: object, context: grpc.aio.ServicerContext) -> object:
        with calling(quotas, entry, method):
            return await inner(request, context)

    return handler


class TlsCredentials:
    """Server credentials whose certificate can change while serving (SIGHUP).

    Whether client certificates are required is fixed when the server starts; the
    certificate, key and client CA may change.
    """

    def __init__(self, material: TlsMaterial) -> None:
        self._material = material
        self._pending: grpc.ServerCertificateConfiguration | None = None
        self._lock = threading.Lock()

    @property
    def material(self) -> TlsMaterial:
        return self._material

    @staticmethod
    def _configuration(material: TlsMaterial) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration(
            [(material.private_key, material.cert_chain)], root_certificates=material.client_ca)

    def server_credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(
            self._configuration(self._material), self._fetch,
            require_client_authentication=self._material.require_client_cert)

    def update(self, material: TlsMaterial) -> None:
        """Serve ``material`` from the next handshake on (already checked by
        :func:`daemon.config.access.load_tls`)."""
        if material.require_client_cert != self._material.require_client_cert:
            raise ValueError("turning mutual TLS on or off needs a restart")
        configuration = self._configuration(material)
        with self._lock:
            self._pending = configuration
            self._material = material

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        # Called by gRPC (from its own threads) before each handshake: None keeps the
        # current certificate. Never raises.
        with self._lock:
            pending, self._pending = self._pending, None
        return pending
