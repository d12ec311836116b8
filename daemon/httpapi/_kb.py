"""The knowledge base over HTTP, llamad's own extension beside ``/v1/llamad/ask``: search,
documents (push text or a file's bytes, get, delete, list), review (list held, approve,
reject), sources (list, add, disable, remove), reindex, reprocess and status.

Each route stands for one RetrievalService RPC (its access role, its metrics label) and
takes that RPC's request message in protobuf's JSON mapping (a JSON body, or for the GET
and DELETE routes the query string), answering its response message the same way
(:mod:`._protojson`). The handlers only translate: the work is the wire-free services'
(:mod:`daemon.services.documents`, :mod:`daemon.services.sources`,
:class:`daemon.services.search.SearchService`). A refusal names its field in
``error.param`` (``top_k``, ``filters.indexed_since``, ``id``, ``content_type``...).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from llamad_protocol.v1 import retrieval_pb2 as rpb

from ..grpcapi.retrieval_wire import (
    _document,
    _progress,
    _source,
    filters_from,
    query_from,
    retrieval_status,
    search_response,
    states_from,
)
from ..grpcapi.rpc import Call
from ..services import documents, sources
from ..services.knowledge import Knowledge
from . import _parse
from ._context import RAW_BODY, Api, json_response, open_stream
from ._errors import ApiError, ParamError
from ._openapi import Doc
from ._protojson import read_body, read_query, to_json
from ._shapes import DONE, sse

_STREAM = {"stream": {"type": "boolean", "description": "Stream each report as an event"}}


def _kb(api: Api) -> Knowledge:
    if api.knowledge is None:
        raise ApiError(404, "this daemon has no knowledge base (retrieval is off)",
                       code="not_found")
    return api.knowledge


def _timestamp_seconds(message: Any, name: str) -> int | None:
    return int(getattr(message, name).seconds) if message.HasField(name) else None


SEARCH = Doc("Search the knowledge base (hybrid, text or vector; every SearchRequest "
             "option)", tag="knowledge", body=rpb.SearchRequest, body_required=("query",),
             response=rpb.SearchResponse)


async def search(api: Api, request: web.BaseRequest, call: Call,
                 body: _parse.Body) -> web.StreamResponse:
    msg = read_body(body, rpb.SearchRequest)
    result = await _kb(api).search.search(
        msg.query, top_k=msg.top_k, filters=filters_from(msg.filters),
        options=query_from(msg), note=call.note)
    return json_response(request, to_json(search_response(result)))


PUSH = Doc("Push a document as text (or a file's bytes in base64 content with its "
           "content_type)", tag="knowledge", body=rpb.UpsertDocumentRequest,
           body_required=("source_id",), response=rpb.UpsertDocumentResponse)


async def push(api: Api, request: web.BaseRequest, call: Call,
               body: _parse.Body) -> web.StreamResponse:
    msg = read_body(body, rpb.UpsertDocumentRequest)
    return await _pushed(api, request, call, msg, msg.content,
                         content_type=msg.content_type)


PUSH_RAW = Doc("Push a file's bytes as the body, in its own media type (Content-Type); the "
               "other UpsertDocumentRequest fields are query parameters",
               tag="knowledge", raw_body=tuple(documents.CONTENT_TYPES),
               query=rpb.UpsertDocumentRequest,
               query_skip=("text", "content", "content_type"),
               response=rpb.UpsertDocumentResponse)


async def push_raw(api: Api, request: web.BaseRequest, call: Call,
                   body: _parse.Body) -> web.StreamResponse:
    msg = read_query(request.query, rpb.UpsertDocumentRequest,
                     skip=("text", "content", "content_type"))
    content = request[RAW_BODY]
    if not content:
        raise ParamError("body", "the request body is empty: send the document's bytes")
    media = request.headers.get("Content-Type", "")
    if not media:
        raise ParamError("Content-Type", "give the document's media type in Content-Type")
    return await _pushed(api, request, call, msg, content, content_type=media)


async def _pushed(api: Api, request: web.BaseRequest, call: Call,
                  msg: rpb.UpsertDocumentRequest, content: bytes, *,
                  content_type: str) -> web.StreamResponse:
    if not msg.source_id:
        raise ParamError("source_id", "source_id is required: the source the document "
                                      "belongs to")
    call.note(source=msg.source_id, chars=len(msg.text), content_bytes=len(content) or None)
    row = await documents.push(_kb(api).retriever, documents.Push(
        source_id=msg.source_id, id=msg.id, title=msg.title, text=msg.text,
        content=content, content_type=content_type, kind=msg.kind, category=msg.category,
        tags=tuple(msg.tags), review=msg.review,
        document_date=_timestamp_seconds(msg, "document_date"),
        wait=msg.wait if msg.HasField("wait") else True))
    call.note(document=row.id, state=row.state)
    return json_response(request, to_json(rpb.UpsertDocumentResponse(document=_document(row))))


GET_DOCUMENT = Doc("One document: its state, error, review note, dates",
                   tag="knowledge", query=rpb.GetDocumentRequest, response=rpb.Document)


async def get_document(api: Api, request: web.BaseRequest, call: Call,
                       body: _parse.Body) -> web.StreamResponse:
    msg = read_query(request.query, rpb.GetDocumentRequest)
    row = await documents.get(_kb(api).retriever, msg.id)
    return json_response(request, to_json(_document(row)))


DELETE_DOCUMENT = Doc("Delete a document and its chunks", tag="knowledge",
                      query=rpb.DeleteDocumentRequest, response=rpb.DeleteDocumentResponse)


async def delete_document(api: Api, request: web.BaseRequest, call: Call,
                          body: _parse.Body) -> web.StreamResponse:
    msg = read_query(request.query, rpb.DeleteDocumentRequest)
    call.note(document=msg.id)
    deleted = await documents.delete(_kb(api).retriever, msg.id)
    return json_response(request, to_json(rpb.DeleteDocumentResponse(deleted=deleted)))


LIST_DOCUMENTS = Doc("The documents of a source (or all) in the given states (or any)",
                     tag="knowledge", query=rpb.ListDocumentsRequest,
                     response=rpb.ListDocumentsResponse)


async def list_documents(api: Api, request: web.BaseRequest, call: Call,
                         body: _parse.Body) -> web.StreamResponse:
    msg = read_query(request.query, rpb.ListDocumentsRequest)
    try:
        states = states_from(msg.states)
    except Exception as exc:
        raise ParamError("states", str(exc)) from None
    rows = await documents.listed(_kb(api).retriever, msg.source_id, states)
    call.note(documents=len(rows))
    return json_response(request, to_json(rpb.ListDocumentsResponse(
        documents=[_document(d) for d in rows])))


REVIEW = Doc("The documents held for review (state DOCUMENT_STATE_REVIEW_REQUIRED)",
             tag="knowledge", query=rpb.ListDocumentsRequest, query_skip=("states",),
             response=rpb.ListDocumentsResponse)


async def review(api: Api, request: web.BaseRequest, call: Call,
                 body: _parse.Body) -> web.StreamResponse:
    msg = read_query(request.query, rpb.ListDocumentsRequest, skip=("states",))
    rows = await documents.listed(_kb(api).retriever, msg.source_id, ("review_required",))
    call.note(documents=len(rows))
    return json_response(request, to_json(rpb.ListDocumentsResponse(
        documents=[_document(d) for d in rows])))


APPROVE = Doc("Approve a document held for review: it is indexed", tag="knowledge",
              body=rpb.ReviewDocumentRequest, body_required=("id",), response=rpb.Document)
REJECT = Doc("Reject a document held for review: it leaves every index", tag="knowledge",
             body=rpb.ReviewDocumentRequest, body_required=("id",), response=rpb.Document)


async def approve(api: Api, request: web.BaseRequest, call: Call,
                  body: _parse.Body) -> web.StreamResponse:
    msg = read_body(body, rpb.ReviewDocumentRequest)
    call.note(document=msg.id)
    row = await documents.review(_kb(api).retriever, msg.id, msg.note, approve=True)
    call.note(state=row.state)
    return json_response(request, to_json(_document(row)))


async def reject(api: Api, request: web.BaseRequest, call: Call,
                 body: _parse.Body) -> web.StreamResponse:
    msg = read_body(body, rpb.ReviewDocumentRequest)
    call.note(document=msg.id)
    row = await documents.review(_kb(api).retriever, msg.id, msg.note, approve=False)
    return json_response(request, to_json(_document(row)))


REPROCESS = Doc("Embed now the chunks without a vector of the current embedding model: "
                "one document's, one source's, or all", tag="knowledge",
                body=rpb.ReprocessRequest, response=rpb.ReprocessResponse)


async def reprocess(api: Api, request: web.BaseRequest, call: Call,
                    body: _parse.Body) -> web.StreamResponse:
    msg = read_body(body, rpb.ReprocessRequest)
    chunks, reason = await documents.reprocess(_kb(api).retriever,
                                               document_id=msg.document_id,
                                               source_id=msg.source_id)
    call.note(document=msg.document_id or None, source=msg.source_id or None, chunks=chunks)
    return json_response(request, to_json(rpb.ReprocessResponse(chunks=chunks,
                                                                reason=reason)))


STATUS = Doc("The knowledge base's status: counts by state, vectors, backfill, rebuild, "
             "store", tag="knowledge", response=rpb.RetrievalStatusResponse)


async def status(api: Api, request: web.BaseRequest, call: Call,
                 body: _parse.Body) -> web.StreamResponse:
    retriever = _kb(api).retriever
    counted = [_source(s, n) for s, n in await sources.listed(retriever)]
    return json_response(request, to_json(retrieval_status(
        await retriever.status(), counted, retriever.pruned)))


LIST_SOURCES = Doc("Every source with its number of documents", tag="knowledge",
                   response=rpb.ListSourcesResponse)


async def list_sources(api: Api, request: web.BaseRequest, call: Call,
                       body: _parse.Body) -> web.StreamResponse:
    rows = await sources.listed(_kb(api).retriever)
    return json_response(request, to_json(rpb.ListSourcesResponse(
        sources=[_source(s, n) for s, n in rows])))


ADD_SOURCE = Doc("Add (or update) a source: a directory under retrieval.allowed_roots, "
                 "pushed documents, or history records", tag="knowledge",
                 body=rpb.AddSourceRequest, body_required=("id",), response=rpb.Source)


async def add_source(api: Api, request: web.BaseRequest, call: Call,
                     body: _parse.Body) -> web.StreamResponse:
    msg = read_body(body, rpb.AddSourceRequest)
    kb = _kb(api)
    row = await sources.add(kb.retriever, sources.NewSource(
        id=msg.id, path=msg.path, category=msg.category, tags=tuple(msg.tags),
        review_required=msg.review_required, history=msg.history,
        max_age_days=msg.max_age_days, max_items=msg.max_items,
        exclude=tuple(msg.exclude)), kb.allowed_roots())
    call.note(source=row.id, kind=row.kind)
    return json_response(request, to_json(_source(row)))


DISABLE_SOURCE = Doc("Disable a source (kept, neither searched nor rescanned), or enable "
                     "it with disabled false", tag="knowledge",
                     body=rpb.SetSourceDisabledRequest, body_required=("id", "disabled"),
                     response=rpb.Source)


async def disable_source(api: Api, request: web.BaseRequest, call: Call,
                         body: _parse.Body) -> web.StreamResponse:
    msg = read_body(body, rpb.SetSourceDisabledRequest)
    call.note(source=msg.id, disabled=msg.disabled)
    row, count = await sources.set_disabled(_kb(api).retriever, msg.id, msg.disabled)
    return json_response(request, to_json(_source(row, count)))


REMOVE_SOURCE = Doc("Remove a source, its documents and their chunks", tag="knowledge",
                    body=rpb.RemoveSourceRequest, body_required=("id",),
                    response=rpb.RemoveSourceResponse)


async def remove_source(api: Api, request: web.BaseRequest, call: Call,
                        body: _parse.Body) -> web.StreamResponse:
    msg = read_body(body, rpb.RemoveSourceRequest)
    removed = await sources.remove(_kb(api).retriever, msg.id)
    call.note(source=msg.id, chunks=removed)
    return json_response(request, to_json(rpb.RemoveSourceResponse(chunks_removed=removed)))


REINDEX = Doc("Rescan one directory source, or every enabled one: the final report of "
              "each, or with stream true each report as it comes", tag="knowledge",
              body=rpb.ReindexRequest, body_extra=_STREAM,
              response={"type": "object", "properties": {"reports": {
                  "type": "array",
                  "items": {"$ref": "#/components/schemas/llamad.v1.ReindexProgress"}}}},
              events=rpb.ReindexProgress)


async def reindex(api: Api, request: web.BaseRequest, call: Call,
                  body: _parse.Body) -> web.StreamResponse:
    stream = _parse.streaming({"stream": body.get("stream")}).stream
    msg = read_body(body, rpb.ReindexRequest, skip=("stream",))
    since = msg.since.ToNanoseconds() if msg.HasField("since") else None
    kb = _kb(api)
    reports = sources.reindex(kb.retriever, kb.allowed_roots, source_id=msg.source_id,
                              since_ns=since)
    try:
        finals: list[dict[str, Any]] = []
        first = await anext(reports, None)  # before the headers: a refusal is a status
        response = await open_stream(request) if stream else None
        while first is not None:
            report, done = first
            if done:
                call.note(source=report.source_id, added=report.added,
                          changed=report.changed, deleted=report.deleted,
                          failed=report.failed_total)
            event = to_json(_progress(report, done=done))
            if response is not None:
                await response.write(sse(event))
            elif done:
                finals.append(event)
            first = await anext(reports, None)
        if response is None:
            return json_response(request, {"reports": finals})
        await response.write(DONE)
        await response.write_eof()
        return response
    finally:
        await reports.aclose()  # type: ignore[attr-defined]
