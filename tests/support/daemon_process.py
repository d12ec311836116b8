"""``python -m daemon serve`` as a real process, as operators run it: it logs JSON to a
file, gets real signals, and is queried with blocking gRPC stubs (the fault-matrix tests).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import grpc

from llamad_protocol.v1 import common_pb2, control_pb2, control_pb2_grpc
from tests.conftest import ROOT
from tests.support.daemon import GEN

S = TypeVar("S")

RUNNING = control_pb2.CHILD_STATE_RUNNING


class DaemonProcess:
    """``python -m daemon serve`` as operators run it, logging JSON to a file."""

    def __init__(self, tmp: Path, env: dict[str, str], prefix: Sequence[str] = (), *,
                 command: Sequence[str] = (sys.executable, "-m", "daemon", "serve"),
                 cwd: Path = ROOT) -> None:
        """``command`` (by default this checkout's daemon) after ``prefix``, run in
        ``cwd`` with ``env`` over this process's environment."""
        self.log = tmp / f"daemon-{time.monotonic_ns()}.log"
        with open(self.log, "wb") as out:  # a file: nobody has to keep draining a pipe
            self.proc = subprocess.Popen(
                [*prefix, *command], cwd=cwd,
                env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=out)
        self.pid = self.proc.pid
        try:
            self.address = str(self.wait_event("listening", timeout=120)["address"])
        except BaseException:
            self.kill()
            raise

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def records(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
        return out

    def wait_event(self, event: str, timeout: float = 60.0, **fields: object) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            for record in self.records():
                if record.get("event") == event and all(
                        record.get(k) == v for k, v in fields.items()):
                    return record
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited {self.proc.returncode} before {event!r}:\n"
                                     f"{self.tail()}")
            if time.monotonic() > deadline:
                self.proc.send_signal(signal.SIGUSR1)  # every thread's stack, in the log
                time.sleep(1)
                raise AssertionError(f"no {event!r} {fields} within {timeout}s:\n{self.tail()}")
            time.sleep(0.05)

    def tail(self, chars: int = 6000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    @contextlib.contextmanager
    def stub(self, stub_class: Callable[[grpc.Channel], S]) -> Iterator[S]:
        """A blocking ``stub_class`` stub on a channel of its own to the daemon (so each
        thread of a test can have one), closed on the way out."""
        with grpc.insecure_channel(self.address) as ch:
            yield stub_class(ch)

    def status(self, role: int = GEN) -> control_pb2.ChildStatus:
        with self.stub(control_pb2_grpc.ControlServiceStub) as stub:
            resp = stub.Status(control_pb2.StatusRequest(), timeout=10)
        found: control_pb2.ChildStatus = next(c for c in resp.children if c.role == role)
        return found

    def wait_running(self, role: int = GEN, timeout: float = 120.0) -> control_pb2.ChildStatus:
        deadline = time.monotonic() + timeout
        while (child := self.status(role)).state != RUNNING:
            assert time.monotonic() < deadline, f"child never running: {child}\n{self.tail()}"
            time.sleep(0.1)
        return child

    def wait_embeddable(self, timeout: float = 120.0) -> control_pb2.ChildStatus:
        """Wait until the embedding child runs and its model's SHA-256 is known: only then
        are vectors written (documents ingested before stay BM25-only, issue 16)."""
        deadline = time.monotonic() + timeout
        while not (child := self.wait_running(common_pb2.CHILD_ROLE_EMBEDDING,
                                               timeout)).model_sha256:
            assert time.monotonic() < deadline, f"model never hashed: {child}\n{self.tail()}"
            time.sleep(0.1)
        return child

    def terminate(self, timeout: float) -> tuple[int, float]:
        """SIGTERM; return (exit status, seconds it took)."""
        began = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGUSR1)
            time.sleep(1)
            raise AssertionError(f"no exit within {timeout}s of SIGTERM:\n{self.tail()}") from None
        return code, time.monotonic() - began
