"""llamad's OpenAI-compatible HTTP API, beside gRPC (issue 15).

Served by aiohttp's low-level server (:mod:`._server`) in the daemon's own event loop:
no thread, no second loop. Requests go through the same router, admission control,
access tokens, metrics and summary log line as gRPC calls (:mod:`daemon.services.inference`,
:meth:`daemon.grpcapi.auth.AuthInterceptor.check`, :func:`daemon.grpcapi.rpc.write_summary`).

Modules: :mod:`._server` (listener, per-request frame, aiohttp's own errors in JSON),
:mod:`._context` (what every handler works with: the daemon's objects, request values),
:mod:`._routes` (the route table, models, embeddings, rerank), :mod:`._generate` (chat
and completions, whole and streamed), :mod:`._parse` (request bodies), :mod:`._shapes`
(response bodies), :mod:`._models` (the catalog), :mod:`._errors` (statuses and OpenAI's
error object), :mod:`._kb` (the knowledge base: search, documents, review, sources,
reindex, reprocess, status), :mod:`._admin` (``/tokenize``, model load and unload),
:mod:`._protojson` (gRPC messages read from and written as JSON, and their JSON Schema),
:mod:`._openapi` and :mod:`._docs` (``GET /openapi.json``, made from the route table),
:mod:`._mount` (pages and routes of a part above this package served beside the API: the
operator console).
"""

from ._context import Api, json_response
from ._errors import ApiError, ParamError
from ._models import Catalog, Listed, Served
from ._mount import Mount
from ._protojson import to_json
from ._routes import Route
from ._server import HttpApi

__all__ = ["Api", "ApiError", "Catalog", "HttpApi", "Listed", "Mount", "ParamError", "Route",
           "Served", "json_response", "to_json"]
