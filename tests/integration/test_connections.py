"""A connection flood against a real ``python -m daemon serve`` process with a low
descriptor limit (issue 25): many more idle connections than the limit, on loopback
only, to the gRPC port (bare TCP, and HTTP/2 preface and settings with no call) and to
the HTTP listener, from several loopback addresses. Health and Status keep answering, the
per-peer cap and the total cap hold, idle connections are closed after their limit, the
daemon never runs out of descriptors, and its log stays short (rate limited, with a
count of what was suppressed).

Both roles are disabled: this is about the listeners, not the models (no child needed).
The daemon wants tokens, as a remote deployment does: the flood has none, the prober's
Status and the HTTP requests carry one (health needs none).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import selectors
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from llamad_protocol.v1 import control_pb2, control_pb2_grpc
from tests.support.access import READ_TOKEN, token_files
from tests.support.daemon_process import DaemonProcess
from tests.support.load import patience

pytestmark = pytest.mark.timeout(patience(180))

NOFILE = 320
RESERVE = 96
PER_PEER = 16
HANDSHAKE = 3.0
IDLE = 6.0
HTTP_IDLE = 6.0
BATCH = 64
# The HTTP/2 client preface and an empty SETTINGS frame: a connection gRPC takes as
# established (its handshake is over), that then makes no call.
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
# Run as uid 65534 by the system's Python (stdlib only): another local user's flood of
# bare connections to the gRPC port, held until stdin closes; prints how many the daemon
# left open after 1.5 s.
FLOOD = """
import socket, sys, time
port, count = int(sys.argv[1]), int(sys.argv[2])
socks = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(count)]
print("ready", flush=True)
time.sleep(1.5)
held = 0
for s in socks:
    s.setblocking(False)
    try:
        while s.recv(65536):
            pass
    except BlockingIOError:
        held += 1
    except OSError:
        pass
