"""What every handler of the HTTP API works with: the daemon's objects (:class:`Api`),
the per-request values (its id, arrival time, and stream once begun), the deadline, and
the two kinds of response (a JSON body, an event stream)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import orjson
from aiohttp import web

from ..config import Limits
from ..grpcapi.rpc import Call
from ..models.router import InferenceRouter
from ..telemetry.metrics import Metrics
from ._models import Catalog
from ._stored import ResponseStore

if TYPE_CHECKING:
    from ..models.pool import Pool
    from ..services.ask import AskService
    from ..services.knowledge import Knowledge

REQUEST_ID = web.RequestKey("request_id", str)
"""The request's id (``x-request-id``), echoed on every response."""
RECEIVED = web.RequestKey("received", float)
"""When the request arrived (:func:`time.perf_counter`): time to first token counts
from here."""
RAW_BODY = web.RequestKey("raw_body", bytes)
"""The body of a route that takes raw bytes (:attr:`daemon.httpapi._routes.Route.raw_body`),
read within the same limits as a JSON body."""
CALLER = web.RequestKey("caller", str)
"""Whose request it is: the fingerprint of its bearer token ("" when no tokens are
configured); a stored response is continued by its caller only."""
STREAM = web.RequestKey("stream", web.StreamResponse)
"""The response, once a stream has sent its headers (a deadline then ends it with an
error event)."""


def time_remaining(call: Call) -> float | None:
    """Seconds left before the request's deadline (None: it has none)."""
    return None if call.deadline is None else max(0.0, call.deadline - time.monotonic())


@dataclass(frozen=True)
class Api:
    """What the handlers serve from (the daemon's own objects)."""

    router: InferenceRouter
    catalog: Catalog
    limits: Callable[[], Limits]
    metrics: Metrics | None
    answer: AskService | None = None
    knowledge: Knowledge | None = None
    """The knowledge base (None: the daemon has none, retrieval off)."""
    pool: Pool | None = None
    """The model pool (admin load and unload)."""
    responses: ResponseStore = field(default_factory=lambda: ResponseStore(0, 0.0))
    """The stored responses of ``/v1/responses`` (none kept by default)."""


def json_response(request: web.BaseRequest, data: object, status: int = 200
                  ) -> web.Response:
    return web.Response(body=orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY),
                        status=status, content_type="application/json",
                        headers={"x-request-id": request[REQUEST_ID]})


async def open_stream(request: web.BaseRequest) -> web.StreamResponse:
    """Send the headers of an event stream; from here on, an error is its last event."""
    response = web.StreamResponse(headers={
        "Content-Type": "text/event-stream", "Cache-Control": "no-cache",
        "X-Accel-Buffering": "no", "x-request-id": request[REQUEST_ID]})
    await response.prepare(request)
    request[STREAM] = response
    return response


