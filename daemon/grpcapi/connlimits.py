"""Connection limits: the descriptor budget the listeners share, gRPC's channel arguments,
and the HTTP listener's per-peer and total count (issue 25).

A client connection costs the daemon a file descriptor; at the process's limit
(RLIMIT_NOFILE) every ``accept``, every file the indexes open, every pipe a child needs
fails. So the listeners together hold at most the limit less ``connections.reserve_fds``:
the metrics and agent listeners their own small caps, the rest for gRPC (all of it, or
half when the HTTP API is on) and HTTP (the other half). Past its cap a listener closes a
new connection as it is accepted; the reserve keeps health, Status, children, index files
and logs working whatever the clients do.

gRPC's core (grpcio) counts the connections itself (``grpc.max_allowed_incoming_connections``:
past it a connection is closed as soon as it is accepted, before its handshake) and closes
a connection that has not sent its HTTP/2 settings within
``grpc.server_handshake_timeout_ms`` (a bare TCP connection, a preface alone) and one idle
for ``grpc.max_connection_idle_ms``. It cannot cap a peer: :mod:`daemon.grpcapi.peerguard` does.
"""

from __future__ import annotations

import resource
import socket
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import structlog

from ..config._connections import ConnectionSettings

if TYPE_CHECKING:
    from ..config import Config

_log = structlog.get_logger("llamad.connections")

MIN_LISTENER = 8
"""The fewest connections a listener is given, whatever the budget: below it a listener
could not serve a load balancer's and a client's channels at once."""


@dataclass(frozen=True)
class Budget:
    """What each listener may hold at once, from the descriptor limit read at start."""

    nofile: int
    grpc: int
    http: int
    metrics: int
    per_peer: int


