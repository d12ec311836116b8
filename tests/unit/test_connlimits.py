"""The descriptor budget the listeners share, gRPC's channel arguments from
``[connections]``, the HTTP listener's connection count, and the per-peer guard's reading
of the kernel's socket tables (daemon.grpcapi.connlimits, daemon.grpcapi.peerguard)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
from pathlib import Path

import pytest

from daemon.config import ConnectionSettings
from daemon.grpcapi import peerguard
from daemon.grpcapi.connlimits import (
    MIN_LISTENER,
    ConnectionCap,
    budget,
    counted_listeners,
    grpc_options,
)
from daemon.grpcapi.peerguard import connections, descriptors_held, enforce, worth_a_look
from tests.support.load import patience

S = ConnectionSettings()


def test_budget_splits_the_descriptors_below_the_limit() -> None:
    """The listeners' caps add up to the limit less the reserve: gRPC takes it all, or
    half when HTTP listens; metrics and agent caps come off first."""
    b = budget(S, http=False, metrics=False, nofile=20000)
    assert (b.grpc, b.http, b.metrics) == (20000 - 256, 0, 0)
    b = budget(S, http=True, metrics=True, agent=16, nofile=20000)
    room = 20000 - 256 - 16 - 16
    assert (b.grpc, b.http, b.metrics) == (room // 2, room - room // 2, 16)
    assert b.grpc + b.http + b.metrics + 16 + 256 == 20000
    assert b.per_peer == 128


def test_configured_caps_are_lowered_to_the_budget() -> None:
    """A cap larger than its share is lowered to it; a smaller one is kept."""
    s = dataclasses.replace(S, grpc_max=50_000, http_max=10)
    b = budget(s, http=True, metrics=False, nofile=4096)
    assert b.grpc == (4096 - 256) // 2 and b.http == 10


def test_a_tiny_limit_still_gives_each_listener_a_few_connections() -> None:
    b = budget(S, http=True, metrics=False, nofile=100)
    assert b.grpc >= MIN_LISTENER and b.http >= MIN_LISTENER


def test_grpc_options_carry_every_limit() -> None:
    """Each limit becomes the channel argument grpcio's core reads, in milliseconds;
    max_age is off (no argument) at 0, and so is the idle limit."""
    b = budget(S, http=False, metrics=False, nofile=1024)
    opts = dict(grpc_options(S, b))
    assert opts == {"grpc.max_allowed_incoming_connections": 1024 - 256,
                    "grpc.server_handshake_timeout_ms": 10_000,
                    "grpc.keepalive_time_ms": 600_000, "grpc.keepalive_timeout_ms": 20_000,
                    "grpc.max_concurrent_streams": 256,
                    "grpc.max_connection_idle_ms": 300_000}
    s = dataclasses.replace(S, idle_timeout=0, max_age=3600, max_age_grace=5)
    opts = dict(grpc_options(s, b))
    assert "grpc.max_connection_idle_ms" not in opts
    assert opts["grpc.max_connection_age_ms"] == 3_600_000
    assert opts["grpc.max_connection_age_grace_ms"] == 5_000


def test_connection_cap_counts_per_peer_and_in_total() -> None:
    """Past the per-peer cap one address is refused while others are admitted; past the
    total everyone is; a release makes room again."""
    cap = ConnectionCap(total=5, per_peer=2)
    assert cap.admit("10.0.0.1") is None and cap.admit("10.0.0.1") is None
    assert cap.admit("10.0.0.1") == \
        "this address holds its most connections (2, connections.per_peer_max)"
    assert cap.admit("10.0.0.2") is None and cap.admit("10.0.0.3") is None
    assert cap.admit("10.0.0.4") is None
    assert "most connections (5, connections.http_max)" in (cap.admit("10.0.0.5") or "")
    cap.release("10.0.0.1")
    assert cap.admit("10.0.0.1") is None
    assert cap.open == 5


def _table(tmp: Path, rows: list[tuple[str, str, str, int]],
           uids: dict[int, int] | None = None) -> Path:
    """A /proc/net/tcp with ``rows`` (local, remote, state, inode); ``uids``: the owner of
    the row at an index (default 0)."""
    head = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt" \
           "   uid  timeout inode\n"
    uids = uids or {}
    lines = [f"{i:4}: {local} {remote} {state} 00000000:00000000 00:00000000 00000000"
             f"  {uids.get(i, 0):4}        0 {inode} 1 0000000000000000 20 4 30 10 -1"
             for i, (local, remote, state, inode) in enumerate(rows)]
    path = tmp / "tcp"
    path.write_text(head + "\n".join(lines) + "\n")
    return path


def test_socket_table_is_read_by_peer(tmp_path: Path) -> None:
    """Connections to the port are grouped by the peer's address (IPv4, and IPv6 with a
    mapped IPv4 address taken as IPv4); the listening socket, other ports and sockets
    without an inode are left out."""
    v4 = _table(tmp_path, [
        ("0100007F:C383", "00000000:0000", "0A", 10),  # the listener
        ("0100007F:C383", "0200007F:9C40", "01", 11),  # 127.0.0.2
        ("0100007F:C383", "0200007F:9C41", "01", 12),
        ("0100007F:C383", "0300007F:9C42", "08", 13),  # 127.0.0.3, close-wait
        ("0100007F:1F90", "0200007F:9C43", "01", 14),  # another port
        ("0100007F:C383", "0200007F:9C44", "01", 0),  # not accepted yet
        ("0100007F:C383", "0200007F:9C41", "01", 12),  # listed twice (read as it changed)
    ])
    mapped = "0000000000000000FFFF00000A00000A"  # ::ffff:10.0.0.10
    v6 = tmp_path / "tcp6"
    v6.write_text("header\n   0: 00000000000000000000000001000000:C383 "
                  f"{mapped}:D431 01 0:0 0:0 0 0 0 15 1\n")
    assert connections(0xC383, (v4, v6)) == {"127.0.0.2": [11, 12], "127.0.0.3": [13],
                                             "10.0.0.10": [15]}


def test_a_local_client_is_a_peer_per_user(tmp_path: Path) -> None:
    """A client on this host, whose own socket is in the table too, is its address and its
    user: two users of one address have a cap each."""
    table = _table(tmp_path, [
        ("0100007F:C383", "0100007F:9C40", "01", 21),  # daemon side of user 65534's
        ("0100007F:9C40", "0100007F:C383", "01", 0),  # user 65534's own socket
        ("0100007F:C383", "0100007F:9C41", "01", 22),  # daemon side of user 1000's
        ("0100007F:9C41", "0100007F:C383", "01", 0),
        ("0100007F:C383", "0500007F:9C42", "01", 23),  # a client whose socket is not here
    ], uids={1: 65534, 3: 1000})
    assert connections(0xC383, (table,)) == {"127.0.0.1 uid 65534": [21],
                                             "127.0.0.1 uid 1000": [22], "127.0.0.5": [23]}
    # gRPC's listener in IPv6 with IPv4-mapped addresses (tcp6), its client in IPv4 (tcp).
    mapped = "0000000000000000FFFF00000100007F"  # ::ffff:127.0.0.1
    v6 = tmp_path / "tcp6"
    v6.write_text(f"header\n   0: {mapped}:C383 {mapped}:9C40 01 0:0 0:0 0 0 0 31 1\n")
    v4 = _table(tmp_path, [("0100007F:9C40", "0100007F:C383", "01", 0)], uids={0: 65534})
    assert connections(0xC383, (v4, v6)) == {"127.0.0.1 uid 65534": [31]}


def test_no_readable_table_is_an_error(tmp_path: Path) -> None:
    """Without any socket table to read the guard cannot work: it is told, not fooled
    into seeing no connections (a missing tcp6 alone is fine)."""
    with pytest.raises(OSError, match="can be read"):
        connections(1, (tmp_path / "tcp", tmp_path / "tcp6"))
    (tmp_path / "tcp").write_text("header\n")
    assert connections(1, (tmp_path / "tcp", tmp_path / "tcp6")) == {}


def test_enforce_shuts_down_only_this_processes_sockets_of_the_table(tmp_path: Path
                                                                     ) -> None:
    """A peer over the cap in the table whose sockets are not this process's: nothing is
    touched (the guard maps inodes to its own descriptors before it acts), and a real
    socket of this process named in the table is shut down."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server_side, _ = listener.accept()
    try:
        port = listener.getsockname()[1]
        local = f"0100007F:{port:04X}"
        inode = os.fstat(server_side.fileno()).st_ino
        foreign = _table(tmp_path, [(local, "0200007F:9C40", "01", 1),
                                    (local, "0200007F:9C41", "01", 2),
                                    (local, "0200007F:9C42", "01", 3)])
        assert enforce(port, 2, (foreign,)) == {}  # inode 3 is no socket of ours
        table = _table(tmp_path, [(local, "0200007F:9C40", "01", 1),
                                  (local, "0200007F:9C41", "01", 2),
                                  (local, "0200007F:9C42", "01", inode)])
        assert enforce(port, 2, (table,)) == {"127.0.0.2": 1}
        client.settimeout(2)
        assert client.recv(1) == b""  # the peer sees the connection end
    finally:
        for s in (client, server_side, listener):
            s.close()


