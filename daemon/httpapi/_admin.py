"""Tokenizers and model residency over HTTP: ``POST /tokenize`` and ``POST /detokenize``
(llama-server's shapes, answered by the model's own child, as gRPC's
InferenceService/Tokenize is) and the admin
routes ``POST /v1/llamad/models/load`` and ``/unload`` (ControlService/LoadModel and
UnloadModel: their messages in protobuf's JSON mapping, the work
:mod:`daemon.services.residency`'s)."""

from __future__ import annotations

from aiohttp import web

from llamad_protocol.v1 import control_pb2 as cpb

from ..config import Role
from ..grpcapi._pool_wire import model_info
from ..grpcapi.rpc import Call
from ..models.backend import InferenceBackend
from ..models.pool import Pool
from ..services import residency
from . import _parse
from ._context import Api, json_response, time_remaining
from ._errors import ApiError, ParamError
from ._openapi import Doc
from ._protojson import read_body, to_json

_TOKENIZE_FIELDS = ("content", "add_special", "model")
_DETOKENIZE_FIELDS = ("tokens", "model")
_MODEL = {"type": "string",
          "description": "A model of GET /v1/models (default: the generation model)"}

TOKENIZE = Doc(
    "Token ids of a text from a model's own tokenizer (llama-server's /tokenize)",
    tag="admin",
    body={"type": "object", "required": ["content"], "additionalProperties": False,
          "properties": {
              "content": {"type": "string"},
              "add_special": {"type": "boolean",
                              "description": "Add the model's special tokens (BOS) as a "
                                             "prompt would"},
              "model": _MODEL}},
    response={"type": "object", "required": ["tokens", "model"], "properties": {
        "tokens": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "model": {"type": "string"}}})
DETOKENIZE = Doc(
    "The text of token ids of a model's own tokenizer (llama-server's /detokenize); an id "
    "outside the model's vocabulary is a 400 naming it",
    tag="admin",
    body={"type": "object", "required": ["tokens"], "additionalProperties": False,
          "properties": {
              "tokens": {"type": "array", "items": {"type": "integer", "minimum": 0}},
              "model": _MODEL}},
    response={"type": "object", "required": ["content", "model"], "properties": {
        "content": {"type": "string"}, "model": {"type": "string"}}})


async def tokenize(api: Api, request: web.BaseRequest, call: Call,
                   body: _parse.Body) -> web.StreamResponse:
    _only(body, _TOKENIZE_FIELDS, "/tokenize")
    content, add_special, name = (body.get("content"), body.get("add_special", False),
                                  body.get("model") or "")
    if not isinstance(content, str):
        raise ParamError("content", f"content must be a string, not {_parse.kind(content)}")
    if not isinstance(add_special, bool):
        raise ParamError("add_special", "add_special must be true or false, not "
                                        f"{_parse.kind(add_special)}")
    limit = api.limits().max_prompt_chars
    if len(content) > limit:
        raise ParamError("content", f"content has {len(content)} characters; the limit is "
                                    f"{limit} (limits.max_prompt_chars)")
    backend, role, served = await _tokenizer_of(api, call, name)
    tokens = await backend.tokenize(content, add_special=add_special)
    call.note(role=role, tokens=len(tokens), model=served)
    return json_response(request, {"tokens": tokens, "model": served})


async def detokenize(api: Api, request: web.BaseRequest, call: Call,
                     body: _parse.Body) -> web.StreamResponse:
    _only(body, _DETOKENIZE_FIELDS, "/detokenize")
    tokens, name = body.get("tokens"), body.get("model") or ""
    if not isinstance(tokens, list):
        raise ParamError("tokens", f"tokens must be an array of token ids, not "
                                   f"{_parse.kind(tokens)}")
    limit = api.limits().max_prompt_chars
    if len(tokens) > limit:
        raise ParamError("tokens", f"tokens has {len(tokens)} ids; the limit is {limit} "
                                   "(limits.max_prompt_chars)")
    for i, token in enumerate(tokens):
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise ParamError("tokens", f"tokens[{i}] must be a token id (an integer from "
                                       f"0), not {str(token)[:40]}")
    backend, role, served = await _tokenizer_of(api, call, name)
    content = await backend.detokenize(tokens)
    call.note(role=role, tokens=len(tokens), model=served)
    return json_response(request, {"content": content, "model": served})


def _only(body: _parse.Body, fields: tuple[str, ...], route: str) -> None:
    for key in body:
        if key not in fields:
            raise ParamError(key, f'unknown field "{key[:100]}": {route} takes '
                                  f"{', '.join(fields)}")


async def _tokenizer_of(api: Api, call: Call,
                        name: object) -> tuple[InferenceBackend, str, str]:
    """The backend whose tokenizer ``model`` names (none: the generation model's), its
    role, and the name it is served as."""
    if not isinstance(name, str):
        raise ParamError("model", f"model must be a string, not {_parse.kind(name)}")
    listed = api.catalog.find(name) if name else None
    if name and listed is None:
        known = ", ".join(e.name for e in api.catalog.models())
        raise ApiError(404, f"the model {name[:200]!r} does not exist; GET /v1/models lists "
                            f"the models ({known})", param="model", code="model_not_found")
    role, route = (listed.role, listed.route) if listed is not None else (Role.GENERATION, "")
    backend = await api.router.backend_of(role, route, time_remaining(call))
    served = api.catalog.served_name(listed, backend.model_name) if listed is not None \
        else api.router.model_name(role, "")
    return backend, role, served


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
