"""``[connections]``: how many connections the listeners hold and for how long (issue 25),
a section of :class:`~daemon.config._sections.Settings` declared apart to keep that
module short. What the numbers become at start (the descriptor budget) is
:mod:`daemon.grpcapi.connlimits`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._options import setting


@dataclass(frozen=True)
class ConnectionSettings:
    """``[connections]``: fixed when the listeners start (a reload reports a change as
    needing a restart)."""

    reserve_fds: int = setting(256, minimum=16, help="""
        File descriptors kept free of client connections, out of the process's limit
        (RLIMIT_NOFILE, read at start): for the children's pipes and sockets, the indexes, the
        logs, and health and Status calls while the listeners are full.""")
    grpc_max: int = setting(0, minimum=0, help="""
        Most gRPC connections held at once; past it a new connection is closed as it is
        accepted. 0: the descriptor budget (the limit less reserve_fds, less the metrics and
        agent listeners' caps), halved when http_listen is set; a larger value is lowered to
        it.""")
    http_max: int = setting(0, minimum=0, help="""
        Most HTTP API connections held at once; past it a new connection gets a 503 and is
        closed. 0: the other half of the descriptor budget; a larger value is lowered to it.""")
    metrics_max: int = setting(16, minimum=1, help="""
        Most metrics-listener connections held at once; more are closed unanswered.""")
    per_peer_max: int = setting(128, minimum=0, help="""
        Most connections one peer address holds on the gRPC listener, and on the HTTP listener
        (a proxy in front counts as one peer; on the gRPC listener a client on this host is one
        peer per user); past it the newest are closed (gRPC: within guard_interval) or refused
        (HTTP: 503). 0: no per-peer cap.""")
    guard_interval: float = setting(1.0, minimum=0.1, help="""
        Seconds between looks for gRPC peers over per_peer_max (gRPC's core cannot count per
        peer, so llamad looks at its sockets).""")
    handshake_timeout: float = setting(10.0, minimum=0.1, help="""
        Seconds a new connection has to complete its handshake (TLS and HTTP/2 settings for
        gRPC, TLS for HTTP) before it is closed: connections that send nothing are cut off
        here.""")
    idle_timeout: float = setting(300.0, minimum=0, help="""
        Seconds a gRPC connection may go without a call before it is closed (GOAWAY; a client
        reconnects on its next call). 0: never.""")
    max_age: float = setting(0.0, minimum=0, help="""
        Seconds a gRPC connection may live before the server asks the client to reconnect
        (GOAWAY; spreads clients over nodes behind a load balancer). 0: no limit.""")
    max_age_grace: float = setting(30.0, minimum=0, help="""
        Seconds the calls of a connection past max_age get to finish before it is closed.""")
    keepalive_time: float = setting(600.0, minimum=1, help="""
        Seconds without traffic on a gRPC connection before the server pings the client (a peer
        that is gone is found even while it holds an open stream).""")
    keepalive_timeout: float = setting(20.0, minimum=1, help="""
        Seconds the server waits for a ping's answer before it closes the connection.""")
    max_concurrent_streams: int = setting(256, minimum=1, help="""
        Most calls in flight on one gRPC connection (HTTP/2 streams); a client's further calls
        wait for one to end.""")