def test_counted_listener_refuses_past_the_cap_at_accept() -> None:
    """Past the cap, accept answers the refusal itself and closes the connection, then
    hands over the next admitted one; a closed admitted connection gives its place
    back."""
    cap = ConnectionCap(total=1, per_peer=0)
    refused: list[tuple[str, str]] = []
    [listener] = counted_listeners("127.0.0.1", 0, cap, refusal=lambda why: b"no: " + why.encode(),
                                   on_refuse=lambda peer, why: refused.append((peer, why)))
    port = listener.getsockname()[1]
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
    try:
        listener.settimeout(2)
        first, _ = listener.accept()
        assert cap.open == 1
        clients[1].settimeout(2)
        with pytest.raises(TimeoutError):  # the second is refused, and none is left
            listener.accept()
        assert clients[1].recv(200).startswith(b"no: the listener holds its most")
        assert [(peer, "most connections (1" in why) for peer, why in refused] == [
            ("127.0.0.1", True)]
        first.close()
        assert cap.open == 0
    finally:
        for s in (*clients, listener):
            s.close()


def test_counted_listeners_bind_every_address_on_one_port() -> None:
    """An empty host binds every address (IPv4 and IPv6 where there is IPv6), all on the
    port the first got; they share one cap."""
    cap = ConnectionCap(total=4, per_peer=0)
    socks = counted_listeners("", 0, cap, refusal=None, on_refuse=lambda peer, why: None)
    try:
        expected = {info[0] for info in socket.getaddrinfo(
            None, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)}
        assert {s.family for s in socks} == expected
        assert len({s.getsockname()[1] for s in socks}) == 1
    finally:
        for s in socks:
            s.close()


