"""Each fault of the fake child, supervised for real: real processes, real HTTP, real
signals, and the state sequence the supervisor must go through."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from supervisor import (
    ChildRequestError,
    LaunchSpec,
    LogRing,
    ProcessLauncher,
    Sampling,
    State,
    Supervisor,
    SystemClock,
    Timeouts,
)
from supervisor.testing.fake_child import generate_tokens
from supervisor.testing.fake_runtime import FakeRuntime
from tests.support.procs import alive
from tests.support.supervised import FAST, POLICY, Harness, fake_model, supervise


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return fake_model(tmp_path)


Factory = Callable[..., Harness]


@pytest.fixture
async def harness_factory(model: Path) -> AsyncIterator[Callable[..., Harness]]:
    made: list[Harness] = []

    def make(runtime: FakeRuntime, **options: Any) -> Harness:
        h = supervise(model, runtime, **options)
        made.append(h)
        return h

    yield make
    for h in made:
        await h.sup.stop()


async def test_healthy_child_streams(harness_factory: Factory) -> None:
    """A well-behaved child goes starting -> running and streams tokens."""
    h = harness_factory(FakeRuntime())
    h.sup.start()
    await h.until("starting,running")
    chunks = [c async for c in h.sup.client.stream_completion("a b c", Sampling(max_tokens=5))]
    assert sum(c.tokens for c in chunks) == 5
    assert chunks[-1].finish_reason == "length"


async def test_a_lagging_reader_gets_what_came_in_one_chunk_all_of_it(
        harness_factory: Factory) -> None:
    """At token delay 0 the child outruns a busy reader: what came meanwhile is one chunk
    (issue 27), and nothing is lost: the text is the child's, every token counted, the
    usage the child's. A reader that leaves mid-stream stops the child's generation."""
    h = harness_factory(FakeRuntime(token_delay=0.0))
    h.sup.start()
    await h.until("starting,running")
    prompt = "user: tell\nassistant:"
    chunks = []
    async for chunk in h.sup.client.stream_chat([("user", "tell")], Sampling(max_tokens=400)):
        chunks.append(chunk)
        time.sleep(0.002)  # noqa: ASYNC251 (a busy relay: the loop is held on purpose)
    body, last = chunks[:-1], chunks[-1]
    assert "".join(c.text for c in body) == "".join(generate_tokens(prompt, 400))
    assert sum(c.tokens for c in body) == 400 == last.completion_tokens
    assert len(body) < 400  # coalesced, not one chunk per token
    assert last.finish_reason == "length"

    stream = h.sup.client.stream_chat([("user", "again")], Sampling(max_tokens=2000))
    first = await anext(stream)
    assert first.text
    await stream.aclose()  # type: ignore[attr-defined]
    deadline = time.monotonic() + 10
    while not any("cancel task" in line.text for line in h.ring.tail()):
        assert time.monotonic() < deadline, "the child never stopped the generation"
        await asyncio.sleep(0.05)


async def test_crash_at_start_backs_off_then_breaker_opens(harness_factory: Factory) -> None:
    """Crashing at every start backs off, then opens the breaker after 3 failures."""
    h = harness_factory(FakeRuntime(fault="crash-at-start"))
    h.sup.start()
    await h.until("starting,backoff,starting,backoff,starting,failed")
    assert h.sup.last_exit is not None
    assert h.sup.last_exit.kind == "crash"
    assert h.sup.last_exit.exit_code == 1
    assert h.runtime.launches == 3


async def test_crash_mid_stream_fails_the_call_and_restarts(harness_factory: Factory) -> None:
    """A SIGSEGV mid-stream ends the call with an error; the child comes back."""
    h = harness_factory(FakeRuntime(faults_per_launch=("crash-mid-stream",), fault_after=2))
    h.sup.start()
    await h.until("starting,running")
    first_pid = h.sup.pid
    tokens = 0
    with pytest.raises(ChildRequestError):
        async for chunk in h.sup.client.stream_completion("x", Sampling(max_tokens=50)):
            tokens += chunk.tokens  # two events that came together are one chunk
    assert tokens == 2
    await h.until("running,backoff,starting,running")
    assert h.sup.last_exit is not None
    assert h.sup.last_exit.signal == "SIGSEGV"
    assert h.sup.pid != first_pid
    assert not alive(first_pid)


async def test_hang_is_detected_killed_and_restarted(harness_factory: Factory) -> None:
    """A child that stops answering fails its probes, is killed, and is replaced."""
    h = harness_factory(FakeRuntime(faults_per_launch=("hang",), fault_after=4))
    h.sup.start()
    await h.until("starting,running")
    hung_pid = h.sup.pid
    await h.until("running,backoff", timeout=10)
    assert h.sup.last_exit is not None
    assert h.sup.last_exit.kind == "hung"
    # Marked not ready first (no call goes to it meanwhile), then stopped (issue 28).
    deadline = time.monotonic() + FAST.stop_grace + 5
    while alive(hung_pid) and time.monotonic() < deadline:  # noqa: ASYNC110 (a process)
        await asyncio.sleep(0.05)
    assert not alive(hung_pid)
    await h.until("backoff,starting,running")


async def test_health_503_forever_times_out(harness_factory: Factory) -> None:
    """A child that loads forever hits the hard start cap, is killed, and backs off."""
    timeouts = Timeouts(start=0.5, start_cap=1.5, probe_interval=0.2, probe_timeout=0.3,
                        probe_failures=2, stop_grace=1.0)
    h = harness_factory(FakeRuntime(fault="health-503-forever"), timeouts=timeouts)
    h.sup.start()
    await h.until("starting,backoff")
    assert h.sup.last_exit is not None
    assert h.sup.last_exit.kind == "start_timeout"
    assert "hard cap" in h.sup.last_exit.message  # progress kept extending the soft deadline


async def test_health_ok_but_probe_request_failing_is_never_ready(
    harness_factory: Factory
) -> None:
    """A child whose /health and /v1/models answer but whose one-token readiness request
    fails is never "running": the start ends never_ready (naming the failed request), the
    child is stopped, and the supervisor backs off to try again (not permanent)."""
    h = harness_factory(FakeRuntime(fault="probe-fails"))
    h.sup.start()
    await h.until("starting,backoff")
    assert h.sup.last_exit is not None
    assert h.sup.last_exit.kind == "never_ready"
    assert "readiness request failed" in h.sup.last_exit.message
    assert not h.sup.last_exit.permanent
    assert "running" not in h.states()


async def test_slow_start_with_progress_extends_the_deadline(harness_factory: Factory) -> None:
    """A 2 s load succeeds under a 0.7 s no-progress deadline because it shows progress."""
    timeouts = Timeouts(start=0.7, start_cap=10.0, probe_interval=0.2, probe_timeout=0.3,
                        probe_failures=2, stop_grace=1.0)
    h = harness_factory(FakeRuntime(fault="slow-start", load_seconds=2.0), timeouts=timeouts)
    began = time.monotonic()
    h.sup.start()
    await h.until("starting,running")
    assert time.monotonic() - began >= 1.9
    assert h.states() == ["starting", "running"]


async def test_ignore_sigterm_is_killed_after_grace(harness_factory: Factory) -> None:
    """stop() of a child ignoring SIGTERM escalates to SIGKILL after the grace period."""
    h = harness_factory(FakeRuntime(fault="ignore-sigterm"))
    h.sup.start()
    await h.until("starting,running")
    pid = h.sup.pid
    began = time.monotonic()
    await h.sup.stop()
    took = time.monotonic() - began
    assert 0.9 <= took < 5.0  # grace is 1 s
    assert not alive(pid)
    assert h.states()[-1] == "stopped"


async def test_flood_stdout_is_drained_and_bounded(harness_factory: Factory) -> None:
    """A child flooding stdout keeps serving; the ring holds only its last lines."""
    h = harness_factory(FakeRuntime(fault="flood-stdout"), ring_lines=100)
    h.sup.start()
    await h.until("starting,running")
    await asyncio.sleep(0.5)
    text = await h.sup.client.complete("hello there", Sampling(max_tokens=3))
    assert text
    assert h.ring.last_seq > 1000
    assert len(h.ring.tail()) == 100
    assert h.sup.state is State.RUNNING


@pytest.mark.parametrize(("fault", "kind"), [("usage-error", "usage_error"),
                                             ("model-error", "model_error")])
async def test_permanent_errors_open_breaker_at_once(
    harness_factory: Factory, fault: str, kind: str
) -> None:
    """Bad arguments and unloadable models fail once, with no retry loop."""
    h = harness_factory(FakeRuntime(fault=fault))
    h.sup.start()
    await h.until("starting,failed")
    await asyncio.sleep(0.3)
    assert h.states() == ["starting", "failed"]
    assert h.sup.last_exit is not None
    assert h.sup.last_exit.kind == kind
    assert h.sup.last_exit.permanent
    assert h.runtime.launches == 1


async def test_exit_while_idle_restarts(harness_factory: Factory) -> None:
    """A child that exits on its own while idle is restarted."""
    h = harness_factory(FakeRuntime(faults_per_launch=("exit-after-ready",), fault_after=1))
    h.sup.start()
    await h.until("starting,running,backoff,starting,running")
    assert h.sup.last_exit is not None
    assert h.sup.last_exit.kind == "crash"


async def test_a_stale_socket_at_the_childs_path_never_confuses_it(
    model: Path, stale: tuple[Path, list[int]]
) -> None:
    """A socket left at the path a child is given (someone else still listening on it) is
    replaced before the child starts: the child starts at once, serves on that path, and
    the stale server never gets a connection."""
    path, connections = stale
    h = supervise(model, FakeRuntime(), socket_picker=lambda: path)
    sup = h.sup
    sup.start()
    try:
        await sup.wait_for(State.RUNNING, timeout=10)
        assert h.states() == ["starting", "running"]
        assert sup.socket == str(path)
        assert await sup.client.complete("hello", Sampling(max_tokens=2))
        assert connections == []
    finally:
        await sup.stop()
    assert not path.exists()  # the child's socket goes with it


@dataclass(frozen=True)
class ImpostorRuntime(FakeRuntime):
    """Starts a fake child that reports another model id than the launch's alias."""

    def command(self, spec: LaunchSpec, *, socket: Path, alias: str) -> list[str]:
        return super().command(spec, socket=socket, alias="someone-else")


