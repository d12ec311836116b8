"""Fake llama-server children as the fake child's own tests run them
(tests/unit/test_fake_child_*.py): started on free ports with a tiny model, their stderr in a
file, always killed and reaped at teardown; plus reading their server-sent events.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from supervisor.testing import fake_child_command
from tests.support.load import patience
from tests.support.procs import free_port

PROMPT = "the quick brown fox"


class Child:
    """A started fake child, its port, and the file its stderr goes to."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, stderr_path: Path) -> None:
        self.proc = proc
        self.port = port
        self.stderr_path = stderr_path
        self.url = f"http://127.0.0.1:{port}"

    def stderr(self) -> str:
        """Return everything the child has written to stderr so far."""
        return self.stderr_path.read_text()

    def wait_ready(self, timeout: float = patience(5.0)) -> float:
        """Poll /health until it answers 200 and return when that happened (monotonic)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"child exited with {self.proc.returncode}: {self.stderr()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    return time.monotonic()
            except httpx.TransportError:
                pass
            time.sleep(0.01)
        pytest.fail(f"child not ready after {timeout} s: {self.stderr()}")

    def wait_stderr(self, text: str, timeout: float = patience(5.0)) -> None:
        """Wait until ``text`` appears on the child's stderr, without sending any request."""
        deadline = time.monotonic() + timeout
        while text not in self.stderr():
            if time.monotonic() > deadline:
                pytest.fail(f"{text!r} not on stderr after {timeout} s: {self.stderr()}")
            time.sleep(0.01)

    def stats(self) -> dict[str, int]:
        """Return the child's /fake/stats counters."""
        stats: dict[str, int] = httpx.get(f"{self.url}/fake/stats", timeout=2.0).json()
        return stats


class Spawner:
    """Starts fake children and always kills and reaps them at teardown."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.model = tmp_path / "tiny.gguf"
        self.model.write_bytes(b"GGUF")
        self.children: list[Child] = []

    def __call__(self, *, port: int | None = None, model: str | None = None,
                 stdout: int = subprocess.DEVNULL, **options: Any) -> Child:
        """Start one fake child with ``fake_child_command`` (``options`` are its other
        keywords: fault, load_seconds, embedding, ...) on a free port, with the tiny model."""
        port = free_port() if port is None else port
        cmd = fake_child_command(
            port=port, model=str(self.model) if model is None else model, **options)
        stderr_path = self.tmp_path / f"stderr-{len(self.children)}.txt"
        with stderr_path.open("wb") as stderr:
            proc = subprocess.Popen(cmd, stdout=stdout, stderr=stderr)
        child = Child(proc, port, stderr_path)
        self.children.append(child)
        return child

    def close(self) -> None:
        """Kill and reap every child started."""
        for child in self.children:
            try:
                if child.proc.poll() is None:
                    child.proc.kill()
                child.proc.wait(timeout=10)
            finally:
                if child.proc.stdout is not None:
                    child.proc.stdout.close()


def sse_data(response: httpx.Response, into: list[str]) -> None:
    """Append the payload of every ``data:`` line of a streamed response to ``into``."""
    for line in response.iter_lines():
        if line.startswith("data: "):
            into.append(line.removeprefix("data: "))


def post_stream(url: str, body: dict[str, Any], into: list[str]) -> httpx.Response:
    """POST a streaming request, collect its events into ``into`` and return the response."""
    with httpx.Client(timeout=5.0) as client, client.stream("POST", url, json=body) as response:
        sse_data(response, into)
        return response
