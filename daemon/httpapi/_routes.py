"""The routes of the HTTP API: what each serves, the gRPC method it stands for (its access
role, its metrics and log label), and the handlers that are not generation.

===========================  ======  ====================  =====================
route                        method  stands for (auth)     counted as
===========================  ======  ====================  =====================
/v1/models                   GET     ControlService/Status  ListModels
/v1/models/{id}              GET     ControlService/Status  ListModels
/v1/chat/completions         POST    InferenceService/Chat  Chat
/v1/completions              POST    InferenceService/Generate  Generate
/v1/responses                POST    InferenceService/Chat  Chat
/v1/messages                 POST    InferenceService/Chat  Chat
/v1/messages/count_tokens    POST    InferenceService/Tokenize  Tokenize
/v1/embeddings               POST    InferenceService/Embed  Embed
/v1/rerank                   POST    InferenceService/Embed  Rerank (other)
/v1/llamad/ask               POST    AnswerService/Ask      Ask
===========================  ======  ====================  =====================

Every route needs the ``read`` role when tokens are configured; the ``/v1/messages``
routes also take the token as ``x-api-key`` and answer errors in Anthropic's shape.
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np
from aiohttp import web

from ..config import Role
from ..grpcapi.rpc import Call
from ..services.inference import embed
from . import _ask, _generate, _messages, _parse, _responses
from ._context import Api, json_response, time_remaining
from ._errors import ApiError, ParamError, same_style

Handler = Callable[[Api, web.BaseRequest, Call, _parse.Body], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Route:
    """A route: its HTTP method, the full gRPC method it stands for, its metrics label."""

    http_method: str
    grpc_method: str
    label: str
    handler: Handler
    reads_body: bool = True
    restyle: Callable[[ApiError], ApiError] = same_style
    """The route's error shape (OpenAI's, or Anthropic's for /v1/messages)."""
    api_key: bool = False
    """``x-api-key: <token>`` is taken as ``Authorization: Bearer <token>`` (Anthropic's
    SDKs send it)."""


async def models(api: Api, request: web.BaseRequest, call: Call,
                 body: _parse.Body) -> web.StreamResponse:
    """The catalog: every model with its role and whether it is loaded."""
    listed = api.catalog.models()
    call.note(models=len(listed))
    created = api.catalog.created
    return json_response(request, {"object": "list",
                                   "data": [m.to_json(created) for m in listed]})


async def model(api: Api, request: web.BaseRequest, call: Call,
                body: _parse.Body) -> web.StreamResponse:
    """One model of the catalog, by name or alias."""
    name = request.path.removeprefix("/v1/models/")
    found = api.catalog.find(name)
    if found is None:
        raise ApiError(404, f"the model {name[:200]!r} does not exist; GET /v1/models lists "
                       "the models", param="model", code="model_not_found")
    return json_response(request, found.to_json(api.catalog.created))


async def embeddings(api: Api, request: web.BaseRequest, call: Call,
                     body: _parse.Body) -> web.StreamResponse:
    """Embeddings of a string, strings or token arrays, L2-normalised as gRPC Embed's
    (``float``: JSON numbers, the float32 values exactly; ``base64``: little-endian
    float32 bytes)."""
    limits = api.limits()
    listed = api.catalog.resolve(_parse.model_name(body), Role.EMBEDDING, "/v1/embeddings")
    inputs = _parse.embedding_inputs(body, limits)
    fmt = _parse.encoding_format(body)
    wanted = _parse.dimensions(body)
    call.note(texts=len(inputs), encoding=fmt)
    result = await embed(api.router, inputs, time_remaining(call), model=listed.route)
    matrix = result.matrix
    dimension = int(matrix.shape[1]) if matrix.size else 0
    if wanted is not None and wanted != dimension:
        raise ParamError("dimensions", f"dimensions {wanted} is not available: "
                         f"{result.model} makes {dimension}-dimensional embeddings and "
                         "cannot shorten them (omit dimensions, or give "
                         f"{dimension})")
    call.note(dimension=dimension, prompt_tokens=result.prompt_tokens)
    rows = matrix.astype("<f4", copy=False)
    data = [{"object": "embedding", "index": i,
             "embedding": base64.b64encode(row.tobytes()).decode() if fmt == "base64"
             else np.ascontiguousarray(row)}
            for i, row in enumerate(rows)]
    return json_response(request, {
        "object": "list", "data": data, "model": api.catalog.served_name(listed, result.model),
        "usage": {"prompt_tokens": result.prompt_tokens,
                  "total_tokens": result.prompt_tokens}})


async def rerank(api: Api, request: web.BaseRequest, call: Call,
                 body: _parse.Body) -> web.StreamResponse:
    """No rerank model exists in llamad yet: a clear 404."""
    raise ApiError(404, "no rerank model is configured: llamad serves /v1/rerank once its "
                   "model pool holds a rerank model (GET /v1/models lists the models)",
                   param="model", code="model_not_found")


_INFERENCE = "/llamad.v1.InferenceService/"
_STATUS = "/llamad.v1.ControlService/Status"

ROUTES: dict[str, Route] = {
    "/v1/models": Route("GET", _STATUS, "ListModels", models, reads_body=False),
    "/v1/chat/completions": Route("POST", _INFERENCE + "Chat", "Chat", _generate.chat),
    "/v1/completions": Route("POST", _INFERENCE + "Generate", "Generate",
                             _generate.completions),
    "/v1/responses": Route("POST", _INFERENCE + "Chat", "Chat", _responses.create,
                           restyle=_responses.responses_style),
    "/v1/messages": Route("POST", _INFERENCE + "Chat", "Chat", _messages.create,
                          restyle=_messages.restyle, api_key=True),
    "/v1/messages/count_tokens": Route("POST", _INFERENCE + "Tokenize", "Tokenize",
                                       _messages.count_tokens, restyle=_messages.restyle,
                                       api_key=True),
    "/v1/embeddings": Route("POST", _INFERENCE + "Embed", "Embed", embeddings),
    "/v1/rerank": Route("POST", _INFERENCE + "Embed", "Rerank", rerank),
    "/v1/llamad/ask": Route("POST", "/llamad.v1.AnswerService/Ask", "Ask", _ask.ask),
}
MODEL_ROUTE = Route("GET", _STATUS, "ListModels", model, reads_body=False)


def route_of(path: str) -> Route | None:
    """The route serving ``path`` (None: no such route)."""
    found = ROUTES.get(path)
    if found is None and path.startswith("/v1/models/") and len(path) > len("/v1/models/"):
        return MODEL_ROUTE
    return found
