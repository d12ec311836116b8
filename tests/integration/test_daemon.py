"""The daemon end to end: real llama.cpp children (both runtimes) on real GGUF models, a
real gRPC server on port 0, real clients."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest

from daemon import Daemon
from llamad_protocol.v1 import control_pb2
from llamad_protocol.v1 import inference_pb2 as pb
from tests.conftest import RUNTIMES, SMALL_MODEL, model_path
from tests.support.abandoned import abandon_a_long_generation
from tests.support.child_http import generation_idle
from tests.support.daemon import (
    EMB,
    GEN,
    NOT_SERVING,
    SERVING,
    Clients,
    config_env,
    make_daemon,
    serving,
)
from tests.support.endless import never_end
from tests.support.procs import alive

pytestmark = pytest.mark.integration



@pytest.fixture(params=RUNTIMES)
def runtime(request: pytest.FixtureRequest, llama_server: str) -> str:
    return str(request.param)


@pytest.fixture
async def running(runtime: str) -> AsyncIterator[tuple[Daemon, Clients]]:
    # /slots on: the cancellation test looks at the child's slots (as root, over its socket).
    async with serving(config_env(runtime, LLAMAD_CHILD_SLOTS="true")) as pair:
        yield pair


async def test_generate_streams_tokens_then_usage(running: tuple[Daemon, Clients]) -> None:
    """Generate streams text as produced; the last message has finish reason and usage."""
    _, c = running
    msgs = [m async for m in c.inference.Generate(pb.GenerateRequest(
        prompt="The three primary colors are", sampling=pb.SamplingParams(max_tokens=16)))]
    assert len(msgs) >= 4  # streamed, not one blob
    text = "".join(m.text for m in msgs)
    assert text.strip()
    last = msgs[-1]
    assert last.finish_reason in (pb.FINISH_REASON_LENGTH, pb.FINISH_REASON_STOP)
    assert 3 <= last.usage.completion_tokens <= 16
    if last.finish_reason == pb.FINISH_REASON_LENGTH:
        assert last.usage.completion_tokens == 16
    assert sum(m.tokens for m in msgs) == last.usage.completion_tokens
    assert last.usage.time_to_first_token_ms > 0
    assert last.model == SMALL_MODEL
    assert not any(m.HasField("usage") for m in msgs[:-1])


async def test_generate_is_deterministic_when_greedy(running: tuple[Daemon, Clients]) -> None:
    """Temperature 0 gives the same text twice (the child really generates it)."""
    _, c = running
    req = pb.GenerateRequest(prompt="Once upon a time",
                             sampling=pb.SamplingParams(max_tokens=12, temperature=0.0))
    first = "".join([m.text async for m in c.inference.Generate(req)])
    second = "".join([m.text async for m in c.inference.Generate(req)])
    assert first == second
    assert len(first) > 10


async def test_chat_streams(running: tuple[Daemon, Clients]) -> None:
    """Chat formats the messages with the model's template and streams the answer."""
    _, c = running
    msgs = [m async for m in c.inference.Chat(pb.ChatRequest(
        messages=[pb.ChatMessage(role=pb.CHAT_ROLE_SYSTEM, content="You are terse."),
                  pb.ChatMessage(role=pb.CHAT_ROLE_USER, content="Name a color.")],
        sampling=pb.SamplingParams(max_tokens=8)))]
    assert "".join(m.text for m in msgs)
    assert msgs[-1].finish_reason in (pb.FINISH_REASON_LENGTH, pb.FINISH_REASON_STOP)
    assert msgs[-1].usage.completion_tokens >= 1


async def test_tokenize_and_embed_return_real_values(running: tuple[Daemon, Clients]) -> None:
    """Tokenize uses the model's tokenizer; Embed returns 384-d vectors that mean something."""
    _, c = running
    short = await c.inference.Tokenize(pb.TokenizeRequest(text="hello"))
    long = await c.inference.Tokenize(pb.TokenizeRequest(text="hello world, how are you today?"))
    assert 1 <= short.count < long.count
    assert list(long.tokens)[: short.count] != [] and len(long.tokens) == long.count
    emb = await c.inference.Embed(pb.EmbedRequest(texts=[
        "a cat sat on the mat", "a kitten rested on the rug", "quarterly tax filing deadline"]))
    assert emb.dimension == 384
    vectors = np.array([e.values for e in emb.embeddings])
    assert vectors.shape == (3, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-4)
    sims = vectors @ vectors.T
    assert sims[0, 1] > sims[0, 2] + 0.2
    raw = await c.inference.Embed(pb.EmbedRequest(texts=["a cat sat on the mat"],
                                                   normalize=False))
    plain = np.array(raw.embeddings[0].values)
    # The same direction (batched with others, a text's vector may differ by ~1e-5).
    assert float(plain @ vectors[0]) / float(np.linalg.norm(plain)) > 0.99999
    etok = await c.inference.Tokenize(pb.TokenizeRequest(text="hello", role=EMB))
    assert etok.count >= 1


