"""The OpenAPI 3.1 document of the HTTP API (``GET /openapi.json``), made from the route
table itself (:func:`daemon.httpapi._routes.routes`): each route declares its
:class:`Doc` beside its handler, and the message schemas come from the gRPC messages'
descriptors (:mod:`._protojson`), the same ones requests are read with. A route cannot be
served undocumented, nor documented unserved (tests/unit/test_http_openapi.py).

Each operation carries its access role (``x-llamad-role``: the role of the gRPC method
it stands for, :data:`daemon.grpcapi.auth.METHOD_ROLES`) and that method
(``x-llamad-grpc-method``); every route takes the bearer token when tokens are configured.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from google.protobuf.message import Message

from ..grpcapi.auth import METHOD_ROLES
from ._protojson import field_schema, message_schema, ref

if TYPE_CHECKING:  # _routes imports Doc from here at run time
    from ._routes import Route

Schema = type[Message] | Mapping[str, Any]
"""A gRPC message (its JSON mapping) or a JSON Schema."""


@dataclass(frozen=True)
class Doc:
    """What the OpenAPI document says of one route.

    Attributes:
        body: the JSON body (a message: its JSON mapping; ``body_skip`` left out and
            ``body_extra`` added: the route's own fields, such as ``stream``).
        raw_body: the media types of a body taken as raw bytes (instead of JSON).
        query: a message whose fields are the query parameters (``query_skip`` left out).
        response: the JSON answer.
        events: the event of the stream ``"stream": true`` asks for (``data: <event>``,
            then ``data: [DONE]``).
        error: the error object's schema (``Error``: OpenAI's).
    """

    summary: str
    description: str = ""
    tag: str = "openai"
    body: Schema | None = None
    body_skip: tuple[str, ...] = ()
    body_extra: Mapping[str, Any] = field(default_factory=dict)
    body_required: tuple[str, ...] = ()
    raw_body: tuple[str, ...] = ()
    query: type[Message] | None = None
    query_skip: tuple[str, ...] = ()
    path_params: tuple[str, ...] = ()
    response: Schema | None = None
    events: Schema | None = None
    error: str = "Error"


_ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type"],
    "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                   "param": {"type": ["string", "null"]},
                   "code": {"type": ["string", "null"]}}}}}
_ANTHROPIC_ERROR = {"type": "object", "required": ["type", "error"], "properties": {
    "type": {"const": "error"},
    "error": {"type": "object", "required": ["type", "message"],
              "properties": {"type": {"type": "string"}, "message": {"type": "string"}}}}}
_TAGS = [
    {"name": "openai", "description": "OpenAI's (and Anthropic's) APIs, as those SDKs call "
                                      "them"},
    {"name": "knowledge", "description": "llamad's knowledge base: search, documents, "
                                         "sources, review, reprocess, ask. Bodies and answers "
                                         "are the llamad.v1 gRPC messages in protobuf's JSON "
                                         "mapping (proto field names; lowerCamelCase read "
                                         "too)."},
    {"name": "admin", "description": "Models and tokenizers"},
]


def _llamad_version() -> str:
    try:
        return version("llamad")
    except PackageNotFoundError:  # run from a source tree without an install
        return "0"


def _schema(given: Schema, components: dict[str, Any], *, skip: tuple[str, ...] = (),
            extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    if isinstance(given, type):
        descriptor = given.DESCRIPTOR
        if not skip and not extra:  # the message itself: one component, referenced
            name = descriptor.full_name
            if name not in components:
                components[name] = {}  # a placeholder: a message holding itself stops here
                components[name] = message_schema(descriptor, components)
            return ref(descriptor)
        return message_schema(descriptor, components, skip=skip, extra=extra)
    return dict(given)


def _operation(path: str, route: Route, doc: Doc,
               components: dict[str, Any]) -> dict[str, Any]:
    role = METHOD_ROLES.get(route.grpc_method, "none")
    operation: dict[str, Any] = {
        "operationId": f"{route.http_method.lower()}{path.replace('/', '_').replace('.', '_')}"
                       .replace("{", "").replace("}", ""),
        "summary": doc.summary, "tags": [doc.tag],
        "security": [{"bearer": []}],
        "x-llamad-role": role, "x-llamad-grpc-method": route.grpc_method,
    }
    text = doc.description + (" " if doc.description else "") + \
        f"Needs a token with the {role} role when tokens are configured."
    operation["description"] = text
    parameters: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in doc.path_params]
    if doc.query is not None:
        for f in doc.query.DESCRIPTOR.fields:
            if f.name in doc.query_skip:
                continue
            parameters.append({"name": f.name, "in": "query", "required": False,
                               "schema": field_schema(f, components)})
    if parameters:
        operation["parameters"] = parameters
    if doc.body is not None:
        schema = _schema(doc.body, components, skip=doc.body_skip, extra=doc.body_extra)
        if doc.body_required:
            schema = {**schema, "required": list(doc.body_required)} if "$ref" not in schema \
                else {"allOf": [schema, {"required": list(doc.body_required)}]}
        operation["requestBody"] = {"required": True, "content": {
            "application/json": {"schema": schema}}}
    elif doc.raw_body:
        operation["requestBody"] = {"required": True, "content": {
            media: {"schema": {"type": "string", "contentMediaType": media}}
            for media in doc.raw_body}}
    content: dict[str, Any] = {}
    if doc.response is not None:
        content["application/json"] = {"schema": _schema(doc.response, components)}
    if doc.events is not None:
        content["text/event-stream"] = {
            "schema": {"type": "string"},
            "x-llamad-event": _schema(doc.events, components)}
    operation["responses"] = {
        "200": {"description": "OK", **({"content": content} if content else {})},
        "default": {"description": "A refusal: its status, and the error object naming "
                                   "the field at fault in param",
                    "content": {"application/json": {
                        "schema": {"$ref": f"#/components/schemas/{doc.error}"}}}}}
    return operation


def document(routes: Iterable[tuple[str, Route]]) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``routes`` (path template, route).

    Raises:
        ValueError: a route without its :class:`Doc` (tests catch it before a release).
    """
    components: dict[str, Any] = {"Error": _ERROR, "AnthropicError": _ANTHROPIC_ERROR}
    paths: dict[str, dict[str, Any]] = {}
    for path, route in routes:
        if route.doc is None:
            raise ValueError(f"{route.http_method} {path} has no OpenAPI Doc")
        paths.setdefault(path, {})[route.http_method.lower()] = _operation(
            path, route, route.doc, components)
    return {
        "openapi": "3.1.0",
        "info": {"title": "llamad HTTP API", "version": _llamad_version(),
                 "description": "OpenAI-compatible inference, llamad's knowledge base and "
                                "administration over HTTP. docs/http-api.md describes it."},
        "tags": _TAGS,
        "paths": dict(sorted(paths.items())),
        "components": {
            "schemas": dict(sorted(components.items())),
            "securitySchemes": {"bearer": {
                "type": "http", "scheme": "bearer",
                "description": "A token of auth.token_file (read or admin role); not asked "
                               "for when that option is unset."}}},
    }
