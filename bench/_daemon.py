"""The daemon as operators run it, for the benchmarks: ``python -m daemon serve`` in its
own process, its log in a file, the address read from its ``listening`` line."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TextIO

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench._support import ROOT
from llamad_protocol.v1 import control_pb2, control_pb2_grpc


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
