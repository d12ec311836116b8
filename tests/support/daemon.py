"""Helpers to run a real daemon in-process on port 0 and talk to it with real clients."""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from daemon import Daemon, load
from llamad_protocol.v1 import common_pb2, control_pb2, control_pb2_grpc, inference_pb2_grpc
from tests.conftest import EMBED_MODEL, SMALL_MODEL, model_path

GEN = common_pb2.CHILD_ROLE_GENERATION
EMB = common_pb2.CHILD_ROLE_EMBEDDING
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def config_env(runtime: str, **overrides: str) -> dict[str, str]:
    env = {
        "LLAMAD_LISTEN": "127.0.0.1:0",
        # Never the repository's ./var: every test daemon gets its own state.
        "LLAMAD_STATE_DIR": tempfile.mkdtemp(prefix="llamad-test-state-"),
        "LLAMAD_GENERATION_MODEL": str(model_path(SMALL_MODEL)),
        "LLAMAD_EMBEDDING_MODEL": str(model_path(EMBED_MODEL)),
        "LLAMAD_GENERATION_RUNTIME": runtime,
        "LLAMAD_EMBEDDING_RUNTIME": runtime,
        "LLAMAD_GENERATION_THREADS": "2",
        "LLAMAD_EMBEDDING_THREADS": "2",
        "LLAMAD_GENERATION_PARALLEL": "2",
        "LLAMAD_GENERATION_CTX_SIZE": "2048",
        "LLAMAD_RESTART_BACKOFF_BASE": "0.1",
        "LLAMAD_RESTART_BACKOFF_CAP": "0.5",
        "LLAMAD_CHILD_PROBE_INTERVAL": "0.5",
        "LLAMAD_CHILD_STOP_GRACE": "3",
        "LLAMAD_DRAIN_GRACE": "5",
        "LLAMAD_LOG_FORMAT": "json",
        # Sources are scanned when a test asks (AddSource, Reindex): the live watcher would
        # race a test's counts of what its scan added. tests/integration/test_watch_daemon.py
        # turns it on (and tests/unit/test_watch.py tests the watcher itself).
        "LLAMAD_RETRIEVAL_WATCH": "false",
    }
    env.update(overrides)
    return env


def catalog_env(folder: Path, toml: str, **overrides: str) -> dict[str, str]:
    """:func:`config_env` (llama-server, embedding disabled, ``overrides``) whose models are
    only the ``[models.NAME]`` tables of ``toml``, written as ``folder``/llamad.toml (its
    models directory is empty); a ``[generation]`` table in it names the generation model."""
    config = folder / "llamad.toml"
    config.write_text(toml)
    empty = folder / "no-models"
    empty.mkdir(exist_ok=True)
    env = config_env("llama-server", LLAMAD_CONFIG=str(config), LLAMAD_MODELS_DIR=str(empty),
                     LLAMAD_EMBEDDING_MODE="disabled", **overrides)
    if "[generation]" in toml:
        del env["LLAMAD_GENERATION_MODEL"]  # the file's [generation] names it
    return env


def make_daemon(env: Mapping[str, str]) -> Daemon:
    return Daemon(load(None, env=env))


@contextlib.asynccontextmanager
async def served(daemon: Daemon, service: str = "") -> AsyncIterator[Clients]:
    """``daemon`` started and stubs to it, yielded once ``service`` (by default the whole
    server) is SERVING; the stubs closed and the daemon shut down on the way out."""
    clients = Clients(await daemon.start())
    try:
        await clients.wait_serving(service)
        yield clients
    finally:
        await clients.close()
        await daemon.shutdown()


@contextlib.asynccontextmanager
async def serving(env: Mapping[str, str], service: str = ""
                  ) -> AsyncIterator[tuple[Daemon, Clients]]:
    """A daemon made from ``env``, :func:`served`."""
    daemon = make_daemon(env)
    async with served(daemon, service) as clients:
        yield daemon, clients


class Clients:
    """Real gRPC stubs over one channel to the daemon."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.aio.insecure_channel(address)
        self.inference = inference_pb2_grpc.InferenceServiceStub(self.channel)
        self.control = control_pb2_grpc.ControlServiceStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)

    async def status(self, service: str = "") -> int:
        resp = await self.health.Check(health_pb2.HealthCheckRequest(service=service))
        return int(resp.status)

    async def wait_serving(self, service: str = "", timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        async for resp in self.health.Watch(health_pb2.HealthCheckRequest(service=service),
                                            timeout=timeout):
            if resp.status == health_pb2.HealthCheckResponse.SERVING:
                return
            if time.monotonic() > deadline:
                break
        raise AssertionError(f"{service or 'overall'} never became SERVING")

    async def child(self, role: int) -> control_pb2.ChildStatus:
        resp = await self.control.Status(control_pb2.StatusRequest())
        for child in resp.children:
            if child.role == role:
                found: control_pb2.ChildStatus = child
                return found
        raise AssertionError(f"no child with role {role}")

    async def close(self) -> None:
        await self.channel.close()