def descriptor_limit() -> int:
    """The process's soft RLIMIT_NOFILE (the one ``accept`` fails at)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return hard if hard != resource.RLIM_INFINITY else 1 << 20
    return soft


def budget(s: ConnectionSettings, *, http: bool, metrics: bool, agent: int = 0,
           nofile: int | None = None) -> Budget:
    """Split the descriptor budget between the listeners (see the module docstring).

    Args:
        s: ``[connections]``.
        http: the HTTP API listens (``http_listen``).
        metrics: the metrics listener listens (``metrics_listen``).
        agent: the agent-check listener's cap (0: off).
        nofile: the descriptor limit (default: read now).
    """
    nofile = descriptor_limit() if nofile is None else nofile
    metrics_max = s.metrics_max if metrics else 0
    room = nofile - s.reserve_fds - metrics_max - agent
    if room < 2 * MIN_LISTENER:
        _log.warning("descriptor limit leaves little room for connections", nofile=nofile,
                     reserve_fds=s.reserve_fds, room=room,
                     hint="raise LimitNOFILE, or lower connections.reserve_fds")
        room = 2 * MIN_LISTENER
    share = room // 2 if http else room
    grpc_max = _capped("connections.grpc_max", s.grpc_max, share)
    http_max = _capped("connections.http_max", s.http_max, room - share) if http else 0
    return Budget(nofile, grpc_max, http_max, metrics_max, s.per_peer_max)


def budget_of(config: Config) -> Budget:
    """:func:`budget` of the listeners ``config`` turns on, at the limit in force now."""
    s = config.settings
    return budget(s.connections, http=bool(s.http_listen), metrics=bool(s.metrics_listen),
                  agent=s.agent.max_connections if s.agent_listen else 0)


def _capped(key: str, asked: int, share: int) -> int:
    """``asked`` (0: ``share``), lowered to ``share`` with a warning naming the option."""
    share = max(share, MIN_LISTENER)
    if asked == 0:
        return share
    if asked > share:
        _log.warning("connection cap lowered to the descriptor budget", option=key,
                     configured=asked, used=share)
        return share
    return asked


def grpc_options(s: ConnectionSettings, b: Budget) -> list[tuple[str, int]]:
    """gRPC server channel arguments for ``[connections]`` (every one of them read by
    grpcio's core on the server side; tests/integration/test_connections.py sees them
    act)."""
    def ms(seconds: float) -> int:
        return max(1, round(seconds * 1000))

    options = [
        ("grpc.max_allowed_incoming_connections", b.grpc),
        ("grpc.server_handshake_timeout_ms", ms(s.handshake_timeout)),
        ("grpc.keepalive_time_ms", ms(s.keepalive_time)),
        ("grpc.keepalive_timeout_ms", ms(s.keepalive_timeout)),
        ("grpc.max_concurrent_streams", s.max_concurrent_streams),
    ]
    if s.idle_timeout > 0:
        options.append(("grpc.max_connection_idle_ms", ms(s.idle_timeout)))
    if s.max_age > 0:
        options += [("grpc.max_connection_age_ms", ms(s.max_age)),
                    ("grpc.max_connection_age_grace_ms", ms(s.max_age_grace))]
    return options


class ConnectionCap:
    """Counts the HTTP listener's open connections, in total and per peer address.

    Args:
        total: most connections at once.
        per_peer: most connections of one peer address at once (0: no per-peer cap).
    """

    def __init__(self, total: int, per_peer: int) -> None:
        self.total = total
        self.per_peer = per_peer
        self.open = 0
        self._peers: dict[str, int] = {}

    def admit(self, peer: str) -> str | None:
        """Count a new connection of ``peer``; None when admitted, else why it is not
        (then nothing was counted)."""
        if self.open >= self.total:
            return (f"the listener holds its most connections ({self.total}, "
                    "connections.http_max)")
        held = self._peers.get(peer, 0)
        if self.per_peer and held >= self.per_peer:
            return (f"this address holds its most connections ({self.per_peer}, "
                    "connections.per_peer_max)")
        self.open += 1
        self._peers[peer] = held + 1
        return None

    def release(self, peer: str) -> None:
        """An admitted connection of ``peer`` closed."""
        self.open -= 1
        left = self._peers.get(peer, 1) - 1
        if left > 0:
            self._peers[peer] = left
        else:
            self._peers.pop(peer, None)


class _Counted(socket.socket):
    """An accepted connection that gives its place back when it is closed (asyncio
    closes every transport's socket, a failed TLS handshake's too)."""

    __slots__ = ("_release",)
    _release: Callable[[], None] | None

    def close(self) -> None:
        release, self._release = getattr(self, "_release", None), None
        try:
            super().close()
        finally:
            if release is not None:
                release()


class CountedListener(socket.socket):
    """A listening socket whose ``accept`` admits connections by ``cap``: one past a cap
    is answered ``refusal(reason)`` (nothing on TLS) and closed right there, before
    asyncio sees it. Counting at accept, not in the protocol, bounds the descriptors
    exactly: asyncio accepts up to its backlog in one go and makes the protocols later,
    and a TLS connection reaches its protocol only after its handshake.

    Args:
        family: the address family of ``address``.
        cap: what to count the connections by.
        refusal: the bytes a refused connection gets (None: none, e.g. under TLS).
        on_refuse: told the peer and the reason of each refusal (for the log).
    """

    __slots__ = ("_cap", "_on_refuse", "_refusal")

    def __init__(self, family: int, cap: ConnectionCap,
                 refusal: Callable[[str], bytes] | None,
                 on_refuse: Callable[[str, str], None]) -> None:
        super().__init__(family, socket.SOCK_STREAM)
        self._cap, self._refusal, self._on_refuse = cap, refusal, on_refuse

    def accept(self) -> tuple[socket.socket, object]:
        while True:  # until one is admitted, or none waits (BlockingIOError)
            fd, address = self._accept()  # type: ignore[attr-defined]
            peer = str(address[0]) if isinstance(address, tuple) and address else ""
            conn = _Counted(self.family, self.type, self.proto, fileno=fd)
            reason = self._cap.admit(peer)
            if reason is None:
                conn._release = partial(self._cap.release, peer)
                if socket.getdefaulttimeout() is None and self.gettimeout():
                    conn.setblocking(True)  # as socket.accept does
                return conn, address
            try:
                if self._refusal is not None:
                    conn.setblocking(False)
                    conn.send(self._refusal(reason))  # a few hundred bytes: never blocks
            except OSError:
                pass  # gone already
            finally:
                conn.close()
            self._on_refuse(peer, reason)


def counted_listeners(host: str, port: int, cap: ConnectionCap, *,
                      refusal: Callable[[str], bytes] | None,
                      on_refuse: Callable[[str, str], None],
                      backlog: int = 128) -> list[CountedListener]:
    """:class:`CountedListener` sockets bound to every address ``host`` resolves to (""
    is every address), as asyncio's ``create_server`` binds them, on one port (port 0:
    the one the system gives the first), listening and non-blocking; all count against
    one ``cap``.

    Raises:
        OSError: the address cannot be resolved or bound (nothing is left bound).
    """
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                               flags=socket.AI_PASSIVE)
    socks: list[CountedListener] = []
    try:
        for family, address in dict.fromkeys((i[0], i[4]) for i in infos):
            sock = CountedListener(family, cap, refusal, on_refuse)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            bound = address
            if port == 0 and len(socks) > 1:  # one port for every address
                bound = (address[0], socks[0].getsockname()[1], *address[2:])
            sock.bind(bound)
            sock.listen(backlog)
            sock.setblocking(False)
    except OSError:
        for sock in socks:
            sock.close()
        raise
    return socks
