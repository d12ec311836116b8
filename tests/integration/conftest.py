"""Fixtures shared by integration modules (the global ones are in tests/conftest.py): daemon
processes (the fault matrix; the ``daemon serve`` processes of the signal tests), the daemon
of the hostile-input modules and the one of the translated-API modules (one per module),
the CA and in-process daemons of the access modules, the unsupervised llama-servers and
daemons of the inference-mode modules, and a stale server at a child's socket path (the
fault matrices)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path

import pytest
import pytest_asyncio

from daemon import Daemon
from llamad_protocol.v1 import answer_pb2_grpc, retrieval_pb2_grpc
from llamad_protocol.v1 import retrieval_pb2 as rpb
from tests.conftest import EMBED_MODEL, SMALL_MODEL, model_path
from tests.support.daemon import Clients, config_env, make_daemon, serving
from tests.support.daemon_process import DaemonProcess
from tests.support.hostile import FILES, KEYS, PUSHED, Hostile, intact, listed
from tests.support.modes import KEY, MakeDaemon, Server, start_server
from tests.support.pki import Pki
from tests.support.serve_process import ServeProcess
from tests.support.tools_daemon import tools_daemon


@pytest.fixture
def processes() -> Iterator[Callable[..., DaemonProcess]]:
    """Starts daemon processes; kills any still running at the end (never leaks one)."""
    started: list[DaemonProcess] = []

    def start(tmp: Path, env: dict[str, str], prefix: Sequence[str] = ()) -> DaemonProcess:
        d = DaemonProcess(tmp, env, prefix)
        started.append(d)
        return d

    yield start
    for d in started:
        d.kill()


@pytest.fixture
def spawned() -> Iterator[list[ServeProcess]]:
    """The ``daemon serve`` processes a test appends: killed if still running, reaped and
    their logs closed at the end."""
    procs: list[ServeProcess] = []
    yield procs
    for d in procs:
        if d.proc.poll() is None:
            d.proc.kill()
        d.proc.wait()
        if d.proc.stderr is not None:
            d.proc.stderr.close()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def hostile(llama_server: str, tmp_path_factory: pytest.TempPathFactory
                  ) -> AsyncIterator[Hostile]:
    """A daemon for the hostile-input cases of one module, with a few documents indexed
    (three pushed, two from a directory source) and checked ``intact`` before the first."""
    root = tmp_path_factory.mktemp("hostile")
    files, drop, models = root / "files", root / "drop", root / "models"
    for rel, text in FILES.items():
        (files / rel).parent.mkdir(parents=True, exist_ok=True)
        (files / rel).write_text(text)
    drop.mkdir()
    models.mkdir()
    async with serving(config_env("llama-server", LLAMAD_STATE_DIR=str(root / "state"),
                                  LLAMAD_RETRIEVAL_ALLOWED_ROOTS=str(root))) as (daemon, c):
        deadline = time.monotonic() + 30  # vectors need the embedding model's SHA-256
        while not daemon.children["embedding"].setup.model.sha256:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        r = retrieval_pb2_grpc.RetrievalServiceStub(c.channel)
        await r.AddSource(rpb.AddSourceRequest(id="seed"))
        await r.AddSource(rpb.AddSourceRequest(id="files", path=str(files)))
        await r.AddSource(rpb.AddSourceRequest(id="hostile", path=str(drop)))
        for doc_id, (title, text) in PUSHED.items():
            await r.UpsertDocument(rpb.UpsertDocumentRequest(source_id="seed", id=doc_id,
                                                             title=title, text=text))
        done = [m async for m in r.Reindex(rpb.ReindexRequest(source_id="files"))][-1]
        assert (done.added, len(done.failed)) == (2, 0)
        h = Hostile(daemon, c, r, answer_pb2_grpc.AnswerServiceStub(c.channel),
                    drop, models, await r.Status(rpb.RetrievalStatusRequest()), {})
        h.listed = await listed(h)
        assert set(h.listed) == set(KEYS.values())
        assert h.status.documents_by_state == {"indexed": 5}
        assert h.status.chunks >= 5 and h.status.vectors == h.status.chunks
        await intact(h)
        yield h


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def tools_running(llama_server: str, tmp_path_factory: pytest.TempPathFactory
                        ) -> AsyncIterator[Daemon]:
    """The daemon of :func:`tests.support.tools_daemon.tools_daemon` (one per module): the
    ``/v1/messages`` and ``/v1/responses`` modules'."""
    async with tools_daemon(tmp_path_factory.mktemp("tools")) as daemon:
        yield daemon


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A throwaway CA (made with openssl), one per module."""
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
async def started() -> AsyncIterator[list[Daemon]]:
    """Daemons a test starts; all shut down at the end."""
    daemons: list[Daemon] = []
    yield daemons
    for d in daemons:
        await d.shutdown()


@pytest.fixture(scope="module")
def servers(llama_server: str, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[dict[str, Server]]:
    """Three real llama-servers: generation, embedding (--embedding), and generation behind
    an API key (--api-key-file)."""
    logs = tmp_path_factory.mktemp("endpoints")
    started: dict[str, Server] = {}
    try:
        started["gen"] = start_server(llama_server, model_path(SMALL_MODEL), logs / "gen.log",
                                      "--ctx-size", "4096", "--parallel", "2")
        started["emb"] = start_server(llama_server, model_path(EMBED_MODEL), logs / "emb.log",
                                      "--embedding", "--ctx-size", "1024", "--parallel", "2",
                                      "--batch-size", "512", "--ubatch-size", "512")
        started["keyed"] = start_server(llama_server, model_path(SMALL_MODEL),
                                        logs / "keyed.log", "--ctx-size", "1024", key=KEY)
        yield started
    finally:
        for server in started.values():
            server.stop()


@pytest.fixture
async def daemon_for(tmp_path: Path) -> AsyncIterator[MakeDaemon]:
    """Starts daemons with extra settings; stops them at the end."""
    made: list[tuple[Daemon, Clients]] = []

    async def make(**overrides: str) -> tuple[Daemon, Clients]:
        env = config_env("llama-server", LLAMAD_STATE_DIR=str(tmp_path / f"state{len(made)}"),
                         **overrides)
        daemon = make_daemon(env)
        c = Clients(await daemon.start())
        made.append((daemon, c))
        return daemon, c

    try:
        yield make
    finally:
        for daemon, c in made:
            await c.close()
            await daemon.shutdown()


@pytest.fixture
async def stale(tmp_path: Path) -> AsyncIterator[tuple[Path, list[int]]]:
    """A server still listening on a socket path (a crashed daemon's child that lived on):
    yields the path and the list its connections are counted in."""
    path = tmp_path / "stale.sock"
    connections: list[int] = []

    async def count(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        writer.close()

    server = await asyncio.start_unix_server(count, str(path))
    try:
        yield path, connections
    finally:
        server.close()
        await server.wait_closed()
