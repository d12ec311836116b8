"""The fault matrix (docs/faults.md): each fault, and what operators and clients see of it.

Real daemons (in-process on port 0, or ``python -m daemon serve`` processes that get real
signals), real gRPC clients, real llama-server children on real GGUF models. The fake child
stands in only for faults a real child cannot be made to show on demand (crash at start,
never healthy, ignoring SIGTERM, flooding stdout). Faults already proven elsewhere are
listed in docs/faults.md with their tests; this file holds the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import grpc
import httpx
import pytest

from daemon import Daemon
from llamad_protocol.v1 import common_pb2, control_pb2, control_pb2_grpc, retrieval_pb2_grpc
from llamad_protocol.v1 import inference_pb2 as pb
from llamad_protocol.v1 import retrieval_pb2 as rpb
from supervisor.testing import fake_child_command
from supervisor.testing.fake_runtime import FakeRuntime
from tests.conftest import DEFAULT_MODEL, ROOT, SMALL_MODEL, model_path
from tests.support.daemon import GEN, NOT_SERVING, SERVING, Clients, config_env, make_daemon
from tests.support.procs import alive, descendants, gone

pytestmark = pytest.mark.integration

S = TypeVar("S")

RUNNING = control_pb2.CHILD_STATE_RUNNING
FAILED = control_pb2.CHILD_STATE_FAILED
OPEN = control_pb2.BREAKER_STATE_OPEN
CLOSED = control_pb2.BREAKER_STATE_CLOSED
# Greedy counting: SmolLM2 keeps going for hundreds of tokens.
LONG = pb.GenerateRequest(prompt="1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
                          sampling=pb.SamplingParams(max_tokens=1500, temperature=0.0))


# -- helpers ----------------------------------------------------------------------------


def fake_children() -> list[int]:
    """This process's fake children (an in-process daemon's children are ours)."""
    found = []
    for pid in descendants(os.getpid()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if b"fake_child.py" in fh.read():
                    found.append(pid)
        except OSError:
            continue
    return found


async def wait_child(c: Clients, role: int, predicate: Callable[[control_pb2.ChildStatus], bool],
                     timeout: float, what: str) -> control_pb2.ChildStatus:
    deadline = time.monotonic() + timeout
    while True:
        child = await c.child(role)
        if predicate(child):
            return child
        if time.monotonic() > deadline:
            raise AssertionError(f"never {what} within {timeout}s: {child}")
        await asyncio.sleep(0.05)


async def generate_error(c: Clients, **sampling: Any) -> grpc.aio.AioRpcError:
    """Run a Generate that must fail; return its error."""
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in c.inference.Generate(pb.GenerateRequest(
                prompt="Hi", sampling=pb.SamplingParams(**sampling)), timeout=30):
            pass
    return err.value


async def refused_at_once(c: Clients, gen: control_pb2.ChildStatus) -> grpc.aio.AioRpcError:
    """A failed child ``gen`` has no pid and its last error is its last exit's message;
    a Generate then fails UNAVAILABLE at once (within 2 s): return its error."""
    assert gen.last_error == gen.last_exit.message
    assert gen.pid == 0
    t0 = time.monotonic()
    err = await generate_error(c)
    assert time.monotonic() - t0 < 2.0
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    return err


async def reset_serves_again(c: Clients, timeout: float) -> None:
    """After Reset the generation child serves again, running with its breaker closed."""
    await c.control.Reset(control_pb2.ResetRequest(role=GEN))
    await c.wait_serving("generation", timeout=timeout)
    gen = await c.child(GEN)
    assert (gen.state, gen.breaker) == (RUNNING, CLOSED)


def retry_after_ms(err: grpc.aio.AioRpcError) -> int | None:
    trailers = dict(err.trailing_metadata() or ())
    value = trailers.get("retry-after-ms")
    return None if value is None else int(value)


@pytest.fixture
async def in_process() -> AsyncIterator[Callable[..., Daemon]]:
    """Builds in-process daemons (not started); shuts every one down at the end."""
    made: list[Daemon] = []

    def make(env: dict[str, str]) -> Daemon:
        made.append(make_daemon(env))
        return made[-1]

    yield make
    for daemon in made:
        await daemon.shutdown()


class DaemonProcess:
    """``python -m daemon serve`` as operators run it, logging JSON to a file."""

    def __init__(self, tmp: Path, env: dict[str, str], prefix: Sequence[str] = ()) -> None:
        self.log = tmp / f"daemon-{time.monotonic_ns()}.log"
        with open(self.log, "wb") as out:  # a file: nobody has to keep draining a pipe
            self.proc = subprocess.Popen(
                [*prefix, sys.executable, "-m", "daemon", "serve"], cwd=ROOT,
                env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=out)
        self.pid = self.proc.pid
        try:
            self.address = str(self.wait_event("listening", timeout=120)["address"])
        except BaseException:
            self.kill()
            raise

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def records(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
        return out

    def wait_event(self, event: str, timeout: float = 60.0, **fields: object) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            for record in self.records():
                if record.get("event") == event and all(
                        record.get(k) == v for k, v in fields.items()):
                    return record
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited {self.proc.returncode} before {event!r}:\n"
                                     f"{self.tail()}")
            if time.monotonic() > deadline:
                self.proc.send_signal(signal.SIGUSR1)  # every thread's stack, in the log
                time.sleep(1)
                raise AssertionError(f"no {event!r} {fields} within {timeout}s:\n{self.tail()}")
            time.sleep(0.05)

    def tail(self, chars: int = 6000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    @contextlib.contextmanager
    def stub(self, stub_class: Callable[[grpc.Channel], S]) -> Iterator[S]:
        """A blocking ``stub_class`` stub on a channel of its own to the daemon (so each
        thread of a test can have one), closed on the way out."""
        with grpc.insecure_channel(self.address) as ch:
            yield stub_class(ch)

    def status(self, role: int = GEN) -> control_pb2.ChildStatus:
        with self.stub(control_pb2_grpc.ControlServiceStub) as stub:
            resp = stub.Status(control_pb2.StatusRequest(), timeout=10)
        found: control_pb2.ChildStatus = next(c for c in resp.children if c.role == role)
        return found

    def wait_running(self, role: int = GEN, timeout: float = 120.0) -> control_pb2.ChildStatus:
        deadline = time.monotonic() + timeout
        while (child := self.status(role)).state != RUNNING:
            assert time.monotonic() < deadline, f"child never running: {child}\n{self.tail()}"
            time.sleep(0.1)
        return child

    def wait_embeddable(self, timeout: float = 120.0) -> control_pb2.ChildStatus:
        """Wait until the embedding child runs and its model's SHA-256 is known: only then
        are vectors written (documents ingested before stay BM25-only, issue 16)."""
        deadline = time.monotonic() + timeout
        while not (child := self.wait_running(common_pb2.CHILD_ROLE_EMBEDDING,
                                               timeout)).model_sha256:
            assert time.monotonic() < deadline, f"model never hashed: {child}\n{self.tail()}"
            time.sleep(0.1)
        return child

    def terminate(self, timeout: float) -> tuple[int, float]:
        """SIGTERM; return (exit status, seconds it took)."""
        began = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGUSR1)
            time.sleep(1)
            raise AssertionError(f"no exit within {timeout}s of SIGTERM:\n{self.tail()}") from None
        return code, time.monotonic() - began


@pytest.fixture
def processes() -> Iterator[Callable[..., DaemonProcess]]:
    """Starts daemon processes; kills any still running at the end (never leaks one)."""
    started: list[DaemonProcess] = []

    def start(tmp: Path, env: dict[str, str], prefix: Sequence[str] = ()) -> DaemonProcess:
        d = DaemonProcess(tmp, env, prefix)
        started.append(d)
        return d

    yield start
    for d in started:
        d.kill()


def fake_llama_bin(tmp: Path, fault: str) -> str:
    """A "llama-server" that is the fake child with ``fault``: for daemon processes, which
    take their runtime from ``--llama-bin`` (the fake accepts llama-server's flags)."""
    argv = fake_child_command(port=1, model="-", fault=fault)
    python, script = argv[0], argv[1]
    path = tmp / f"llama-server-{fault}"
    path.write_text(f'#!/bin/sh\nexec "{python}" "{script}" --fault {fault} "$@"\n')
    path.chmod(0o755)
    return str(path)


# -- a child crashes at start -------------------------------------------------------------


async def test_crash_at_start_opens_breaker_with_cause_in_status(
        in_process: Callable[..., Daemon], llama_server: str) -> None:
    """A child that dies at every start backs off, opens the breaker after
    restart.breaker_failures starts; Status, health, calls and TailLogs all say why; Reset
    (after the cause is fixed) brings it back."""
    runtime = FakeRuntime(faults_per_launch=("crash-at-start",) * 3)
    daemon = in_process(config_env("llama-server", LLAMAD_EMBEDDING_ENABLED="false",
                                   LLAMAD_RESTART_BREAKER_FAILURES="3"))
    daemon.children["generation"].supervisor.launcher.runtime = runtime  # type: ignore[attr-defined]
    began = time.monotonic()
    c = Clients(await daemon.start())
    try:
        gen = await wait_child(c, GEN, lambda s: s.state == FAILED, 30, "failed")
        assert time.monotonic() - began < 15  # backoff 0.1 s doubling to 0.5 s
        assert (gen.breaker, gen.consecutive_failures, gen.restarts) == (OPEN, 3, 2)
        assert runtime.launches == 3
        assert gen.last_exit.kind == "crash"
        assert not gen.last_exit.permanent
        assert gen.last_exit.exit_code == 1
        assert "crash-at-start" in gen.last_exit.message  # the child's own last line
        err = await refused_at_once(c, gen)
        assert "failed" in (err.details() or "")
        hint = retry_after_ms(err)  # the breaker's cool-down (300 s)
        assert hint is not None and 250_000 < hint <= 301_000
        assert await c.status("generation") == NOT_SERVING
        lines = [ln.text async for ln in c.control.TailLogs(
            control_pb2.TailLogsRequest(role=GEN, lines=50))]
        assert sum("crash-at-start" in ln for ln in lines) == 3
        await asyncio.sleep(1.0)
        assert runtime.launches == 3  # no restart loop while the breaker is open
        await reset_serves_again(c, timeout=30)
    finally:
        await c.close()


# -- a child crashes mid-stream -----------------------------------------------------------


async def test_crash_mid_stream_ends_the_call_with_unavailable_and_restarts(
        in_process: Callable[..., Daemon], llama_server: str) -> None:
    """kill -9 of a real llama-server while it streams: the client has the tokens sent so
    far, then UNAVAILABLE with a retry hint (never a silent end); the child comes back and
    serves; Status counts the restart and names the signal."""
    daemon = in_process(config_env("llama-server", LLAMAD_EMBEDDING_ENABLED="false"))
    c = Clients(await daemon.start())
    try:
        await c.wait_serving("generation")
        before = await c.child(GEN)
        call = c.inference.Generate(LONG)
        got = [await call.read() for _ in range(3)]
        os.kill(before.pid, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            while (msg := await call.read()) is not grpc.aio.EOF:
                got.append(msg)
        assert time.monotonic() - t0 < 10
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "inference child failed" in (err.value.details() or "")
        assert retry_after_ms(err.value)
        assert len(got) >= 3
        assert not any(m.HasField("usage") for m in got)  # no fake "finished" ending
        now = await wait_child(c, GEN, lambda s: s.state == RUNNING and s.pid != before.pid,
                               60, "running again")
        assert now.restarts == before.restarts + 1
        assert (now.last_exit.kind, now.last_exit.signal) == ("signal", "SIGKILL")
        assert not alive(before.pid)
        out = [m async for m in c.inference.Generate(pb.GenerateRequest(
            prompt="Hello", sampling=pb.SamplingParams(max_tokens=4)))]
        assert out[-1].usage.completion_tokens >= 1
    finally:
        await c.close()


# -- a child hangs ------------------------------------------------------------------------


async def test_hung_child_is_killed_and_restarted_and_its_call_fails(
        in_process: Callable[..., Daemon], llama_server: str) -> None:
    """A real llama-server frozen with SIGSTOP mid-stream: once the stream has been silent
    for child.busy_silence and probe_failures probes failed, the child is killed (SIGTERM,
    grace, SIGKILL) and restarted; the stuck call ends with UNAVAILABLE; Status says
    "hung"."""
    daemon = in_process(config_env(
        "llama-server", LLAMAD_EMBEDDING_ENABLED="false",
        LLAMAD_CHILD_PROBE_INTERVAL="0.3", LLAMAD_CHILD_PROBE_TIMEOUT="0.5",
        LLAMAD_CHILD_PROBE_FAILURES="2", LLAMAD_CHILD_BUSY_SILENCE="2",
        LLAMAD_CHILD_STOP_GRACE="1"))
    c = Clients(await daemon.start())
    try:
        await c.wait_serving("generation")
        before = await c.child(GEN)
        call = c.inference.Generate(LONG)
        for _ in range(2):
            await call.read()
        os.kill(before.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            while await call.read() is not grpc.aio.EOF:
                pass
        took = time.monotonic() - t0
        # busy_silence 2 s + 2 probes (0.3 s apart, 0.5 s each) + 1 s grace, on a busy box.
        assert 2.0 <= took < 20, took
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert retry_after_ms(err.value)
        assert gone([before.pid], 5) == []
        now = await wait_child(c, GEN, lambda s: s.state == RUNNING and s.pid != before.pid,
                               60, "running again")
        assert now.last_exit.kind == "hung"
        assert "liveness probes failed" in now.last_exit.message
        assert now.restarts == before.restarts + 1
        out = [m async for m in c.inference.Generate(pb.GenerateRequest(
            prompt="Hello", sampling=pb.SamplingParams(max_tokens=4)))]
        assert out[-1].usage.completion_tokens >= 1
    finally:
        with_pid = (await c.child(GEN)).pid
        if with_pid and alive(with_pid):
            os.kill(with_pid, signal.SIGCONT)
        await c.close()


# -- a child never becomes healthy --------------------------------------------------------


async def test_never_healthy_child_times_out_then_opens_breaker(
        in_process: Callable[..., Daemon], llama_server: str) -> None:
    """A child answering 503 "loading" forever: calls get UNAVAILABLE "starting" with a
    retry hint meanwhile; at child.start_cap it is killed (start_timeout, in Status), backs
    off, and after restart.breaker_failures such starts the breaker opens."""
    runtime = FakeRuntime(fault="health-503-forever")
    daemon = in_process(config_env(
        "llama-server", LLAMAD_EMBEDDING_ENABLED="false", LLAMAD_CHILD_START_TIMEOUT="1",
        LLAMAD_CHILD_START_CAP="2", LLAMAD_RESTART_BREAKER_FAILURES="2"))
    daemon.children["generation"].supervisor.launcher.runtime = runtime  # type: ignore[attr-defined]
    c = Clients(await daemon.start())
    try:
        starting = await c.child(GEN)
        assert starting.state == control_pb2.CHILD_STATE_STARTING
        deadline = time.monotonic() + 10
        while not (loading := fake_children()):
            assert time.monotonic() < deadline, "the child was never spawned"
            await asyncio.sleep(0.05)
        err = await generate_error(c)
        assert err.code() == grpc.StatusCode.UNAVAILABLE
        assert "starting" in (err.details() or "")
        assert retry_after_ms(err)
        t0 = time.monotonic()
        backoff = await wait_child(c, GEN, lambda s: s.last_exit.kind != "", 15, "timed out")
        # The progress lines keep extending the 1 s soft deadline: the 2 s cap ends it.
        assert time.monotonic() - t0 < 10
        assert backoff.last_exit.kind == "start_timeout"
        assert "hard cap 2s" in backoff.last_exit.message
        assert gone(loading, 5) == []
        failed = await wait_child(c, GEN, lambda s: s.state == FAILED, 20, "failed")
        assert (failed.breaker, runtime.launches) == (OPEN, 2)
        assert await c.status("generation") == NOT_SERVING
    finally:
        await c.close()


# -- a child ignores SIGTERM --------------------------------------------------------------


def test_child_ignoring_sigterm_does_not_hold_up_daemon_shutdown(
        tmp_path: Path, processes: Callable[..., DaemonProcess], llama_server: str) -> None:
    """SIGTERM to the daemon whose child ignores SIGTERM: the child gets SIGKILL after
    child.stop_grace, and the daemon exits 0 within drain_grace + stop_grace."""
    env = config_env("llama-server", LLAMAD_EMBEDDING_ENABLED="false",
                     LLAMAD_LLAMA_BIN=fake_llama_bin(tmp_path, "ignore-sigterm"),
                     LLAMAD_CHILD_STOP_GRACE="2", LLAMAD_DRAIN_GRACE="1",
                     LLAMAD_STATE_DIR=str(tmp_path / "state"))
    d = processes(tmp_path, env)
    pid = d.wait_running().pid
    code, took = d.terminate(timeout=30)
    assert code == 0
    assert 2.0 <= took < 12, took  # the 2 s grace was waited for, and not much more
    assert gone([pid], 5) == []
    assert not descendants(d.pid)
    stopped = [r for r in d.records() if r.get("event") == "child state"
               and r.get("new") == "stopped" and r.get("role") == "generation"]
    assert stopped
    assert d.records()[-1]["event"] == "stopped"


# -- a child floods stdout ----------------------------------------------------------------


def test_flooding_child_is_drained_and_rate_limited(
        tmp_path: Path, processes: Callable[..., DaemonProcess], llama_server: str) -> None:
    """A child writing to stdout as fast as it can: the daemon stays responsive and keeps
    serving, TailLogs holds only the last child.log_lines lines, and the daemon's own log
    gets at most ~100 child lines a second plus "child output suppressed" summaries."""
    env = config_env("llama-server", LLAMAD_EMBEDDING_ENABLED="false",
                     LLAMAD_LLAMA_BIN=fake_llama_bin(tmp_path, "flood-stdout"),
                     LLAMAD_CHILD_LOG_LINES="100", LLAMAD_STATE_DIR=str(tmp_path / "state"))
    d = processes(tmp_path, env)
    d.wait_running()
    d.wait_event("child output suppressed", timeout=30)
    with grpc.insecure_channel(d.address) as ch:
        from llamad_protocol.v1 import inference_pb2_grpc

        control = control_pb2_grpc.ControlServiceStub(ch)
        inference = inference_pb2_grpc.InferenceServiceStub(ch)
        slowest = 0.0
        for _ in range(10):
            t0 = time.monotonic()
            control.Status(control_pb2.StatusRequest(), timeout=10)
            slowest = max(slowest, time.monotonic() - t0)
            time.sleep(0.2)
        assert slowest < 2.0, slowest
        out = list(inference.Generate(pb.GenerateRequest(
            prompt="a b c", sampling=pb.SamplingParams(max_tokens=5)), timeout=30))
        assert out[-1].usage.completion_tokens == 5
        tail = list(control.TailLogs(control_pb2.TailLogsRequest(role=GEN, lines=10_000),
                                     timeout=10))
        assert len(tail) == 100
        assert tail[-1].seq > 1000  # far more lines went by than were kept
        assert all(ln.text.startswith("flood line") for ln in tail)
    records = d.records()
    per_second: dict[str, int] = {}
    for r in records:
        if r.get("event") == "child output":
            per_second[r["timestamp"][:19]] = per_second.get(r["timestamp"][:19], 0) + 1
    # 100 lines per (unaligned) one-second window: at most 200 in any clock second.
    assert max(per_second.values()) <= 200, per_second
    suppressed = sum(r["lines"] for r in records if r.get("event") == "child output suppressed")
    assert suppressed > 1000
    code, _ = d.terminate(timeout=30)
    assert code == 0


# -- a stranger takes the child's port ----------------------------------------------------


@pytest.fixture
def stranger(llama_server: str) -> Iterator[int]:
    """Someone else's llama-server (another alias) on a loopback port; yields the port."""
    from supervisor._child import free_port

    port = free_port()
    proc = subprocess.Popen(
        [llama_server, "--model", str(model_path(SMALL_MODEL)), "--host", "127.0.0.1",
         "--port", str(port), "--alias", "someone-else", "--threads", "1",
         "--ctx-size", "512", "--metrics", "--no-webui"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", trust_env=False).is_success:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "no stranger"
            time.sleep(0.1)
        yield port
        assert proc.poll() is None  # untouched: not ours to stop
    finally:
        proc.kill()
        proc.wait()


async def test_port_taken_by_a_stranger_is_never_used(
        in_process: Callable[..., Daemon], stranger: int) -> None:
    """Another llama-server (someone else's, another model alias) holds the port the child
    was given: that start fails (port_in_use, or stranger if the readiness probe reached
    the other server first), the retry takes a new port, and no request ever reaches the
    stranger."""
    from supervisor._child import free_port

    daemon = in_process(config_env("llama-server", LLAMAD_EMBEDDING_ENABLED="false"))
    ports = iter([stranger])
    launcher = daemon.children["generation"].supervisor.launcher
    launcher._port_picker = lambda: next(ports, None) or free_port()  # type: ignore[attr-defined]
    c = Clients(await daemon.start())
    try:
        await c.wait_serving("generation")
        gen = await c.child(GEN)
        assert gen.port != stranger
        assert gen.last_exit.kind in ("port_in_use", "stranger"), gen.last_exit
        assert not gen.last_exit.permanent
        assert gen.restarts == 1
        out = [m async for m in c.inference.Generate(pb.GenerateRequest(
            prompt="Hello", sampling=pb.SamplingParams(max_tokens=4)))]
        assert out[-1].model == SMALL_MODEL
    finally:
        await c.close()
    async with httpx.AsyncClient(trust_env=False) as http:
        metrics = (await http.get(f"http://127.0.0.1:{stranger}/metrics")).text
    served = [ln for ln in metrics.splitlines()
              if ln.startswith(("llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total"))]
    assert served and all(float(ln.split()[-1]) == 0 for ln in served), served


# -- the model file is deleted while the child runs ---------------------------------------


async def test_model_deleted_while_running(in_process: Callable[..., Daemon],
                                           llama_server: str, tmp_path: Path) -> None:
    """The running child keeps serving (it has the file mapped); the restart after a crash
    fails the pre-launch check at once: breaker open, Status names the missing file, calls
    get UNAVAILABLE fast, no restart loop. Restoring the file and Reset recover."""
    model = tmp_path / "gen.gguf"
    shutil.copy(model_path(SMALL_MODEL), model)
    daemon = in_process(config_env("llama-server", LLAMAD_EMBEDDING_ENABLED="false",
                                   LLAMAD_GENERATION_MODEL=str(model)))
    c = Clients(await daemon.start())
    try:
        await c.wait_serving("generation")
        before = await c.child(GEN)
        model.unlink()
        out = [m async for m in c.inference.Generate(pb.GenerateRequest(
            prompt="Hello", sampling=pb.SamplingParams(max_tokens=4)))]
        assert out[-1].usage.completion_tokens >= 1
        still = await c.child(GEN)
        assert (still.state, still.pid) == (RUNNING, before.pid)
        assert await c.status("generation") == SERVING
        os.kill(before.pid, signal.SIGKILL)
        gen = await wait_child(c, GEN, lambda s: s.state == FAILED, 20, "failed")
        assert gen.breaker == OPEN
        assert gen.last_exit.kind == "invalid_model"
        assert gen.last_exit.permanent
        assert str(model) in gen.last_exit.message
        assert "not found" in gen.last_exit.message.lower() or \
            "no such file" in gen.last_exit.message.lower()
        err = await refused_at_once(c, gen)
        assert retry_after_ms(err) is None  # permanent: it will not come back by itself
        assert await c.status("generation") == NOT_SERVING
        await asyncio.sleep(1.0)
        again = await c.child(GEN)
        assert (again.state, again.restarts) == (FAILED, gen.restarts)  # no restart loop
        shutil.copy(model_path(SMALL_MODEL), model)
        await reset_serves_again(c, timeout=60)
    finally:
        await c.close()


# -- SIGTERM during a swap ----------------------------------------------------------------


@pytest.mark.parametrize("drain", [0.0, 30.0], ids=["drain-cuts-the-swap", "swap-finishes"])
def test_sigterm_during_swap_exits_clean_without_orphans(
        tmp_path: Path, processes: Callable[..., DaemonProcess], llama_server: str,
        drain: float) -> None:
    """SIGTERM while a swap's new child is loading beside the old one. With a drain grace
    the swap finishes within it (DONE), else the drain cuts it (the call ends with
    CANCELLED or UNAVAILABLE, the new child is stopped half-loaded); either way the swap
    call ends, both children are stopped and reaped, and the daemon exits 0 within
    drain_grace + stop_grace."""
    env = config_env("llama-server", LLAMAD_EMBEDDING_ENABLED="false",
                     LLAMAD_DRAIN_GRACE=str(drain), LLAMAD_CHILD_STOP_GRACE="3",
                     LLAMAD_STATE_DIR=str(tmp_path / "state"))
    d = processes(tmp_path, env)
    old = d.wait_running().pid
    stages: list[int] = []
    ended: list[grpc.StatusCode] = []
    loading = threading.Event()

    def swap() -> None:
        with d.stub(control_pb2_grpc.ControlServiceStub) as stub:
            try:
                for p in stub.Swap(control_pb2.SwapRequest(
                        role=GEN, model_path=str(model_path(DEFAULT_MODEL))), timeout=120):
                    stages.append(p.stage)
                    if p.stage == control_pb2.SWAP_STAGE_LOADING:
                        loading.set()
                ended.append(grpc.StatusCode.OK)
            except grpc.RpcError as exc:
                ended.append(exc.code())
            finally:
                loading.set()

    worker = threading.Thread(target=swap)
    worker.start()
    assert loading.wait(60)
    assert control_pb2.SWAP_STAGE_DONE not in stages
    deadline = time.monotonic() + 10
    while len(children := descendants(d.pid)) < 2:  # the new child beside the old one
        assert time.monotonic() < deadline, children
        time.sleep(0.05)
    assert old in children
    code, took = d.terminate(timeout=90)
    worker.join(30)
    assert not worker.is_alive(), "the Swap call never ended"
    assert code == 0
    assert took < drain + 3 + 5, took
    assert gone(sorted(children), 5) == []
    if drain:
        assert ended == [grpc.StatusCode.OK] and stages[-1] == control_pb2.SWAP_STAGE_DONE
    else:
        assert ended in ([grpc.StatusCode.CANCELLED], [grpc.StatusCode.UNAVAILABLE]), ended
    assert d.records()[-1]["event"] == "stopped"


# -- SIGTERM during an ingest -------------------------------------------------------------


def test_sigterm_during_ingest_keeps_acknowledged_documents(
        tmp_path: Path, processes: Callable[..., DaemonProcess], llama_server: str) -> None:
    """SIGTERM while documents are pushed and a directory is being reindexed: every call
    either succeeded or got UNAVAILABLE/CANCELLED, the daemon exits 0 within drain_grace +
    stop_grace, and after a restart every acknowledged document is indexed and found."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(400):  # enough that the scan is still running at SIGTERM
        (corpus / f"note{i:03}.md").write_text(
            f"# note {i}\n\nscanword{i} " + " ".join(f"filler{j}" for j in range(60)) + "\n")
    env = config_env("llama-server", LLAMAD_GENERATION_ENABLED="false",
                     LLAMAD_DRAIN_GRACE="2", LLAMAD_CHILD_STOP_GRACE="3",
                     LLAMAD_RETRIEVAL_ALLOWED_ROOTS=str(tmp_path),
                     LLAMAD_STATE_DIR=str(tmp_path / "state"))
    d = processes(tmp_path, env)
    d.wait_embeddable()
    acked: list[str] = []
    outcomes: list[grpc.StatusCode] = []
    stop = threading.Event()

    def push() -> None:
        with d.stub(retrieval_pb2_grpc.RetrievalServiceStub) as stub:
            i = 0
            while not stop.is_set():
                token = f"pushword{i}"
                try:
                    stub.UpsertDocument(rpb.UpsertDocumentRequest(
                        source_id="notes", id=f"notes/{token}", title=token,
                        text=f"{token} " + " ".join(f"word{j}" for j in range(100))), timeout=60)
                except grpc.RpcError as exc:
                    outcomes.append(exc.code())
                    return
                acked.append(f"notes/{token}")
                i += 1

    def reindex() -> None:
        with d.stub(retrieval_pb2_grpc.RetrievalServiceStub) as stub:
            try:
                for _ in stub.Reindex(rpb.ReindexRequest(source_id="docs"), timeout=120):
                    pass
                outcomes.append(grpc.StatusCode.OK)
            except grpc.RpcError as exc:
                outcomes.append(exc.code())

    with d.stub(retrieval_pb2_grpc.RetrievalServiceStub) as stub:
        stub.AddSource(rpb.AddSourceRequest(id="notes"))
        stub.AddSource(rpb.AddSourceRequest(id="docs", path=str(corpus)))
    workers = [threading.Thread(target=push), threading.Thread(target=reindex)]
    for w in workers:
        w.start()
    deadline = time.monotonic() + 60
    while len(acked) < 5:
        assert time.monotonic() < deadline, outcomes
        assert not set(outcomes) - {grpc.StatusCode.OK}, outcomes
        time.sleep(0.05)
    code, took = d.terminate(timeout=60)
    stop.set()
    for w in workers:
        w.join(30)
        assert not w.is_alive()
    assert code == 0, d.tail()
    assert took < 2 + 3 + 5, took
    assert set(outcomes) <= {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED,
                             grpc.StatusCode.OK}, outcomes
    assert not [r for r in d.records() if r.get("level") == "error"], d.tail()

    again = processes(tmp_path, env)
    again.wait_embeddable()
    with again.stub(retrieval_pb2_grpc.RetrievalServiceStub) as stub:
        docs = {doc.id: doc for doc in stub.ListDocuments(rpb.ListDocumentsRequest()).documents}
        stuck = [doc for doc in docs.values() if doc.state == rpb.DOCUMENT_STATE_PROCESSING]
        assert not stuck, stuck

        def found(doc_id: str, word: str) -> bool:
            hits = stub.Search(rpb.SearchRequest(query=word, top_k=5)).hits
            return any(h.document_id == doc_id and h.text_rank == 1 for h in hits)

        for doc_id in acked:
            assert docs[doc_id].state == rpb.DOCUMENT_STATE_INDEXED, docs[doc_id]
            assert found(doc_id, doc_id.split("/")[1]), doc_id
        for doc in docs.values():  # everything that says "indexed" is searchable
            if doc.id.startswith("docs/") and doc.state == rpb.DOCUMENT_STATE_INDEXED:
                assert found(doc.id, "scanword" + str(int(doc.id[-6:-3]))), doc.id
        status = stub.Status(rpb.RetrievalStatusRequest())
        # Calls the drain let finish were embedded too (not left BM25-only for good).
        assert status.embedded_chunks == status.chunks == status.vectors, status
    code, _ = again.terminate(timeout=60)
    assert code == 0


# -- the disk fills up while indexing -----------------------------------------------------


class SmallDisk:
    """A size-limited filesystem (tmpfs) at ``path``, in a mount namespace of its own that
    a holder process keeps alive: processes started with :meth:`run` see it, the rest of
    the machine does not (no root needed where unprivileged user namespaces are allowed).
    """

    def __init__(self, path: Path, size: str) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        if not shutil.which("unshare") or not shutil.which("nsenter"):
            pytest.skip("needs util-linux unshare and nsenter for a size-limited tmpfs")
        # A user namespace lets anyone mount a tmpfs; root can do without one (where
        # user namespaces are disabled).
        ways = [["--user", "--map-root-user", "--mount"]]
        if os.geteuid() == 0:
            ways.append(["--mount"])
        errors = []
        for flags in ways:
            self.holder = subprocess.Popen(
                ["unshare", *flags, "sh", "-c",
                 f'mount -t tmpfs -o size={size} llamad-test "{path}" && echo ok && '
                 "exec sleep infinity"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            assert self.holder.stdout is not None
            if self.holder.stdout.readline().strip() == "ok":
                self._enter = ["-U", "--preserve-credentials"] if "--user" in flags else []
                return
            self.holder.kill()
            errors.append(f"unshare {' '.join(flags)}: {self.holder.communicate()[1].strip()}")
        pytest.skip(f"cannot mount a size-limited tmpfs here: {'; '.join(errors)}")

    def prefix(self) -> list[str]:
        """Prepended to a command, runs it in the namespace (same credentials, same pid:
        nsenter execs it)."""
        return ["nsenter", "-t", str(self.holder.pid), "-m", *self._enter]

    def run(self, *argv: str) -> str:
        return subprocess.run([*self.prefix(), *argv], check=True, capture_output=True,
                              text=True, timeout=60).stdout

    def fill(self, leave: int = 0) -> None:
        """Fill the filesystem, then give ``leave`` bytes back."""
        self.run("sh", "-c", f'dd if=/dev/zero of="{self.path}/filler" bs=64k 2>/dev/null; '
                             f'truncate -s -{leave} "{self.path}/filler"')

    def free(self) -> None:
        self.run("rm", "-f", str(self.path / "filler"))

    def close(self) -> None:
        self.holder.kill()
        self.holder.communicate()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[SmallDisk]:
    disk = SmallDisk(tmp_path / "state", "32m")
    yield disk
    disk.close()


def test_disk_full_while_indexing(tmp_path: Path, small_disk: SmallDisk,
                                  processes: Callable[..., DaemonProcess],
                                  llama_server: str) -> None:
    """The state directory's filesystem fills up: ingest fails with RESOURCE_EXHAUSTED
    saying so (never INTERNAL), earlier documents stay searchable, the daemon keeps
    running; once space is freed, ingest works again (the failed document too). A SIGTERM
    while the disk is full still exits 0, and the indexes open intact afterwards."""
    env = config_env("llama-server", LLAMAD_GENERATION_ENABLED="false",
                     LLAMAD_STATE_DIR=str(small_disk.path))

    def upsert(stub: Any, name: str, words: int = 200) -> grpc.StatusCode:
        try:
            stub.UpsertDocument(rpb.UpsertDocumentRequest(
                source_id="notes", id=f"notes/{name}", title=name,
                text=f"{name} " + " ".join(f"{name}w{j}" for j in range(words))), timeout=60)
        except grpc.RpcError as exc:
            codes[name] = (exc.code(), exc.details() or "")
            return exc.code()
        return grpc.StatusCode.OK

    def found(stub: Any, name: str) -> bool:
        hits = stub.Search(rpb.SearchRequest(query=name, top_k=5), timeout=30).hits
        return any(h.document_id == f"notes/{name}" and h.text_rank == 1 for h in hits)

    codes: dict[str, tuple[grpc.StatusCode, str]] = {}
    d = processes(tmp_path, env, small_disk.prefix())
    d.wait_embeddable()
    with d.stub(retrieval_pb2_grpc.RetrievalServiceStub) as stub:
        stub.AddSource(rpb.AddSourceRequest(id="notes"))
        before = [f"early{i}" for i in range(3)]
        assert all(upsert(stub, name) == grpc.StatusCode.OK for name in before)

        small_disk.fill(leave=32 * 1024)
        acked: list[str] = []
        failed: list[str] = []
        for i in range(40):
            name = f"full{i}"
            code = upsert(stub, name)
            (acked if code == grpc.StatusCode.OK else failed).append(name)
            if len(failed) >= 3:
                break
        assert failed, "the disk never filled up"
        for name in failed:
            code, details = codes[name]
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, codes
            assert "no space left" in details and "free space" in details, details
        assert d.proc.poll() is None
        assert d.status(common_pb2.CHILD_ROLE_EMBEDDING).state == RUNNING
        for name in before + acked:
            assert found(stub, name), name
        docs = {doc.id: doc for doc in stub.ListDocuments(rpb.ListDocumentsRequest()).documents}
        for name in before + acked:
            assert docs[f"notes/{name}"].state == rpb.DOCUMENT_STATE_INDEXED

        small_disk.free()
        assert upsert(stub, "after0") == grpc.StatusCode.OK
        assert found(stub, "after0")
        assert upsert(stub, failed[0]) == grpc.StatusCode.OK  # the retry works
        assert found(stub, failed[0])
        for name in before + acked:
            assert found(stub, name), name

        small_disk.fill(leave=0)  # full again, for the shutdown
        assert upsert(stub, "late") == grpc.StatusCode.RESOURCE_EXHAUSTED
    code, _ = d.terminate(timeout=60)
    assert code == 0, d.tail()
    assert not [r for r in d.records() if r.get("level") == "error"], d.tail()

    small_disk.free()
    again = processes(tmp_path, env, small_disk.prefix())
    again.wait_embeddable()
    with again.stub(retrieval_pb2_grpc.RetrievalServiceStub) as stub:
        for name in [*before, *acked, "after0", failed[0]]:
            assert found(stub, name), name
        status = stub.Status(rpb.RetrievalStatusRequest())
        assert status.embedded_chunks == status.chunks == status.vectors, status
    code, _ = again.terminate(timeout=60)
    assert code == 0


# Run inside SmallDisk's namespace by test_indexes_recover_from_a_full_disk: the stores
# themselves, on a full disk, with SQLite's WAL small (SQLite fails first) and grown (SQLite
# reuses its WAL and succeeds, then tantivy fails: SQLite is ahead of the index).
_FULL_DISK_SCRIPT = '''
import asyncio, os, shutil, sys
from pathlib import Path
import numpy as np
from retrieval import Retriever, StorageFull
from retrieval._vectors import VectorIndex

disk = Path(sys.argv[1])

def fill(leave):
    with open(disk / "filler", "wb") as f:
        try:
            while True:
                f.write(bytes(65536))
        except OSError:
            pass
    os.truncate(disk / "filler", max(0, os.path.getsize(disk / "filler") - leave))

def words(name, n=300):
    return f"{name} " + " ".join(f"{name}w{j}" for j in range(n))

async def scenario(root, before, leave):
    r = Retriever(root, lambda: None)
    await r.open()
    await r.add_source("notes")
    for i in range(before):
        await r.upsert("notes", f"pre{i}", words(f"pre{i}"), doc_id=f"notes/pre{i}")
    fill(leave)
    acked, failed, behind = [], [], False
    for i in range(30):
        try:
            await r.upsert("notes", f"f{i}", words(f"f{i}"), doc_id=f"notes/f{i}")
            acked.append(f"f{i}")
        except StorageFull as exc:
            assert "no space left" in str(exc), exc
            failed.append(f"f{i}")
            behind = behind or r._indexes.behind
            if len(failed) == 3:
                break
    assert failed, "never full"
    for name in ["pre0", *acked]:
        assert (await r.search(name, k=1)).hits[0].doc_id == f"notes/{name}", name
    os.unlink(disk / "filler")
    await r.upsert("notes", "after", words("after"), doc_id="notes/after")
    await r.upsert("notes", failed[0], words(failed[0]), doc_id=f"notes/{failed[0]}")
    for name in ["pre0", *acked, "after", failed[0]]:
        assert (await r.search(name, k=1)).hits[0].doc_id == f"notes/{name}", name
    await r.close()
    return behind

def grown(leave):
    try:
        return asyncio.run(scenario(disk / "grown", 200, leave))
    finally:
        shutil.rmtree(disk / "grown", ignore_errors=True)

asyncio.run(scenario(disk / "fresh", 2, 0))
# Whether SQLite still takes a write that tantivy then cannot make depends on the room the
# text index's background merges happen to leave: a few margins, until one shows it.
assert any(grown(leave) for leave in (20000, 50000, 100000)), \
    "tantivy never failed after SQLite"

# hnswlib writes a short file on a full disk without a word: save() must notice, keep the
# previous file, and leave no temporary behind.
v = VectorIndex(disk / "v.hnsw", 384)
v.add(list(range(1, 101)), np.random.default_rng(1).random((100, 384), dtype=np.float32))
v.save()
saved = (disk / "v.hnsw").read_bytes()
v.add(list(range(101, 2001)), np.random.default_rng(2).random((1900, 384), dtype=np.float32))
fill(100_000)
try:
    v.save()
    raise AssertionError("save() on a full disk did not fail")
except OSError:
    pass
assert (disk / "v.hnsw").read_bytes() == saved
assert not (disk / "v.hnsw.tmp").exists()
assert VectorIndex(disk / "v.hnsw", 384).count() == 100
os.unlink(disk / "filler")
v.save()
assert VectorIndex(disk / "v.hnsw", 384).count() == 2000
print("survived")
'''


def test_indexes_recover_from_a_full_disk(tmp_path: Path, small_disk: SmallDisk) -> None:
    """The stores on a real full filesystem: every failure is StorageFull (SQLite's,
    tantivy's, tantivy's killed writer), documents committed before stay searchable, the
    text index catches up on what SQLite took while it could not, writes work again once
    space is freed; hnswlib's silently short file never replaces a good index."""
    script = tmp_path / "full_disk.py"
    script.write_text(_FULL_DISK_SCRIPT)
    out = subprocess.run(
        [*small_disk.prefix(), sys.executable, str(script), str(small_disk.path)],
        cwd=ROOT, capture_output=True, text=True, timeout=240, check=False)
    assert out.returncode == 0 and "survived" in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]


# -- the daemon is killed while a child starts --------------------------------------------


def _processes_with(needle: str) -> dict[int, bytes]:
    """Live processes whose command line holds ``needle``, with their command lines."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and alive(int(entry)):
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    cmdline = fh.read()
            except OSError:
                continue
            if needle.encode() in cmdline:
                found[int(entry)] = cmdline
    return found


def test_sigkill_while_a_child_starts_leaves_no_orphan(
        tmp_path: Path, processes: Callable[..., DaemonProcess], llama_server: str) -> None:
    """kill -9 of the daemon between spawning a child and the child arming its
    parent-death signal (an instant, widened here to 2 s by a slow ``setpriv`` on PATH):
    the child finds itself orphaned and exits instead of running on for good."""
    real = shutil.which("setpriv")
    if real is None:
        pytest.skip("needs util-linux setpriv")
    slow = tmp_path / "bin"
    slow.mkdir()
    (slow / "setpriv").write_text(f'#!/bin/sh\nsleep 2\nexec "{real}" "$@"\n')
    (slow / "setpriv").chmod(0o755)
    env = config_env("llama-server", LLAMAD_EMBEDDING_ENABLED="false",
                     LLAMAD_STATE_DIR=str(tmp_path / "state"),
                     PATH=f"{slow}{os.pathsep}{os.environ['PATH']}")
    d = processes(tmp_path, env)
    argv = str(d.wait_event("launching child")["argv"])
    alias = argv.split("--alias ")[1].split(maxsplit=1)[0]
    d.kill()
    try:
        deadline = time.monotonic() + 15
        while (left := _processes_with(alias)) and time.monotonic() < deadline:
            running = [c for c in left.values() if c.startswith(llama_server.encode())]
            assert not running, f"the child outlived the daemon: {running}"
            time.sleep(0.2)
        assert not left, left
    finally:
        for pid in _processes_with(alias):
            os.kill(pid, signal.SIGKILL)
