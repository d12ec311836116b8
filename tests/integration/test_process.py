"""The daemon as operators run it: a real ``python -m daemon serve`` process, signalled."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from llamad_protocol.v1 import control_pb2, control_pb2_grpc, inference_pb2_grpc
from llamad_protocol.v1 import inference_pb2 as pb
from tests.conftest import PREPARED_DEFAULT, ROOT, model_path, models_dir
from tests.support.daemon import config_env
from tests.support.endless import never_end
from tests.support.procs import gone
from tests.support.serve_process import ServeProcess, child_pids

pytestmark = pytest.mark.integration


@pytest.fixture
def daemon_env(llama_server: str) -> dict[str, str]:
    return config_env("llama-server", LLAMAD_EMBEDDING_ENABLED="false")


def test_sigterm_drains_in_flight_stream_and_exits_zero(
    daemon_env: dict[str, str], spawned: list[ServeProcess]
) -> None:
    """SIGTERM: the running stream completes, new calls are refused, children stop, exit 0."""
    # A grace far above the stream's length, so a loaded machine cannot cut it short.
    d = ServeProcess({**daemon_env, "LLAMAD_DRAIN_GRACE": "60"})
    spawned.append(d)
    address = str(d.wait_event("listening")["address"])
    d.wait_running(1)
    pids = child_pids(address)
    assert len(pids) == 1

    async def scenario() -> tuple[list[pb.GenerateResponse], grpc.StatusCode | None]:
        async with grpc.aio.insecure_channel(address) as ch:
            stub = inference_pb2_grpc.InferenceServiceStub(ch)
            call = stub.Generate(pb.GenerateRequest(
                prompt="List the planets of the solar system, one per line, with facts:",
                sampling=pb.SamplingParams(
                    max_tokens=100, logit_bias=never_end(model_path(PREPARED_DEFAULT)))))
            msgs = [await call.read()]
            d.proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.3)  # the drain has begun
            refused: grpc.StatusCode | None = None
            try:
                async for _ in stub.Generate(pb.GenerateRequest(prompt="hi"), timeout=5):
                    pass
            except grpc.aio.AioRpcError as exc:
                refused = exc.code()
            while (msg := await call.read()) is not grpc.aio.EOF:
                msgs.append(msg)
            return msgs, refused

    msgs, refused = asyncio.run(scenario())
    assert msgs[-1].usage.completion_tokens >= 1
    assert msgs[-1].finish_reason != pb.FINISH_REASON_UNSPECIFIED  # finished, not cut off
    assert refused == grpc.StatusCode.UNAVAILABLE
    assert d.proc.wait(timeout=30) == 0
    assert not gone(pids, 5)
    log = "".join(d.rest_of_log())
    assert '"draining"' in log or "draining" in log


def test_sigkill_of_daemon_leaves_no_child(
    daemon_env: dict[str, str], spawned: list[ServeProcess]
) -> None:
    """kill -9 of the daemon takes its children down too (parent-death signal)."""
    d = ServeProcess(config_env("llama-server"))
    spawned.append(d)
    address = str(d.wait_event("listening")["address"])
    d.wait_running(2)
    pids = child_pids(address)
    assert len(pids) == 2
    d.proc.kill()
    d.proc.wait()
    assert not gone(pids, 5), "a child outlived the daemon"


def test_second_daemon_on_same_port_fails_with_one_line(
    daemon_env: dict[str, str], spawned: list[ServeProcess], tmp_path: Path
) -> None:
    """A fatal start error exits non-zero with one clear line, and no traceback."""
    first = ServeProcess(daemon_env)
    spawned.append(first)
    address = str(first.wait_event("listening")["address"])
    # Its own state directory: the address is what clashes here.
    second = ServeProcess({**daemon_env, "LLAMAD_LISTEN": address,
                            "LLAMAD_STATE_DIR": str(tmp_path / "state")})
    spawned.append(second)
    assert second.proc.wait(timeout=30) == 1
    err = "".join(second.rest_of_log())
    assert f"llamad: cannot listen on {address}" in err
    assert "Traceback" not in err


def test_second_daemon_on_same_state_dir_is_refused_naming_the_first(
    daemon_env: dict[str, str], spawned: list[ServeProcess]
) -> None:
    """A second daemon on a state directory a live one holds exits 2 saying "state
    directory <path> in use by pid <first's pid>" (one line, no traceback), the first
    serving on; after kill -9 of the first, a new daemon starts on it."""
    state = daemon_env["LLAMAD_STATE_DIR"]
    first = ServeProcess(daemon_env)
    spawned.append(first)
    address = str(first.wait_event("listening")["address"])
    second = ServeProcess(daemon_env)  # port 0: only the state directory clashes
    spawned.append(second)
    assert second.proc.wait(timeout=30) == 2
    err = "".join(second.rest_of_log())
    assert f"llamad: state directory {state} in use by pid {first.proc.pid}" in err
    assert "Traceback" not in err
    assert first.proc.poll() is None
    with grpc.insecure_channel(address) as ch:
        stub = control_pb2_grpc.ControlServiceStub(ch)
        assert stub.Status(control_pb2.StatusRequest(), timeout=5).version

    first.proc.kill()
    first.proc.wait()
    third = ServeProcess(daemon_env)
    spawned.append(third)
    address = str(third.wait_event("listening")["address"])
    with grpc.insecure_channel(address) as ch:
        stub = control_pb2_grpc.ControlServiceStub(ch)
        assert stub.Status(control_pb2.StatusRequest(), timeout=5).version
    third.proc.send_signal(signal.SIGTERM)
    assert third.proc.wait(timeout=60) == 0


def test_config_error_exits_2(tmp_path: Path) -> None:
    """An invalid setting stops the daemon at start with exit 2 and the option's name."""
    result = subprocess.run(
        [sys.executable, "-m", "daemon", "serve", "--listen", "0.0.0.0:1234",
         "--generation-model", str(tmp_path / "m.gguf"), "--no-embedding-enabled"],
        cwd=ROOT, capture_output=True, text=True, timeout=30, check=False,
    )
    assert result.returncode == 2
    assert "listen" in result.stderr
    assert "not a loopback address" in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_without_a_model_runs_the_prepared_default(
    daemon_env: dict[str, str], spawned: list[ServeProcess]
) -> None:
    """`llamad serve` with no model set runs the default model of the prepared models
    directory, and its start log says so."""
    env = {k: v for k, v in daemon_env.items() if k != "LLAMAD_GENERATION_MODEL"}
    d = ServeProcess({**env, "LLAMAD_MODELS_DIR": str(models_dir())})
    spawned.append(d)
    record = d.wait_event("generation.model not set: using the prepared default")
    assert record["model"] == str(model_path(PREPARED_DEFAULT).absolute())
    assert d.wait_event("listening")["modes"]
    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(timeout=60) == 0


