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
/tokenize                    POST    InferenceService/Tokenize  Tokenize
/detokenize                  POST    InferenceService/Detokenize  Detokenize
/openapi.json                GET     ControlService/Status  OpenAPI
===========================  ======  ====================  =====================

and the knowledge base and model residency (:data:`KB_ROUTES`, :mod:`._kb`,
:mod:`._admin`): each ``/v1/llamad/...`` route stands for the RetrievalService or
ControlService RPC of its name, and needs that RPC's role (``admin`` for those that
change state).

Every route above needs the ``read`` role when tokens are configured; the ``/v1/messages``
routes also take the token as ``x-api-key`` and answer errors in Anthropic's shape. Each
route carries its OpenAPI :class:`~._openapi.Doc`; ``GET /openapi.json`` is made from this
table (:func:`routes`).
"""

from __future__ import annotations

import base64
import functools
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from aiohttp import web

from ..config import Role
from ..grpcapi.rpc import Call
from ..services.inference import embed
from . import _admin, _ask, _docs, _generate, _kb, _messages, _openapi, _parse, _responses
from ._context import Api, json_response, time_remaining
from ._errors import ApiError, ParamError, same_style
from ._openapi import Doc

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
    doc: Doc | None = None
    """What ``/openapi.json`` says of it (every route has one: a test holds them)."""
    raw_body: bool = False
    """The body is raw bytes (``RAW_BODY``), not a JSON object."""


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


async def openapi(api: Api, request: web.BaseRequest, call: Call,
                  body: _parse.Body) -> web.StreamResponse:
    """The OpenAPI 3.1 document of every route (:mod:`._openapi`)."""
    return json_response(request, _openapi_document())


@functools.cache
def _openapi_document() -> dict[str, Any]:
    """Made once: the route table is fixed once imported."""
    return _openapi.document(routes())


_INFERENCE = "/llamad.v1.InferenceService/"
_STATUS = "/llamad.v1.ControlService/Status"
_RETRIEVAL = "/llamad.v1.RetrievalService/"
_CONTROL = "/llamad.v1.ControlService/"

ROUTES: dict[str, Route] = {
    "/v1/models": Route("GET", _STATUS, "ListModels", models, reads_body=False,
                        doc=_docs.MODELS),
    "/v1/chat/completions": Route("POST", _INFERENCE + "Chat", "Chat", _generate.chat,
                                  doc=_docs.CHAT),
    "/v1/completions": Route("POST", _INFERENCE + "Generate", "Generate",
                             _generate.completions, doc=_docs.COMPLETIONS),
    "/v1/responses": Route("POST", _INFERENCE + "Chat", "Chat", _responses.create,
                           restyle=_responses.responses_style, doc=_docs.RESPONSES),
    "/v1/messages": Route("POST", _INFERENCE + "Chat", "Chat", _messages.create,
                          restyle=_messages.restyle, api_key=True, doc=_docs.MESSAGES),
    "/v1/messages/count_tokens": Route("POST", _INFERENCE + "Tokenize", "Tokenize",
                                       _messages.count_tokens, restyle=_messages.restyle,
                                       api_key=True, doc=_docs.COUNT_TOKENS),
    "/v1/embeddings": Route("POST", _INFERENCE + "Embed", "Embed", embeddings,
                            doc=_docs.EMBEDDINGS),
    "/v1/rerank": Route("POST", _INFERENCE + "Embed", "Rerank", rerank, doc=_docs.RERANK),
    "/v1/llamad/ask": Route("POST", "/llamad.v1.AnswerService/Ask", "Ask", _ask.ask,
                            doc=_docs.ASK),
    "/tokenize": Route("POST", _INFERENCE + "Tokenize", "Tokenize", _admin.tokenize,
                       doc=_admin.TOKENIZE),
    "/detokenize": Route("POST", _INFERENCE + "Detokenize", "Detokenize", _admin.detokenize,
                         doc=_admin.DETOKENIZE),
    "/openapi.json": Route("GET", _STATUS, "OpenAPI", openapi, reads_body=False,
                           doc=_docs.OPENAPI),
}
MODEL_ROUTE = Route("GET", _STATUS, "ListModels", model, reads_body=False, doc=_docs.MODEL)
MODEL_PATH = "/v1/models/{id}"


def _rpc(method: str, rpc: str, handler: Handler, doc: Doc, *, service: str = _RETRIEVAL,
        raw_body: bool = False) -> Route:
    return Route(method, service + rpc, rpc, handler, doc=doc, raw_body=raw_body,
                 reads_body=method == "POST")


KB_ROUTES: tuple[tuple[str, Route], ...] = (
    ("/v1/llamad/search", _rpc("POST", "Search", _kb.search, _kb.SEARCH)),
    ("/v1/llamad/documents", _rpc("GET", "ListDocuments", _kb.list_documents,
                                 _kb.LIST_DOCUMENTS)),
    ("/v1/llamad/documents", _rpc("POST", "UpsertDocument", _kb.push, _kb.PUSH)),
    ("/v1/llamad/documents/content", _rpc("POST", "UpsertDocument", _kb.push_raw,
                                         _kb.PUSH_RAW, raw_body=True)),
    ("/v1/llamad/document", _rpc("GET", "GetDocument", _kb.get_document,
                                _kb.GET_DOCUMENT)),
    ("/v1/llamad/document", _rpc("DELETE", "DeleteDocument", _kb.delete_document,
                                _kb.DELETE_DOCUMENT)),
    ("/v1/llamad/review", _rpc("GET", "ListDocuments", _kb.review, _kb.REVIEW)),
    ("/v1/llamad/review/approve", _rpc("POST", "ApproveDocument", _kb.approve,
                                      _kb.APPROVE)),
    ("/v1/llamad/review/reject", _rpc("POST", "RejectDocument", _kb.reject, _kb.REJECT)),
    ("/v1/llamad/reprocess", _rpc("POST", "Reprocess", _kb.reprocess, _kb.REPROCESS)),
    ("/v1/llamad/status", _rpc("GET", "Status", _kb.status, _kb.STATUS)),
    ("/v1/llamad/sources", _rpc("GET", "ListSources", _kb.list_sources,
                               _kb.LIST_SOURCES)),
    ("/v1/llamad/sources", _rpc("POST", "AddSource", _kb.add_source, _kb.ADD_SOURCE)),
    ("/v1/llamad/sources/disabled", _rpc("POST", "SetSourceDisabled", _kb.disable_source,
                                        _kb.DISABLE_SOURCE)),
    ("/v1/llamad/sources/remove", _rpc("POST", "RemoveSource", _kb.remove_source,
                                      _kb.REMOVE_SOURCE)),
    ("/v1/llamad/reindex", _rpc("POST", "Reindex", _kb.reindex, _kb.REINDEX)),
    ("/v1/llamad/models/load", _rpc("POST", "LoadModel", _admin.load, _admin.LOAD,
                                   service=_CONTROL)),
    ("/v1/llamad/models/unload", _rpc("POST", "UnloadModel", _admin.unload, _admin.UNLOAD,
                                     service=_CONTROL)),
)
"""The knowledge base's and the admin routes (path, route): a path may take several
methods, one route each."""


def routes() -> Iterator[tuple[str, Route]]:
    """Every route the server has, as (path template, route)."""
    yield from ROUTES.items()
    yield MODEL_PATH, MODEL_ROUTE
    yield from KB_ROUTES


@functools.cache
def _by_path() -> dict[str, dict[str, Route]]:
    table: dict[str, dict[str, Route]] = {}
    for path, route in (*ROUTES.items(), *KB_ROUTES):
        table.setdefault(path, {})[route.http_method] = route
    return table


def route_of(path: str, method: str = "") -> Route | None:
    """The route serving ``method`` on ``path``; when none serves that method, a route of
    the path (its caller answers 405 naming :func:`methods_of`); None: no such path."""
    by_method = _by_path().get(path)
    if by_method is None:
        if path.startswith("/v1/models/") and len(path) > len("/v1/models/"):
            return MODEL_ROUTE
        return None
    return by_method.get(method) or next(iter(by_method.values()))


def methods_of(path: str) -> tuple[str, ...]:
    """The methods ``path`` takes."""
    by_method = _by_path().get(path)
    if by_method is None:
        return (MODEL_ROUTE.http_method,) if route_of(path) is MODEL_ROUTE else ()
    return tuple(by_method)