async def test_a_server_reporting_another_alias_is_never_taken_for_the_child(
    harness_factory: Factory,
) -> None:
    """A server on the child's socket that reports another model id (not this launch's
    alias) fails the start as a stranger, and is stopped; it never becomes running."""
    h = harness_factory(ImpostorRuntime())
    h.sup.start()
    await h.until("starting,backoff")
    assert "running" not in h.states()
    assert h.sup.last_exit is not None
    assert h.sup.last_exit.kind == "stranger"
    assert "someone-else" in h.sup.last_exit.message
    await h.sup.stop()


async def test_missing_model_file_is_permanent(tmp_path: Path) -> None:
    """A model path that does not exist fails at once (validated before launch)."""
    from supervisor import read_gguf_info

    missing = tmp_path / "nope.gguf"

    def check() -> None:
        read_gguf_info(missing)

    launcher = ProcessLauncher(LaunchSpec(role="generation", model=missing), FakeRuntime(),
                               clock=SystemClock(), ring=LogRing(10), timeouts=FAST)
    sup = Supervisor("generation", launcher, policy=POLICY,
                     validate=check)
    sup.start()
    try:
        await sup.wait_for(State.FAILED, timeout=5)
        assert sup.last_exit is not None
        assert sup.last_exit.kind == "invalid_model"
        assert "nope.gguf" in sup.last_exit.message
    finally:
        await sup.stop()


