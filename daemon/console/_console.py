"""The console as a mount of the HTTP listener (:class:`daemon.httpapi.Mount`): its
static pages, its routes (:mod:`._api`), and what runs while the listener does: the
metric sampler and the record of exits (:mod:`._exits`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping

from aiohttp import web

from ..config import ConsoleSettings
from ..grpcapi.auth import AuthInterceptor
from ..grpcapi.rpc import Call
from ..httpapi import Api, Route
from ..httpapi._parse import Body
from ..models.pool import Pool
from ..ops.balancing import Drainer
from ..telemetry.history import WANTED, MetricHistory
from ..telemetry.metrics import Metrics
from . import _api
from ._api import Node
from ._exits import ExitLog
from ._pages import Pages, load

PREFIX = "/console"
_STATUS = "/llamad.v1.ControlService/Status"


class Console:
    """The operator console (module docstring of :mod:`daemon.console`).

    Args:
        node: what its pages read of the daemon.
        files: the static files by name (default: those shipped in the package).
    """

    prefix = PREFIX

    def __init__(self, node: Node, files: Mapping[str, bytes] | None = None) -> None:
        self.node = node
        self._pages = Pages(PREFIX, load() if files is None else files)
        self._sampler: asyncio.Task[None] | None = None
        self._routes: dict[str, Route] = {
            f"{PREFIX}/api/overview": self._route(_STATUS, "Status", _api.overview),
            f"{PREFIX}/api/metrics": self._route(_STATUS, "Status", _api.metrics),
            f"{PREFIX}/api/logs": self._route("/llamad.v1.ControlService/TailLogs",
                                              "TailLogs", _api.logs),
            f"{PREFIX}/api/review/change": Route(
                "GET", "/llamad.v1.RetrievalService/GetDocument", "GetDocument",
                self._review, reads_body=False),
        }

    def _route(self, method: str, label: str, answer: _api.Answer) -> Route:
        node = self.node

        async def handler(api: Api, request: web.BaseRequest, call: Call,
                          body: Body) -> web.StreamResponse:
            return answer(node, request, call)

        return Route("GET", method, label, handler, reads_body=False)

    @staticmethod
    async def _review(api: Api, request: web.BaseRequest, call: Call,
                      body: Body) -> web.StreamResponse:
        return await _api.review_change(api, request, call)

    # -- the Mount protocol ----------------------------------------------------------

    def page(self, request: web.BaseRequest) -> web.StreamResponse | None:
        return self._pages.answer(request)

    def route(self, path: str, method: str) -> Route | None:
        return self._routes.get(path)

    def methods(self, path: str) -> tuple[str, ...]:
        found = self._routes.get(path)
        return () if found is None else (found.http_method,)

    async def start(self) -> None:
        """Start sampling the metrics (the Metrics page's history) and recording exits."""
        self.node.exits.start()
        if self._sampler is None:
            self._sampler = asyncio.create_task(self.node.history.run(),
                                                name="console-sampler")

    async def stop(self) -> None:
        """Stop sampling and recording."""
        self.node.exits.stop()
        task, self._sampler = self._sampler, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def console(pool: Pool, version: str, *, started: float, draining: Callable[[], bool],
            drainer: Drainer | None, auth: AuthInterceptor, metrics: Metrics,
            settings: ConsoleSettings) -> Console | None:
    """The console of a daemon (None: ``console.enabled`` is off), its metric history
    sampled every ``console.sample_interval`` seconds over ``console.history``."""
    if not settings.enabled:
        return None
    history = MetricHistory(metrics.registry.restricted_registry(WANTED).collect,
                            interval=settings.sample_interval, window=settings.history,
                            models=pool.names)
    return Console(Node(pool, version, started, draining, drainer, auth, history,
                        ExitLog(pool)))
