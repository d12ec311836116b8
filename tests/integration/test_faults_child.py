"""The fault matrix (docs/faults.md), a child's faults in an in-process daemon: a child that
crashes at start or mid-stream, hangs, never becomes healthy, finds a stale socket at its
path, or loses its model file, and what operators (Status) and clients (the failed call,
its retry hint, Reset) see of each.

Real daemons in-process on port 0, real gRPC clients, real llama-server children on real
GGUF models; the fake child stands in only for faults a real child cannot be made to show on
demand (crash at start, never healthy). Faults already proven elsewhere are listed in
docs/faults.md with their tests.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from daemon import Daemon
from llamad_protocol.v1 import control_pb2
from llamad_protocol.v1 import inference_pb2 as pb
from supervisor.testing.fake_runtime import FakeRuntime
from tests.conftest import SMALL_MODEL, model_path
from tests.support.daemon import GEN, NOT_SERVING, SERVING, Clients, config_env, make_daemon
from tests.support.daemon_process import RUNNING
from tests.support.endless import never_end
from tests.support.procs import alive, descendants, gone

pytestmark = pytest.mark.integration


FAILED = control_pb2.CHILD_STATE_FAILED
OPEN = control_pb2.BREAKER_STATE_OPEN
CLOSED = control_pb2.BREAKER_STATE_CLOSED
def long_request() -> pb.GenerateRequest:
    """Greedy counting that cannot end early (every end-of-generation token banned)."""
    return pb.GenerateRequest(prompt="1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
                              sampling=pb.SamplingParams(
                                  max_tokens=1500, temperature=0.0,
                                  logit_bias=never_end(model_path(SMALL_MODEL))))


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
        call = c.inference.Generate(long_request())
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
        call = c.inference.Generate(long_request())
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
        # The call ends first, then the child is killed (issue 28): wait without blocking
        # the loop the in-process daemon kills it on.
        deadline = time.monotonic() + 5
        while alive(before.pid) and time.monotonic() < deadline:  # noqa: ASYNC110 (a process)
            await asyncio.sleep(0.05)
        assert not alive(before.pid)
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
        LLAMAD_CHILD_START_CAP="2", LLAMAD_CHILD_START_CAP_PER_GIB="0",  # 2 s whatever its size
        LLAMAD_RESTART_BREAKER_FAILURES="2"))
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


# -- a stale socket at the child's path ---------------------------------------------------


async def test_a_stale_socket_is_never_used(
        in_process: Callable[..., Daemon], stale: tuple[Path, list[int]]) -> None:
    """A server still listens on the socket path the real child is given: the path is
    taken over before llama-server starts, so the child starts at once (no restart), serves
    there, and no request ever reaches the stale server."""
    path, connections = stale
    daemon = in_process(config_env("llama-server", LLAMAD_EMBEDDING_ENABLED="false"))
    launcher = daemon.children["generation"].supervisor.launcher
    launcher.socket_picker = lambda: path  # type: ignore[attr-defined]
    c = Clients(await daemon.start())
    try:
        await c.wait_serving("generation")
        gen = await c.child(GEN)
        assert gen.socket == str(path)
        assert gen.restarts == 0
        out = [m async for m in c.inference.Generate(pb.GenerateRequest(
            prompt="Hello", sampling=pb.SamplingParams(max_tokens=4)))]
        assert out[-1].model == SMALL_MODEL
    finally:
        await c.close()
    assert connections == []


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
