"""The wire-free cores of Ask and Search (daemon.services): plain arguments in, plain
dataclasses out, refusals carrying their field; and each API's adapter naming that field
(gRPC in a google.rpc.BadRequest detail, HTTP in error.param) even where the message's
first word is another (the "param": "the" defect of issue 26)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from daemon.config import Limits
from daemon.errors import InvalidArgument
from daemon.grpcapi.answer import AnswerServicer
from daemon.grpcapi.retrieval import RetrievalServicer
from daemon.models.router import InferenceRouter
from daemon.services import ask as asking
from daemon.services.ask import Question, Turn
from daemon.services.retrieval_bridge import ChildEmbedder, counting_tokens
from daemon.services.search import SearchService
from daemon.telemetry.audit import AuditLog
from llamad_protocol.v1 import answer_pb2 as apb
from llamad_protocol.v1 import answer_pb2_grpc, retrieval_pb2_grpc
from llamad_protocol.v1 import inference_pb2 as ipb
from llamad_protocol.v1 import retrieval_pb2 as rpb
from llamad_protocol.v1.wire import STATUS_DETAILS_KEY
from retrieval import Filters, Query, Retriever
from supervisor import Sampling
from tests.support.backend import FakeBackend, FakeRole
from tests.support.embedder import HashEmbedder, filled
from tests.support.httpapi import client, serving
from tests.support.inprocess import serving as grpc_serving

SETTINGS = asking.AnswerSettings(max_history_turns=2)


@pytest.fixture
async def retriever(tmp_path: Path) -> AsyncIterator[Retriever]:
    r = await filled(tmp_path / "index", HashEmbedder("hash"))
    try:
        yield r
    finally:
        await r.close()


def service(router: InferenceRouter, retriever: Retriever, audit: Path) -> asking.AskService:
    return asking.AskService(router, retriever, Limits(), settings=SETTINGS,
                             cache=asking.ResponseCache(ttl=60, max_entries=8),
                             audit=AuditLog(audit, max_bytes=1 << 20, backups=1))


async def collect(events: AsyncIterator[asking.AskEvent]) -> list[asking.AskEvent]:
    return [e async for e in events]


async def test_ask_takes_plain_arguments_and_yields_plain_events(
        retriever: Retriever, tmp_path: Path) -> None:
    """A Question and a Sampling in; the answer's pieces (str), its Sources (S1 the
    runbook, found by BM25 in text mode) and Done out; the summary fields noted and one
    audit record written: no gRPC context, no message."""
    backend = FakeBackend(pieces=["Rotate", " the logs", " [S1]."], finish="stop")
    ask = service(InferenceRouter({"generation": FakeRole(backend)}), retriever,
                  tmp_path / "audit.jsonl")
    noted: dict[str, object] = {}
    events = await collect(ask.ask(
        Question("web01 disk full: what do I do?", mode="text",
                 history=(Turn("user", "hello"),)),
        Sampling(max_tokens=32), note=noted.update))
    *pieces, sources, done = events
    assert pieces == ["Rotate", " the logs", " [S1]."]
    assert isinstance(sources, asking.Sources) and isinstance(done, asking.Done)
    assert sources.retrieval_mode == "text"
    assert sources.citations[0].label == "S1"
    assert sources.citations[0].document_id == "docs/disk"
    assert sources.citations[0].search_source == "text"
    assert (done.completion_tokens, done.finish_reason, done.cached) == (3, "stop", False)
    assert done.model_name == "generation" and len(done.prompt_sha256) == 64
    assert noted["task"] == "answer" and noted["tokens"] == 3
    record = json.loads((tmp_path / "audit.jsonl").read_text().splitlines()[-1])
    assert record["hits"][0]["label"] == "S1" and record["prompt_sha256"] == \
        done.prompt_sha256


async def test_an_ask_stream_cut_short_notes_the_prompt_and_the_tokens_it_streamed(
        retriever: Retriever, tmp_path: Path) -> None:
    """The client leaves after two of five pieces: the call's fields (what its token's
    tpm quota counts when it ends, as for Generate and Chat) hold the prompt's tokens and
    the two streamed."""
    backend = FakeBackend(pieces=["Rotate", " the", " logs", " now", " [S1]."])
    ask = service(InferenceRouter({"generation": FakeRole(backend)}), retriever,
                  tmp_path / "audit.jsonl")
    noted: dict[str, object] = {}
    events = ask.ask(Question("web01 disk full: what do I do?", mode="text"),
                     Sampling(max_tokens=32), note=noted.update)
    pieces = []
    async for event in events:
        if isinstance(event, str):
            pieces.append(event)
            if len(pieces) == 2:
                break
    await events.aclose()  # type: ignore[attr-defined]
    assert noted["tokens"] == 2
    prompt = noted["prompt_tokens"]
    assert isinstance(prompt, int) and prompt > 0


async def test_embeddings_made_inside_counting_tokens_add_their_tokens() -> None:
    """A Search's tpm counts its query embedding: each embedding's prompt tokens, as the
    child counted them (no call of its own), add to the box, those made in tasks started
    inside too; an embedding outside adds nothing."""
    backend = FakeBackend()
    embedder = ChildEmbedder(InferenceRouter({"embedding": FakeRole(backend)}), backend)
    with counting_tokens() as spent:
        await embedder.embed(["disk full on web01"])  # 4 words: the fake's 4 tokens
        await asyncio.gather(asyncio.create_task(embedder.embed(["two words"])))
    assert spent == [6]
    await embedder.embed(["not counted"])
    assert spent == [6]


@pytest.mark.parametrize(("question", "field", "first_word"), [
    (Question("why?", history=(Turn("user", "a"),) * 3), "history", "3"),
    (Question("why?", attachment="a\x00b", task="diagnose"), "attachment", "question"),
    (Question("why?", history=(Turn("system", "a"),)), "history[0].role", "history[0].role"),
    (Question("why?", task="poem"), "task", "unknown"),
    (Question("why?", mode="fuzzy"), "mode", "unknown"),
])
async def test_ask_refusals_carry_their_field(
        retriever: Retriever, tmp_path: Path, question: Question, field: str,
        first_word: str) -> None:
    """Each refusal of a Question names its field in InvalidArgument.field, whatever its
    message begins with; the model is never called."""
    backend = FakeBackend()
    ask = service(InferenceRouter({"generation": FakeRole(backend)}), retriever,
                  tmp_path / "audit.jsonl")
    with pytest.raises(InvalidArgument) as info:
        await collect(ask.ask(question, Sampling(max_tokens=8)))
    assert info.value.field == field
    assert str(info.value).split()[0] == first_word
    assert backend.chats == []


async def test_search_takes_plain_arguments_and_names_the_field_it_refuses(
        retriever: Retriever) -> None:
    """SearchService: a query, filters and options in, retrieval's SearchResult out;
    an empty query is refused naming query, both weights 0 naming text_weight (a message
    that starts with it), and a k below 1 as the request's top_k."""
    search = SearchService(retriever)
    noted: dict[str, object] = {}
    result = await search.search("disk full", top_k=2, filters=Filters(),
                                 options=Query(mode="text"), note=noted.update)
    assert result.mode == "text" and result.hits[0].doc_id == "docs/disk"
    assert noted == {"query_chars": 9, "hits": len(result.hits), "mode": "text",
                     "prompt_tokens": 0}  # text mode: no query embedding to count
    for query, options, field in (
            (" ", Query(), "query"),
            ("disk", Query(text_weight=0, vector_weight=0), "text_weight"),
            ("disk", Query(candidates=10**6), "candidates")):
        with pytest.raises(InvalidArgument) as info:
            await search.search(query, options=options)
        assert info.value.field == field


