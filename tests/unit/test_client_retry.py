"""Retries, deadlines and stream cancellation, against real in-process gRPC servers.

Retries are gRPC's (service config), not ours: a server failing the first attempts with
UNAVAILABLE sees every attempt, and the call still succeeds.
"""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from clients import AsyncClient, Client, errors
from clients._channel import MAX_ATTEMPTS
from clients.testing import FakeLlamad
from llamad_protocol.v1 import common_pb2, control_pb2, control_pb2_grpc

GENERATE = "InferenceService/Generate"
STATUS = "ControlService/Status"


class FlakyControl(control_pb2_grpc.ControlServiceServicer):
    """Status fails with UNAVAILABLE (and a hint) ``failures`` times, then answers."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.invocations = 0

    async def Status(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.invocations += 1
        if self.invocations <= self.failures:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "child starting",
                                (("retry-after-ms", "900"),))
        return control_pb2.StatusResponse(version="flaky-1")


@pytest.fixture
async def flaky() -> AsyncIterator[tuple[FlakyControl, str]]:
    """A real grpc.aio server on port 0 in this event loop, serving FlakyControl."""
    # The RPCs FlakyControl leaves out answer UNIMPLEMENTED through the generated base (whose
    # .pyi declares them abstract).
    servicer = FlakyControl(failures=2)  # type: ignore[abstract]
    server = grpc.aio.server()
    control_pb2_grpc.add_ControlServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield servicer, f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


async def test_unary_unavailable_is_retried_by_grpc(flaky: tuple[FlakyControl, str]) -> None:
    """Two UNAVAILABLE answers, then success: the call succeeds; the server saw 3 calls."""
    servicer, address = flaky
    async with AsyncClient(address) as client:
        status = await client.status()
    assert status.version == "flaky-1"
    assert servicer.invocations == 3


async def test_attempts_are_bounded(flaky: tuple[FlakyControl, str]) -> None:
    """A daemon that keeps refusing: MAX_ATTEMPTS attempts, then Unavailable with the hint."""
    servicer, address = flaky
    servicer.failures = 100
    async with AsyncClient(address) as client:
        with pytest.raises(errors.Unavailable) as err:
            await client.status()
    assert servicer.invocations == MAX_ATTEMPTS
    assert err.value.retry_after == 0.9
    assert err.value.details == "child starting"


def test_sync_client_retries_too(fake: FakeLlamad) -> None:
    """The blocking client gets the same policy: 2 failures absorbed, 3 invocations."""
    fake.fail(STATUS, grpc.StatusCode.UNAVAILABLE, times=2)
    with Client(fake.address) as client:
        assert client.status().child("generation") is not None
    assert fake.calls[STATUS] == 3


def test_other_codes_are_not_retried(fake: FakeLlamad) -> None:
    """INVALID_ARGUMENT and RESOURCE_EXHAUSTED are final: one invocation each."""
    fake.fail(STATUS, grpc.StatusCode.INVALID_ARGUMENT)
    fake.fail("InferenceService/Embed", grpc.StatusCode.RESOURCE_EXHAUSTED, retry_after_ms=5)
    with Client(fake.address) as client:
        with pytest.raises(errors.InvalidArgument):
            client.status()
        with pytest.raises(errors.ResourceExhausted):
            client.embed("x")
    assert fake.calls[STATUS] == 1
    assert fake.calls["InferenceService/Embed"] == 1


def test_stream_is_retried_only_before_its_first_message(fake: FakeLlamad) -> None:
    """A stream refused up front is retried; one failing after a message is not (nothing
    is replayed): the messages already received are kept, then the error is raised."""
    fake.fail(GENERATE, grpc.StatusCode.UNAVAILABLE, times=2)
    with Client(fake.address) as client:
        assert client.generate("hi", max_tokens=3).collect().text == "The quick brown"
        assert fake.calls[GENERATE] == 3
        fake.fail(GENERATE, grpc.StatusCode.UNAVAILABLE, "child died", after=2)
        got = []
        with pytest.raises(errors.Unavailable, match="child died"):
            for chunk in client.generate("hi", max_tokens=5):
                got.append(chunk.text)
    assert got == ["The", " quick"]
    assert fake.calls[GENERATE] == 4


def test_breaking_out_of_a_stream_cancels_it(fake: FakeLlamad) -> None:
    """A `break` out of the for loop cancels the RPC: the server sees the cancellation."""
    fake.endless = True
    with Client(fake.address) as client:
        for n, _ in enumerate(client.generate("go"), 1):
            if n == 3:
                break
        assert fake.wait_cancelled(GENERATE)


def test_close_and_garbage_collection_cancel_a_stream(fake: FakeLlamad) -> None:
    """close(), leaving `with`, and dropping an unfinished stream each cancel it."""
    fake.endless = True
    with Client(fake.address) as client:
        stream = client.generate("go")
        next(stream)
        stream.close()
        assert fake.wait_cancelled(GENERATE)
        with client.chat([("user", "hi")]) as chat:
            next(chat)
        assert fake.wait_cancelled("InferenceService/Chat")
        ask = client.ask("anything")
        next(ask)
        del ask
        gc.collect()
        assert fake.wait_cancelled("AnswerService/Ask")
    assert fake.cancelled == {GENERATE: 1, "InferenceService/Chat": 1, "AnswerService/Ask": 1}


async def test_async_break_cancels_the_stream(fake: FakeLlamad) -> None:
    """Async: breaking out of `async for` cancels the RPC at once."""
    fake.endless = True
    async with AsyncClient(fake.address) as client:
        n = 0
        async for _ in client.generate("go"):
            n += 1
            if n == 3:
                break
        assert await asyncio.to_thread(fake.wait_cancelled, GENERATE)
        texts = []
        async with client.tail_logs("embedding", lines=2, follow=True) as logs:
            async for line in logs:
                texts.append(line.text)
                if len(texts) == 2:
                    break  # the server keeps following until we leave the block
        assert texts == ["line 29", "line 30"]
        assert await asyncio.to_thread(fake.wait_cancelled, "ControlService/TailLogs")


async def test_cancelling_the_task_cancels_the_rpc(fake: FakeLlamad) -> None:
    """Cancelling the asyncio task that reads a stream cancels the RPC."""
    fake.endless = True
    async with AsyncClient(fake.address) as client:
        async def consume() -> None:
            async for _ in client.generate("go"):
                pass

        task = asyncio.create_task(consume())
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await asyncio.to_thread(fake.wait_cancelled, GENERATE)


def test_deadlines(fake: FakeLlamad) -> None:
    """Unary calls get the client's default deadline, streams none unless given; a
    per-call timeout overrides both; a passed deadline raises DeadlineExceeded."""
    fake.delay[STATUS] = 0.5
    with Client(fake.address, timeout=0.2) as client:
        # The reply comes 0.5 s after the call at the earliest: an error, not a reply,
        # shows the 0.2 s deadline was applied (a busy machine can only make both later).
        with pytest.raises(errors.DeadlineExceeded):
            client.status()
        assert client.status(timeout=5).version == "0.0.0-fake"
        with pytest.raises(errors.DeadlineExceeded):
            client.status(timeout=0.1)
        # Streams have no deadline by default: this one outlives the unary default.
        fake.delay[GENERATE] = 0.3
        assert client.generate("hi", max_tokens=2).collect().text == "The quick"
        fake.endless = True
        with pytest.raises(errors.DeadlineExceeded):
            client.generate("hi", timeout=0.3).collect()


async def test_async_client_maps_errors_and_deadlines(fake: FakeLlamad) -> None:
    """Async unary and stream calls raise the same LlamadError subclasses."""
    async with AsyncClient(fake.address, timeout=5) as client:
        with pytest.raises(errors.InvalidArgument, match="query is empty"):
            await client.search("")
        with pytest.raises(errors.NotFound):
            await client.get_document("nope")
        fake.fail(GENERATE, grpc.StatusCode.RESOURCE_EXHAUSTED, retry_after_ms=300)
        with pytest.raises(errors.ResourceExhausted) as busy:
            await client.generate("hi").collect()
        assert busy.value.retry_after == 0.3
        fake.endless = True
        with pytest.raises(errors.DeadlineExceeded):
            await client.generate("hi", timeout=0.2).collect()


def test_cancel_from_another_thread_raises_cancelled(fake: FakeLlamad) -> None:
    """Stream.cancel() (thread-safe) interrupts a blocked iteration with Cancelled."""
    fake.endless = True
    with Client(fake.address) as client:
        stream = client.generate("go")
        next(stream)
        threading.Timer(0.2, stream.cancel).start()
        with pytest.raises(errors.Cancelled):
            for _ in stream:
                pass
    assert fake.wait_cancelled(GENERATE)


async def test_async_stream_cancel_raises_cancelled_not_cancelled_error(
        fake: FakeLlamad) -> None:
    """AsyncStream.cancel() from another task ends the reader with errors.Cancelled, not
    asyncio.CancelledError (which would look like the reader's task was cancelled)."""
    fake.endless = True
    async with AsyncClient(fake.address) as client:
        stream = client.generate("go")
        await anext(stream)
        asyncio.get_running_loop().call_later(0.2, stream.cancel)
        with pytest.raises(errors.Cancelled):
            async for _ in stream:
                pass


def test_set_mode_sends_the_endpoint_and_streams_stages(fake: FakeLlamad) -> None:
    """set_mode builds SetModeRequest from keywords (the key by file name, never its
    value) and streams the stages; an unknown mode is refused before sending."""
    with Client(fake.address) as client:
        stages = [p.stage for p in client.set_mode(
            "embedding", "endpoint", endpoint_url="http://10.0.0.5:8080/v1",
            endpoint_model="bge-small", api_key_file="/etc/llamad/key", reason="offload")]
        with pytest.raises(ValueError, match="mode must be"):
            client.set_mode("generation", "cloud")  # type: ignore[arg-type]
    assert stages == ["validating", "probing", "swapping", "done"]
    sent = fake.last_set_mode
    assert sent is not None
    assert sent.role == common_pb2.CHILD_ROLE_EMBEDDING
    assert sent.mode == control_pb2.INFERENCE_MODE_ENDPOINT
    assert (sent.endpoint.url, sent.endpoint.model, sent.endpoint.api_key_file) == (
        "http://10.0.0.5:8080/v1", "bge-small", "/etc/llamad/key")
    assert sent.reason == "offload"
