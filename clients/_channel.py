"""How a client reaches llamad: address, channel options, retry policy, credentials.

Retries are gRPC's own (``grpc.enable_retries`` plus a ``retryPolicy`` in the channel's
service config), never a loop in this package:

* Every llamad RPC and ``grpc.health.v1.Health/Check`` is retried on ``UNAVAILABLE`` only
  (daemon not reachable yet, draining, child starting), up to :data:`MAX_ATTEMPTS`
  attempts in all, with exponential backoff and jitter (gRPC's). Other codes are final.
  Unary RPCs that change state (upsert, delete, add/remove source, reset) are safe to
  retry: the daemon either refused them before doing anything, or they are idempotent.
* A streaming RPC is retried the same way only until the daemon sends its first message:
  gRPC commits the call when the response headers arrive (the daemon sends them with the
  first message), so a stream that fails after its first message is never retried —
  nothing is replayed or duplicated. The error is raised from the iterator.
* ``retryThrottling`` stops retrying when most recent calls fail (a daemon that is down
  for long), so a busy caller does not multiply its load.
* A retry hint the daemon sends (``retry-after-ms``) is not what gRPC's backoff reads;
  once the attempts are spent the error carries it as ``retry_after``.

Several addresses (``"10.0.0.1:50051,10.0.0.2:50051"`` or a list) make one channel that
balances calls over the daemons with gRPC's own ``round_robin`` and client-side health
checking (``healthCheckConfig``): each daemon is watched on ``grpc.health.v1`` (service
``""``), and one that is not SERVING — drained, shutting down, loading, unreachable — gets
no new calls until it is again; calls running on it go on. They must be IP addresses
(gRPC's ``ipv4:``/``ipv6:`` targets), all of one family; with TLS, ``server_name`` names
the certificate they share. When no daemon is SERVING, calls fail with UNAVAILABLE
(retried as above). One address keeps gRPC's default (``pick_first``, no health
checking), so a daemon still loading its models answers Status and health.
"""

from __future__ import annotations

import enum
import ipaddress
import json
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeAlias, TypedDict

import grpc

from llamad_protocol.v1 import answer_pb2, control_pb2, inference_pb2, retrieval_pb2
from llamad_protocol.v1.wire import AUTHORIZATION_KEY, BEARER_SCHEME, HEALTH_SERVICE


class _Default(enum.Enum):
    DEFAULT = "default"


DEFAULT: Final = _Default.DEFAULT
"""Per-call ``timeout`` default: use the client's (``timeout`` for unary calls,
``stream_timeout`` for streams)."""

Timeout: TypeAlias = float | _Default | None
"""A per-call deadline in seconds; None for none; :data:`DEFAULT` for the client's."""

DEFAULT_ADDRESS = "127.0.0.1:50051"
ADDRESS_ENV = "LLAMAD_ADDRESS"
MAX_ATTEMPTS = 4
MAX_MESSAGE_BYTES = 64 * 1024 * 1024

_SERVICES = (
    inference_pb2.DESCRIPTOR.services_by_name["InferenceService"],
    control_pb2.DESCRIPTOR.services_by_name["ControlService"],
    retrieval_pb2.DESCRIPTOR.services_by_name["RetrievalService"],
    answer_pb2.DESCRIPTOR.services_by_name["AnswerService"],
)

_RETRY_POLICY = {
    "maxAttempts": MAX_ATTEMPTS,
    "initialBackoff": "0.1s",
    "maxBackoff": "2s",
    "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE"],
}


def _names(streaming: bool) -> list[dict[str, str]]:
    names = [
        {"service": service.full_name, "method": method.name}
        for service in _SERVICES
        for method in service.methods
        if method.server_streaming == streaming
    ]
    if not streaming:
        names.append({"service": HEALTH_SERVICE, "method": "Check"})
    return names


def service_config() -> dict[str, Any]:
    """The channel's service config: retry policies for unary and streaming methods."""
    return {
        "methodConfig": [
            {"name": _names(streaming=False), "retryPolicy": dict(_RETRY_POLICY)},
            {"name": _names(streaming=True), "retryPolicy": dict(_RETRY_POLICY)},
        ],
        # One failed attempt costs a token, a success earns 0.1; below 5 of 10, no retries.
        "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1},
    }