def field_violations(error: grpc.aio.AioRpcError) -> list[tuple[str, str]]:
    """The BadRequest field violations in an error's status details."""
    details = dict(error.trailing_metadata() or ())[STATUS_DETAILS_KEY]
    assert isinstance(details, bytes)
    status = status_pb2.Status.FromString(details)
    found = []
    for detail in status.details:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            found += [(v.field, v.description) for v in bad.field_violations]
    return found


async def test_grpc_names_the_field_of_a_refusal_in_a_bad_request_detail(
        retriever: Retriever, tmp_path: Path) -> None:
    """Over a real gRPC server: too many history turns ("3 history turns; ...") and a NUL
    in the attachment ("question or attachment contains ...") are INVALID_ARGUMENT with
    one field violation naming history and attachment; Search's both-weights-zero names
    text_weight."""
    servicer = AnswerServicer(
        InferenceRouter({"generation": FakeRole(FakeBackend())}), retriever, Limits(),
        settings=SETTINGS, cache=asking.ResponseCache(ttl=60, max_entries=8),
        audit=AuditLog(tmp_path / "audit.jsonl", max_bytes=1 << 20, backups=1))
    turn = apb.Turn(role=ipb.CHAT_ROLE_USER, content="a")
    async with grpc_serving(lambda s: answer_pb2_grpc.add_AnswerServiceServicer_to_server(
            servicer, s)) as channel:
        stub = answer_pb2_grpc.AnswerServiceStub(channel)
        for request, field, first_word in (
                (apb.AskRequest(question="why?", history=[turn] * 3), "history", "3"),
                (apb.AskRequest(question="why?", attachment="a\x00b",
                                task=apb.TASK_TYPE_DIAGNOSE), "attachment", "question")):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                _ = [m async for m in stub.Ask(request)]
            error = info.value
            assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert (error.details() or "").split()[0] == first_word
            assert field_violations(error) == [(field, error.details())]
    searches = RetrievalServicer(retriever)
    async with grpc_serving(lambda s: retrieval_pb2_grpc.add_RetrievalServiceServicer_to_server(
            searches, s)) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await retrieval_pb2_grpc.RetrievalServiceStub(channel).Search(rpb.SearchRequest(
                query="disk", text_weight=0, vector_weight=0))
    assert [f for f, _ in field_violations(info.value)] == ["text_weight"]