def test_one_json_summary_line_per_rpc_without_the_prompt(
    daemon_env: dict[str, str], spawned: list[ServeProcess]
) -> None:
    """Each call logs one JSON 'rpc' line (method, code, duration, tokens); the prompt never
    appears in the log at info level."""
    d = ServeProcess(daemon_env)
    spawned.append(d)
    address = str(d.wait_event("listening")["address"])
    d.wait_running(1)
    secret = "zebra-prompt-do-not-log-4711"
    with grpc.insecure_channel(address) as ch:
        stub = inference_pb2_grpc.InferenceServiceStub(ch)
        list(stub.Generate(pb.GenerateRequest(prompt=secret,
                                              sampling=pb.SamplingParams(max_tokens=4))))
        with pytest.raises(grpc.RpcError):
            list(stub.Generate(pb.GenerateRequest(prompt="")))
    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(timeout=30) == 0
    lines = d.rest_of_log()
    records = [json.loads(line) for line in lines if line.startswith("{")]
    assert len(records) == len([line for line in lines if line.strip()]), "non-JSON log line"
    rpcs = [r for r in records if r.get("event") == "rpc"]
    assert [(r["method"], r["code"]) for r in rpcs] == [
        ("Generate", "OK"), ("Generate", "INVALID_ARGUMENT")]
    assert rpcs[0]["tokens"] == 4
    assert rpcs[0]["prompt_chars"] == len(secret)
    assert isinstance(rpcs[0]["duration_ms"], float)
    assert rpcs[0]["peer"]
    assert not any(secret in line for line in lines)


def test_systemd_notify_protocol_end_to_end(
    daemon_env: dict[str, str], spawned: list[ServeProcess], tmp_path: Path
) -> None:
    """Under a (socket standing in for) systemd: READY=1 once listening, STATUS lines with
    child states, WATCHDOG=1 pings, STOPPING=1 on SIGTERM; children don't inherit it."""
    import socket

    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(0.2)
    d = ServeProcess({**daemon_env, "NOTIFY_SOCKET": path, "WATCHDOG_USEC": "400000"})
    spawned.append(d)
    messages: list[str] = []

    def drain_until(predicate: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                messages.append(sock.recv(4096).decode())
            except TimeoutError:
                continue
            if any(predicate in m for m in messages):
                return
        raise AssertionError(f"never got {predicate!r}; got {messages[-10:]}")

    try:
        drain_until("READY=1")
        ready = next(m for m in messages if "READY=1" in m)
        assert f"MAINPID={d.proc.pid}" in ready
        drain_until("generation: running")
        drain_until("WATCHDOG=1")
        address = str(d.wait_event("listening")["address"])
        pid = child_pids(address)[0]
        with open(f"/proc/{pid}/environ", "rb") as fh:
            assert b"NOTIFY_SOCKET" not in fh.read()
        d.proc.send_signal(signal.SIGTERM)
        drain_until("STOPPING=1")
        assert d.proc.wait(timeout=30) == 0
    finally:
        sock.close()