def balanced_service_config() -> dict[str, Any]:
    """:func:`service_config` plus round_robin over the addresses, each health-checked."""
    return {**service_config(), "loadBalancingConfig": [{"round_robin": {}}],
            "healthCheckConfig": {"serviceName": ""}}


SERVICE_CONFIG_JSON = json.dumps(service_config(), separators=(",", ":"))
BALANCED_SERVICE_CONFIG_JSON = json.dumps(balanced_service_config(), separators=(",", ":"))


def split_addresses(address: str | Sequence[str] | None) -> list[str]:
    """The addresses in ``address``: a list, a comma-separated string, or None (one: the
    environment's or the default)."""
    if address is None or isinstance(address, str):
        value = address if address is not None else os.environ.get(ADDRESS_ENV)
        if value is None or "," not in value:
            return [resolve_address(address)]
        address = value.split(",")
    parts = [a.strip() for a in address]
    if not parts or not all(parts):
        raise ValueError(f"an empty address in {','.join(parts)!r}")
    return [resolve_address(a) for a in parts]


def balanced_target(addresses: Sequence[str]) -> str:
    """One gRPC target for several daemons: ``ipv4:a:p,b:q`` or ``ipv6:[a]:p,[b]:q``
    (``localhost`` is 127.0.0.1).

    Raises:
        ValueError: an address that is not an IP literal and a port, or a mix of families.

    Example:
        >>> balanced_target(["127.0.0.1:5001", "localhost:5002"])
        'ipv4:127.0.0.1:5001,127.0.0.1:5002'
    """
    families: set[int] = set()
    out: list[str] = []
    for address in addresses:
        host, sep, port = address.rpartition(":")
        host = "127.0.0.1" if host == "localhost" else host.strip("[]")
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            ip = None
        if not sep or not port.isdigit() or ip is None:
            raise ValueError(
                f"several addresses must each be an IP address and a port, got {address!r}")
        families.add(ip.version)
        out.append(f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}")
    if len(families) > 1:
        raise ValueError("several addresses must be all IPv4 or all IPv6")
    return ("ipv6:" if families == {6} else "ipv4:") + ",".join(out)


def resolve_address(address: str | None) -> str:
    """The gRPC target for ``address``, ``$LLAMAD_ADDRESS`` or the default.

    ``host:port`` and ``unix:/path`` pass through; a bare absolute path is taken as a
    unix socket.

    Raises:
        ValueError: an empty address.

    Example:
        >>> resolve_address("/run/llamad/llamad.sock")
        'unix:/run/llamad/llamad.sock'
    """
    value = (address if address is not None else os.environ.get(ADDRESS_ENV, "")).strip()
    if address is None and not value:
        value = DEFAULT_ADDRESS
    if not value:
        raise ValueError("the daemon address is empty")
    if value.startswith("/"):
        return f"unix:{value}"
    return value


def _read(path: str | os.PathLike[str], what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read the {what} {os.fspath(path)}: "
                         f"{exc.strerror or exc}") from None


