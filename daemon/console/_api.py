"""The console's own routes, beside the HTTP API's (which its pages call for everything
else: search, documents, sources, review, Ask, model load and unload):

* ``GET /console/api/overview`` (ControlService/Status, read): the node, its models,
  its children, and whether the caller's token is admin;
* ``GET /console/api/metrics`` (ControlService/Status, read): the metric history
  (``?since=`` wall-clock seconds);
* ``GET /console/api/logs`` (ControlService/TailLogs, admin): a child's log lines
  (``?model=``) after ``?after=`` (a line's ``seq``);
* ``GET /console/api/review/change`` (RetrievalService/GetDocument, read): a held
  document (``?id=``) against its indexed version.

Each is checked, counted and logged as the API route of the same RPC is (the frame of
:class:`daemon.httpapi.HttpApi`); the work is the services' and the pool's, as gRPC's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from aiohttp import web

from ..grpcapi.auth import AuthInterceptor
from ..grpcapi.control import child_status, status_response
from ..grpcapi.rpc import Call
from ..httpapi import Api, ApiError, ParamError, json_response, to_json
from ..models.pool import Pool
from ..ops.balancing import Drainer
from ..services import review
from ..telemetry.history import MetricHistory
from ._exits import ExitLog
from ._pages import SECURITY_HEADERS

ADMIN_PROBE = "/llamad.v1.ControlService/LoadModel"
"""An admin RPC: whether the caller's token may call it tells the page to show admin
controls (the server checks every admin call again, whatever the page shows)."""
Answer = Callable[["Node", web.BaseRequest, Call], web.Response]
"""A synchronous route of the console: over the node, the request, its call record."""
MAX_LOG_LINES = 500
"""Most log lines one answer carries (the page asks again for the rest)."""


@dataclass(frozen=True)
class Node:
    """What the console reads of the daemon.

    Attributes:
        pool: the model pool (models, children, log rings).
        version: llamad's version.
        started: :func:`time.monotonic` at the daemon's start.
        draining: whether the daemon is draining (SIGTERM).
        drainer: the administrative drain (None: none).
        auth: the token checker (the caller's role).
        history: the metric history.
        exits: each child's recent exits.
    """

    pool: Pool
    version: str
    started: float
    draining: Callable[[], bool]
    drainer: Drainer | None
    auth: AuthInterceptor
    history: MetricHistory
    exits: ExitLog


def _answer(request: web.BaseRequest, data: object) -> web.Response:
    response = json_response(request, data)
    response.headers.update(SECURITY_HEADERS)
    response.headers["Cache-Control"] = "no-store"
    return response


def _is_admin(node: Node, request: web.BaseRequest) -> bool:
    authorization = request.headers.get("Authorization")
    metadata = [("authorization", authorization)] if authorization is not None else []
    return node.auth.check(ADMIN_PROBE, metadata) is None


def overview(node: Node, request: web.BaseRequest, call: Call) -> web.Response:
    """The node (version, uptime, drain), every catalog model (with its expected load
    time while loading), every child serving now (with its recent exits), and whether the
    caller is admin."""
    pool = node.pool
    status = to_json(status_response(pool, node.version, node.started,
                                     draining=node.draining(), drainer=node.drainer))
    for model in status.get("models", []):
        if model.get("state") == "MODEL_STATE_LOADING":
            model["load_expected_seconds"] = pool.expected_load(model["name"])
    children = [{"name": name, **to_json(child_status(model)),
                 "recent_exits": node.exits.of(name)}
                for name, model in pool.every_model().items()]
    status["children"] = children
    status["admin"] = _is_admin(node, request)
    call.note(models=len(status.get("models", [])), children=len(children))
    return _answer(request, status)


def _number(query: Mapping[str, str], name: str, default: float = 0.0) -> float:
    given = query.get(name)
    if given is None:
        return default
    try:
        value = float(given)
    except ValueError:
        value = -1.0
    if not value >= 0:  # NaN too
        raise ParamError(name, f"{name} must be a number >= 0, not {given[:40]!r}")
    return value


def metrics(node: Node, request: web.BaseRequest, call: Call) -> web.Response:
    """The samples after ``?since=`` (wall-clock seconds; default: all kept)."""
    since = _number(request.query, "since")
    samples = node.history.samples(since)
    call.note(samples=len(samples))
    return _answer(request, {"interval": node.history.interval,
                             "window": node.history.window,
                             "samples": [s.to_json() for s in samples]})


def logs(node: Node, request: web.BaseRequest, call: Call) -> web.Response:
    """``?model=``'s child log lines after ``?after=`` (a line's ``seq``; 0: the latest
    :data:`MAX_LOG_LINES`), at most :data:`MAX_LOG_LINES`; and every model with a child,
    for the page's choice."""
    every = node.pool.every_model()
    name = request.query.get("model") or next(iter(every), "")
    model = every.get(name)
    if model is None:
        raise ApiError(404, f"no child serves {name[:200]!r} now; serving: "
                       f"{', '.join(every) or 'none'}", param="model", code="not_found")
    after = int(_number(request.query, "after"))
    ring = model.ring
    lines = ring.since(after) if after else ring.tail(MAX_LOG_LINES)
    more = len(lines) > MAX_LOG_LINES
    lines = lines[:MAX_LOG_LINES]
    call.note(model=name, lines=len(lines))
    return _answer(request, {
        "model": name, "models": list(every), "more": more, "last_seq": ring.last_seq,
        "lines": [{"seq": ln.seq, "time": ln.time, "pid": ln.pid, "stream": ln.stream,
                   "text": ln.text} for ln in lines]})


async def review_change(api: Api, request: web.BaseRequest, call: Call) -> web.Response:
    """The change of the held document ``?id=`` (:mod:`daemon.services.review`)."""
    if api.knowledge is None:
        raise ApiError(404, "this daemon has no knowledge base (retrieval is off)",
                       code="not_found")
    doc_id = request.query.get("id", "")
    call.note(document=doc_id[:200])
    found = await review.change(api.knowledge.retriever, doc_id)
    return _answer(request, {"id": found.id, "indexed": found.indexed,
                             "lines": list(found.lines), "truncated": found.truncated,
                             "held_chars": found.held_chars})

