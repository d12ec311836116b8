"""The fault-injecting fake llama-server's faults, run as real processes on free ports: crash
at start or mid-stream, hang, failing probes, 503 forever, slow start, ignoring SIGTERM,
flooding stdout, usage and model errors, and exiting after ready; each as the supervisor
will see it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time

import httpx
import pytest

from supervisor.testing import fake_child as fake
from tests.support.fake_children import PROMPT, Spawner, post_stream
from tests.support.load import patience

pytestmark = pytest.mark.process  # every test runs the fake child


# ------------------------------------------------------------------------------ faults


def test_crash_at_start_exits_1_quickly(spawn: Spawner) -> None:
    """crash-at-start exits 1 with an error line before ever listening."""
    started = time.monotonic()
    child = spawn(fault="crash-at-start")
    assert child.proc.wait(timeout=patience(5)) == 1
    assert time.monotonic() - started < patience(2.0)
    assert "crash-at-start" in child.stderr()
    assert "listening" not in child.stderr()


def test_crash_mid_stream_dies_of_sigsegv(spawn: Spawner) -> None:
    """crash-mid-stream sends fault_after token events, then the child dies of SIGSEGV."""
    child = spawn(fault="crash-mid-stream", fault_after=2)
    child.wait_ready()
    plain = httpx.post(f"{child.url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 3})
    assert plain.status_code == 200
    events: list[str] = []
    body = {"prompt": PROMPT, "max_tokens": 10, "stream": True}
    with pytest.raises(httpx.TransportError):
        post_stream(f"{child.url}/v1/completions", body, events)
    assert [json.loads(e)["choices"][0]["text"] for e in events] == fake.generate_tokens(PROMPT, 2)
    assert child.proc.wait(timeout=patience(5)) == -signal.SIGSEGV


def test_hang_stops_answering_after_n_requests(spawn: Spawner) -> None:
    """hang answers the first fault_after requests, then accepts but never answers."""
    child = spawn(fault="hang", fault_after=2)
    child.wait_stderr("starting the main loop")
    assert httpx.get(f"{child.url}/health").status_code == 200
    assert httpx.get(f"{child.url}/v1/models").status_code == 200
    with pytest.raises(httpx.ReadTimeout):
        httpx.get(f"{child.url}/health", timeout=0.3)
    with pytest.raises(httpx.ReadTimeout):
        httpx.get(f"{child.url}/fake/stats", timeout=0.3)
    assert child.proc.poll() is None


def test_probe_fails(spawn: Spawner) -> None:
    """probe-fails is healthy and lists its model, but every inference request is a 500."""
    child = spawn(fault="probe-fails")
    child.wait_stderr("starting the main loop")
    assert httpx.get(f"{child.url}/health").status_code == 200
    assert httpx.get(f"{child.url}/v1/models").status_code == 200
    for path, body in (("/v1/completions", {"prompt": "hi", "max_tokens": 1}),
                       ("/v1/chat/completions", {"messages": [{"role": "user",
                                                               "content": "hi"}]}),
                       ("/v1/embeddings", {"input": "hi"})):
        answer = httpx.post(f"{child.url}{path}", json=body)
        assert answer.status_code == 500
        assert answer.json()["error"]["type"] == "server_error"


def test_health_503_forever(spawn: Spawner) -> None:
    """health-503-forever never becomes ready and keeps printing load progress."""
    child = spawn(fault="health-503-forever")
    child.wait_stderr("main: loading model")
    # At least 0.6 s, and until 4 progress lines (0.1 s apart) are out: a busy machine
    # may print them later.
    deadline = time.monotonic() + 0.6
    while time.monotonic() < deadline or child.stderr().count("loading tensors ... ") < 4:
        assert httpx.get(f"{child.url}/health").status_code == 503
        assert httpx.get(f"{child.url}/v1/models").status_code == 503
        assert time.monotonic() < deadline + patience(2.0), child.stderr()
        time.sleep(0.05)
    assert "starting the main loop" not in child.stderr()


def test_slow_start_loads_for_three_seconds_by_default(spawn: Spawner) -> None:
    """slow-start loads for 3 s unless --load-seconds says otherwise: ready no sooner (the
    child's own clock, whatever the machine's load), 503 and progress lines meanwhile."""
    started = time.monotonic()
    slow = spawn(fault="slow-start")
    quick = spawn(fault="slow-start", load_seconds=0.2)
    slow.wait_stderr("main: loading model")
    assert httpx.get(f"{slow.url}/health").status_code == 503
    quick.wait_ready()
    assert httpx.get(f"{slow.url}/health").status_code == 503 or (
        time.monotonic() - started >= 3.0)
    ready = slow.wait_ready() - started
    assert 3.0 <= ready < patience(3.0)
    percents = [int(line.split("%", 1)[0])
                for line in slow.stderr().split("loading tensors ... ")[1:]]
    assert percents[-1] == 100 and percents[:-1] == sorted(percents[:-1])
    assert max(percents[:-1]) < 100 and len(percents) > 3


def test_ignore_sigterm_survives_until_sigkill(spawn: Spawner) -> None:
    """ignore-sigterm keeps serving through SIGTERM and SIGINT; only SIGKILL ends it."""
    child = spawn(fault="ignore-sigterm")
    child.wait_ready()
    child.proc.send_signal(signal.SIGTERM)
    child.proc.send_signal(signal.SIGINT)
    time.sleep(1.0)
    assert child.proc.poll() is None
    assert httpx.get(f"{child.url}/health").status_code == 200
    child.proc.kill()
    assert child.proc.wait(timeout=patience(5)) == -signal.SIGKILL


def test_flood_stdout_while_serving(spawn: Spawner) -> None:
    """flood-stdout writes over 1 MB of stdout while completions still work."""
    child = spawn(fault="flood-stdout", stdout=subprocess.PIPE)
    received = [0]
    first_line: list[bytes] = []

    def drain() -> None:
        assert child.proc.stdout is not None
        fd = child.proc.stdout.fileno()
        while chunk := os.read(fd, 1 << 16):
            if not first_line:
                first_line.append(chunk.split(b"\n", 1)[0])
            received[0] += len(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    ready_at = child.wait_ready()
    response = httpx.post(f"{child.url}/v1/completions", json={"prompt": PROMPT}, timeout=5.0)
    assert response.status_code == 200
    # Over 1 MB within a second of ready on a quiet machine; a busy one is given LOAD times
    # as long (the flood's size is the point, not its speed).
    while received[0] <= 1_000_000 and time.monotonic() < ready_at + patience(1.0):
        time.sleep(0.05)
    assert received[0] > 1_000_000
    assert first_line[0].startswith(b"flood line 0 ")
    child.proc.kill()
    child.proc.wait(timeout=patience(5))
    reader.join(timeout=patience(5))


def test_usage_error_exits_1(spawn: Spawner) -> None:
    """usage-error prints an "invalid argument" error and a usage line, then exits 1."""
    child = spawn(fault="usage-error")
    assert child.proc.wait(timeout=patience(5)) == 1
    assert "error: invalid argument: " in child.stderr()
    assert "usage: " in child.stderr()


def test_model_error_exits_1(spawn: Spawner) -> None:
    """model-error prints llama.cpp's invalid-magic load error and exits 1."""
    child = spawn(fault="model-error")
    assert child.proc.wait(timeout=patience(5)) == 1
    stderr = child.stderr()
    assert "llama_model_load: error loading model: invalid magic characters" in stderr
    assert "main: exiting due to model loading error" in stderr


def test_exit_after_ready_crashes_while_idle(spawn: Spawner) -> None:
    """exit-after-ready serves for fault_after seconds, then exits 1 on its own."""
    # Long enough for a busy machine's test to see it ready before it goes.
    after = round(patience(0.5))
    started = time.monotonic()
    child = spawn(fault="exit-after-ready", fault_after=after)
    child.wait_ready()
    assert child.proc.wait(timeout=patience(5) + after) == 1
    # Never before its seconds (the child's own clock, from after its start); the upper
    # bound is only a busy machine's wait.
    assert after <= time.monotonic() - started < after + patience(3.0)
