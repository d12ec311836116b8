"""Start and recovery in ``bench.bench_generation``: cold starts and a killed child."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import grpc
import httpx

from bench._daemon import Running
from bench._generation.common import (
    POLL,
    Guard,
    KillSample,
    StartResult,
    StartSample,
    daemon_env,
    started,
)
from bench._support import (
    cpu_snap,
)
from daemon import Daemon, load
from llamad_protocol.v1 import inference_pb2
from supervisor import State
from supervisor._rundir import child_key, socket_path

# -- start and recovery -----------------------------------------------------------------


async def direct_start(runtime: str, model: Path, threads: int) -> float:
    """The child's own command line and environment (as llamad builds them: its private
    socket, its per-launch key), started by hand and polled every 20 ms until it is healthy
    and a one-token completion succeeds: the readiness llamad waits for, without llamad."""
    child = Daemon(load(None, env=daemon_env(runtime, model, threads))).children["generation"]
    sock = socket_path()
    key = child_key()
    setup = child.setup
    argv = setup.runtime.command(setup.spec, socket=sock, alias="bench-direct")
    env = setup.runtime.environment(os.environ, key)
    health = setup.runtime.api.health_path or "/v1/models"
    began = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env,
        stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        async with httpx.AsyncClient(
                transport=httpx.AsyncHTTPTransport(uds=str(sock)), base_url="http://localhost",
                headers={"Authorization": f"Bearer {key}"}, trust_env=False,
                timeout=10.0) as http:
            body = {"prompt": "Hello", "max_tokens": 1, "temperature": 0.0}
            for path, method in ((health, "GET"), ("/v1/completions", "POST")):
                while True:
                    if proc.returncode is not None:
                        raise RuntimeError(f"{argv[0]} exited with {proc.returncode}")
                    with contextlib.suppress(httpx.HTTPError):
                        resp = await http.request(method, path,
                                                  json=body if method == "POST" else None)
                        if resp.status_code == 200:
                            break
                    await asyncio.sleep(POLL)
        return time.perf_counter() - began
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        sock.unlink(missing_ok=True)


async def kill_and_recover(running: Running) -> KillSample:
    old = (await running.generation()).pid
    request = inference_pb2.GenerateRequest(
        prompt="Hello", sampling=inference_pb2.SamplingParams(max_tokens=1, temperature=0.0))
    killed = time.perf_counter()
    os.kill(old, signal.SIGKILL)
    attempts = 0
    while True:
        attempts += 1
        try:
            async for _ in running.inference.Generate(request, timeout=60):
                pass
            break
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE:
                raise
        await asyncio.sleep(POLL)
    done = time.perf_counter()
    new = (await running.generation()).pid
    if new in (0, old):
        raise RuntimeError(f"Generate succeeded but the child pid is {new} (was {old})")
    backoff_at = running.first_after(State.BACKOFF, killed)
    starting_at = running.first_after(State.STARTING, backoff_at)
    running_at = running.first_after(State.RUNNING, starting_at)
    return KillSample(done - killed, backoff_at - killed, starting_at - backoff_at,
                      running_at - starting_at, attempts)


async def bench_start(runtime: str, model: Path, starts: int, *, kill: bool, threads: int,
                      guard: Guard) -> StartResult:
    result = StartResult(runtime, model.name)
    while len(result.llamad) < starts:
        n = len(result.llamad) + 1
        await guard.quiet()
        before = cpu_snap()
        async with started(runtime, model, threads) as (running, ready):
            if not guard.kept(before, f"{model.name} start {n}"):
                continue
            began = running.first_after(State.STARTING, 0.0)
            child = running.first_after(State.RUNNING, began) - began
            line = f"  [{runtime}] {model.name} start {n}: {ready:.2f}s (child {child:.2f}s)"
            if kill:
                await guard.quiet()
                before = cpu_snap()
                k = await kill_and_recover(running)
                if not guard.kept(before, f"kill {n}"):
                    continue
                result.kills.append(k)
                line += (f"; kill -9 -> serving {k.total:.2f}s (backoff {k.backoff:.3f}s, "
                         f"restart {k.restart:.2f}s)")
            result.llamad.append(StartSample(ready, child))
            print(line, flush=True)
    while len(result.direct) < starts:
        await guard.quiet()
        before = cpu_snap()
        seconds = await direct_start(runtime, model, threads)
        if guard.kept(before, f"direct start {len(result.direct) + 1}"):
            result.direct.append(seconds)
            print(f"  [{runtime}] {model.name} direct start {len(result.direct)}: "
                  f"{seconds:.2f}s", flush=True)
    return result
