"""Loads that say how far they are (issue 28), with real processes: a supervised fake child
that takes 2 s to load (its /health 503 "loading" and its progress lines), and a real
daemon whose generation child (real llama-server) is still loading, seen by its callers
(gRPC UNAVAILABLE, HTTP 503) and in Status, and a model loading on demand, seen in
ListModels and GET /v1/models."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import httpx
import pytest

from llamad_protocol.v1 import common_pb2, control_pb2, inference_pb2
from llamad_protocol.v1.wire import RETRY_AFTER_KEY
from supervisor import ChildNotReadyError, State, Timeouts
from supervisor.testing.fake_runtime import FakeRuntime
from tests.conftest import models_dir
from tests.support.daemon import Clients, config_env, make_daemon, serving
from tests.support.supervised import fake_model, supervise

pytestmark = pytest.mark.integration

GEMMA = "gemma-3-270m-q4_k_m"


async def test_a_slow_start_shows_its_phase_to_waiting_callers(tmp_path: Path) -> None:
    """While the fake child loads (2 s, /health 503): load_progress() says loading, with
    the seconds growing; a caller gets ChildNotReadyError naming the phase, with a retry
    hint; once running, no progress is reported."""
    timeouts = Timeouts(start=5.0, start_cap=20.0, probe_interval=0.2, probe_timeout=0.5,
                        probe_failures=2, stop_grace=1.0)
    h = supervise(fake_model(tmp_path), FakeRuntime(fault="slow-start", load_seconds=2.0),
                  timeouts=timeouts)
    h.sup.start()
    try:
        seen: list[tuple[str, float]] = []
        deadline = time.monotonic() + 15
        while h.sup.state is not State.RUNNING:
            assert time.monotonic() < deadline, h.states()
            progress = h.sup.load_progress()
            if progress is not None:
                seen.append((progress.phase, progress.seconds))
                if progress.phase == "loading" and progress.seconds > 0.5:
                    with pytest.raises(ChildNotReadyError) as info:
                        _ = h.sup.client
                    assert "loading the model (phase 2 of 4)" in str(info.value)
                    assert info.value.retry_after is not None
                    assert 0.1 <= info.value.retry_after <= 1.0
            await asyncio.sleep(0.05)
        phases = [phase for phase, _ in seen]
        assert "loading" in phases, seen
        assert phases == sorted(phases, key=["launching", "loading", "warming_up",
                                             "probing"].index)  # never back
        loading_seconds = [s for phase, s in seen if phase == "loading"]
        assert max(loading_seconds) >= 1.0  # 2 s of loading, watched from its start
        assert h.sup.load_progress() is None
    finally:
        await h.sup.stop()


async def test_callers_of_a_starting_daemon_are_told_how_far_its_load_is(
        llama_server: str) -> None:
    """Calls made as the daemon starts, before its generation child (SmolLM2 under real
    llama-server) is ready: every gRPC UNAVAILABLE names the load's phase and carries a
    retry hint, every HTTP 503 too (with Retry-After); Status shows the phase and seconds
    while the child starts, and nothing once it runs."""
    env = config_env("llama-server", LLAMAD_EMBEDDING_ENABLED="false",
                     LLAMAD_HTTP_LISTEN="127.0.0.1:0")
    daemon = make_daemon(env)
    clients = Clients(await daemon.start())
    refused = status_seen = 0
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=60) as http:
            url = f"http://127.0.0.1:{daemon.http_port}/v1/completions"
            deadline = time.monotonic() + 120
            while True:
                assert time.monotonic() < deadline
                child = await clients.child(common_pb2.CHILD_ROLE_GENERATION)
                if child.state == control_pb2.CHILD_STATE_RUNNING:
                    assert not child.HasField("loading")
                    break
                if child.state == control_pb2.CHILD_STATE_STARTING:
                    assert child.loading.phase != control_pb2.LOAD_PHASE_UNSPECIFIED
                    status_seen += 1
                request = inference_pb2.GenerateRequest(
                    prompt="Hello", sampling=inference_pb2.SamplingParams(max_tokens=1))
                error = await _refusal(clients.inference.Generate(request, timeout=60))
                if error is not None:
                    assert error.code() is grpc.StatusCode.UNAVAILABLE, error
                    assert "state: starting; " in (error.details() or ""), error.details()
                    assert " of 4), " in (error.details() or "")
                    assert int(dict(error.trailing_metadata() or ())[RETRY_AFTER_KEY]) >= 100
                    refused += 1
                response = await http.post(url, json={"prompt": "Hello", "max_tokens": 1})
                if response.status_code == 503:
                    assert " of 4), " in response.json()["error"]["message"]
                    assert int(response.headers["Retry-After"]) >= 1
                await asyncio.sleep(0.02)
    finally:
        await clients.close()
        await daemon.shutdown()
    # The first look came within milliseconds of start(); the load takes about a second.
    assert refused >= 1 and status_seen >= 1


async def test_a_model_loading_on_demand_shows_its_phase_in_the_listings(
        llama_server: str) -> None:
    """While gemma loads on demand (a call naming it waits for it), ListModels and GET
    /v1/models show its phase and seconds; once ready, neither shows any."""
    env = config_env("llama-server", LLAMAD_MODELS_DIR=str(models_dir()),
                     LLAMAD_GENERATION_PARALLEL="1", LLAMAD_HTTP_LISTEN="127.0.0.1:0")
    async with serving(env) as (daemon, clients), \
            httpx.AsyncClient(trust_env=False, timeout=30) as http:
        request = inference_pb2.GenerateRequest(
            prompt="Hello", model=GEMMA, sampling=inference_pb2.SamplingParams(max_tokens=1))
        call = asyncio.ensure_future(
            _drain(clients.inference.Generate(request, timeout=120)))
        loading_seen = ready = False
        deadline = time.monotonic() + 120
        while not ready:
            assert time.monotonic() < deadline
            listed = await clients.control.ListModels(control_pb2.ListModelsRequest())
            gemma = next(m for m in listed.models if m.name == GEMMA)
            page = (await http.get(f"http://127.0.0.1:{daemon.http_port}/v1/models")).json()
            entry = next(m for m in page["data"] if m["id"] == GEMMA)
            if gemma.state == control_pb2.MODEL_STATE_LOADING:
                loading_seen = True
                assert gemma.loading.phase != control_pb2.LOAD_PHASE_UNSPECIFIED
            ready = gemma.state == control_pb2.MODEL_STATE_READY
            if ready:
                assert not gemma.HasField("loading")
                assert "loading" not in entry
            elif "loading" in entry:
                assert entry["loading"]["phase"] in ("launching", "loading", "warming_up",
                                                     "probing")
                assert entry["loading"]["seconds"] >= 0
            await asyncio.sleep(0.02)
        assert await call >= 1
        assert loading_seen  # looked at every 20 ms during a load of about a second


async def _drain(stream: object) -> int:
    return len([m async for m in stream])  # type: ignore[attr-defined]


async def _refusal(stream: object) -> grpc.aio.AioRpcError | None:
    """The error a streaming call ends with, None when it succeeds."""
    try:
        await _drain(stream)
    except grpc.aio.AioRpcError as exc:
        return exc
    return None