async def test_kill9_child_comes_back_and_serves(running: tuple[Daemon, Clients]) -> None:
    """SIGKILL of the generation child: health drops, the child restarts, calls succeed."""
    _, c = running
    before = await c.child(GEN)
    assert before.state == control_pb2.CHILD_STATE_RUNNING
    os.kill(before.pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while True:
        now = await c.child(GEN)
        if now.state == control_pb2.CHILD_STATE_RUNNING and now.pid != before.pid:
            break
        assert time.monotonic() < deadline, "child never came back"
        await asyncio.sleep(0.1)
    assert now.restarts == before.restarts + 1
    assert now.last_exit.signal == "SIGKILL"
    assert not alive(before.pid)
    text = "".join([m.text async for m in c.inference.Generate(pb.GenerateRequest(
        prompt="Hello", sampling=pb.SamplingParams(max_tokens=4)))])
    assert text
    assert await c.status("generation") == SERVING


async def test_status_reports_children(running: tuple[Daemon, Clients], runtime: str) -> None:
    """Status shows state, pid, model path and SHA-256, runtime, socket, breaker."""
    _, c = running
    await asyncio.sleep(0.5)  # the SHA-256 is computed in the background
    gen = await c.child(GEN)
    assert gen.enabled
    assert gen.pid > 0
    assert alive(gen.pid)
    assert gen.socket.endswith(".sock") and gen.port == 0  # a private socket, no TCP
    assert gen.model_path.endswith(SMALL_MODEL)
    assert gen.runtime == ("llama-server" if runtime == "llama-server" else "llama-cpp-python")
    assert gen.breaker == control_pb2.BREAKER_STATE_CLOSED
    assert gen.model_architecture == "llama"
    # OpenMP threads spin briefly at barriers ({role}.spin_count), then sleep.
    environ = Path(f"/proc/{gen.pid}/environ").read_bytes().split(b"\0")
    assert b"GOMP_SPINCOUNT=300" in environ
    deadline = time.monotonic() + 20
    while not (await c.child(GEN)).model_sha256:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.2)
    import hashlib

    digest = hashlib.sha256(Path(gen.model_path).read_bytes()).hexdigest()
    assert (await c.child(GEN)).model_sha256 == digest
    emb = await c.child(EMB)
    assert emb.model_context_length == 512
    environ = Path(f"/proc/{emb.pid}/environ").read_bytes().split(b"\0")
    assert b"GOMP_SPINCOUNT=3000" in environ


async def test_cancel_stops_generation_in_the_child(running: tuple[Daemon, Clients],
                                                   runtime: str) -> None:
    """A client cancelling a stream makes the child stop generating for it."""
    _, c = running
    await abandon_a_long_generation(c)
    gen = await c.child(GEN)
    if runtime == "llama-server":
        assert await generation_idle(gen.socket, gen.pid), "the child kept generating"
    # The bundled runtime serves one request at a time: if the abandoned generation went
    # on (3000 tokens), this call would wait behind it for tens of seconds.
    began = time.monotonic()
    out = [m async for m in c.inference.Generate(pb.GenerateRequest(
        prompt="Hi", sampling=pb.SamplingParams(max_tokens=3)), timeout=20)]
    assert out
    assert time.monotonic() - began < 10


async def test_deadline_propagates(running: tuple[Daemon, Clients]) -> None:
    """A deadline that passes mid-stream ends the call with DEADLINE_EXCEEDED (the
    generation cannot end first: every end-of-generation token is banned)."""
    _, c = running
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in c.inference.Generate(pb.GenerateRequest(
                prompt="Count to one thousand:", sampling=pb.SamplingParams(
                    max_tokens=3000, logit_bias=never_end(model_path(SMALL_MODEL)))),
                timeout=1.0):
            pass
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    out = [m async for m in c.inference.Generate(pb.GenerateRequest(
        prompt="Hi", sampling=pb.SamplingParams(max_tokens=3)), timeout=20)]
    assert out


