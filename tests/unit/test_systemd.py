"""sd_notify: what :class:`Notifier` sends, read back from a real unix datagram socket
(filesystem path and abstract namespace), and the watchdog loop's pings, timed by the
kernel's send timestamps."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import socket
import struct
import time
import uuid
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from daemon.config.inference_mode import InferenceMode
from daemon.ops.systemd import STATUS_MAX_BYTES, Notifier, status_line, watchdog_loop
from supervisor import State
from tests.support.load import patience
from tests.support.scripted import settle
from tests.support.scripted_pool import Rig, until

# SO_TIMESTAMP (asm-generic value; the socket module does not export it): the kernel stamps
# each datagram with CLOCK_REALTIME when it is sent, which time.time() reads too.
SO_TIMESTAMP = getattr(socket, "SO_TIMESTAMP", 29)
TIMEVAL = struct.Struct("@ll")


@dataclass(frozen=True)
class Datagram:
    lines: list[str]
    sent_at: float

    @property
    def fields(self) -> dict[str, str]:
        return dict(line.split("=", 1) for line in self.lines)


class Receiver:
    """Plays systemd's end: a bound ``AF_UNIX``/``SOCK_DGRAM`` socket."""

    def __init__(self, notify_socket: str, bind_to: str) -> None:
        self.notify_socket = notify_socket
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(bind_to)
        self.sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMP, 1)
        self.sock.setblocking(False)
        self.received: list[Datagram] = []

    def drain(self) -> list[Datagram]:
        """Read every queued datagram; return the new ones."""
        new: list[Datagram] = []
        while True:
            try:
                data, ancillary, _, _ = self.sock.recvmsg(8192, socket.CMSG_SPACE(TIMEVAL.size))
            except BlockingIOError:
                break
            stamp = next(TIMEVAL.unpack(d[: TIMEVAL.size]) for lvl, kind, d in ancillary
                         if lvl == socket.SOL_SOCKET and kind == SO_TIMESTAMP)
            new.append(Datagram(data.decode().split("\n"), stamp[0] + stamp[1] / 1e6))
        self.received.extend(new)
        return new

    async def wait_for(self, count: int, timeout: float = patience(5.0)) -> list[Datagram]:
        """Wait until ``count`` datagrams in all have arrived."""
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(timeout):
            while True:
                self.drain()
                if len(self.received) >= count:
                    return self.received
                readable: asyncio.Future[None] = loop.create_future()
                loop.add_reader(self.sock.fileno(), _resolve, readable)
                try:
                    await readable
                finally:
                    loop.remove_reader(self.sock.fileno())

    def close(self) -> None:
        self.sock.close()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _receiver(kind: str, tmp_path: Path) -> Receiver:
    if kind == "path":
        path = tmp_path / "notify.sock"
        assert len(os.fsencode(path)) < 108, f"{path} is too long for a unix socket"
        return Receiver(str(path), str(path))
    name = f"llamad-test-{uuid.uuid4().hex}"
    return Receiver("@" + name, "\0" + name)


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[Receiver]:
    rx = _receiver("path", tmp_path)
    yield rx
    rx.close()


@pytest.fixture(params=["path", "abstract"])
def any_receiver(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Receiver]:
    rx = _receiver(request.param, tmp_path)
    yield rx
    rx.close()


@pytest.fixture
def notifiers() -> Iterator[Callable[[MutableMapping[str, str]], Notifier]]:
    """Build notifiers from an environment mapping; close them all afterwards."""
    made: list[Notifier] = []

    def make(env: MutableMapping[str, str]) -> Notifier:
        made.append(Notifier.from_env(env))
        return made[-1]

    yield make
    for notifier in made:
        notifier.close()


Make = Callable[[MutableMapping[str, str]], Notifier]


# --- messages --------------------------------------------------------------------------