print(held, flush=True)
sys.stdin.read()
"""
# prlimit as a Python prefix: the daemon starts with a low RLIMIT_NOFILE.
LOW_LIMIT = [sys.executable, "-c",
             "import os, resource, sys; "
             f"resource.setrlimit(resource.RLIMIT_NOFILE, ({NOFILE}, {NOFILE})); "
             "os.execv(sys.argv[1], sys.argv[1:])"]


@pytest.fixture
def daemon(tmp_path: Path, processes: Callable[..., DaemonProcess]) -> DaemonProcess:
    (tmp_path / "models").mkdir()
    env = {
        "LLAMAD_LISTEN": "127.0.0.1:0", "LLAMAD_HTTP_LISTEN": "127.0.0.1:0",
        "LLAMAD_STATE_DIR": str(tmp_path / "state"),
        "LLAMAD_MODELS_DIR": str(tmp_path / "models"),
        "LLAMAD_GENERATION_MODE": "disabled", "LLAMAD_EMBEDDING_MODE": "disabled",
        "LLAMAD_LOG_FORMAT": "json", "LLAMAD_DRAIN_GRACE": "1",
        "LLAMAD_CONNECTIONS_RESERVE_FDS": str(RESERVE),
        "LLAMAD_CONNECTIONS_PER_PEER_MAX": str(PER_PEER),
        "LLAMAD_CONNECTIONS_GUARD_INTERVAL": "0.2",
        "LLAMAD_CONNECTIONS_HANDSHAKE_TIMEOUT": str(HANDSHAKE),
        "LLAMAD_CONNECTIONS_IDLE_TIMEOUT": str(IDLE),
        "LLAMAD_HTTP_IDLE_TIMEOUT": str(HTTP_IDLE),
        "LLAMAD_LOG_RATE_LIMIT": "5", "LLAMAD_LOG_RATE_INTERVAL": "2",
        # Tokens, as a remote deployment has them: the flood has none, the prober one.
        "LLAMAD_AUTH_TOKEN_FILE": str(token_files(tmp_path)[0]),
    }
    return processes(tmp_path, env, LOW_LIMIT)


def caps(d: DaemonProcess) -> dict[str, int]:
    listening = d.wait_event("listening")
    return {**listening["connections"], "http_port": listening["http_port"]}


def connect(port: int, sources: Iterable[str], count: int, first: bytes = b"",
            every: int = 1) -> list[socket.socket]:
    """``count`` connections from each address of ``sources`` to loopback ``port``, made
    BATCH at a time (a connect the kernel retries costs its second once a batch, not once
    each), every ``every``-th one sending ``first`` once connected; one the server
    refuses at once is still returned (closed by it)."""
    socks = []
    for source in sources:
        for _ in range(count):
            s = socket.socket()
            s.setblocking(False)
            s.bind((source, 0))
            socks.append(s)
    # In batches below the listen backlog (aiohttp's 128): past it the kernel, not the
    # daemon, holds a connection in its queue until its SYN-ACK is resent (seconds later),
    # and such a connection looks open from here.
    for start in range(0, len(socks), BATCH):
        batch = socks[start:start + BATCH]
        for s in batch:
            assert s.connect_ex(("127.0.0.1", port)) in (0, errno.EINPROGRESS)
        with selectors.DefaultSelector() as sel:
            for s in batch:
                sel.register(s, selectors.EVENT_WRITE)
            pending, deadline = len(batch), time.monotonic() + 15
            while pending:
                assert time.monotonic() < deadline, f"{pending} connects pending"
                for key, _ in sel.select(timeout=1):
                    sel.unregister(key.fileobj)
                    pending -= 1
        time.sleep(0.05)  # the daemon accepts the batch
    for i, s in enumerate(socks):
        assert s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) in (0, errno.ECONNRESET)
        if first and i % every == 0:
            with contextlib.suppress(OSError):  # refused: closed before it could send
                s.send(first)
    return socks


def open_ones(socks: list[socket.socket]) -> list[socket.socket]:
    """The sockets the server has not closed (what it sent is read and dropped)."""
    alive = []
    for s in socks:
        try:
            while s.recv(65536):
                pass
        except BlockingIOError:
            alive.append(s)
        except OSError:
            pass
    return alive


def settle(socks: list[socket.socket], at_most: int, pid: int, fds: int) -> int:
    """Wait until at most ``at_most`` of ``socks`` are open (those past the kernel's
    accept queue are accepted, and refused, only as it drains: until then they look open
    from here); meanwhile the daemon ``pid`` never holds more than ``fds`` descriptors.
    Returns how many are open."""
    deadline = time.monotonic() + 4
    while True:
        assert descriptors(pid) <= fds
        if (held := len(open_ones(socks))) <= at_most:
            return held
        assert time.monotonic() < deadline, f"{held} of {len(socks)} still open"
        time.sleep(0.1)


def wait_closed(socks: list[socket.socket], within: float) -> float:
    """Seconds until the server closed every one of ``socks``; fails past ``within``."""
    began = time.monotonic()
    while open_ones(socks):
        assert time.monotonic() - began < within, f"{len(open_ones(socks))} still open"
        time.sleep(0.1)
    return time.monotonic() - began


def close_all(socks: list[socket.socket]) -> None:
    for s in socks:
        s.close()


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def refusal(port: int, source: str) -> str:
    """The JSON error message a connection from ``source`` is refused with."""
    with connect(port, [source], 1)[0] as s:
        s.settimeout(5)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    head, _, body = answer.decode().partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 503 "), head
    error = json.loads(body)["error"]
    assert error["code"] == "too_many_connections"
    return str(error["message"])


def models(port: int) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/models",
                                     headers={"Authorization": f"Bearer {READ_TOKEN}"})
    with urllib.request.urlopen(request, timeout=5) as r:  # noqa: S310 (http on loopback)
        return int(r.status)


class Prober:
    """Health Check and Status on one channel opened before the flood (a load
    balancer's), every call timed."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address)
        self.health = health_pb2_grpc.HealthStub(self.channel)
        self.control = control_pb2_grpc.ControlServiceStub(self.channel)
        self.slowest = 0.0
        self.status = self.check()

    def check(self) -> int:
        began = time.monotonic()
        status = self.health.Check(health_pb2.HealthCheckRequest(), timeout=5).status
        children = self.control.Status(control_pb2.StatusRequest(), timeout=5,
                                       metadata=[("authorization", f"Bearer {READ_TOKEN}")]
                                       ).children
        assert len(children) == 2
        self.slowest = max(self.slowest, time.monotonic() - began)
        return int(status)

    def during(self, seconds: float) -> None:
        """Check every 0.2 s for ``seconds`` (the channel is never idle meanwhile)."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            assert self.check() == self.status
            time.sleep(0.2)


@pytest.fixture
def prober(daemon: DaemonProcess) -> Iterator[Prober]:
    p = Prober(daemon.address)
    yield p
    p.channel.close()


def test_grpc_flood_is_capped_per_peer_and_in_total_and_health_answers(
        daemon: DaemonProcess, prober: Prober) -> None:
    """Bare TCP and preface-only connections, ~2x the descriptor limit: one address
    keeps at most per_peer_max, the listener at most its cap, the daemon's descriptors
    stay under its limit, health and Status on an open channel answer within 1 s
    throughout, bare connections are closed at the handshake timeout and preface-only
    ones at the idle timeout, and a new channel is served once the flood is gone."""
    c = caps(daemon)
    port = int(daemon.address.rpartition(":")[2])
    assert (c["fd_limit"], c["per_peer"]) == (NOFILE, PER_PEER)
    assert c["grpc"] + c["http"] <= NOFILE - RESERVE
    lines_before = len(daemon.records())

    # One address, four times its cap: its newest connections are closed.
    one_peer = connect(port, ["127.0.0.2"], 4 * PER_PEER)
    prober.during(1.0)
    assert len(open_ones(one_peer)) == PER_PEER
    # Many addresses, each under the per-peer cap, together past twice the descriptor
    # limit: bare TCP and preface-only connections, interleaved.
    began = time.monotonic()
    sources = [f"127.0.0.{i}" for i in range(3, 3 + 48)]
    both = connect(port, sources, 14, PREFACE, every=2)  # interleaved
    preface, bare = both[::2], both[1::2]
    assert len(one_peer) + len(bare) + len(preface) > 2 * NOFILE
    prober.during(1.0)
    assert len(open_ones(one_peer + bare + preface)) <= c["grpc"]
    assert open_ones(preface)
    assert descriptors(daemon.pid) < NOFILE - RESERVE // 2
    # Bare connections never send their settings: closed at the handshake timeout...
    wait_closed(bare + one_peer, HANDSHAKE + 3)
    assert time.monotonic() - began >= HANDSHAKE - 0.5
    # ...while those that did are still open: they are closed at the idle timeout.
    assert open_ones(preface)
    prober.during(0.5)
    wait_closed(preface, IDLE + 4)
    assert time.monotonic() - began >= IDLE - 0.5
    assert prober.slowest < 1.0, prober.slowest
    close_all(one_peer + bare + preface)
    with grpc.insecure_channel(daemon.address) as ch:
        resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(),
                                                     timeout=5, wait_for_ready=True)
        assert resp.status == prober.status
    logged = daemon.records()[lines_before:]
    assert not [r for r in logged if "Too many open files" in json.dumps(r)]
    guard = [r for r in logged if r["event"] == "connections over the per-peer cap closed"]
    # Only the one address over its cap (on this host: address and user), exactly its
    # excess: the others, 14 connections each, are under it.
    assert {r["peer"] for r in guard} == {"127.0.0.2 uid 0"}
    assert sum(r["closed"] for r in guard) == 3 * PER_PEER
    assert len(logged) <= 40, [r["event"] for r in logged]


def test_http_flood_gets_503_past_the_caps_and_idle_connections_close(
        daemon: DaemonProcess, prober: Prober) -> None:
    """HTTP connections that send nothing: one address past per_peer_max gets a 503
    naming the option, the listener past its cap too, a request from another address is
    served meanwhile, admitted idle connections close after http.idle_timeout, gRPC
    health answers throughout, and the refusals' log lines are rate limited with a
    count of the suppressed ones."""
    c = caps(daemon)
    port = int(c["http_port"])
    lines_before = len(daemon.records())
    base = descriptors(daemon.pid)
    one_peer = connect(port, ["127.0.0.2"], 3 * PER_PEER)
    assert settle(one_peer, PER_PEER, daemon.pid, base + PER_PEER + 2) == PER_PEER
    assert "connections.per_peer_max" in refusal(port, "127.0.0.2")
    assert models(port) == 200  # another address is served
    # Many addresses under the per-peer cap, together past the listener's cap.
    began = time.monotonic()
    many = connect(port, [f"127.0.0.{i}" for i in range(3, 3 + 20)], PER_PEER - 1)
    settle(one_peer + many, c["http"], daemon.pid, base + c["http"] + 2)
    assert "connections.http_max" in refusal(port, "127.0.0.30")
    prober.during(0.5)
    # Admitted connections that send nothing are closed at http.idle_timeout.
    wait_closed(one_peer + many, HTTP_IDLE + 3)
    assert time.monotonic() - began >= HTTP_IDLE - 0.5
    assert models(port) == 200
    close_all(one_peer + many)
    time.sleep(2.5)  # the log limiter's window ends: its summary is written
    logged = daemon.records()[lines_before:]
    assert not [r for r in logged if "out of system resource" in r["event"]]
    refusals = [r for r in logged if r["event"] == "http connection refused"]
    assert 1 <= len(refusals) <= 20
    summaries = [r for r in logged if r["event"] == "log lines suppressed"
                 and r["line_event"] == "http connection refused"]
    assert summaries and sum(r["suppressed"] for r in summaries) >= 2 * PER_PEER
    assert len(logged) <= 30, [r["event"] for r in logged]


def test_one_local_users_flood_does_not_take_another_users_connections(
        daemon: DaemonProcess, prober: Prober) -> None:
    """Another local user (uid 65534) opens four times per_peer_max gRPC connections from
    127.0.0.1: the daemon keeps per_peer_max of them, while new channels this test's user
    opens from 127.0.0.1 meanwhile are served (on this host a peer is an address and a
    user, so one user's flood does not fill everyone's cap)."""
    port = daemon.address.rpartition(":")[2]
    lines_before = len(daemon.records())
    flood = subprocess.Popen([*NOBODY, "/usr/bin/python3", "-c", FLOOD, port,
                              str(4 * PER_PEER)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert flood.stdout is not None and flood.stdout.readline() == "ready\n"
        mine = connect(int(port), ["127.0.0.1"], 4)  # newer than all of the flood
        end = time.monotonic() + 1.5
        while time.monotonic() < end:  # a new channel each time: the newest from 127.0.0.1
            with grpc.insecure_channel(daemon.address) as ch:
                resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(),
                                                             timeout=3)
                assert resp.status == prober.status
            time.sleep(0.2)
        assert int(flood.stdout.readline()) == PER_PEER
        assert len(open_ones(mine)) == 4  # over several guard rounds: none was cut
        close_all(mine)
    finally:
        flood.kill()
        flood.communicate()
    guard = [r for r in daemon.records()[lines_before:]
             if r["event"] == "connections over the per-peer cap closed"]
    assert {r["peer"] for r in guard} == {"127.0.0.1 uid 65534"}
    assert sum(r["closed"] for r in guard) == 3 * PER_PEER
