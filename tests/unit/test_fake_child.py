"""Tests of the fault-injecting fake llama-server, run as real processes on free ports."""

from __future__ import annotations

import base64
import json
import math
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from supervisor.testing import FAULTS, fake_child_command
from supervisor.testing import fake_child as fake
from tests.support.procs import free_port

pytestmark = pytest.mark.process  # every test runs the fake child

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

    def wait_ready(self, timeout: float = 5.0) -> float:
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

    def wait_stderr(self, text: str, timeout: float = 5.0) -> None:
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


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawner]:
    """Yield a Spawner whose children are killed and reaped whatever the test does."""
    spawner = Spawner(tmp_path)
    try:
        yield spawner
    finally:
        spawner.close()


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
    """With no load time the child answers /health 200 well within a second of exec."""
    started = time.monotonic()
    child = spawn()
    assert child.wait_ready() - started < 1.0
    assert "main: server is listening on http://127.0.0.1:" in child.stderr()


def test_health_503_while_loading_then_200(spawn: Spawner) -> None:
    """While loading, /health and /v1/models answer 503 "Loading model", then /health 200."""
    child = spawn(load_seconds=1.0)
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


def test_completion_is_deterministic(spawn: Spawner) -> None:
    """A non-streamed completion returns generate_tokens(prompt), the same every time."""
    child = spawn()
    child.wait_ready()
    body = {"prompt": PROMPT, "max_tokens": 5, "temperature": 0.7, "seed": 3}
    first = httpx.post(f"{child.url}/v1/completions", json=body).json()
    second = httpx.post(f"{child.url}/v1/completions", json=body).json()
    assert first["choices"] == second["choices"]
    assert first["object"] == "text_completion"
    assert first["model"] == "tiny.gguf"
    assert first["choices"][0]["text"] == "".join(fake.generate_tokens(PROMPT, 5))
    assert first["choices"][0]["finish_reason"] == "length"
    assert first["usage"] == {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}


def test_stream_completion_events(spawn: Spawner) -> None:
    """A streamed completion sends one event per token, a final event with usage, then [DONE]."""
    child = spawn()
    child.wait_ready()
    events: list[str] = []
    response = post_stream(
        f"{child.url}/v1/completions", {"prompt": PROMPT, "max_tokens": 4, "stream": True}, events
    )
    assert response.headers["content-type"] == "text/event-stream"
    assert response.headers["transfer-encoding"] == "chunked"
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert [c["choices"][0]["text"] for c in chunks[:-1]] == fake.generate_tokens(PROMPT, 4)
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 4
    assert child.stats() == {"cancelled": 0, "completions": 1, "active_streams": 0}


