"""Inference modes end to end, switched live: a real daemon's roles moved between endpoint
(real llama-server processes it does not supervise), embedded (its own children) and
disabled, with SetMode and by reload, under streaming load; and each failure reason named
against a real server that refuses it, leaving the old mode serving.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
import pytest

from daemon import Daemon, load
from llamad_protocol.v1 import common_pb2, control_pb2
from llamad_protocol.v1 import inference_pb2 as pb
from tests.conftest import SMALL_MODEL
from tests.support.daemon import EMB, GEN, NOT_SERVING, SERVING, Clients, config_env
from tests.support.modes import (
    DISABLED,
    EMBEDDED,
    ENDPOINT,
    KEY,
    MakeDaemon,
    Server,
    generate,
    wait_state,
)
from tests.support.procs import alive, free_port

pytestmark = pytest.mark.integration


@pytest.fixture
def not_openai(tmp_path: Path) -> Iterator[str]:
    """A plain HTTP file server on port 0: speaks HTTP, is no OpenAI endpoint."""
    (tmp_path / "index.html").write_text("<html><body>intranet</body></html>")

    class Quiet(SimpleHTTPRequestHandler):
        def __init__(self, *args: object, **kw: object) -> None:
            super().__init__(*args, directory=str(tmp_path), **kw)  # type: ignore[arg-type]

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


async def set_mode(c: Clients, role: common_pb2.ChildRole.ValueType,
                   mode: control_pb2.InferenceMode.ValueType, *, url: str = "", model: str = "",
                   key_file: str = "", key_env: str = "") -> list[control_pb2.SwapProgress]:
    endpoint = control_pb2.EndpointSettings(url=url, model=model, api_key_file=key_file,
                                            api_key_env=key_env)
    request = control_pb2.SetModeRequest(role=role, mode=mode, endpoint=endpoint)
    return [p async for p in c.control.SetMode(request)]


# --- failures, named ---------------------------------------------------------------------


async def test_failures_are_named_and_leave_the_old_mode(
    servers: dict[str, Server], daemon_for: MakeDaemon, not_openai: str,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """Against real servers that refuse: a closed port, a missing or wrong key, a web
    server that is no OpenAI endpoint, TLS to a plain-HTTP port, an unknown model, an
    embedding model for chat, a chat model for embeddings. Each switch fails (ABORTED)
    with the reason named; the role stays as it was; the right key then succeeds."""
    closed = free_port()
    daemon, c = await daemon_for(
        LLAMAD_GENERATION_MODE="endpoint",
        LLAMAD_GENERATION_ENDPOINT_URL=f"http://127.0.0.1:{closed}/v1",
        LLAMAD_EMBEDDING_MODE="disabled", LLAMAD_ENDPOINT_KEYS_DIR=str(tmp_path))
    # Configured at a closed port: retried with backoff until the breaker opens (no more
    # retries for the cool-down), the reason in Status.
    status = await wait_state(c, GEN, control_pb2.CHILD_STATE_FAILED, timeout=30)
    assert status.last_exit.kind == "refused"
    assert status.breaker == control_pb2.BREAKER_STATE_OPEN
    assert "connection refused" in status.last_error
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await generate(c)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE

    wrong = tmp_path / "wrong.key"
    wrong.write_text("sk-not-this-one\n")
    wrong.chmod(0o600)
    right = tmp_path / "right.key"
    right.write_text(f"{KEY}\n")
    right.chmod(0o600)
    keyed, gen, emb = servers["keyed"].url, servers["gen"].url, servers["emb"].url
    cases = [
        (GEN, dict(url=keyed), "auth", "needs an API key"),
        (GEN, dict(url=keyed, key_file=str(wrong)), "auth", "refused the API key"),
        (GEN, dict(url=f"http://{not_openai}/v1"), "not_openai",
         "not an OpenAI-compatible endpoint: GET /v1/models answered HTTP 404 (text/html)"),
        (GEN, dict(url=f"https://{not_openai}/v1"), "tls", "TLS"),
        (GEN, dict(url=f"http://127.0.0.1:{closed}"), "refused", "connection refused"),
        (GEN, dict(url=gen, model="gpt-4o"), "unknown_model", "does not offer the model"),
        (GEN, dict(url=emb), "not_chat", "does not serve chat completions"),
        (EMB, dict(url=gen), "no_embeddings", "no embeddings API"),
    ]
    for role, where, kind, needle in cases:
        seen: list[control_pb2.SwapProgress] = []
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for p in c.control.SetMode(control_pb2.SetModeRequest(
                    role=role, mode=ENDPOINT, endpoint=control_pb2.EndpointSettings(
                        url=where["url"], model=where.get("model", ""),
                        api_key_file=where.get("key_file", "")))):
                seen.append(p)
        assert err.value.code() == grpc.StatusCode.ABORTED, (kind, err.value.details())
        assert seen[-1].stage == control_pb2.SWAP_STAGE_FAILED
        assert seen[-1].cause.kind == kind, (kind, seen[-1].cause)
        assert needle in seen[-1].cause.message, (kind, seen[-1].cause.message)
        assert "sk-not-this-one" not in seen[-1].cause.message
        assert needle in (await c.child(role)).last_error
    assert (await c.child(EMB)).mode == DISABLED  # the failed switch changed nothing
    assert (await c.child(GEN)).endpoint_url == f"http://127.0.0.1:{closed}/v1"

    # Refused before anything starts: a world-readable key file, a bad URL.
    loose = tmp_path / "loose.key"
    loose.write_text(f"{KEY}\n")
    loose.chmod(0o644)
    for settings, needle in ((dict(url=keyed, key_file=str(loose)),
                              "readable or writable by group or others"),
                             (dict(url="ftp://host/v1"), "http or https")):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await set_mode(c, GEN, ENDPOINT, **settings)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert needle in (err.value.details() or "")
        assert KEY not in (err.value.details() or "")

    # The right key, from an environment variable this time (of endpoint_keys.env_prefix).
    monkeypatch.setenv("LLAMAD_ENDPOINT_KEY_TEST", KEY)
    progress = await set_mode(c, GEN, ENDPOINT, url=keyed, key_env="LLAMAD_ENDPOINT_KEY_TEST")
    stages = [p.stage for p in progress]
    assert control_pb2.SWAP_STAGE_PROBING in stages
    assert stages[-1] == control_pb2.SWAP_STAGE_DONE
    status = await c.child(GEN)
    assert (status.mode, status.state) == (ENDPOINT, control_pb2.CHILD_STATE_RUNNING)
    assert status.endpoint_url == keyed
    assert status.last_error == ""
    assert (await generate(c))[-1].model == str(servers["keyed"].model)
    assert await c.status("generation") == SERVING
    logged = capsys.readouterr()
    assert "connecting to endpoint" in logged.out + logged.err  # the log was captured
    assert KEY not in logged.out + logged.err  # and no line of it holds the key
    assert daemon.children["generation"].supervisor.pid == 0


async def test_reload_switches_the_mode(servers: dict[str, Server], tmp_path: Path) -> None:
    """A reload whose file changes a role's mode switches it (make-before-break), and back;
    a reload that points at a refusing endpoint keeps the running mode."""
    file = tmp_path / "llamad.toml"
    env = config_env("llama-server", LLAMAD_EMBEDDING_MODE="disabled",
                     LLAMAD_STATE_DIR=str(tmp_path / "state"))
    del env["LLAMAD_GENERATION_MODEL"]

    def write(generation: str) -> None:
        file.write_text(f"[generation]\n{generation}\n")

    write('mode = "disabled"')
    daemon = Daemon(load(None, env=env, file=file), reload=lambda: load(None, env=env, file=file))
    c = Clients(await daemon.start())
    try:
        assert (await c.child(GEN)).mode == DISABLED
        write(f'mode = "endpoint"\nendpoint_url = "{servers["gen"].url}"')
        report = await daemon.reload()
        assert report.swapped == ["generation"], report
        assert (await c.child(GEN)).mode == ENDPOINT
        assert (await generate(c))[-1].model == str(servers["gen"].model)
        write(f'mode = "endpoint"\nendpoint_url = "http://127.0.0.1:{free_port()}"')
        report = await daemon.reload()
        assert "connection refused" in report.kept["generation"]
        assert (await c.child(GEN)).endpoint_url == servers["gen"].url
        write('mode = "disabled"')
        report = await daemon.reload()
        assert report.swapped == ["generation"]
        assert (await c.child(GEN)).mode == DISABLED
    finally:
        await c.close()
        await daemon.shutdown()


# --- switching under load ----------------------------------------------------------------


@dataclass
class Load:
    """Generate calls in a loop, recording what happened to each."""

    ok: list[tuple[float, str]] = field(default_factory=list)
    refused: list[float] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self, c: Clients, worker: int) -> None:
        while not self.stop.is_set():
            try:
                out = await generate(c, f"Count to ten, worker {worker}:", max_tokens=12)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                    self.refused.append(time.monotonic())
                else:
                    self.failed.append(f"{exc.code().name}: {exc.details()}")
                await asyncio.sleep(0.05)
                continue
            if out[-1].finish_reason == pb.FINISH_REASON_UNSPECIFIED:
                self.failed.append("stream ended without a finish reason")
            else:
                self.ok.append((time.monotonic(), out[-1].model))

    def served_since(self, t: float) -> set[str]:
        return {model for at, model in self.ok if at > t}

    async def wait_served(self, t: float, n: int = 3, timeout: float = 60) -> set[str]:
        """The models that served the ``n`` calls completed after ``t``."""
        deadline = time.monotonic() + timeout
        while len([at for at, _ in self.ok if at > t]) < n:
            assert time.monotonic() < deadline, (self.ok[-3:], self.failed[-3:])
            await asyncio.sleep(0.1)
        return self.served_since(t)


async def test_switch_modes_under_streaming_load(servers: dict[str, Server],
                                                 daemon_for: MakeDaemon) -> None:
    """embedded → endpoint → disabled → embedded while three Generate loops stream: no
    call fails, except those refused (FAILED_PRECONDITION) while disabled; the child
    stops once drained after leaving embedded mode, and a new one serves after."""
    gen = servers["gen"]
    daemon, c = await daemon_for(LLAMAD_EMBEDDING_MODE="disabled")
    await c.wait_serving("generation")
    child = await c.child(GEN)
    assert child.mode == EMBEDDED and child.pid > 0
    load = Load()
    workers = [asyncio.create_task(load.run(c, i)) for i in range(3)]
    try:
        assert await load.wait_served(0) == {SMALL_MODEL}

        progress = await set_mode(c, GEN, ENDPOINT, url=gen.url)
        assert progress[-1].stage == control_pb2.SWAP_STAGE_DONE
        assert control_pb2.SWAP_STAGE_DRAINING in [p.stage for p in progress]
        assert not alive(child.pid)  # stopped after the drain
        status = await c.child(GEN)
        assert (status.mode, status.pid) == (ENDPOINT, 0)
        switched = time.monotonic()
        # The old child is gone (drained, stopped): every call completing from here on was
        # served by the endpoint. (Calls completing during the switch may all be the old
        # child's drained ones: asserting on them raced.)
        assert await load.wait_served(switched) == {str(gen.model)}

        disabled_at = time.monotonic()
        progress = await set_mode(c, GEN, DISABLED)
        assert progress[-1].stage == control_pb2.SWAP_STAGE_DONE
        assert await c.status("generation") == NOT_SERVING
        await asyncio.sleep(1)
        refused_before = len(load.refused)
        assert refused_before > 0

        progress = await set_mode(c, GEN, EMBEDDED)
        enabled_at = time.monotonic()
        assert progress[-1].stage == control_pb2.SWAP_STAGE_DONE
        status = await c.child(GEN)
        assert status.mode == EMBEDDED
        assert status.pid > 0 and status.pid != child.pid and alive(status.pid)
        await c.wait_serving("generation", timeout=10)
        assert await load.wait_served(enabled_at) == {SMALL_MODEL}
    finally:
        load.stop.set()
        await asyncio.gather(*workers)
    assert load.failed == []
    # Refusals only while disabled (a call refused at the moment of enabling may land
    # a moment after enabled_at).
    assert all(disabled_at <= t <= enabled_at + 0.5 for t in load.refused)
    del daemon
