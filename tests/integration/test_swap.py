"""Hot-swap with real children: make-before-break between two real GGUF models."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from daemon import Daemon
from llamad_protocol.v1 import common_pb2, control_pb2
from llamad_protocol.v1 import inference_pb2 as pb
from tests.conftest import DEFAULT_MODEL, SMALL_MODEL, model_path
from tests.support.daemon import Clients, config_env, serving
from tests.support.endless import never_end
from tests.support.procs import alive

pytestmark = pytest.mark.integration

GEN = common_pb2.CHILD_ROLE_GENERATION
DONE = control_pb2.SWAP_STAGE_DONE
FAILED = control_pb2.SWAP_STAGE_FAILED


@pytest.fixture
async def running(llama_server: str) -> AsyncIterator[tuple[Daemon, Clients]]:
    async with serving(config_env("llama-server", LLAMAD_EMBEDDING_ENABLED="false")) as pair:
        yield pair


async def swap(c: Clients, model_path: str = "", *, rollback: bool = False,
               stop_old_first: bool = False, reason: str = "") -> list[control_pb2.SwapProgress]:
    request = control_pb2.SwapRequest(role=GEN, model_path=model_path, rollback=rollback,
                                      stop_old_first=stop_old_first, reason=reason)
    return [p async for p in c.control.Swap(request)]


async def test_swap_under_a_running_stream(running: tuple[Daemon, Clients]) -> None:
    """The stream on the old model finishes; new calls use the new model; old child stops."""
    _, c = running
    before = await c.child(GEN)
    stream = c.inference.Generate(pb.GenerateRequest(
        prompt="Write a list of twenty fruits:", sampling=pb.SamplingParams(
            max_tokens=120, logit_bias=never_end(model_path(SMALL_MODEL)))))
    first = await stream.read()
    assert first.model == SMALL_MODEL
    progress = await swap(c, model_path=str(model_path(DEFAULT_MODEL)), reason="upgrade")
    stages = [p.stage for p in progress]
    assert stages[0] == control_pb2.SWAP_STAGE_VALIDATING
    assert control_pb2.SWAP_STAGE_PROBING in stages
    assert control_pb2.SWAP_STAGE_SWAPPING in stages
    assert stages[-1] == DONE
    rest = []
    while (msg := await stream.read()) is not grpc.aio.EOF:
        rest.append(msg)
    assert rest[-1].finish_reason != pb.FINISH_REASON_UNSPECIFIED  # completed, not cut
    assert rest[-1].model == SMALL_MODEL
    after = await c.child(GEN)
    assert after.state == control_pb2.CHILD_STATE_RUNNING
    assert after.model_path.endswith(DEFAULT_MODEL)
    assert after.previous_model_path.endswith(SMALL_MODEL)
    assert after.last_swap.reason == "upgrade"
    assert after.pid != before.pid
    assert not alive(before.pid)
    out = [m async for m in c.inference.Generate(pb.GenerateRequest(
        prompt="Hi", sampling=pb.SamplingParams(max_tokens=3)))]
    assert out[-1].model == DEFAULT_MODEL


async def test_failed_swap_keeps_old_child(running: tuple[Daemon, Clients],
                                           tmp_path: Path) -> None:
    """A corrupt new model fails the swap with its cause; the old child is untouched."""
    _, c = running
    before = await c.child(GEN)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + os.urandom(4000))
    seen: list[control_pb2.SwapProgress] = []
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for p in c.control.Swap(control_pb2.SwapRequest(role=GEN, model_path=str(bad))):
            seen.append(p)
    assert err.value.code() == grpc.StatusCode.ABORTED
    assert seen[-1].stage == FAILED
    assert seen[-1].cause.permanent
    assert "bad.gguf" in seen[-1].cause.message
    after = await c.child(GEN)
    assert (after.pid, after.model_path) == (before.pid, before.model_path)
    assert not after.previous_model_path
    out = [m async for m in c.inference.Generate(pb.GenerateRequest(
        prompt="Hi", sampling=pb.SamplingParams(max_tokens=3)))]
    assert out[-1].model == SMALL_MODEL


async def test_rollback_returns_to_previous_model(running: tuple[Daemon, Clients]) -> None:
    """Rollback swaps back to the model before the last swap."""
    _, c = running
    assert (await swap(c, model_path=str(model_path(DEFAULT_MODEL))))[-1].stage == DONE
    assert (await swap(c, rollback=True))[-1].stage == DONE
    after = await c.child(GEN)
    assert after.model_path.endswith(SMALL_MODEL)
    assert after.previous_model_path.endswith(DEFAULT_MODEL)
    assert after.last_swap.reason == "rollback"


async def test_concurrent_swap_is_rejected(running: tuple[Daemon, Clients]) -> None:
    """A second swap of the same child while one runs gets FAILED_PRECONDITION."""
    _, c = running
    first = asyncio.ensure_future(swap(c, model_path=str(model_path(DEFAULT_MODEL))))
    await asyncio.sleep(0.2)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await swap(c, model_path=str(model_path(DEFAULT_MODEL)))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "already running" in (err.value.details() or "")
    assert (await first)[-1].stage == DONE


async def test_swap_that_does_not_fit_needs_stop_old_first(
    running: tuple[Daemon, Clients], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without room for both children the swap refuses, unless told to stop the old first."""
    import daemon.models.memory

    _, c = running
    monkeypatch.setattr(daemon.models.memory, "memory_available", lambda: 64 * 1024 * 1024)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await swap(c, model_path=str(model_path(DEFAULT_MODEL)))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "stop_old_first" in (err.value.details() or "")
    before = await c.child(GEN)
    progress = await swap(c, model_path=str(model_path(DEFAULT_MODEL)), stop_old_first=True)
    assert progress[-1].stage == DONE
    after = await c.child(GEN)
    assert after.model_path.endswith(DEFAULT_MODEL)
    assert not alive(before.pid)


