"""GET /openapi.json against the route table it is made from: a validator accepts it,
every route is documented and every documented route served with its method, each
operation's role is its gRPC method's; and the message schemas agree with how bodies are
read (a message written as JSON validates and reads back equal; refusals name the
field's path)."""

from __future__ import annotations

import re
from typing import Any

import jsonschema
import pytest
from google.protobuf.message import Message
from hypothesis import given, settings
from hypothesis import strategies as st
from multidict import MultiDict
from openapi_spec_validator import validate

from daemon.grpcapi.auth import METHOD_ROLES
from daemon.httpapi._errors import ParamError
from daemon.httpapi._openapi import document
from daemon.httpapi._protojson import read_body, read_query, to_json
from daemon.httpapi._routes import ROUTES, route_of, routes
from llamad_protocol.v1 import answer_pb2 as apb
from llamad_protocol.v1 import control_pb2 as cpb
from llamad_protocol.v1 import retrieval_pb2 as rpb

_METHODS = {"get", "post", "put", "patch", "delete", "head", "options"}


def _served_path(template: str) -> str:
    """A concrete path of a template (``{id}`` filled in)."""
    return re.sub(r"\{[^}]+\}", "some-model", template)


def test_a_validator_accepts_the_document() -> None:
    """openapi-spec-validator accepts the document as OpenAPI 3.1."""
    doc = document(routes())
    validate(doc)
    assert doc["openapi"] == "3.1.0"


def test_every_route_is_documented_and_every_documented_route_served() -> None:
    """The documented (path, method) pairs are exactly the route table's, and each
    resolves to the route it documents."""
    doc = document(routes())
    documented = {(path, method.upper()) for path, ops in doc["paths"].items()
                  for method in ops if method in _METHODS}
    table = {(path, route.http_method) for path, route in routes()}
    assert documented == table
    assert {p for p in ROUTES} <= {p for p, _ in documented}  # the exact routes too
    for path, method in documented:
        route = route_of(_served_path(path), method)
        assert route is not None and route.http_method == method, (path, method)
        assert route.doc is not None


def test_each_operation_needs_its_grpc_methods_role() -> None:
    """x-llamad-role is the role auth checks for the route's gRPC method: every knowledge
    base change is admin, every read read."""
    doc = document(routes())
    roles = {}
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            assert op["x-llamad-role"] == METHOD_ROLES[op["x-llamad-grpc-method"]]
            roles[(path, method)] = op["x-llamad-role"]
    for admin in [("/v1/llamad/documents", "post"), ("/v1/llamad/documents/content", "post"),
                  ("/v1/llamad/document", "delete"), ("/v1/llamad/review/approve", "post"),
                  ("/v1/llamad/review/reject", "post"), ("/v1/llamad/sources", "post"),
                  ("/v1/llamad/sources/disabled", "post"), ("/v1/llamad/reindex", "post"),
                  ("/v1/llamad/reprocess", "post"), ("/v1/llamad/models/load", "post"),
                  ("/v1/llamad/models/unload", "post")]:
        assert roles[admin] == "admin", admin
    for read in [("/v1/llamad/search", "post"), ("/v1/llamad/documents", "get"),
                 ("/v1/llamad/document", "get"), ("/v1/llamad/review", "get"),
                 ("/v1/llamad/sources", "get"), ("/v1/llamad/ask", "post"),
                 ("/tokenize", "post"), ("/openapi.json", "get"),
                 ("/v1/llamad/status", "get")]:
        assert roles[read] == "read", read


def test_a_path_with_several_methods_refuses_the_others() -> None:
    """A method the path does not take finds a route of another method (answered 405)."""
    found = route_of("/v1/llamad/document", "PUT")
    assert found is not None and found.http_method in ("GET", "DELETE")
    assert route_of("/v1/llamad/nothing", "GET") is None


def _full_messages() -> list[tuple[str, Message]]:
    """(route, a request of it with every kind of field set)."""
    search = rpb.SearchRequest(query="disk full", top_k=7, mode=rpb.SEARCH_MODE_TEXT,
                               min_score=0.25, candidates=40, text_weight=1.5,
                               vector_weight=0.5, group_by_document=True, fusion="dbsf")
    search.filters.sources.extend(["runbooks"])
    search.filters.tags.extend(["disk", "linux"])
    search.filters.indexed_since.FromJsonString("2026-01-31T00:00:00Z")
    push = rpb.UpsertDocumentRequest(source_id="notes", id="a/b.md", title="T",
                                     content=b"\x00\xffbytes", content_type="text/plain",
                                     kind="markdown", tags=["x"], wait=False, review=True)
    push.document_date.FromJsonString("2025-06-01T12:00:00Z")
    ask = apb.AskRequest(question="why?", top_k=3, mode=rpb.SEARCH_MODE_HYBRID)
    ask.history.add(role=2, content="before")
    ask.sampling.max_tokens = 50
    ask.sampling.seed = 2**63
    return [("/v1/llamad/search", search), ("/v1/llamad/documents", push),
            ("/v1/llamad/ask", ask),
            ("/v1/llamad/sources",
             rpb.AddSourceRequest(id="hist", history=True, max_age_days=30, max_items=9)),
            ("/v1/llamad/reindex", rpb.ReindexRequest(source_id="docs")),
            ("/v1/llamad/models/load", cpb.LoadModelRequest(name="m")),
            ("/v1/llamad/review/approve", rpb.ReviewDocumentRequest(id="x", note="ok"))]


