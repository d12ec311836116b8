"""A real ``python -m daemon serve`` process read through its JSON log, as operators run it
(tests/integration/test_process.py, test_pool_process.py), and its children's pids."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import grpc

from llamad_protocol.v1 import control_pb2, control_pb2_grpc
from tests.conftest import ROOT


class ServeProcess:
    """``python -m daemon serve`` in a process of its own (the checkout's, ``env`` added to
    this environment), its JSON log read from stderr as the test asks for events."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "daemon", "serve", *args],
            cwd=ROOT, env={**os.environ, **env},
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        self.lines: list[str] = []

    def wait_event(self, event: str, timeout: float = 60.0) -> dict[str, object]:
        """Read log lines until one with ``event``; return it parsed."""
        deadline = time.monotonic() + timeout
        assert self.proc.stderr is not None
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                raise AssertionError(f"daemon exited before {event!r}: {self.lines[-20:]}")
            self.lines.append(line)
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("event") == event:
                return dict(record)
        raise AssertionError(f"no {event!r} within {timeout}s")

    def wait_running(self, roles: int) -> None:
        for _ in range(roles):
            while self.wait_event("child state").get("new") != "running":
                pass

    def rest_of_log(self) -> list[str]:
        assert self.proc.stderr is not None
        return self.lines + self.proc.stderr.readlines()


def child_pids(address: str) -> list[int]:
    """The pids of the children the daemon at ``address`` reports in Status."""
    with grpc.insecure_channel(address) as ch:
        stub = control_pb2_grpc.ControlServiceStub(ch)
        status = stub.Status(control_pb2.StatusRequest(), timeout=5)
        return [int(c.pid) for c in status.children if c.pid]
