"""Tokenizers and model residency over HTTP: ``POST /tokenize`` (llama-server's shape,
answered by the model's own child, as gRPC's InferenceService/Tokenize is) and the admin
routes ``POST /v1/llamad/models/load`` and ``/unload`` (ControlService/LoadModel and
UnloadModel: their messages in protobuf's JSON mapping, the work
:mod:`daemon.services.residency`'s)."""

from __future__ import annotations

from aiohttp import web

from llamad_protocol.v1 import control_pb2 as cpb

from ..config import Role
from ..grpcapi._pool_wire import model_info
from ..grpcapi.rpc import Call
from ..models.pool import Pool
from ..services import residency
from . import _parse
from ._context import Api, json_response, time_remaining
from ._errors import ApiError, ParamError
from ._openapi import Doc
from ._protojson import read_body, to_json

_TOKENIZE_FIELDS = ("content", "add_special", "model")

TOKENIZE = Doc(
    "Token ids of a text from a model's own tokenizer (llama-server's /tokenize)",
    tag="admin",
    body={"type": "object", "required": ["content"], "additionalProperties": False,
          "properties": {
              "content": {"type": "string"},
              "add_special": {"type": "boolean",
                              "description": "Add the model's special tokens (BOS) as a "
                                             "prompt would"},
              "model": {"type": "string",
                        "description": "A model of GET /v1/models (default: the "
                                       "generation model)"}}},
    response={"type": "object", "required": ["tokens", "model"], "properties": {
        "tokens": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "model": {"type": "string"}}})


async def tokenize(api: Api, request: web.BaseRequest, call: Call,
                   body: _parse.Body) -> web.StreamResponse:
    for key in body:
        if key not in _TOKENIZE_FIELDS:
            raise ParamError(key, f'unknown field "{key[:100]}": /tokenize takes '
                                  f"{', '.join(_TOKENIZE_FIELDS)}")
    content, add_special, name = (body.get("content"), body.get("add_special", False),
                                  body.get("model") or "")
    if not isinstance(content, str):
        raise ParamError("content", f"content must be a string, not {_parse.kind(content)}")
    if not isinstance(add_special, bool):
        raise ParamError("add_special", "add_special must be true or false, not "
                                        f"{_parse.kind(add_special)}")
    if not isinstance(name, str):
        raise ParamError("model", f"model must be a string, not {_parse.kind(name)}")
    limit = api.limits().max_prompt_chars
    if len(content) > limit:
        raise ParamError("content", f"content has {len(content)} characters; the limit is "
                                    f"{limit} (limits.max_prompt_chars)")
    listed = api.catalog.find(name) if name else None
    if name and listed is None:
        known = ", ".join(e.name for e in api.catalog.models())
        raise ApiError(404, f"the model {name[:200]!r} does not exist; GET /v1/models lists "
                            f"the models ({known})", param="model", code="model_not_found")
    role, route = (listed.role, listed.route) if listed is not None else (Role.GENERATION, "")
    backend = await api.router.backend_of(role, route, time_remaining(call))
    tokens = await backend.tokenize(content, add_special=add_special)
    served = api.catalog.served_name(listed, backend.model_name) if listed is not None \
        else api.router.model_name(role, "")
    call.note(role=role, tokens=len(tokens), model=served)
    return json_response(request, {"tokens": tokens, "model": served})


def _pool(api: Api) -> Pool:
    if api.pool is None:
        raise ApiError(404, "this daemon has no model pool", code="not_found")
    return api.pool


LOAD = Doc("Make a model resident (admin)", tag="admin", body=cpb.LoadModelRequest,
           body_required=("name",), response=cpb.LoadModelResponse)
UNLOAD = Doc("Take a model out of residency; running calls finish first (admin)",
             tag="admin", body=cpb.UnloadModelRequest, body_required=("name",),
             response=cpb.UnloadModelResponse)


async def load(api: Api, request: web.BaseRequest, call: Call,
               body: _parse.Body) -> web.StreamResponse:
    msg = read_body(body, cpb.LoadModelRequest)
    if not msg.name:
        raise ParamError("name", "name is required: a model of GET /v1/models")
    call.note(model=msg.name)
    view = await residency.load(_pool(api), msg.name)
    return json_response(request, to_json(cpb.LoadModelResponse(model=model_info(view))))


async def unload(api: Api, request: web.BaseRequest, call: Call,
                 body: _parse.Body) -> web.StreamResponse:
    msg = read_body(body, cpb.UnloadModelRequest)
    if not msg.name:
        raise ParamError("name", "name is required: a model of GET /v1/models")
    call.note(model=msg.name, reason=msg.reason[:200])
    view = await residency.unload(_pool(api), msg.name)
    return json_response(request, to_json(cpb.UnloadModelResponse(model=model_info(view))))