def test_each_message_arrives_as_one_datagram(any_receiver: Receiver, notifiers: Make) -> None:
    """READY (with MAINPID), STATUS, RELOADING, WATCHDOG and STOPPING reach a path or an
    abstract-namespace socket, one datagram each, in order."""
    notifier = notifiers({"NOTIFY_SOCKET": any_receiver.notify_socket})
    assert notifier.enabled
    assert notifier.ready()
    assert notifier.status("generation: running (pid 123), embedding: starting")
    assert notifier.reloading()
    assert notifier.watchdog()
    assert notifier.stopping()
    got = [d.fields for d in any_receiver.drain()]
    assert got[0] == {"READY": "1", "MAINPID": str(os.getpid())}
    assert got[1] == {"STATUS": "generation: running (pid 123), embedding: starting"}
    assert got[2].keys() == {"RELOADING", "MONOTONIC_USEC"} and got[2]["RELOADING"] == "1"
    assert abs(int(got[2]["MONOTONIC_USEC"]) - time.monotonic_ns() // 1000) < patience(5) * 1e6
    assert got[3:] == [{"WATCHDOG": "1"}, {"STOPPING": "1"}]


def test_status_is_one_line_and_cannot_smuggle_assignments(
    receiver: Receiver, notifiers: Make
) -> None:
    """Newlines and other control characters in a status become spaces, so a status can
    never add an assignment such as READY=1."""
    notifier = notifiers({"NOTIFY_SOCKET": receiver.notify_socket})
    notifier.status("generation: failed\nREADY=1\r\n\tembedding:\x00running\n")
    [datagram] = receiver.drain()
    assert datagram.lines == ["STATUS=generation: failed READY=1 embedding: running"]


def test_status_is_capped_on_a_character_boundary(receiver: Receiver, notifiers: Make) -> None:
    """A long status is cut to STATUS_MAX_BYTES of valid UTF-8, marked with '...'."""
    notifier = notifiers({"NOTIFY_SOCKET": receiver.notify_socket})
    notifier.status("é" * STATUS_MAX_BYTES)
    [datagram] = receiver.drain()
    value = datagram.fields["STATUS"]
    assert value.endswith("...") and set(value[:-3]) == {"é"}
    assert STATUS_MAX_BYTES - 4 <= len(value.encode()) <= STATUS_MAX_BYTES


@pytest.mark.parametrize("bad", ["A=1\nB=2", "READY=1\0", "NOEQUALS"])
def test_notify_refuses_anything_but_single_assignments(
    receiver: Receiver, notifiers: Make, bad: str
) -> None:
    """A raw assignment with a newline, a NUL or no '=' is a programming error."""
    notifier = notifiers({"NOTIFY_SOCKET": receiver.notify_socket})
    with pytest.raises(ValueError, match="KEY=VALUE"):
        notifier.notify(bad)
    assert receiver.drain() == []


# --- disabled, environment -------------------------------------------------------------


def test_without_notify_socket_everything_is_a_no_op(
    monkeypatch: pytest.MonkeyPatch, notifiers: Make
) -> None:
    """Not run by systemd: nothing is sent, no socket is opened, no watchdog."""
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    for notifier in (Notifier.from_env(), notifiers({"NOTIFY_SOCKET": ""})):
        assert not notifier.enabled
        results = [notifier.ready(), notifier.status("x"), notifier.stopping(),
                   notifier.watchdog(), notifier.reloading()]
        assert results == [False] * 5
        assert notifier.watchdog_interval() is None
        assert notifier._sock is None
        assert notifier.failures == 0


@pytest.mark.parametrize("address", ["vsock:2:1234", "relative/notify.sock", "@"])
def test_unsupported_address_disables_with_a_warning(notifiers: Make, address: str) -> None:
    """An address that is neither an absolute path nor @name is logged and ignored."""
    with capture_logs() as logs:
        notifier = notifiers({"NOTIFY_SOCKET": address})
        assert not notifier.ready()
    assert not notifier.enabled
    assert [e["log_level"] for e in logs] == ["warning"]
    assert logs[0]["notify_socket"] == address


@pytest.mark.parametrize(
    ("usec", "pid", "expected"),
    [
        ("30000000", None, 15.0),
        ("30000000", "self", 15.0),
        ("1000000", "self", 0.5),
        ("30000000", "other", None),
        ("30000000", "junk", None),
        (None, "self", None),
        ("0", "self", None),
        ("-5", "self", None),
        ("soon", "self", None),
    ],
)
def test_watchdog_interval_is_half_of_watchdog_usec_for_this_process(
    receiver: Receiver, notifiers: Make, usec: str | None, pid: str | None,
    expected: float | None
) -> None:
    """Half of WATCHDOG_USEC in seconds; None when unset or invalid, or when WATCHDOG_PID
    names another process."""
    env = {"NOTIFY_SOCKET": receiver.notify_socket}
    if usec is not None:
        env["WATCHDOG_USEC"] = usec
    if pid is not None:
        env["WATCHDOG_PID"] = {"self": str(os.getpid()), "other": str(os.getpid() + 1)}.get(
            pid, pid)
    assert notifiers(env).watchdog_interval() == expected


def test_from_env_unset_removes_the_variables(receiver: Receiver) -> None:
    """unset=True keeps children from inheriting the protocol's variables; default keeps
    them."""
    env = {"NOTIFY_SOCKET": receiver.notify_socket, "WATCHDOG_USEC": "2000000",
           "WATCHDOG_PID": str(os.getpid()), "PATH": "/bin"}
    kept = Notifier.from_env(dict(env))
    removed_from = dict(env)
    notifier = Notifier.from_env(removed_from, unset=True)
    try:
        assert removed_from == {"PATH": "/bin"}
        assert notifier.watchdog_interval() == kept.watchdog_interval() == 1.0
        assert notifier.ready()
    finally:
        notifier.close()
        kept.close()


# --- failures never reach the daemon ---------------------------------------------------


def test_vanished_socket_does_not_raise_and_warns_once(tmp_path: Path, notifiers: Make) -> None:
    """With the socket gone every send returns False, one warning is logged, and when the
    socket comes back (systemd re-executed) the same notifier reaches it again."""
    rx = _receiver("path", tmp_path)
    notifier = notifiers({"NOTIFY_SOCKET": rx.notify_socket})
    assert notifier.ready()
    rx.close()
    Path(rx.notify_socket).unlink()
    with capture_logs() as logs:
        results = [notifier.status("x"), notifier.watchdog(), notifier.stopping()]
    assert results == [False, False, False]
    assert notifier.failures == 3
    assert [e["log_level"] for e in logs] == ["warning", "debug", "debug"]
    assert logs[0]["assignment"] == "STATUS"
    back = _receiver("path", tmp_path)
    try:
        assert notifier.watchdog()
        assert [d.fields for d in back.drain()] == [{"WATCHDOG": "1"}]
    finally:
        back.close()


def test_a_full_queue_drops_messages_without_blocking(receiver: Receiver, notifiers: Make) -> None:
    """When systemd does not read, sends fail at once (EAGAIN) instead of blocking: 5000
    sends into the full queue end (a blocking send would wait for ever; the bound is a
    quiet machine's 2 s stretched for a busy one)."""
    notifier = notifiers({"NOTIFY_SOCKET": receiver.notify_socket})
    start = time.monotonic()
    results = [notifier.watchdog() for _ in range(5000)]
    assert time.monotonic() - start < patience(2.0)
    assert results[0] and not all(results)
    assert notifier.failures == results.count(False)
    assert receiver.drain()  # what was queued is intact


def test_one_socket_is_reused(receiver: Receiver, notifiers: Make) -> None:
    """All messages go through the same socket, opened on first use."""
    notifier = notifiers({"NOTIFY_SOCKET": receiver.notify_socket})
    assert notifier._sock is None
    notifier.ready()
    sock = notifier._sock
    notifier.status("a")
    notifier.watchdog()
    assert notifier._sock is sock
    notifier.close()
    notifier.close()
    assert notifier.watchdog() and notifier._sock is not sock


# --- the watchdog loop -----------------------------------------------------------------


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert task.cancelled()


async def test_watchdog_loop_pings_at_the_interval(receiver: Receiver, notifiers: Make) -> None:
    """WATCHDOG=1 goes out at once, then every interval, until the task is cancelled."""
    notifier = notifiers({"NOTIFY_SOCKET": receiver.notify_socket})
    task = asyncio.create_task(watchdog_loop(notifier, 0.05))
    try:
        pings = await receiver.wait_for(5, timeout=patience(3.0))
    finally:
        await _cancel(task)
    assert {tuple(p.lines) for p in pings} == {("WATCHDOG=1",)}
    gaps = [b.sent_at - a.sent_at for a, b in itertools.pairwise(pings)]
    assert min(gaps) >= 0.04
    receiver.drain()
    await asyncio.sleep(0.15)
    assert receiver.drain() == []  # cancelled: no more pings


async def test_watchdog_pings_stop_while_the_loop_is_blocked(
    receiver: Receiver, notifiers: Make
) -> None:
    """A coroutine blocking the loop for 0.3 s (six intervals) stops the pings for exactly
    that window -- what lets systemd's watchdog notice a wedged daemon -- and the late
    wake-up is logged."""
    notifier = notifiers({"NOTIFY_SOCKET": receiver.notify_socket})

    async def wedge() -> tuple[float, float]:
        start = time.time()
        time.sleep(0.3)  # noqa: ASYNC251 -- blocking the event loop is the point
        return start, time.time()

    with capture_logs() as logs:
        task = asyncio.create_task(watchdog_loop(notifier, 0.05))
        try:
            before = len(await receiver.wait_for(2))
            blocked_from, blocked_until = await asyncio.create_task(wedge())
            pings = await receiver.wait_for(before + 2)
        finally:
            await _cancel(task)
    stamps = [p.sent_at for p in pings]
    assert [s for s in stamps if blocked_from < s < blocked_until] == []
    assert any(s <= blocked_from for s in stamps) and any(s >= blocked_until for s in stamps)
    stalls = [e for e in logs if e["event"].startswith("event loop stalled")]
    # The wedge's stall, not the first one logged: on a busy machine the loop can also
    # wake up a little late (over half an interval, which is logged too) before the wedge.
    wedged = [e for e in stalls if e["late_s"] >= 0.2]
    assert wedged and wedged[0]["log_level"] == "warning"
    assert all(e["log_level"] == "warning" for e in stalls)


async def test_watchdog_loop_returns_at_once_when_disabled(notifiers: Make) -> None:
    """Without NOTIFY_SOCKET the loop has nothing to do and ends."""
    async with asyncio.timeout(patience(1)):
        await watchdog_loop(notifiers({}), 0.05)


@pytest.mark.parametrize("interval", [0.0, -1.0, float("nan"), float("inf")])
async def test_watchdog_loop_refuses_a_bad_interval(
    receiver: Receiver, notifiers: Make, interval: float
) -> None:
    """The interval must be a positive finite number of seconds."""
    notifier = notifiers({"NOTIFY_SOCKET": receiver.notify_socket})
    with pytest.raises(ValueError, match="positive"):
        await watchdog_loop(notifier, interval)
    assert receiver.drain() == []


async def test_status_line_names_every_model_of_the_registry(tmp_path: Path) -> None:
    """The status line shows a model loaded on demand (its name, state and pid) beside
    the roles' models, and a model being unloaded while it still serves calls as
    draining (issue 26: the line read only the roles' models)."""
    rig = Rig(tmp_path)
    rig.default.start()
    await settle(rig.default.supervisor, State.RUNNING)
    pid_a = rig.default.serving_pid
    assert status_line(rig.pool.every_model(), draining=False) == (
        f"generation: running (pid {pid_a})")
    gen_b = await rig.pool.load("gen-b")
    pid_b = gen_b.serving_pid
    assert pid_b not in (0, pid_a)
    assert status_line(rig.pool.every_model(), draining=True) == (
        f"draining, generation: running (pid {pid_a}), gen-b: running (pid {pid_b})")
    async with gen_b.admission.slot():  # a call the unload lets finish
        unloading = asyncio.create_task(rig.pool.unload("gen-b"))
        await until(lambda: gen_b.mode.kind is InferenceMode.DISABLED)
        assert status_line(rig.pool.every_model(), draining=False) == (
            f"generation: running (pid {pid_a}), gen-b: draining")
    while not unloading.done():  # the drain looks again every few (manual) moments
        await rig.clock.advance(0.05)
        await asyncio.sleep(0)
    await unloading
    assert status_line(rig.pool.every_model(), draining=False) == (
        f"generation: running (pid {pid_a})")


async def test_the_registry_tells_its_listeners_of_an_on_demand_models_changes(
        tmp_path: Path) -> None:
    """What the daemon re-sends its status line on: the pool's listeners hear a model
    loaded on demand start, serve and stop."""
    rig = Rig(tmp_path)
    heard: list[str] = []
    rig.pool.subscribe(lambda: heard.append(
        status_line(rig.pool.every_model(), draining=False)))
    gen_b = await rig.pool.load("gen-b")
    assert f"gen-b: running (pid {gen_b.serving_pid})" in heard[-1]
    await rig.pool.unload("gen-b")
    assert "gen-b" not in heard[-1]
