"""What the inference-mode tests share (tests/integration/test_modes_*.py): a real
llama-server that llamad does not supervise (the "shared server" an endpoint is), the mode
constants, and small calls against a daemon (generate, wait for a child's state).
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from daemon import Daemon
from llamad_protocol.v1 import common_pb2, control_pb2
from llamad_protocol.v1 import inference_pb2 as pb
from tests.support.daemon import Clients
from tests.support.procs import free_port

ENDPOINT = control_pb2.INFERENCE_MODE_ENDPOINT
EMBEDDED = control_pb2.INFERENCE_MODE_EMBEDDED
DISABLED = control_pb2.INFERENCE_MODE_DISABLED
KEY = "sk-llamad-test-4711"


@dataclass
class Server:
    """A llama-server llamad does not supervise: the "shared server" an endpoint is."""

    proc: subprocess.Popen[bytes]
    port: int
    model: Path
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start_server(binary: str, model: Path, log: Path, *extra: str,
                 key: str | None = None) -> Server:
    port = free_port()
    argv = [binary, "--model", str(model), "--host", "127.0.0.1", "--port", str(port),
            "--threads", "1", "--threads-batch", "1", "--no-webui", *extra]
    headers = {}
    if key is not None:
        keys = log.with_suffix(".keys")
        keys.write_text(f"# test keys\n{key}\n")
        keys.chmod(0o600)
        argv += ["--api-key-file", str(keys)]
        headers = {"Authorization": f"Bearer {key}"}
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    server = Server(proc, port, model, log)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-2000:]
        try:
            if httpx.get(f"{server.url}/models", headers=headers, timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    server.stop()
    raise AssertionError(f"llama-server on {model.name} never became ready")


MakeDaemon = Callable[..., Awaitable[tuple[Daemon, Clients]]]


async def generate(c: Clients, prompt: str = "The capital of France is",
                   max_tokens: int = 8) -> list[pb.GenerateResponse]:
    return [m async for m in c.inference.Generate(pb.GenerateRequest(
        prompt=prompt, sampling=pb.SamplingParams(max_tokens=max_tokens)), timeout=60)]


async def wait_state(c: Clients, role: common_pb2.ChildRole.ValueType, state: int,
                     timeout: float = 60) -> control_pb2.ChildStatus:
    deadline = time.monotonic() + timeout
    while (now := await c.child(role)).state != state:
        assert time.monotonic() < deadline, now
        await asyncio.sleep(0.1)
    return now
