"""Per-token quotas through the real servers in-process (issue 28): a real gRPC server on
port 0 with the auth interceptor, and the HTTP API on port 0, over scripted backends and
an injected clock. A token with rpm=2 gets its third call refused (RESOURCE_EXHAUSTED
with RetryInfo; HTTP 429 with Retry-After in the route's error shape), another token is
unaffected, and once the window has moved the token works again."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from structlog.testing import capture_logs

from daemon.config import AuthSettings, Limits
from daemon.config.access import load_tokens
from daemon.grpcapi.auth import AuthInterceptor
from daemon.grpcapi.inference import InferenceServicer
from daemon.models.admission import Admission
from daemon.models.router import InferenceRouter
from daemon.services.quotas import Quotas
from daemon.telemetry.metrics import Metrics
from llamad_protocol.v1 import inference_pb2 as ipb
from llamad_protocol.v1 import inference_pb2_grpc
from llamad_protocol.v1.wire import STATUS_DETAILS_KEY
from tests.support.backend import FakeBackend, FakeRole
from tests.support.httpapi import client, serving

LIMITED = "limited-token-0123456789abcdef"
FREE = "free-token-0123456789abcdef"
BATCH = "batch-token-0123456789abcdef"
THRIFTY = "thrifty-token-0123456789abcdef"
TOKENS = (f"read {LIMITED} class=etl rpm=2\n"
          f"read {FREE} class=people\n"
          f"read {BATCH} class=nightly lane=batch\n"
          f"read {THRIFTY} class=thrifty tpm=10\n")


class Clock:
    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Served:
    auth: AuthInterceptor
    clock: Clock
    metrics: Metrics
    gen: FakeBackend | None = None


def interceptor(tmp_path: Path, mode: str = "enforce") -> Served:
    """The auth interceptor over :data:`TOKENS`, its quotas on an injected clock (60 s)."""
    path = tmp_path / "tokens"
    path.write_text(TOKENS)
    path.chmod(0o600)
    tokens = load_tokens(path)
    metrics = Metrics()
    auth = AuthInterceptor(tokens, metrics, AuthSettings(quota_mode=mode))
    clock = Clock()
    auth.quotas = Quotas(mode, 60.0, clock=clock, metrics=metrics)
    auth.quotas.keep(tokens.entries)
    return Served(auth, clock, metrics)


def md(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def retry_ms(error: grpc.aio.AioRpcError) -> int:
    """The RetryInfo delay of a refusal's status details, in milliseconds."""
    raw = dict(error.trailing_metadata() or ())[STATUS_DETAILS_KEY]
    status = status_pb2.Status.FromString(raw)
    infos = [d for d in status.details if d.Is(error_details_pb2.RetryInfo.DESCRIPTOR)]
    info = error_details_pb2.RetryInfo()
    infos[0].Unpack(info)
    return int(info.retry_delay.ToMilliseconds())


