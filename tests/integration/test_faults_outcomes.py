"""Health from outcomes (issue 28), with the fake child's wedges: real processes, real
HTTP, real signals. A child whose ``/health`` answers 200 while its completions hang or
fail, and which ignores SIGTERM, is marked not ready within 10 s, killed and replaced;
the calls waiting on it end at once with an error naming the cause; through the daemon
that error is UNAVAILABLE with a retry hint, Status shows the cause and the exit is
counted. Timings use the default outcome options (probe every 1 s, 4 s allowance)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from daemon.telemetry.metrics import Metrics
from llamad_protocol.v1 import common_pb2, control_pb2, inference_pb2
from llamad_protocol.v1.wire import RETRY_AFTER_KEY
from supervisor import ChildRequestError, Sampling, State, StateChange, Supervisor
from supervisor.errors import ChildUnresponsiveError
from supervisor.testing import fake_child_command
from supervisor.testing.fake_runtime import FakeRuntime
from tests.support.daemon import config_env, serving
from tests.support.models import write_model
from tests.support.procs import alive
from tests.support.supervised import FAST, fake_model, supervise


@pytest.fixture
async def supervised(tmp_path: Path) -> AsyncIterator[list[Supervisor]]:
    made: list[Supervisor] = []
    yield made
    for sup in made:
        await sup.stop()


def start(made: list[Supervisor], tmp_path: Path, runtime: FakeRuntime
          ) -> tuple[Supervisor, list[StateChange]]:
    """A started supervisor of ``runtime``'s child: fast /health probing and start, a 10 s
    stop grace; the outcome options are left at their defaults."""
    h = supervise(fake_model(tmp_path), runtime,
                  timeouts=dataclasses.replace(FAST, stop_grace=10.0))
    made.append(h.sup)
    h.sup.start()
    return h.sup, h.changes


async def until_gone(pid: int, timeout: float) -> float:
    began = time.monotonic()
    while alive(pid):
        if time.monotonic() - began > timeout:
            raise AssertionError(f"{pid} still alive after {timeout} s")
        await asyncio.sleep(0.02)
    return time.monotonic() - began


async def test_a_wedged_child_whose_completions_hang_is_replaced_within_10_s(
        supervised: list[Supervisor], tmp_path: Path) -> None:
    """``/health`` 200, completions never answered, SIGTERM ignored: the caller's stream
    ends with ChildUnresponsiveError naming the stalled probe (not a hang), the child is
    marked not ready within 10 s, SIGKILLed after the 2 s grace, and a new child serves
    within 10 s of the call."""
    sup, changes = start(supervised, tmp_path, FakeRuntime(faults_per_launch=("wedge-hang",)))
    await sup.wait_for(State.RUNNING, timeout=10)
    wedged = sup.pid
    began = time.monotonic()
    with pytest.raises(ChildUnresponsiveError) as ended:
        async for _ in sup.client.stream_completion("x", Sampling(max_tokens=5)):
            pass
    failed_after = time.monotonic() - began
    assert failed_after < 10, failed_after
    assert ended.value.kind == "probe_stalled"
    assert "taken out of service" in str(ended.value)
    assert "probe got no answer within 4.0 s" in str(ended.value)
    assert sup.state is not State.RUNNING or sup.pid != wedged
    unready = next(c for c in changes if c.old is State.RUNNING)
    assert unready.new is State.BACKOFF and unready.cause is not None
    assert unready.cause.kind == "probe_stalled"
    await until_gone(wedged, 2.0 + 3)  # SIGTERM ignored: SIGKILL after the grace
    await sup.wait_for(State.RUNNING, timeout=10)
    replaced_after = time.monotonic() - began
    assert sup.pid != wedged
    assert replaced_after < 10, replaced_after
    chunks = [c async for c in sup.client.stream_completion("x", Sampling(max_tokens=5))]
    assert sum(c.tokens for c in chunks) == 5
    assert sup.last_exit is not None and sup.last_exit.kind == "probe_stalled"


async def test_a_wedged_child_whose_completions_fail_is_replaced(
        supervised: list[Supervisor], tmp_path: Path) -> None:
    """``/health`` 200, every completion 500, SIGTERM ignored: the failed call gets the
    child probed at once; the probe fails too, so it is out of service within a second,
    killed and replaced."""
    sup, changes = start(supervised, tmp_path, FakeRuntime(faults_per_launch=("wedge-fail",)))
    await sup.wait_for(State.RUNNING, timeout=10)
    wedged = sup.pid
    began = time.monotonic()
    with pytest.raises(ChildRequestError, match="HTTP 500: fake: wedged"):
        async for _ in sup.client.stream_completion("x", Sampling(max_tokens=5)):
            pass
    await sup.wait_for(State.BACKOFF, State.STARTING, timeout=10)
    assert time.monotonic() - began < 2
    unready = next(c for c in changes if c.old is State.RUNNING)
    assert unready.cause is not None and unready.cause.kind == "probe_failed"
    assert "fake: wedged" in unready.cause.message
    await until_gone(wedged, 2.0 + 3)
    await sup.wait_for(State.RUNNING, timeout=10)
    assert sup.pid != wedged
    assert time.monotonic() - began < 10


def wedged_once_bin(tmp: Path) -> str:
    """A "llama-server" that is the fake child, wedged (``wedge-hang``) on its first
    launch only: the replacement is healthy."""
    argv = fake_child_command(port=1, model="-")
    python, script = argv[0], argv[1]
    mark = tmp / "launched-once"
    path = tmp / "llama-server-wedged-once"
    path.write_text(
        "#!/bin/sh\n"
        f'if [ -e "{mark}" ]; then exec "{python}" "{script}" "$@"; fi\n'
        f'touch "{mark}"\n'
        f'exec "{python}" "{script}" --fault wedge-hang "$@"\n')
    path.chmod(0o755)
    return str(path)


async def test_through_the_daemon_callers_get_unavailable_naming_the_cause(
        tmp_path: Path) -> None:
    """Two callers stream from the wedged child: both get UNAVAILABLE within 10 s, naming
    the stalled probe, with a retry hint; Status shows the cause (last_error, last_exit);
    the exit is counted (llamad_child_exits{kind="probe_stalled"}); a retry is served
    by the replacement."""
    model = tmp_path / "fake.gguf"
    write_model(model)
    env = config_env("llama-server", LLAMAD_LLAMA_BIN=wedged_once_bin(tmp_path),
                     LLAMAD_GENERATION_MODEL=str(model), LLAMAD_EMBEDDING_MODE="disabled",
                     LLAMAD_RETRIEVAL_ENABLED="false")
    async with serving(env) as (daemon, clients):
        wedged = daemon.children["generation"].serving_pid
        request = inference_pb2.GenerateRequest(
            prompt="hello", sampling=inference_pb2.SamplingParams(max_tokens=5))

        async def call() -> grpc.aio.AioRpcError:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                async for _ in clients.inference.Generate(request, timeout=60):
                    pass
            return refused.value

        began = time.monotonic()
        errors = await asyncio.gather(call(), call())
        assert time.monotonic() - began < 10
        for error in errors:
            assert error.code() is grpc.StatusCode.UNAVAILABLE
            assert "taken out of service" in (error.details() or "")
            assert "probe got no answer" in (error.details() or "")
            assert int(dict(error.trailing_metadata() or ())[RETRY_AFTER_KEY]) > 0

        status = await clients.control.Status(control_pb2.StatusRequest())
        child = next(c for c in status.children if c.role == common_pb2.CHILD_ROLE_GENERATION)
        assert "probe got no answer" in child.last_error
        assert child.last_exit.kind == "probe_stalled"
        exits = daemon.metrics.registry.get_sample_value(
            "llamad_child_exits_total",
            {"role": "generation", "model": daemon.config.catalog.defaults["generation"],
             "kind": "probe_stalled"})
        assert exits == 1
        assert isinstance(daemon.metrics, Metrics)

        await until_gone(wedged, 2.0 + 3)
        await clients.wait_serving(timeout=20)
        served = [m async for m in clients.inference.Generate(request, timeout=60)]
        assert served[-1].usage.completion_tokens == 5
        assert daemon.children["generation"].serving_pid != wedged
