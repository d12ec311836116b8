"""The fault-injecting fake llama-server, run as real processes on free ports: its command
(by path, only known faults, every fault documented), start-up (ready quickly, 503 while
loading, /models), llama-server's flags accepted and a bogus one refused, failing like
llama-server on a missing model or a port in use, and a clean exit on SIGTERM.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from pathlib import Path

import httpx
import pytest

from supervisor.testing import FAULTS, fake_child_command
from supervisor.testing import fake_child as fake
from tests.support.fake_children import Spawner
from tests.support.load import patience

pytestmark = pytest.mark.process  # every test runs the fake child


# ------------------------------------------------------------------ the helper itself


def test_command_runs_the_fake_by_path() -> None:
    """The command is the current interpreter on fake_child.py plus the requested flags."""
    cmd = fake_child_command(
        port=8080, model="m.gguf", fault="hang", fault_after=2, load_seconds=1, extra=["-c", "64"]
    )
    assert cmd[0] == sys.executable
    assert cmd[1] == os.path.abspath(fake.__file__)
    assert cmd[2:6] == ["--port", "8080", "--model", "m.gguf"]
    tail = ["--fault", "hang", "--fault-after", "2", "--load-seconds", "1.0", "-c", "64"]
    assert cmd[-8:] == tail


def test_command_rejects_unknown_fault() -> None:
    """An unknown fault name is a ValueError, not a child that fails later."""
    with pytest.raises(ValueError, match="unknown fault"):
        fake_child_command(port=8080, model="m.gguf", fault="explode")


def test_every_fault_is_documented() -> None:
    """Each fault the fake accepts has its entry in the script's docstring."""
    assert fake.__doc__ is not None
    missing = [f for f in FAULTS if f"``{f}``\n" not in fake.__doc__]
    assert missing == []


# ------------------------------------------------------------------ start-up and API


def test_ready_quickly(spawn: Spawner) -> None:
    """With no load time the child loads nothing: its only progress line is the final 100 %
    (its own clock, whatever the machine's load), and /health answers 200 within a second
    of exec on a quiet machine."""
    started = time.monotonic()
    child = spawn()
    assert child.wait_ready() - started < patience(1.0)
    assert child.stderr().count("loading tensors ... ") == 1
    assert "loading tensors ... 100%" in child.stderr()
    assert "main: server is listening on http://127.0.0.1:" in child.stderr()


def test_health_503_while_loading_then_200(spawn: Spawner) -> None:
    """While loading, /health and /v1/models answer 503 "Loading model", then /health 200."""
    child = spawn(load_seconds=patience(0.5))  # a busy machine's test still asks in time
    child.wait_stderr("main: loading model")
    loading = httpx.get(f"{child.url}/health")
    assert loading.status_code == 503
    assert loading.json() == {
        "error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}
    }
    assert httpx.get(f"{child.url}/v1/models").status_code == 503
    child.wait_ready()
    assert httpx.get(f"{child.url}/health").json() == {"status": "ok"}
    stderr = child.stderr()
    assert "llama_model_load: loading tensors ... " in stderr
    assert stderr.index("loading tensors ... 100%") < stderr.index("starting the main loop")


def test_models_reports_alias_and_n_embd(spawn: Spawner) -> None:
    """/v1/models lists one model named by --alias, with the context and embedding size."""
    child = spawn(alias="tiny-chat", n_embd=16)
    child.wait_ready()
    body = httpx.get(f"{child.url}/v1/models").json()
    assert body == {
        "object": "list",
        "data": [
            {
                "id": "tiny-chat",
                "object": "model",
                "owned_by": "llamacpp",
                "meta": {"n_ctx_train": 2048, "n_embd": 16},
            }
        ],
    }


def test_llama_server_flags_are_ignored(spawn: Spawner) -> None:
    """Real llama-server flags with values, even ones argparse could misread, are ignored."""
    flags = ["-c", "4096", "-np", "2", "-ub", "512", "-b", "512", "-t", "4"]
    flags += ["--threads-http", "4", "-md", "draft.gguf", "-ngl", "99", "--mlock"]
    child = spawn(extra=flags)
    child.wait_ready()
    assert httpx.get(f"{child.url}/v1/models").json()["data"][0]["id"] == "tiny.gguf"


def test_bogus_flag_is_a_usage_error(spawn: Spawner) -> None:
    """--bogus-flag is refused like an unknown llama-server flag: message and exit 1."""
    child = spawn(extra=["--bogus-flag", "1"])
    assert child.proc.wait(timeout=patience(5)) == 1
    assert "error: invalid argument: --bogus-flag" in child.stderr()


def test_missing_model_fails_like_llama_server(spawn: Spawner, tmp_path: Path) -> None:
    """A model file that cannot be opened is reported as a load error and exit 1."""
    missing = tmp_path / "absent.gguf"
    child = spawn(model=str(missing))
    assert child.proc.wait(timeout=patience(5)) == 1
    assert f"llama_model_load: error loading model: failed to open {missing}" in child.stderr()


def test_port_in_use_fails_like_llama_server(spawn: Spawner) -> None:
    """A port held by another listener makes the child print the bind error and exit 1."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        child = spawn(port=port)
        assert child.proc.wait(timeout=patience(5)) == 1
    bind_error = f"couldn't bind HTTP server socket, hostname: 127.0.0.1, port: {port}"
    assert bind_error in child.stderr()


def test_sigterm_exits_zero_after_cleanup_line(spawn: Spawner) -> None:
    """SIGTERM makes a well-behaved child log llama-server's clean-up line and exit 0."""
    child = spawn()
    child.wait_ready()
    child.proc.send_signal(signal.SIGTERM)
    assert child.proc.wait(timeout=patience(5)) == 0
    assert "srv    operator(): operator(): cleaning up before exit..." in child.stderr()