async def test_bad_requests_get_invalid_argument(running: tuple[Daemon, Clients]) -> None:
    """Invalid input is refused with INVALID_ARGUMENT and a message naming the field."""
    _, c = running
    cases = [
        (pb.GenerateRequest(prompt=""), "prompt is empty"),
        (pb.GenerateRequest(prompt="x", sampling=pb.SamplingParams(max_tokens=0)), "max_tokens"),
        (pb.GenerateRequest(prompt="x", sampling=pb.SamplingParams(max_tokens=10**9)),
         "max_tokens"),
        (pb.GenerateRequest(prompt="x", sampling=pb.SamplingParams(temperature=float("nan"))),
         "temperature"),
    ]
    for request, needle in cases:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in c.inference.Generate(request):
                pass
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert needle in (err.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await c.inference.Embed(pb.EmbedRequest(texts=["word " * 3000]))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "context" in (err.value.details() or "")


async def test_tail_logs_has_child_output(running: tuple[Daemon, Clients]) -> None:
    """TailLogs returns the child's buffered output lines with its pid."""
    _, c = running
    gen = await c.child(GEN)
    lines = [ln async for ln in c.control.TailLogs(control_pb2.TailLogsRequest(lines=20))]
    assert 0 < len(lines) <= 20
    assert any(ln.pid == gen.pid for ln in lines)
    seqs = [ln.seq for ln in lines]
    assert seqs == sorted(seqs)


@pytest.mark.parametrize("runtime", ["llama-server"])
async def test_corrupt_model_opens_breaker_at_once(tmp_path: Path, runtime: str,
                                                  llama_server: str) -> None:
    """A truncated GGUF fails once with the cause in Status; calls get UNAVAILABLE fast."""
    bad = tmp_path / "truncated.gguf"
    with open(model_path(SMALL_MODEL), "rb") as src:
        bad.write_bytes(src.read(3_000_000))
    daemon = make_daemon(config_env(runtime, LLAMAD_GENERATION_MODEL=str(bad),
                                    LLAMAD_EMBEDDING_ENABLED="false"))
    address = await daemon.start()
    c = Clients(address)
    try:
        deadline = time.monotonic() + 20
        while (gen := await c.child(GEN)).state != control_pb2.CHILD_STATE_FAILED:
            assert time.monotonic() < deadline, gen
            await asyncio.sleep(0.1)
        assert gen.breaker == control_pb2.BREAKER_STATE_OPEN
        assert gen.last_exit.permanent
        assert gen.last_exit.kind == "invalid_model"
        assert "truncated" in gen.last_exit.message
        assert gen.restarts == 0
        began = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in c.inference.Generate(pb.GenerateRequest(prompt="hi")):
                pass
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert time.monotonic() - began < 1.0
        assert await c.status("") == NOT_SERVING
        emb = await c.child(EMB)
        assert not emb.enabled
    finally:
        await c.close()
        await daemon.shutdown()


async def test_unavailable_with_retry_hint_while_starting(tmp_path: Path,
                                                         llama_server: str) -> None:
    """While the child is starting, calls fail fast with UNAVAILABLE and retry-after-ms."""
    from supervisor.testing.fake_runtime import FakeRuntime

    model = tmp_path / "fake.gguf"
    shutil.copy(model_path(SMALL_MODEL), model)
    daemon = make_daemon(config_env("llama-server", LLAMAD_GENERATION_MODEL=str(model),
                                    LLAMAD_EMBEDDING_ENABLED="false"))
    # Slow the start down with the fake child: 5 s of "loading".
    child = daemon.children["generation"]
    child.supervisor.launcher.runtime = FakeRuntime(load_seconds=5)  # type: ignore[attr-defined]
    address = await daemon.start()
    c = Clients(address)
    try:
        began = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in c.inference.Generate(pb.GenerateRequest(prompt="hi")):
                pass
        assert time.monotonic() - began < 1.0
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        trailers = dict(err.value.trailing_metadata() or ())
        assert int(trailers["retry-after-ms"]) > 0
        assert "grpc-status-details-bin" in trailers
        assert "starting" in (err.value.details() or "")
    finally:
        await c.close()
        await daemon.shutdown()


async def test_busy_child_refuses_past_queue_with_retry_hint(llama_server: str) -> None:
    """The bundled runtime serves one call; with no queue the next gets RESOURCE_EXHAUSTED."""
    async with serving(config_env("bundled", LLAMAD_EMBEDDING_ENABLED="false",
                                  LLAMAD_LIMITS_QUEUE_SIZE="0")) as (_, c):
        long = c.inference.Generate(pb.GenerateRequest(
            prompt="Tell a long story.", sampling=pb.SamplingParams(
                max_tokens=200, logit_bias=never_end(model_path(SMALL_MODEL)))))
        await long.read()
        status = await c.child(GEN)
        assert (status.slots, status.in_flight) == (1, 1)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in c.inference.Generate(pb.GenerateRequest(prompt="hi")):
                pass
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert int(dict(err.value.trailing_metadata() or ())["retry-after-ms"]) > 0
        long.cancel()


async def test_metrics_endpoint_counts_what_happened(llama_server: str) -> None:
    """Prometheus metrics on the loopback port reflect calls, tokens, restarts and exits."""
    from prometheus_client.parser import text_string_to_metric_families

    async with serving(config_env("llama-server", LLAMAD_EMBEDDING_ENABLED="false",
                                  LLAMAD_METRICS_LISTEN="127.0.0.1:0")) as (daemon, c):
        msgs = [m async for m in c.inference.Generate(pb.GenerateRequest(
            prompt="Hello there", sampling=pb.SamplingParams(max_tokens=6)))]
        gen = await c.child(GEN)
        os.kill(gen.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while (await c.child(GEN)).pid in (0, gen.pid) or (
                await c.child(GEN)).state != control_pb2.CHILD_STATE_RUNNING:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        assert daemon._metrics_server is not None
        url = f"http://127.0.0.1:{daemon._metrics_server.port}/metrics"
        async with httpx.AsyncClient(trust_env=False) as http:
            resp = await http.get(url)
        assert resp.status_code == 200
        values: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        for family in text_string_to_metric_families(resp.text):
            for s in family.samples:
                values[(s.name, frozenset(s.labels.items()))] = s.value

        def v(name: str, **labels: str) -> float:
            return values.get((name, frozenset(labels.items())), 0.0)

        # Per-call series carry the model (its catalog name) beside the role (issue 28).
        model = daemon.config.catalog.defaults["generation"]
        labels = {"role": "generation", "model": model}
        assert v("llamad_requests_total", protocol="grpc", method="Generate", code="OK") == 1
        assert v("llamad_tokens_generated_total", **labels) == msgs[-1].usage.completion_tokens
        assert v("llamad_time_to_first_token_seconds_count", **labels) == 1
        assert v("llamad_model_calls_total", **labels, outcome="ok") == 1
        assert v("llamad_child_restarts_total", **labels) == 1
        assert v("llamad_child_exits_total", **labels, kind="signal") == 1
        assert v("llamad_child_state", **labels, state="running") == 1
        assert v("llamad_child_state", **labels, state="backoff") == 0


async def test_roles_fail_independently(llama_server: str) -> None:
    """With the embedding child down, Embed fails fast while generation serves; and back."""
    async with serving(config_env("llama-server")) as (daemon, c):
        await daemon.children["embedding"].supervisor.stop()
        began = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.inference.Embed(pb.EmbedRequest(texts=["x"]))
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "embedding child is not running" in (err.value.details() or "")
        assert time.monotonic() - began < 1.0
        assert [m async for m in c.inference.Generate(pb.GenerateRequest(
            prompt="Hi", sampling=pb.SamplingParams(max_tokens=2)))]
        assert await c.status("embedding") == NOT_SERVING
        assert await c.status("generation") == SERVING
        assert await c.status("") == NOT_SERVING
        daemon.children["embedding"].supervisor.start()
        await c.wait_serving("embedding")
        await daemon.children["generation"].supervisor.stop()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in c.inference.Generate(pb.GenerateRequest(prompt="Hi")):
                pass
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        emb = await c.inference.Embed(pb.EmbedRequest(texts=["still embedding"]))
        assert emb.dimension == 384
        assert await c.status("llamad.v1.InferenceService") == NOT_SERVING