async def test_bad_swap_requests(running: tuple[Daemon, Clients]) -> None:
    """Nonsense swap requests are refused with INVALID_ARGUMENT before anything starts."""
    _, c = running
    cases = [
        (control_pb2.SwapRequest(role=GEN), "nothing to swap"),
        (control_pb2.SwapRequest(role=GEN, rollback=True), "nothing to roll back"),
        (control_pb2.SwapRequest(role=GEN, model_path="relative.gguf"), "absolute"),
    ]
    for request, needle in cases:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            _ = [p async for p in c.control.Swap(request)]
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert needle in (err.value.details() or "")


async def test_swap_racing_a_crash_of_the_old_child(running: tuple[Daemon, Clients]) -> None:
    """kill -9 of the old child while the new one loads: the swap still ends swapped."""
    _, c = running
    old = await c.child(GEN)
    swap_task = asyncio.ensure_future(swap(c, model_path=str(model_path(DEFAULT_MODEL))))
    await asyncio.sleep(0.05)
    os.kill(old.pid, 9)
    progress = await swap_task
    assert progress[-1].stage == DONE
    deadline = asyncio.get_running_loop().time() + 30
    while (now := await c.child(GEN)).state != control_pb2.CHILD_STATE_RUNNING:
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.1)
    assert now.model_path.endswith(DEFAULT_MODEL)
    out = [m async for m in c.inference.Generate(pb.GenerateRequest(
        prompt="Hi", sampling=pb.SamplingParams(max_tokens=3)))]
    assert out[-1].model == DEFAULT_MODEL


async def test_new_calls_wait_for_the_old_childs_calls_then_use_the_new_one(
        llama_server: str) -> None:
    """Once a swap switched, a new call waits in the queue until the old child's running
    call ended (swap.handover_hold), rather than computing beside it on the same cores;
    then it runs on the new model. The old call cannot end by itself (every end token
    banned, room for ~2000 tokens): it ends when the test cancels it, whatever the speed
    of the machine."""
    async with serving(config_env("llama-server", LLAMAD_EMBEDDING_ENABLED="false",
                                  LLAMAD_SWAP_HANDOVER_HOLD="60")) as (_, c):
        old = c.inference.Generate(pb.GenerateRequest(
            prompt="1, 2, 3, 4, 5, 6, 7, 8,", sampling=pb.SamplingParams(
                max_tokens=2000, logit_bias=never_end(model_path(SMALL_MODEL)))))
        assert (await old.read()).model == SMALL_MODEL
        old_tokens = 0

        async def read_old() -> None:  # until the test cancels the call
            nonlocal old_tokens
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                while (msg := await old.read()) is not grpc.aio.EOF:
                    old_tokens += msg.tokens

        old_reader = asyncio.create_task(read_old())

        async def new_call() -> tuple[str, float]:
            stream = c.inference.Generate(pb.GenerateRequest(
                prompt="Hi", sampling=pb.SamplingParams(max_tokens=3)))
            out = [m async for m in stream]
            return out[-1].model, asyncio.get_running_loop().time()

        new_task: asyncio.Task[tuple[str, float]] | None = None
        request = control_pb2.SwapRequest(role=GEN, model_path=str(model_path(DEFAULT_MODEL)))
        async for p in c.control.Swap(request):
            if p.stage == control_pb2.SWAP_STAGE_DRAINING and new_task is None:
                assert not old_reader.done(), "the old call ended before the switch"
                new_task = asyncio.create_task(new_call())
                # Room for the new call to run beside the old one if it were not held:
                # the old call makes 20 more tokens first.
                seen = old_tokens
                while old_tokens < seen + 20:
                    assert not old_reader.done(), "the old call ended by itself"
                    await asyncio.sleep(0.01)
                assert not new_task.done(), "the new call ran beside the old child's call"
                ended = asyncio.get_running_loop().time()
                old.cancel()
        assert new_task is not None
        model, new_done = await new_task
        assert model == DEFAULT_MODEL
        assert new_done >= ended  # it waited for the old call to end
        await old_reader


def nice_values(pid: int) -> set[int]:
    """The nice value of every thread of ``pid`` (field 19 of /proc/<pid>/task/<tid>/stat)."""
    out = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/stat") as fh:
            out.add(int(fh.read().rsplit(")", 1)[1].split()[16]))
    return out


def child_pids(parent: int) -> set[int]:
    with open(f"/proc/{parent}/task/{parent}/children") as fh:
        return {int(p) for p in fh.read().split()}


async def test_the_incoming_child_loads_niced_then_gets_the_normal_priority(
        running: tuple[Daemon, Clients]) -> None:
    """swap.launch_nice (10): while the new child loads beside the serving one it runs
    niced; from the switch on it has the daemon's own priority, every thread of it."""
    from supervisor import can_lower_niceness

    _, c = running
    base = os.getpriority(os.PRIO_PROCESS, 0)
    if not can_lower_niceness(base):
        pytest.skip("this process may not lower a nice value (launch_nice is then unused)")
    old = (await c.child(GEN)).pid
    assert nice_values(old) == {base}
    while_loading: dict[int, set[int]] = {}
    request = control_pb2.SwapRequest(role=GEN, model_path=str(model_path(DEFAULT_MODEL)))
    async for p in c.control.Swap(request):
        if p.stage == control_pb2.SWAP_STAGE_PROBING:
            while_loading = {pid: nice_values(pid) for pid in child_pids(os.getpid()) - {old}}
        assert p.stage != FAILED, p.message
    new = (await c.child(GEN)).pid
    assert while_loading == {new: {min(19, base + 10)}}
    assert nice_values(new) == {base}
