"""The daemon for the benchmarks: as operators run it (``python -m daemon serve`` in its
own process, its log in a file, the address read from its ``listening`` line), or in this
process with real gRPC stubs to it (:class:`Running`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TextIO

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench._support import ROOT
from daemon import Daemon
from daemon.telemetry import logs
from llamad_protocol.v1 import common_pb2, control_pb2, control_pb2_grpc, inference_pb2_grpc
from supervisor import State


def clean_environ() -> dict[str, str]:
    """This process's environment without any LLAMAD_* setting (the soak sets its own)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("LLAMAD_")}



class DaemonProcess:
    """``python -m daemon serve`` with its log (stdout and stderr) in a file."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        self._log: TextIO = log_path.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "daemon", "serve"], cwd=ROOT,
            env={**clean_environ(), **env}, stdin=subprocess.DEVNULL, stdout=self._log,
            stderr=subprocess.STDOUT)
        self.pid = self.proc.pid

    def _listening(self, reader: TextIO) -> str | None:
        for line in reader:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("event") == "listening":
                return str(record["address"])
        return None

    async def address(self, timeout: float = 120.0) -> str:
        """Wait for the ``listening`` log line; return its address."""
        deadline = time.monotonic() + timeout
        with self.log_path.open() as reader:
            while time.monotonic() < deadline:
                found = self._listening(reader)
                if found:
                    return found
                if self.proc.poll() is not None:
                    raise SystemExit(f"bench: the daemon exited ({self.proc.returncode}) before "
                                     f"listening; see {self.log_path}")
                await asyncio.sleep(0.1)
        raise SystemExit(f"bench: the daemon did not listen within {timeout:.0f}s; see "
                         f"{self.log_path}")

    async def stop(self, grace: float = 60.0) -> tuple[int | None, float]:
        """SIGTERM, then wait up to ``grace`` s (SIGKILL after); (exit code or None if it
        had to be killed, seconds to exit)."""
        began = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code: int | None
        try:
            code = await asyncio.to_thread(self.proc.wait, grace)
        except subprocess.TimeoutExpired:
            code = None
            self.proc.kill()
            self.proc.wait()
        self._log.close()
        return code, time.monotonic() - began

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


async def wait_ready(channel: grpc.aio.Channel, timeout: float = 300.0) -> None:
    """Until overall health is SERVING and Status says both children are RUNNING."""
    health = health_pb2_grpc.HealthStub(channel)
    control = control_pb2_grpc.ControlServiceStub(channel)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(grpc.aio.AioRpcError):
            resp = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
            if resp.status == health_pb2.HealthCheckResponse.SERVING:
                status = await control.Status(control_pb2.StatusRequest(), timeout=5)
                states = [c.state for c in status.children if c.enabled]
                if states and all(s == control_pb2.CHILD_STATE_RUNNING for s in states):
                    return
        await asyncio.sleep(0.5)
    raise SystemExit(f"bench: the daemon was not ready within {timeout:.0f}s")


@contextlib.asynccontextmanager
async def serving(env: dict[str, str], log_path: Path
                  ) -> AsyncIterator[tuple[DaemonProcess, grpc.aio.Channel]]:
    """``python -m daemon serve`` with ``env``, its log in ``log_path``: yields it and a
    channel to it once :func:`wait_ready`; closes the channel and stops it after."""
    proc = DaemonProcess(env, log_path)
    try:
        async with grpc.aio.insecure_channel(await proc.address()) as channel:
            await wait_ready(channel)
            yield proc, channel
    finally:
        await proc.stop()


# -- the daemon in this process ---------------------------------------------------------------


class Running:
    """A started daemon and real gRPC stubs on one channel to it."""

    def __init__(self, daemon: Daemon, address: str, events: list[tuple[State, float]]) -> None:
        self.daemon = daemon
        self.events = events  # supervisor state changes (perf_counter), from before start()
        self.channel = grpc.aio.insecure_channel(address)
        self.inference = inference_pb2_grpc.InferenceServiceStub(self.channel)
        self.control = control_pb2_grpc.ControlServiceStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)

    def first_after(self, state: State, since: float) -> float:
        for new, at in self.events:
            if new is state and at >= since:
                return at
        raise RuntimeError(f"the generation child never entered {state.value}")

    async def wait_serving(self, timeout: float = 300.0) -> None:
        request = health_pb2.HealthCheckRequest(service="generation")
        async for resp in self.health.Watch(request, timeout=timeout):
            if resp.status == health_pb2.HealthCheckResponse.SERVING:
                return
        raise RuntimeError("health never became SERVING")

    async def generation(self) -> control_pb2.ChildStatus:
        resp = await self.control.Status(control_pb2.StatusRequest(), timeout=10)
        for child in resp.children:
            if child.role == common_pb2.CHILD_ROLE_GENERATION:
                found: control_pb2.ChildStatus = child
                return found
        raise RuntimeError("Status lists no generation child")

    async def close(self) -> None:
        await self.channel.close()
        await self.daemon.shutdown()


@contextlib.contextmanager
def daemon_log() -> Iterator[TextIO]:
    """The in-process daemons log (JSON, as in production) to a temporary file."""
    fd, name = tempfile.mkstemp(prefix="llamad-bench-", suffix=".log")
    with os.fdopen(fd, "w") as fh:
        logs.configure("json", "info", stream=fh)
        print(f"daemon log: {name}", flush=True)
        yield fh