def test_chat_completion_plain_and_streamed(spawn: Spawner) -> None:
    """Chat answers carry message.content, and chat streams carry delta.content chunks."""
    child = spawn()
    child.wait_ready()
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    expected = "".join(fake.generate_tokens(fake.render_chat(messages), 3))
    url = f"{child.url}/v1/chat/completions"
    plain = httpx.post(url, json={"messages": messages, "max_tokens": 3}).json()
    assert plain["object"] == "chat.completion"
    assert plain["choices"][0]["message"] == {"role": "assistant", "content": expected}
    events: list[str] = []
    post_stream(url, {"messages": messages, "max_tokens": 3, "stream": True}, events)
    chunks = [json.loads(e) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == expected
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert events[-1] == "[DONE]"


def test_stop_string_ends_with_finish_reason_stop(spawn: Spawner) -> None:
    """Generation is cut before the first stop string and finish_reason is "stop"."""
    child = spawn()
    child.wait_ready()
    tokens = fake.generate_tokens(PROMPT, 10)
    body = {"prompt": PROMPT, "max_tokens": 10, "stop": [tokens[3].strip()]}
    choice = httpx.post(f"{child.url}/v1/completions", json=body).json()["choices"][0]
    assert choice == {
        "text": "".join(tokens[:3]) + " ",
        "index": 0,
        "logprobs": None,
        "finish_reason": "stop",
    }


def test_stream_disconnect_cancels_the_task(spawn: Spawner) -> None:
    """A client leaving mid-stream stops generation, logs the cancel and counts it."""
    child = spawn(token_delay=0.01)
    child.wait_ready()
    body = {"prompt": PROMPT, "max_tokens": 1000, "stream": True}
    with (
        httpx.Client(timeout=5.0) as client,
        client.stream("POST", f"{child.url}/v1/completions", json=body) as response,
    ):
        lines = response.iter_lines()
        received = [next(lines) for _ in range(5)]
        assert received[0].startswith("data: ")
        assert child.stats()["active_streams"] == 1
    deadline = time.monotonic() + 3.0
    while child.stats() != {"cancelled": 1, "completions": 0, "active_streams": 0}:
        assert time.monotonic() < deadline, child.stats()
        time.sleep(0.02)
    assert "stop: cancel task, id_task = 0" in child.stderr()


def test_non_streamed_disconnect_cancels_the_task(spawn: Spawner) -> None:
    """A client leaving while a non-streamed completion generates cancels it too."""
    child = spawn(token_delay=0.01)
    child.wait_ready()
    body = json.dumps({"prompt": PROMPT, "max_tokens": 1000}).encode()
    request = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    with socket.create_connection(("127.0.0.1", child.port)) as sock:
        sock.sendall(request)
        time.sleep(0.1)
    deadline = time.monotonic() + 3.0
    while child.stats()["cancelled"] != 1:
        assert time.monotonic() < deadline, child.stats()
        time.sleep(0.02)
    assert "stop: cancel task, id_task = 0" in child.stderr()


def test_embeddings_are_deterministic_and_normalised(spawn: Spawner) -> None:
    """Embeddings have n_embd floats of norm 1, equal for equal texts, also as base64."""
    child = spawn(embedding=True, n_embd=16)
    child.wait_ready()
    url = f"{child.url}/v1/embeddings"
    body = httpx.post(url, json={"input": ["alpha", "beta", "alpha"]}).json()
    assert body["object"] == "list"
    assert body["model"] == "tiny.gguf"
    vectors = [d["embedding"] for d in body["data"]]
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    assert all(len(v) == 16 for v in vectors)
    assert all(math.isclose(math.sqrt(sum(x * x for x in v)), 1.0) for v in vectors)
    assert vectors[0] == vectors[2] != vectors[1]
    assert vectors[0] == fake.embed_text("alpha", 16)
    single = httpx.post(url, json={"input": "alpha"}).json()["data"][0]["embedding"]
    assert single == vectors[0]
    packed = httpx.post(url, json={"input": "alpha", "encoding_format": "base64"}).json()
    floats = struct.unpack("<16f", base64.b64decode(packed["data"][0]["embedding"]))
    assert floats == pytest.approx(vectors[0], rel=1e-6)


def test_embeddings_refused_without_embedding_mode(spawn: Spawner) -> None:
    """Without --embedding, /v1/embeddings answers 501 with llama-server's message."""
    child = spawn()
    child.wait_ready()
    response = httpx.post(f"{child.url}/v1/embeddings", json={"input": "x"})
    assert response.status_code == 501
    assert "does not support embeddings" in response.json()["error"]["message"]


def test_completions_refused_in_embedding_mode(spawn: Spawner) -> None:
    """In --embedding mode the completion endpoints answer 501, as llama-server's do."""
    child = spawn(embedding=True)
    child.wait_ready()
    response = httpx.post(f"{child.url}/v1/completions", json={"prompt": "x"})
    assert response.status_code == 501
    assert response.json()["error"]["type"] == "not_supported_error"


def test_tokenize_and_detokenize(spawn: Spawner) -> None:
    """/tokenize gives one id per word (plus BOS on request) and /detokenize reverses it."""
    child = spawn()
    child.wait_ready()
    url = child.url
    plain = httpx.post(f"{url}/tokenize", json={"content": "a b c"}).json()["tokens"]
    special = httpx.post(f"{url}/tokenize", json={"content": "a b c", "add_special": True})
    assert len(plain) == 3
    assert special.json()["tokens"] == [1, *plain]
    back = httpx.post(f"{url}/detokenize", json={"tokens": special.json()["tokens"]}).json()
    assert back == {"content": "a b c"}


def test_errors_are_shaped_like_llama_server(spawn: Spawner) -> None:
    """Unknown paths answer 404 and malformed bodies 400, both in the error envelope."""
    child = spawn()
    child.wait_ready()
    missing = httpx.get(f"{child.url}/v2/nothing")
    assert missing.status_code == 404
    assert missing.json()["error"] == {
        "code": 404,
        "message": "File Not Found",
        "type": "not_found_error",
    }
    bad = httpx.post(f"{child.url}/v1/completions", content=b"{not json")
    assert bad.status_code == 400
    assert bad.json()["error"]["type"] == "invalid_request_error"


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
    assert child.proc.wait(timeout=5) == 1
    assert "error: invalid argument: --bogus-flag" in child.stderr()


def test_missing_model_fails_like_llama_server(spawn: Spawner, tmp_path: Path) -> None:
    """A model file that cannot be opened is reported as a load error and exit 1."""
    missing = tmp_path / "absent.gguf"
    child = spawn(model=str(missing))
    assert child.proc.wait(timeout=5) == 1
    assert f"llama_model_load: error loading model: failed to open {missing}" in child.stderr()


def test_port_in_use_fails_like_llama_server(spawn: Spawner) -> None:
    """A port held by another listener makes the child print the bind error and exit 1."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        child = spawn(port=port)
        assert child.proc.wait(timeout=5) == 1
    bind_error = f"couldn't bind HTTP server socket, hostname: 127.0.0.1, port: {port}"
    assert bind_error in child.stderr()


def test_sigterm_exits_zero_after_cleanup_line(spawn: Spawner) -> None:
    """SIGTERM makes a well-behaved child log llama-server's clean-up line and exit 0."""
    child = spawn()
    child.wait_ready()
    child.proc.send_signal(signal.SIGTERM)
    assert child.proc.wait(timeout=5) == 0
    assert "srv    operator(): operator(): cleaning up before exit..." in child.stderr()


# ------------------------------------------------------------------------------ faults


def test_crash_at_start_exits_1_quickly(spawn: Spawner) -> None:
    """crash-at-start exits 1 with an error line before ever listening."""
    started = time.monotonic()
    child = spawn(fault="crash-at-start")
    assert child.proc.wait(timeout=5) == 1
    assert time.monotonic() - started < 2.0
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
    assert child.proc.wait(timeout=5) == -signal.SIGSEGV


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
    deadline = time.monotonic() + 0.6
    while time.monotonic() < deadline:
        assert httpx.get(f"{child.url}/health").status_code == 503
        assert httpx.get(f"{child.url}/v1/models").status_code == 503
        time.sleep(0.05)
    assert child.stderr().count("loading tensors ... ") >= 4
    assert "starting the main loop" not in child.stderr()


def test_slow_start_loads_for_three_seconds_by_default(spawn: Spawner) -> None:
    """slow-start loads for 3 s unless --load-seconds says otherwise."""
    slow = spawn(fault="slow-start")
    quick = spawn(fault="slow-start", load_seconds=0.2)
    slow.wait_stderr("main: loading model")
    time.sleep(0.5)
    assert httpx.get(f"{slow.url}/health").status_code == 503
    last = slow.stderr().rsplit("loading tensors ... ", 1)[1]
    assert 5 <= int(last.split("%", 1)[0]) <= 45  # about 0.5 s of 3 s
    quick.wait_ready(timeout=2.0)


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
    assert child.proc.wait(timeout=5) == -signal.SIGKILL


def test_flood_stdout_while_serving(spawn: Spawner) -> None:
    """flood-stdout writes over 1 MB of stdout within a second while completions still work."""
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
    time.sleep(max(0.0, ready_at + 1.0 - time.monotonic()))
    assert received[0] > 1_000_000
    assert first_line[0].startswith(b"flood line 0 ")
    child.proc.kill()
    child.proc.wait(timeout=5)
    reader.join(timeout=5)


def test_usage_error_exits_1(spawn: Spawner) -> None:
    """usage-error prints an "invalid argument" error and a usage line, then exits 1."""
    child = spawn(fault="usage-error")
    assert child.proc.wait(timeout=5) == 1
    assert "error: invalid argument: " in child.stderr()
    assert "usage: " in child.stderr()


def test_model_error_exits_1(spawn: Spawner) -> None:
    """model-error prints llama.cpp's invalid-magic load error and exits 1."""
    child = spawn(fault="model-error")
    assert child.proc.wait(timeout=5) == 1
    stderr = child.stderr()
    assert "llama_model_load: error loading model: invalid magic characters" in stderr
    assert "main: exiting due to model loading error" in stderr


def test_exit_after_ready_crashes_while_idle(spawn: Spawner) -> None:
    """exit-after-ready serves for fault_after seconds, then exits 1 on its own."""
    child = spawn(fault="exit-after-ready", fault_after=1)
    ready_at = child.wait_ready()
    assert child.proc.wait(timeout=5) == 1
    assert 0.7 < time.monotonic() - ready_at < 3.0