async def test_http_names_the_field_of_a_refusal_in_param(
        retriever: Retriever, tmp_path: Path) -> None:
    """Over HTTP: the same refusals give error.param history and attachment (never the
    message's first word, "3" or "question"); a history turn's bad role and a field the
    body reads itself (an unknown filter, a time without its offset or before the year 1)
    name theirs."""
    def build(router: InferenceRouter) -> asking.AskService:
        return service(router, retriever, tmp_path / "audit.jsonl")

    cases = [
        ({"question": "why?", "history": [{"role": "CHAT_ROLE_USER", "content": "a"}] * 3},
         "history", "3"),
        ({"question": "why?", "attachment": "a\x00b", "task": "TASK_TYPE_DIAGNOSE"},
         "attachment", "question"),
        ({"question": "why?", "history": [{"role": "CHAT_ROLE_SYSTEM", "content": "a"}]},
         "history[0].role", "history[0].role"),
        ({"question": "why?", "filters": {"colour": ["red"]}}, "filters.colour", "unknown"),
        ({"question": "why?", "filters": {"indexedSince": "2026-01-01T00:00:00"}},
         "filters.indexed_since", "filters.indexed_since"),
        ({"question": "why?", "filters": {"dated_until": "0001-01-01T00:00:00+01:00"}},
         "filters.dated_until", "filters.dated_until"),  # before a Timestamp's year 1
        ({"question": "why?", "sampling": {"maxTokens": 0}}, "max_tokens", "max_tokens"),
    ]
    async with serving(answer=build) as h, client() as http:
        for body, param, first_word in cases:
            resp = await http.post(h.url + "/v1/llamad/ask", json=body)
            error = resp.json()["error"]
            assert resp.status_code == 400, (body, error)
            assert error["param"] == param, (body, error)
            assert error["message"].split()[0] == first_word, (body, error)
    assert h.gen.chats == []


async def test_http_reads_the_json_mapping_and_writes_it_back(
        retriever: Retriever, tmp_path: Path) -> None:
    """lowerCamelCase names, enums by name and by number, and RFC 3339 times are read as
    protobuf's JSON mapping reads them; the answer is written in it (enum names, times,
    no default-valued fields)."""
    def build(router: InferenceRouter) -> asking.AskService:
        return service(router, retriever, tmp_path / "audit.jsonl")

    async with serving(answer=build, pieces=["Rotate", " [S1]."]) as h, client() as http:
        whole = await http.post(h.url + "/v1/llamad/ask", json={
            "question": "web01 disk full?", "topK": 2, "mode": 2, "noCache": True,
            "task": "TASK_TYPE_ANSWER", "sampling": {"maxTokens": 16},
            "filters": {"indexedSince": "2000-01-01T00:00:00Z", "sources": []}})
        none = await http.post(h.url + "/v1/llamad/ask", json={
            "question": "web01 disk full?", "filters": {"indexed_until": "2000-01-01T00:00:00Z"}})
    body = whole.json()
    assert body["text"] == "Rotate [S1]."
    assert body["sources"]["retrieval_mode"] == "SEARCH_MODE_TEXT"
    citation = body["sources"]["citations"][0]
    assert citation["search_source"] == "SEARCH_SOURCE_TEXT"
    assert citation["indexed_at"].endswith("Z") and citation["indexed_at"] > "2000"
    assert "document_date" not in citation
    assert body["done"]["finish_reason"] == "FINISH_REASON_LENGTH"
    assert body["done"]["usage"]["prompt_tokens"] > 0
    assert "cached" not in body["done"] and "no_context" not in body["done"]
    assert h.gen.samplings[0].max_tokens == 16
    nothing = none.json()  # indexed before 2000: nothing, so nothing generated
    assert nothing["done"] == {"no_context": True, "finish_reason": "FINISH_REASON_STOP"}
    assert len(h.gen.chats) == 1


def test_the_http_enum_tables_follow_the_proto() -> None:
    """HTTP reads an enum given by number by its position in its table of names: each
    table lists the proto's names in the order of their numbers."""
    from daemon.httpapi import _ask

    for table, enum in ((_ask._TASKS, apb.TaskType), (_ask._MODES, rpb.SearchMode),
                        (_ask._ROLES, ipb.ChatRole)):
        pairs = sorted(enum.items(), key=lambda pair: pair[1])
        assert list(table) == [name for name, _ in pairs]
        assert [number for _, number in pairs] == list(range(len(table)))