async def test_a_launch_cancelled_while_the_process_is_created_reaps_it(
        model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cancelled while the child process is being created (its pipes still connecting:
    here held open by a wrapper around the real spawn), the launch stops and reaps the
    process it had started instead of leaving it to outlive its supervisor."""
    from supervisor._process import ChildProcess

    created: list[ChildProcess] = []
    hold = asyncio.Event()
    real = ChildProcess.spawn.__func__  # type: ignore[attr-defined]

    async def slow_spawn(cls: type[ChildProcess], /, *args: object,
                         **kw: object) -> ChildProcess:
        process: ChildProcess = await real(cls, *args, **kw)
        created.append(process)
        await hold.wait()  # the launch is cancelled here, the creation ends after
        return process

    monkeypatch.setattr(ChildProcess, "spawn", classmethod(slow_spawn))
    launcher = ProcessLauncher(LaunchSpec(role="generation", model=model), FakeRuntime(),
                               clock=SystemClock(), ring=LogRing(10), timeouts=FAST)
    launch = asyncio.create_task(launcher.launch())
    for _ in range(500):
        if created:
            break
        await asyncio.sleep(0.01)
    assert created and alive(created[0].pid)
    launch.cancel()
    await asyncio.sleep(0.05)
    hold.set()
    with pytest.raises(asyncio.CancelledError):
        await launch
    assert not alive(created[0].pid)