@pytest.mark.parametrize(("path", "message"), _full_messages(),
                         ids=lambda v: v.DESCRIPTOR.name if isinstance(v, Message) else "")
def test_a_message_as_json_validates_and_reads_back_equal(path: str, message: Message
                                                          ) -> None:
    """Written in the JSON mapping, a request validates against its route's documented
    body schema and reads back into the same message; a field it lacks does not
    validate."""
    doc = document(routes())
    schema = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]
    validator = {**schema["schema"], "components": doc["components"]}
    body = to_json(message)
    jsonschema.validate(body, validator)
    assert read_body(body, type(message), skip=("stream",)) == message
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**body, "no_such_field": 1}, validator)


def test_camel_case_names_and_enum_numbers_are_read_too() -> None:
    """The JSON mapping's lowerCamelCase names and enum numbers are read as the proto
    names and enum names are."""
    read = read_body({"query": "q", "topK": "5", "mode": 2, "groupByDocument": True},
                     rpb.SearchRequest)
    assert (read.top_k, read.mode, read.group_by_document) == (5, rpb.SEARCH_MODE_TEXT, True)


@pytest.mark.parametrize(("body", "param"), [
    ({"query": "q", "top_k": -1}, "top_k"),
    ({"query": "q", "top_k": True}, "top_k"),
    ({"query": 5}, "query"),
    ({"query": "q", "nonsense": 1}, "nonsense"),
    ({"query": "q", "filters": {"tags": ["a", 3]}}, "filters.tags[1]"),
    ({"query": "q", "filters": {"indexedSince": "yesterday"}}, "filters.indexed_since"),
    ({"query": "q", "filters": []}, "filters"),
    ({"query": "q", "mode": "SEARCH_MODE_FAST"}, "mode"),
    ({"query": "q", "min_score": "high"}, "min_score"),
    ({"query": "q", "top_k": 1, "topK": 2}, "top_k"),
])
def test_refusals_name_the_field_path(body: dict[str, Any], param: str) -> None:
    """A body that does not fit is refused naming the field by its path."""
    with pytest.raises(ParamError) as refused:
        read_body(body, rpb.SearchRequest)
    assert refused.value.param == param


def test_bytes_must_be_base64() -> None:
    """content is base64 (the JSON mapping's bytes); anything else names content."""
    with pytest.raises(ParamError) as refused:
        read_body({"source_id": "s", "content": "not base64!"}, rpb.UpsertDocumentRequest)
    assert refused.value.param == "content"
    url_safe = read_body({"source_id": "s", "content": "_-8"}, rpb.UpsertDocumentRequest)
    assert url_safe.content == b"\xff\xef"


def test_query_parameters_read_repeated_fields_and_refuse_unknown_ones() -> None:
    """A repeated field is its parameter given once per value (enum names); a parameter
    the message lacks, or one the route leaves out, is refused by name."""
    read = read_query(MultiDict([("source_id", "s"), ("states", "DOCUMENT_STATE_INDEXED"),
                                 ("states", "DOCUMENT_STATE_FAILED")]),
                      rpb.ListDocumentsRequest)
    assert list(read.states) == [rpb.DOCUMENT_STATE_INDEXED, rpb.DOCUMENT_STATE_FAILED]
    with pytest.raises(ParamError) as refused:
        read_query(MultiDict([("sauce", "s")]), rpb.ListDocumentsRequest)
    assert refused.value.param == "sauce"
    with pytest.raises(ParamError) as skipped:
        read_query(MultiDict([("text", "t")]), rpb.UpsertDocumentRequest, skip=("text",))
    assert skipped.value.param == "text"
    with pytest.raises(ParamError) as twice:
        read_query(MultiDict([("id", "a"), ("id", "b")]), rpb.GetDocumentRequest)
    assert twice.value.param == "id"
    dated = read_query(MultiDict([("source_id", "s"), ("wait", "false"),
                                  ("document_date", "2026-01-31T00:00:00Z")]),
                       rpb.UpsertDocumentRequest)
    assert dated.HasField("wait") and not dated.wait
    assert dated.document_date.seconds == 1769817600


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12)
_BODIES = [rpb.SearchRequest, rpb.UpsertDocumentRequest, rpb.AddSourceRequest,
           rpb.ReindexRequest, rpb.ReprocessRequest, rpb.ReviewDocumentRequest,
           rpb.SetSourceDisabledRequest, cpb.UnloadModelRequest]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(_BODIES), st.data())
def test_any_json_is_read_or_refused_naming_a_field(cls: type[Message],
                                                    data: st.DataObject) -> None:
    """Any JSON object, with the message's own field names among random ones, is read or
    refused as a ParamError naming a field; never another exception."""
    names = [f.name for f in cls.DESCRIPTOR.fields] + [f.json_name
                                                       for f in cls.DESCRIPTOR.fields]
    body = data.draw(st.dictionaries(st.sampled_from(names) | st.text(max_size=5), _JSON,
                                     max_size=5))
    refused: ParamError | None = None
    try:
        read_body(body, cls)
    except ParamError as exc:
        refused = exc
    if refused is not None:  # an unknown key itself, or a path from a field's name
        root = re.split(r"[.\[]", refused.param, maxsplit=1)[0]
        assert refused.param in body or root in names, (refused.param, body)
