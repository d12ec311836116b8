"""Health from outcomes (issue 28) with a real llama-server child: a child frozen
mid-generation (SIGSTOP: no token, no answer to a probe or to its serving loop) is taken
out of service by its outcomes, before ``/health`` probing (left at its defaults, 3 x 5 s)
would call it hung; the caller streaming from it gets UNAVAILABLE naming the cause within
10 s; the frozen child is killed (SIGTERM cannot reach a stopped process: SIGKILL after
the grace) and a new child serves. Healthy children under the same watch are left alone:
a long generation and a run of short calls are never interrupted.

SIGSTOP also silences ``/health``, unlike the wedges users report (a serving loop stuck
while the HTTP threads answer); those are the fake child's ``wedge-hang`` and
``wedge-fail`` (test_faults_outcomes.py). Nothing here depends on the model's speed: the
generation cannot end (every end-of-generation token banned) and is frozen, not timed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import grpc
import pytest

from llamad_protocol.v1 import common_pb2, control_pb2, inference_pb2
from tests.conftest import SMALL_MODEL, model_path
from tests.support.daemon import config_env, serving
from tests.support.endless import never_end
from tests.support.procs import alive

pytestmark = pytest.mark.integration


async def test_a_child_frozen_mid_generation_is_replaced_and_its_caller_told(
        llama_server: str) -> None:
    env = config_env("llama-server", LLAMAD_EMBEDDING_MODE="disabled",
                     LLAMAD_RETRIEVAL_ENABLED="false",
                     # /health probing at its defaults: it would need 15 s.
                     LLAMAD_CHILD_PROBE_INTERVAL="5", LLAMAD_CHILD_PROBE_FAILURES="3")
    async with serving(env) as (daemon, clients):
        model = daemon.children["generation"]
        frozen = model.serving_pid
        endless = inference_pb2.SamplingParams(
            max_tokens=8000, temperature=0.0, logit_bias=never_end(model_path(SMALL_MODEL)))

        # A healthy child streaming for a while, and a run of short calls, are left alone.
        long = clients.inference.Generate(inference_pb2.GenerateRequest(
            prompt="Count:", sampling=inference_pb2.SamplingParams(
                max_tokens=300, temperature=0.0,
                logit_bias=never_end(model_path(SMALL_MODEL)))), timeout=120)
        short = [clients.inference.Generate(inference_pb2.GenerateRequest(
            prompt=f"Say {i}", sampling=inference_pb2.SamplingParams(max_tokens=4)),
            timeout=120) for i in range(6)]
        assert [m async for m in long][-1].usage.completion_tokens == 300
        for call in short:
            assert [m async for m in call][-1].finish_reason
        assert model.serving_pid == frozen

        stream = clients.inference.Generate(inference_pb2.GenerateRequest(
            prompt="Count:", sampling=endless), timeout=120)
        first = await stream.read()
        assert first.text
        os.kill(frozen, signal.SIGSTOP)
        began = time.monotonic()
        try:
            with pytest.raises(grpc.aio.AioRpcError) as ended:
                while await stream.read() is not grpc.aio.EOF:
                    pass
            took = time.monotonic() - began
            assert took < 10, took
            assert ended.value.code() is grpc.StatusCode.UNAVAILABLE
            details = ended.value.details() or ""
            assert "taken out of service" in details
            assert "probe got no answer" in details

            deadline = time.monotonic() + 10
            while alive(frozen) and time.monotonic() < deadline:  # noqa: ASYNC110 (a process)
                await asyncio.sleep(0.05)
            assert not alive(frozen)
        finally:
            if alive(frozen):
                os.kill(frozen, signal.SIGKILL)

        await clients.wait_serving(timeout=120)
        served = [m async for m in clients.inference.Generate(inference_pb2.GenerateRequest(
            prompt="The capital of France is",
            sampling=inference_pb2.SamplingParams(max_tokens=4)), timeout=120)]
        assert served[-1].finish_reason
        assert model.serving_pid not in (0, frozen)
        status = await clients.control.Status(control_pb2.StatusRequest())
        child = next(c for c in status.children
                     if c.role == common_pb2.CHILD_ROLE_GENERATION)
        assert child.last_exit.kind == "probe_stalled"
        assert child.restarts >= 1
