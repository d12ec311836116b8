"""The HTTP API in-process on a loopback port 0 over the real router and admission, with
scripted backends (:mod:`tests.support.backend`), for unit tests."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import httpx
import orjson

from daemon.config import HttpSettings, Limits, Role
from daemon.config._resolved import ChildConfig
from daemon.config.access import TlsMaterial, TokenTable
from daemon.grpcapi.auth import AuthInterceptor
from daemon.grpcapi.connlimits import ConnectionCap
from daemon.httpapi import HttpApi, Mount
from daemon.models.admission import Admission
from daemon.models.backend import InferenceBackend
from daemon.models.router import InferenceRouter
from daemon.services.ask import AskService
from daemon.telemetry.metrics import Metrics
from tests.support.backend import FakeBackend, FakeRole


@dataclass
class Served(FakeRole):
    """A scripted role as the router and the catalog see it: a :class:`FakeRole` with the
    role's name and its child's configuration."""

    role: str = "generation"
    config: ChildConfig = field(init=False)

    def __post_init__(self) -> None:
        # A child is named by its GGUF file, as a real one (supervisor's model_name).
        self.config = ChildConfig(role=Role(self.role),
                                  model=f"/models/{self.served.model_name}",
                                  ctx_size=0, threads=1, parallel=1, batch=0, queue_ahead=0,
                                  spin_count=-1)


@dataclass
class Harness:
    """A running API: its URL, the scripted backends, the metrics and the router."""

    url: str
    gen: FakeBackend
    emb: FakeBackend
    metrics: Metrics
    router: InferenceRouter
    gen_admission: Admission
    gen_role: FakeRole
    api: HttpApi


@contextlib.asynccontextmanager
async def serving(*, tokens: TokenTable | None = None, queue: int = 4,
                  settings: HttpSettings | None = None,
                  answer: Callable[[InferenceRouter], AskService] | None = None,
                  pieces: list[str] | None = None,
                  tls: TlsMaterial | None = None, connections: ConnectionCap | None = None,
                  handshake_timeout: float = 10.0,
                  auth: AuthInterceptor | None = None,
                  mount: Mount | None = None,
                  generation: InferenceBackend | None = None) -> AsyncIterator[Harness]:
    """The API on port 0: generation and embedding served by scripted backends (one slot
    each; ``queue`` calls may wait for generation's), Ask by ``answer`` if given, with
    ``connections`` and ``handshake_timeout`` (HttpApi's) if given, and ``auth`` in
    place of an interceptor over ``tokens``, and ``mount`` served beside the API;
    ``generation``, if given, serves generation instead of the scripted backend (a real
    supervised child's)."""
    gen = FakeBackend(model_name="gen.gguf")
    if pieces is not None:
        gen.pieces = pieces
    emb = FakeBackend(model_name="emb.gguf", dimension=4)
    gen_admission = Admission("generation", 1, queue)
    gen_role = Served(generation or gen, gen_admission, role="generation")
    served = {"generation": gen_role,
              "embedding": Served(emb, Admission("embedding", 1, 4), role="embedding")}
    router = InferenceRouter(served)
    metrics = Metrics()
    api = HttpApi(router=router, served=served, limits=Limits, settings=settings or
                  HttpSettings(body_timeout=0.5, idle_timeout=1.0),
                  auth=auth or AuthInterceptor(tokens, metrics), metrics=metrics,
                  answer=answer(router) if answer is not None else None, tls=tls,
                  connections=connections, handshake_timeout=handshake_timeout,
                  mount=mount)
    port = await api.start("127.0.0.1:0")
    try:
        scheme = "https" if tls is not None else "http"
        yield Harness(f"{scheme}://127.0.0.1:{port}", gen, emb, metrics, router,
                      gen_admission, gen_role, api)
    finally:
        await api.stop()


def client() -> httpx.AsyncClient:
    """An HTTP client that ignores proxy settings of the environment."""
    return httpx.AsyncClient(trust_env=False, timeout=10)


def events(content: bytes) -> list[dict[str, object]]:
    """The JSON events of an SSE body (checked to end with [DONE])."""
    parts = content.split(b"\n\n")
    assert parts[-2:] == [b"data: [DONE]", b""]
    return [orjson.loads(p.removeprefix(b"data: ")) for p in parts[:-2]]


