"""The gRPC relay of Generate and Chat (issue 27: each message written by the handler with
``context.write``, no generator per message), through a real in-process gRPC server with
the daemon's request guard, the real router and admission, and a scripted backend: what a
caller relies on is all there (every piece in order, usage only in the last message,
logprobs and tool-call deltas, a mid-stream error as UNAVAILABLE after the pieces), and a
caller that cancels or runs out of time stops the backend's stream and frees its slot."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import pytest
from structlog.testing import capture_logs

from daemon.config import Limits
from daemon.grpcapi.inference import InferenceServicer
from daemon.grpcapi.wire import DecodeGuard
from daemon.models.admission import Admission
from daemon.models.router import InferenceRouter
from llamad_protocol.v1 import inference_pb2 as ipb
from llamad_protocol.v1 import inference_pb2_grpc
from supervisor import Chunk, TokenLogprob, TokenLogprobs, ToolCallDelta
from tests.support.backend import FakeBackend, FakeRole
from tests.support.load import patience


@dataclass
class StallingBackend(FakeBackend):
    """Streams its pieces, then waits for ever; records when its stream is closed."""

    closed: asyncio.Event | None = None
    sent: asyncio.Event | None = None

    async def _stream(self) -> AsyncIterator[Chunk]:
        assert self.closed is not None and self.sent is not None
        try:
            for piece in self.pieces:
                yield Chunk(piece, 1)
            self.sent.set()
            await asyncio.Event().wait()
            yield Chunk("", 0, "stop", 1, 1)  # never reached
        finally:
            self.closed.set()


@dataclass
class Served:
    stub: inference_pb2_grpc.InferenceServiceStub
    role: FakeRole


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    role = FakeRole(FakeBackend(), Admission("generation", 1, 4))
    router = InferenceRouter({"generation": role,
                              "embedding": FakeRole(FakeBackend(model_name="emb"))})
    server = grpc.aio.server(interceptors=[DecodeGuard()])
    inference_pb2_grpc.add_InferenceServiceServicer_to_server(
        InferenceServicer(router, Limits()), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield Served(inference_pb2_grpc.InferenceServiceStub(channel), role)
    finally:
        await server.stop(0)


def chat(text: str = "Hi", **sampling: object) -> ipb.ChatRequest:
    return ipb.ChatRequest(messages=[ipb.ChatMessage(role=ipb.CHAT_ROLE_USER, content=text)],
                           sampling=ipb.SamplingParams(**sampling))  # type: ignore[arg-type]


async def texts_then_code(call: AsyncIterator[ipb.GenerateResponse]
                          ) -> tuple[list[str], grpc.StatusCode]:
    """The texts a call streams before it fails, and its status (it must fail)."""
    received: list[str] = []
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for msg in call:
            received.append(msg.text)
    return received, info.value.code()


def stalling(served: Served) -> StallingBackend:
    backend = StallingBackend(closed=asyncio.Event(), sent=asyncio.Event())
    served.role.served = backend
    return backend


async def test_every_piece_in_order_and_usage_only_in_the_last_message(
        served: Served) -> None:
    """Generate and Chat: one message per piece, in order, each with the model and no
    usage; the last has the finish reason and the usage."""
    for call in (served.stub.Generate(ipb.GenerateRequest(prompt="Say hello")),
                 served.stub.Chat(chat())):
        messages = [m async for m in call]
        assert [m.text for m in messages] == ["Hello", ",", " world", ""]
        assert [m.HasField("usage") for m in messages] == [False, False, False, True]
        assert {m.model for m in messages} == {"fake-model"}
        last = messages[-1]
        assert last.finish_reason == ipb.FINISH_REASON_LENGTH
        assert (last.usage.prompt_tokens, last.usage.completion_tokens,
                last.usage.total_tokens) == (7, 3, 10)
    assert served.role.admission.in_flight == 0


async def test_logprobs_and_tool_call_deltas_ride_in_their_pieces_message(
        served: Served) -> None:
    """A piece's logprobs and tool-call deltas arrive in that piece's message."""
    backend = FakeBackend(pieces=["", "", "ok"])
    hello = TokenLogprob("ok", -0.25, b"ok", 7)
    backend.logprobs = [(), (), (TokenLogprobs(hello, (hello,)),)]
    backend.tool_calls = [(ToolCallDelta(0, "call_1", "lookup", '{"q": '),),
                          (ToolCallDelta(0, "", "", '"disk"}'),), ()]
    served.role.served = backend
    messages = [m async for m in served.stub.Chat(chat(logprobs=True, top_logprobs=1))]
    deltas = [[(d.index, d.id, d.name, d.arguments) for d in m.tool_calls]
              for m in messages]
    assert deltas == [[(0, "call_1", "lookup", '{"q": ')], [(0, "", "", '"disk"}')], [], []]
    assert [len(m.logprobs) for m in messages] == [0, 0, 1, 0]
    assert messages[2].logprobs[0].chosen.token == "ok"


async def test_an_error_mid_stream_ends_unavailable_after_the_pieces(served: Served) -> None:
    """A child connection lost after two pieces: the caller has both, then UNAVAILABLE;
    the slot is free again."""
    served.role.served = FakeBackend(fail_stream_after=2)
    received, code = await texts_then_code(served.stub.Chat(chat()))
    assert (received, code) == (["Hello", ","], grpc.StatusCode.UNAVAILABLE)
    assert served.role.admission.in_flight == 0


async def test_a_cancelled_call_closes_the_backends_stream_and_frees_the_slot(
        served: Served) -> None:
    """The caller cancels after its first pieces: the backend's stream (the child's
    connection) is closed, the slot is given back and the call's line says CANCELLED."""
    backend = stalling(served)
    with capture_logs() as logs:
        call = served.stub.Generate(ipb.GenerateRequest(prompt="Say hello"))
        first = await call.read()
        assert isinstance(first, ipb.GenerateResponse) and first.text == "Hello"
        await asyncio.wait_for(backend.sent.wait(), patience(5))  # type: ignore[union-attr]
        call.cancel()
        await asyncio.wait_for(backend.closed.wait(), patience(5))  # type: ignore[union-attr]
        for _ in range(100):
            if served.role.admission.in_flight == 0 and any(
                    e.get("event") == "rpc" for e in logs):
                break
            await asyncio.sleep(0.01)
    assert served.role.admission.in_flight == 0
    lines = [e for e in logs if e.get("event") == "rpc"]
    assert [(e["method"], e["code"]) for e in lines] == [("Generate", "CANCELLED")]


async def test_a_deadline_mid_stream_is_deadline_exceeded_and_closes_the_stream(
        served: Served) -> None:
    """A call whose deadline passes while the backend stalls: DEADLINE_EXCEEDED after
    the pieces it had, the backend's stream closed, the slot free."""
    backend = stalling(served)
    received, code = await texts_then_code(served.stub.Chat(chat(), timeout=0.5))
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert received == ["Hello", ",", " world"]
    await asyncio.wait_for(backend.closed.wait(), patience(5))  # type: ignore[union-attr]
    for _ in range(100):
        if served.role.admission.in_flight == 0:
            break
        await asyncio.sleep(0.01)
    assert served.role.admission.in_flight == 0