def read_token_file(path: str | os.PathLike[str]) -> str:
    """The bearer token in ``path``: one line (``#`` comment lines and blank lines are
    ignored), in a file nobody but its owner and group may read.

    Raises:
        ValueError: unreadable, readable by everyone, empty, or more than one token
            (messages name the file, never the token).
    """
    name = os.fspath(path)
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError as exc:
        raise ValueError(f"cannot read the token file {name}: {exc.strerror or exc}") from None
    if mode & stat.S_IROTH:
        raise ValueError(f"the token file {name} is readable by everyone (mode {mode:04o}); "
                         "chmod o-rwx it")
    try:
        text = _read(path, "token file").decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"the token file {name} is not UTF-8 text") from None
    lines = [ln.strip() for ln in text.splitlines()
             if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        raise ValueError(f"the token file {name} is empty")
    if len(lines) > 1 or len(lines[0].split()) > 1:
        raise ValueError(f"the token file {name} must hold just one token on one line "
                         "(not the daemon's '<role> <token>' file)")
    return lines[0]


def _loopback(target: str) -> bool:
    """A unix socket, or a loopback host (name or IP literal): plaintext stays local."""
    if target.startswith(("unix:", "unix-abstract:")):
        return True
    host = target.rpartition(":")[0] if ":" in target else target
    host = host.removeprefix("dns:///").removeprefix("ipv4:").removeprefix("ipv6:")
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ChannelSettings:
    """Everything needed to open a channel and make calls on it."""

    target: str
    credentials: Any  # grpc.ChannelCredentials, or None for a plaintext channel
    metadata: tuple[tuple[str, str], ...]
    options: tuple[tuple[str, Any], ...]
    balanced: bool = False
    """Several daemons, round_robin over the healthy ones."""

    @property
    def secure(self) -> bool:
        return self.credentials is not None


class ConnectionOptions(TypedDict, total=False):
    """How a client connects and authenticates: the clients' keyword arguments that
    :func:`settings` takes (documented at :class:`clients.Client`)."""

    tls: bool
    ca_file: str | os.PathLike[str] | None
    cert_file: str | os.PathLike[str] | None
    key_file: str | os.PathLike[str] | None
    token: str | None
    token_file: str | os.PathLike[str] | None
    server_name: str | None
    options: Sequence[tuple[str, Any]]


def settings(
    address: str | Sequence[str] | None = None,
    *,
    tls: bool = False,
    ca_file: str | os.PathLike[str] | None = None,
    cert_file: str | os.PathLike[str] | None = None,
    key_file: str | os.PathLike[str] | None = None,
    token: str | None = None,
    token_file: str | os.PathLike[str] | None = None,
    server_name: str | None = None,
    options: Sequence[tuple[str, Any]] = (),
) -> ChannelSettings:
    """Validate the connection options and build the channel settings.

    TLS is on when ``tls`` is true or any certificate file is given. The bearer token goes
    in call credentials on a TLS channel; on a plaintext channel it is sent as the
    ``authorization`` metadata of every call — only to loopback or a unix socket (the
    daemon listens on nothing else without TLS): a token is never sent in the clear over
    a network. Several addresses (a list, or commas) balance over the daemons (see the
    module docstring).

    Raises:
        ValueError: unreadable files, a token file readable by everyone (see
            :func:`read_token_file`), a certificate without its key (or the reverse), both
            ``token`` and ``token_file``, an empty token, a token without TLS to an address
            that is not loopback; several addresses that are not IP addresses of one family.
    """
    addresses = split_addresses(address)
    balanced = len(addresses) > 1
    target = balanced_target(addresses) if balanced else addresses[0]
    if token is not None and token_file is not None:
        raise ValueError("give token or token_file, not both")
    if token_file is not None:
        token = read_token_file(token_file)
    if token is not None and not token.strip():
        raise ValueError("the token is empty")
    if (cert_file is None) != (key_file is None):
        raise ValueError("mutual TLS needs both cert_file and key_file")
    tls = tls or any(f is not None for f in (ca_file, cert_file, key_file))
    opts: list[tuple[str, Any]] = [
        ("grpc.enable_retries", 1),
        ("grpc.service_config", BALANCED_SERVICE_CONFIG_JSON if balanced
         else SERVICE_CONFIG_JSON),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ]
    if server_name:
        opts.append(("grpc.ssl_target_name_override", server_name))
    opts.extend(options)
    credentials = None
    metadata: tuple[tuple[str, str], ...] = ()
    if tls:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=_read(ca_file, "CA file") if ca_file is not None else None,
            private_key=_read(key_file, "key file") if key_file is not None else None,
            certificate_chain=_read(cert_file, "certificate file")
            if cert_file is not None else None,
        )
        if token is not None:
            credentials = grpc.composite_channel_credentials(
                credentials, grpc.access_token_call_credentials(token.strip()))
    elif token is not None:
        if not all(_loopback(a) for a in addresses):
            raise ValueError(f"refusing to send a bearer token in the clear to {target}: "
                             "connect with TLS (tls=True or ca_file)")
        metadata = ((AUTHORIZATION_KEY, f"{BEARER_SCHEME} {token.strip()}"),)
    return ChannelSettings(target, credentials, metadata, tuple(opts), balanced)
