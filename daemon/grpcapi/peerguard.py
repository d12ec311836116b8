"""The gRPC listener's per-peer cap (``connections.per_peer_max``, issue 25).

grpcio's core counts the server's connections in total
(``grpc.max_allowed_incoming_connections``) but not per peer, and a server interceptor sees
calls, never connections (an idle connection makes none). So the guard looks at the
daemon's own sockets instead: every ``connections.guard_interval`` seconds it reads the
kernel's socket tables (``/proc/net/tcp`` and ``tcp6``), counts the connections to the gRPC
port by peer, and for a peer over the cap shuts down its newest connections (the
highest socket inodes: the kernel numbers sockets in the order it makes them), keeping its
oldest ``per_peer_max``: a client's long-lived channel outlives a flood from its address.
A peer is an address, and on this host an address and a user: a local client's own socket
is in the same tables, with its user's uid, so one local user's flood cannot take the
cap of every other user of 127.0.0.1.

A connection is shut down, never closed under gRPC's feet: the guard duplicates the
descriptor, checks that the duplicate is still that socket (same inode: a descriptor
number may have been reused since it was read), and calls ``shutdown(SHUT_RDWR)`` on it;
gRPC then sees the connection end as if the peer had gone, and closes it itself.

Linux only (``/proc``); elsewhere, and on a unix socket, the guard is off and the total
cap and the handshake and idle timeouts bound the connections.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import structlog

_log = structlog.get_logger("llamad.connections")

_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
_LISTEN = "0A"


def _address(hex_ip: str) -> str:
    """A /proc/net/tcp address (host-order 32-bit words in hex) as text; an IPv4-mapped
    IPv6 address as its IPv4 form."""
    raw = bytes.fromhex(hex_ip)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    text = socket.inet_ntop(socket.AF_INET6, words)
    return text.removeprefix("::ffff:") if "." in text else text


def _endpoint(hex_endpoint: str) -> tuple[str, int]:
    """A /proc/net/tcp ``address:port`` as (address text, port)."""
    address, _, port = hex_endpoint.partition(":")
    return _address(address), int(port, 16)


def connections(port: int, tables: tuple[Path, ...] = _TABLES) -> dict[str, list[int]]:
    """The sockets connected to local ``port``: peer -> socket inodes, ascending. A peer
    is its address, and for a client on this host (whose own socket is in the same
    tables) its address and user: ``127.0.0.1 uid 65534``.

    Raises:
        OSError: no table could be read (no /proc, or it is hidden from the daemon).
    """
    suffix = f":{port:04X}"
    rows: list[list[str]] = []
    read = 0
    for table in tables:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue  # tcp6 is absent where IPv6 is off
        read += 1
        rows += [fields for line in lines if len(fields := line.split()) >= 10]
    if not read:
        raise OSError(f"none of {', '.join(map(str, tables))} can be read")
    # A local client's socket is the row whose ends are ours swapped; its uid is the
    # client's user, so local users do not share one cap. (Compared as text: gRPC's
    # listener may be IPv6 with IPv4-mapped addresses, the client's socket IPv4.)
    owners = {(_endpoint(f[1]), _endpoint(f[2])): f[7] for f in rows if f[2].endswith(suffix)}
    peers: dict[str, set[int]] = {}
    for f in rows:
        if not f[1].endswith(suffix) or f[3] == _LISTEN:
            continue
        inode = int(f[9])
        if not inode:  # 0: not accepted yet (or already closed): no descriptor of ours
            continue
        remote = _endpoint(f[2])
        uid = owners.get((remote, _endpoint(f[1])))
        key = remote[0] if uid is None else f"{remote[0]} uid {uid}"
        # A set: a table read while it changes can list a socket twice (the kernel walks
        # it in pieces), and a socket counted twice could push its peer over the cap.
        peers.setdefault(key, set()).add(inode)
    return {peer: sorted(inodes) for peer, inodes in peers.items()}


def _descriptors(inodes: set[int]) -> Iterator[tuple[int, int]]:
    """(fd, inode) of this process's descriptors that are the sockets ``inodes``."""
    for entry in os.scandir("/proc/self/fd"):
        try:
            target = os.readlink(entry.path)
        except OSError:
            continue
        if target.startswith("socket:["):
            inode = int(target[8:-1])
            if inode in inodes:
                yield int(entry.name), inode


def _shut(fd: int, inode: int) -> bool:
    """Shut down socket ``fd`` if it still is socket ``inode``; whether it was."""
    try:
        dup = os.dup(fd)
    except OSError:
        return False  # closed since it was read
    try:
        if os.fstat(dup).st_ino != inode:
            return False  # the number was reused for another file
        with socket.socket(fileno=dup) as sock:
            dup = -1  # the socket object closes it
            sock.shutdown(socket.SHUT_RDWR)
        return True
    except OSError:
        return False
    finally:
        if dup >= 0:
            os.close(dup)


def enforce(port: int, per_peer: int, tables: tuple[Path, ...] = _TABLES
            ) -> dict[str, int]:
    """Shut down the newest connections of each peer of ``port`` past ``per_peer``;
    return peer -> how many were shut down."""
    excess: dict[int, str] = {}
    for peer, inodes in connections(port, tables).items():
        if len(inodes) > per_peer:
            excess.update((inode, peer) for inode in sorted(inodes)[per_peer:])
    closed: dict[str, int] = {}
    if excess:
        for fd, inode in _descriptors(set(excess)):
            if _shut(fd, inode):
                closed[excess[inode]] = closed.get(excess[inode], 0) + 1
    return closed


def descriptors_held() -> int:
    """How many descriptors this process holds (-1: unknown): a look at ``/proc/self/fd``
    that costs microseconds, where reading the socket tables costs milliseconds."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return -1


def worth_a_look(per_peer: int, held: int) -> bool:
    """Whether a peer can be over ``per_peer`` while this process holds ``held``
    descriptors: only with more descriptors than the cap, since every connection the guard
    can shut down is one of them (or when the count is unknown)."""
    return held < 0 or held > per_peer


async def guard_loop(port: int, per_peer: int, interval: float) -> None:
    """Enforce ``per_peer`` on ``port`` every ``interval`` seconds until cancelled (the
    reading is done in a worker thread: under a flood the tables are long). Where the
    socket tables cannot be read, say so once and stop: the total cap still holds.

    The tables are read once at the first look, then only while the process holds more
    descriptors than ``per_peer`` (:func:`worth_a_look`): reading them every second cost
    4 ms of CPU per second on an idle daemon (bench/RESULTS.md, "Relay cost"), as much as
    relaying 50 tokens."""
    first = True
    while True:
        await asyncio.sleep(interval)
        if not first and not worth_a_look(per_peer, descriptors_held()):
            continue
        first = False
        try:
            closed = await asyncio.to_thread(enforce, port, per_peer)
        except OSError as exc:
            _log.warning("per-peer connection cap off for gRPC", error=str(exc),
                         hint="the daemon cannot read its sockets in /proc (ProcSubset=pid?)")
            return
        for peer, count in closed.items():
            _log.warning("connections over the per-peer cap closed", peer=peer,
                         closed=count, per_peer_max=per_peer, listener="grpc")