@pytest.fixture
async def grpc_stub(tmp_path: Path) -> AsyncIterator[tuple[
        inference_pb2_grpc.InferenceServiceStub, Served]]:
    served = interceptor(tmp_path)
    served.gen = FakeBackend()
    router = InferenceRouter({
        "generation": FakeRole(served.gen),
        "embedding": FakeRole(FakeBackend(model_name="emb"), Admission("embedding", 2, 4))})
    server = grpc.aio.server(interceptors=[served.auth])
    inference_pb2_grpc.add_InferenceServiceServicer_to_server(
        InferenceServicer(router, Limits(), served.metrics), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield inference_pb2_grpc.InferenceServiceStub(channel), served
    finally:
        await server.stop(0)


async def test_grpc_rpm_refuses_the_third_call_with_retry_info_then_recovers(
        grpc_stub: tuple[inference_pb2_grpc.InferenceServiceStub, Served]) -> None:
    """Embed with rpm=2: OK, OK, then RESOURCE_EXHAUSTED naming the quota, RetryInfo and
    retry-after-ms 50 s (the first call leaves the window then); another token goes on;
    after 50 s the token works again. Tokenize spends no model time: never counted."""
    stub, served = grpc_stub
    request = ipb.EmbedRequest(texts=["disk full"])
    await stub.Embed(request, metadata=md(LIMITED))
    served.clock.now += 10
    await stub.Embed(request, metadata=md(LIMITED))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Embed(request, metadata=md(LIMITED))
    error = info.value
    assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "quota exceeded" in (error.details() or "") and "class etl" in (
        error.details() or "")
    assert LIMITED not in (error.details() or "")
    assert retry_ms(error) == 50_000
    assert dict(error.trailing_metadata() or ())["retry-after-ms"] == "50000"
    for _ in range(3):
        await stub.Embed(request, metadata=md(FREE))
        await stub.Tokenize(ipb.TokenizeRequest(text="hi"), metadata=md(LIMITED))
    served.clock.now += 50
    await stub.Embed(request, metadata=md(LIMITED))
    text = served.metrics.render().decode()
    assert 'llamad_quota_exceeded_total{class="etl",limit="requests",mode="enforce"} 1.0' \
        in text
    assert LIMITED not in text and FREE not in text


async def test_grpc_streams_count_their_tokens_when_they_end(
        grpc_stub: tuple[inference_pb2_grpc.InferenceServiceStub, Served]) -> None:
    """tpm=10: a Generate stream of 7 prompt and 3 generated tokens runs to its end; the
    next call is refused on tokens until it leaves the window."""
    stub, served = grpc_stub
    request = ipb.GenerateRequest(prompt="hello")
    first = [m async for m in stub.Generate(request, metadata=md(THRIFTY))]
    assert first[-1].usage.prompt_tokens + first[-1].usage.completion_tokens == 10
    with pytest.raises(grpc.aio.AioRpcError) as info:
        _ = [m async for m in stub.Generate(request, metadata=md(THRIFTY))]
    assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "used 10 tokens of its 10" in (info.value.details() or "")
    served.clock.now += 60
    assert [m async for m in stub.Generate(request, metadata=md(THRIFTY))]


async def test_grpc_streams_ended_early_still_count_what_they_streamed(
        grpc_stub: tuple[inference_pb2_grpc.InferenceServiceStub, Served]) -> None:
    """tpm=10: streams that end after one token, before any usage (the child dropped
    them: the path of a client leaving early too), count that token each, so the
    eleventh is refused: a stream cut short cannot dodge the quota."""
    stub, served = grpc_stub
    assert served.gen is not None
    served.gen.fail_stream_after = 1
    request = ipb.GenerateRequest(prompt="hello")
    for _ in range(10):
        with pytest.raises(grpc.aio.AioRpcError) as dropped:
            _ = [m async for m in stub.Generate(request, metadata=md(THRIFTY))]
        assert dropped.value.code() is grpc.StatusCode.UNAVAILABLE
    with pytest.raises(grpc.aio.AioRpcError) as info:
        _ = [m async for m in stub.Generate(request, metadata=md(THRIFTY))]
    assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "used 10 tokens of its 10" in (info.value.details() or "")


async def test_http_rpm_refuses_with_429_retry_after_in_each_routes_shape(
        tmp_path: Path) -> None:
    """HTTP: OpenAI's routes answer 429, Retry-After: 50 (whole seconds), type
    rate_limit_error, code rate_limit_exceeded; /v1/messages answers in Anthropic's
    shape; another token is unaffected; after the window the token works again."""
    served = interceptor(tmp_path)
    chat = {"model": "gen.gguf", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4}
    async with serving(auth=served.auth) as api, client() as http:
        url = api.url + "/v1/chat/completions"
        for _ in range(2):
            ok = await http.post(url, json=chat, headers={"Authorization": f"Bearer {LIMITED}"})
            assert ok.status_code == 200, ok.text
            served.clock.now += 5
        refused = await http.post(url, json=chat,
                                  headers={"Authorization": f"Bearer {LIMITED}"})
        assert refused.status_code == 429
        assert refused.headers["Retry-After"] == "50"
        error = refused.json()["error"]
        assert (error["type"], error["code"]) == ("rate_limit_error", "rate_limit_exceeded")
        assert LIMITED not in refused.text
        messages = await http.post(api.url + "/v1/messages", headers={"x-api-key": LIMITED},
                                   json={"model": "gen.gguf", "max_tokens": 4,
                                         "messages": [{"role": "user", "content": "hi"}]})
        assert messages.status_code == 429 and messages.headers["Retry-After"] == "50"
        assert messages.json()["type"] == "error"
        assert messages.json()["error"]["type"] == "rate_limit_error"
        other = await http.post(url, json=chat, headers={"Authorization": f"Bearer {FREE}"})
        assert other.status_code == 200
        served.clock.now += 50
        again = await http.post(url, json=chat, headers={"Authorization": f"Bearer {LIMITED}"})
        assert again.status_code == 200


async def test_http_shadow_mode_serves_and_a_batch_token_waits_in_batch(
        tmp_path: Path) -> None:
    """Shadow: the third call is served, its summary line notes quota_shadow and the
    metric counts it (mode=shadow); a batch token's call travels in the batch lane though
    it asked for none; every summary line names the token's class, never the token."""
    served = interceptor(tmp_path, mode="shadow")
    chat = {"model": "gen.gguf", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4}
    async with serving(auth=served.auth) as api, client() as http:
        url = api.url + "/v1/chat/completions"
        with capture_logs() as logs:
            for _ in range(3):
                response = await http.post(url, json=chat,
                                           headers={"Authorization": f"Bearer {LIMITED}"})
                assert response.status_code == 200
            batch = await http.post(url, json=chat,
                                    headers={"Authorization": f"Bearer {BATCH}"})
            assert batch.status_code == 200
    lines = [line for line in logs if line["event"] == "http"]
    assert [line.get("quota_shadow") for line in lines] == [None, None, "requests", None]
    assert [line["token_class"] for line in lines] == ["etl"] * 3 + ["nightly"]
    assert lines[-1]["lane"] == "batch" and "lane" not in lines[0]
    assert not any(secret in repr(logs) for secret in (LIMITED, BATCH))
    text = served.metrics.render().decode()
    assert 'llamad_quota_exceeded_total{class="etl",limit="requests",mode="shadow"} 1.0' \
        in text


async def test_a_reload_changes_the_mode_and_keeps_the_windows(
        grpc_stub: tuple[inference_pb2_grpc.InferenceServiceStub, Served]) -> None:
    """set_tokens (SIGHUP) with quota_mode shadow: the refused token is served; back to
    enforce, its window (kept across both reloads) refuses it again."""
    stub, served = grpc_stub
    request = ipb.EmbedRequest(texts=["x"])
    tokens = served.auth.tokens
    for _ in range(2):
        await stub.Embed(request, metadata=md(LIMITED))
    with pytest.raises(grpc.aio.AioRpcError):
        await stub.Embed(request, metadata=md(LIMITED))
    served.auth.set_tokens(tokens, AuthSettings(quota_mode="shadow"))
    await stub.Embed(request, metadata=md(LIMITED))
    served.auth.set_tokens(tokens, AuthSettings(quota_mode="enforce"))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Embed(request, metadata=md(LIMITED))
    assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