def test_the_guard_looks_at_the_tables_only_past_the_cap_in_descriptors() -> None:
    """A process holding no more descriptors than the cap cannot have a peer over it (each
    connection the guard can shut down is one of them): no table is read then; an
    unknown count is looked at."""
    assert not worth_a_look(128, 40)
    assert not worth_a_look(128, 128)
    assert worth_a_look(128, 129)
    assert worth_a_look(128, -1)
    held = descriptors_held()
    with socket.socket() as extra:
        assert descriptors_held() == held + 1 and extra.fileno() >= 0


async def test_guard_loop_reads_the_tables_first_then_only_when_worth_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The first look reads the tables (so an unreadable /proc is said at start); later
    looks read them only while the descriptors held exceed the cap."""
    reads: list[int] = []
    looks: list[int] = []
    held = [10]
    quiet_looks, read_again = asyncio.Event(), asyncio.Event()

    def count() -> int:
        looks.append(held[0])
        if len(looks) >= 5:
            quiet_looks.set()
        return held[0]

    def enforce(port: int, per_peer: int) -> dict[str, int]:
        reads.append(port)
        if len(reads) >= 3:
            read_again.set()
        return {}

    monkeypatch.setattr(peerguard, "enforce", enforce)
    monkeypatch.setattr(peerguard, "descriptors_held", count)
    task = asyncio.create_task(peerguard.guard_loop(7, 128, 0.01))
    try:
        async with asyncio.timeout(patience(30)):
            await quiet_looks.wait()
        assert reads == [7]  # the first look only
        held[0] = 200
        async with asyncio.timeout(patience(30)):
            await read_again.wait()
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
