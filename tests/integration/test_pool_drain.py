"""Draining counts every model (issue 26): a call streaming from a model the pool loaded on
demand is a call in flight, for SetDraining's count and ``llamad drain --wait``, like a
call on a role's default model; the agent check counts its busy slot; Status, the metrics
and systemd's status line show it."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

import grpc
import pytest

from llamad_protocol.v1 import control_pb2, inference_pb2
from tests.conftest import models_dir
from tests.support.daemon import Clients, config_env, serving
from tests.support.endless import never_end
from tests.support.procs import alive

pytestmark = pytest.mark.integration

GEMMA = "gemma-3-270m-q4_k_m"  # not a role's default: loaded when a call names it
WAITING = 3.0  # seconds ``drain --wait`` is watched for returning early (6 of its polls)


def endless_gemma(clients: Clients) -> Any:
    """A Generate stream on gemma (loaded on demand) that cannot end by itself: every
    end-of-generation token banned, far more tokens asked for than it can make before it
    is cancelled."""
    return clients.inference.Generate(inference_pb2.GenerateRequest(
        prompt="Count to one thousand:", model=GEMMA,
        sampling=inference_pb2.SamplingParams(
            max_tokens=8192, temperature=0.0,
            logit_bias=never_end(models_dir() / f"{GEMMA}.gguf"))), timeout=300)


async def test_drain_wait_waits_for_an_on_demand_models_stream(llama_server: str) -> None:
    env = config_env("llama-server", LLAMAD_MODELS_DIR=str(models_dir()),
                     LLAMAD_GENERATION_PARALLEL="1", LLAMAD_AGENT_LISTEN="127.0.0.1:0")
    async with serving(env) as (daemon, clients):
        stream = endless_gemma(clients)
        first = await stream.read()
        assert first.model_name == GEMMA and first.text
        assert daemon.children["generation"].busy() == 0  # nothing on the roles' models
        status = await clients.control.Status(control_pb2.StatusRequest())
        assert {m.name: m.in_flight for m in status.models if m.in_flight} == {GEMMA: 1}
        # The metrics count it under its model (issue 28), systemd's status line names
        # its child.
        assert daemon.metrics.registry.get_sample_value(
            "llamad_requests_in_flight", {"role": "generation", "model": GEMMA}) == 1
        assert daemon.metrics.registry.get_sample_value(
            "llamad_requests_in_flight",
            {"role": "generation", "model": daemon.config.catalog.defaults["generation"]}) == 0
        gemma = daemon.pool.model(GEMMA)
        assert gemma is not None
        assert f"{GEMMA}: running (pid {gemma.serving_pid})" in daemon.status_line()
        # The agent check weighs gemma's busy slot with the roles' free ones.
        reader, writer = await asyncio.open_connection("127.0.0.1", daemon.agent_port)
        reply = (await reader.read()).decode()
        writer.close()
        assert reply.startswith("up ready ") and reply != "up ready 100%\n", reply

        drained = await clients.control.SetDraining(
            control_pb2.SetDrainingRequest(draining=True, reason="test"))
        assert drained.draining and drained.in_flight == 1

        cli = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "daemon", "drain", "--address", daemon.address,
            "--wait", "120", stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert cli.stdout is not None
        try:
            # Its first look (however long the CLI takes to start) counts the stream...
            first_line = await asyncio.wait_for(cli.stdout.readline(), 60)
            assert first_line.decode() == "drained: 1 calls in flight\n"
            with pytest.raises(TimeoutError):  # ...and it waits while the stream runs
                await asyncio.wait_for(asyncio.shield(cli.wait()), WAITING)
            assert (await stream.read()).text  # still streaming all along
            stream.cancel()
            out, err = await asyncio.wait_for(cli.communicate(), 60)
        finally:
            if cli.returncode is None:
                cli.kill()
                await cli.wait()
        assert cli.returncode == 0, err.decode()
        assert out.decode() == "no calls in flight\n"
        assert await stream.code() is grpc.StatusCode.CANCELLED


async def test_shutdown_serves_an_on_demand_models_stream_through_the_drain(
        llama_server: str) -> None:
    """SIGTERM's shutdown: while new calls are refused, a stream on a model loaded on
    demand is still served (its child is stopped after the drain, with the daemon)."""
    env = config_env("llama-server", LLAMAD_MODELS_DIR=str(models_dir()),
                     LLAMAD_GENERATION_PARALLEL="1", LLAMAD_DRAIN_GRACE="3")
    async with serving(env) as (daemon, clients):
        stream = endless_gemma(clients)
        assert (await stream.read()).text
        gemma = daemon.pool.model(GEMMA)
        assert gemma is not None and alive(pid := gemma.serving_pid)

        daemon.request_stop()
        stopping = asyncio.create_task(daemon.run_until_stopped())
        for _ in range(600):  # up to 30 s for drain_notice (0) and health to pass
            if daemon.router.draining:  # new calls refused from here on
                break
            await asyncio.sleep(0.05)
        assert daemon.router.draining
        # The call still runs on the on-demand model, whose child serves it.
        assert gemma.busy() == 1 and alive(pid)
        assert (await stream.read()).text
        await asyncio.wait_for(stopping, 60)  # the grace ends the stream, then stops all
        assert not alive(pid)
        stream.cancel()
