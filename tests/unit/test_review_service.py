"""Review before indexing (issue 16) through RetrievalService on a real in-process gRPC
server: UpsertDocument with review, AddSource with review_required, ApproveDocument and
RejectDocument (admin only), ListDocuments by state, Status by state; every document
state reachable and shown."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from daemon.config.access import load_tokens
from daemon.grpcapi.auth import AuthInterceptor
from daemon.grpcapi.retrieval import RetrievalServicer
from llamad_protocol.v1 import retrieval_pb2 as rpb
from llamad_protocol.v1 import retrieval_pb2_grpc
from retrieval import Retriever
from retrieval.store._indexes import Indexes
from tests.support.access import ADMIN_TOKEN, READ_TOKEN, token_files
from tests.support.embedder import HashEmbedder
from tests.support.held import hold_commits, hold_later_upserts
from tests.support.inprocess import serving

Stub = retrieval_pb2_grpc.RetrievalServiceStub
S = rpb.DocumentState


@pytest.fixture
async def retriever(tmp_path: Path) -> AsyncIterator[Retriever]:
    r = Retriever(tmp_path / "index", lambda: HashEmbedder("m"))
    await r.open()
    yield r
    await r.close()


@pytest.fixture
async def stub(retriever: Retriever) -> AsyncIterator[Stub]:
    servicer = RetrievalServicer(retriever)
    async with serving(lambda s: retrieval_pb2_grpc.add_RetrievalServiceServicer_to_server(
            servicer, s)) as channel:
        yield Stub(channel)


async def hits(stub: Stub, query: str) -> set[str]:
    response = await stub.Search(rpb.SearchRequest(query=query, top_k=20,
                                                   mode=rpb.SEARCH_MODE_TEXT))
    return {h.document_id for h in response.hits}


async def listed(stub: Stub, *states: S.ValueType) -> list[tuple[str, S.ValueType]]:
    response = await stub.ListDocuments(rpb.ListDocumentsRequest(states=list(states)))
    return [(d.id, d.state) for d in response.documents]


async def code_of(call: object) -> tuple[grpc.StatusCode, str]:
    try:
        await call  # type: ignore[misc]
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


async def test_a_review_source_holds_pushes_until_approved_or_rejected(stub: Stub) -> None:
    """AddSource review_required holds every push (review_required, not searchable,
    listed by state, counted by Status); approval indexes it with the note; rejection
    leaves it rejected with the note and unsearchable; AddSource again turns review off."""
    source = await stub.AddSource(rpb.AddSourceRequest(id="inbox", review_required=True))
    assert source.review_required
    sources = (await stub.ListSources(rpb.ListSourcesRequest())).sources
    assert [s.review_required for s in sources] == [True]
    for key, text in (("a", "printer jammed on floor two"), ("b", "kerberos tickets expire")):
        done = await stub.UpsertDocument(rpb.UpsertDocumentRequest(
            source_id="inbox", id=f"inbox/{key}", title=key, text=text))
        assert done.document.state == S.DOCUMENT_STATE_REVIEW_REQUIRED
    assert await hits(stub, "printer jammed") == set()
    assert await listed(stub, S.DOCUMENT_STATE_REVIEW_REQUIRED) == [
        ("inbox/a", S.DOCUMENT_STATE_REVIEW_REQUIRED),
        ("inbox/b", S.DOCUMENT_STATE_REVIEW_REQUIRED)]
    status = await stub.Status(rpb.RetrievalStatusRequest())
    assert dict(status.documents_by_state) == {"review_required": 2}
    assert status.chunks == 0
    approved = await stub.ApproveDocument(rpb.ReviewDocumentRequest(id="inbox/a", note="ok"))
    assert (approved.state, approved.review_note) == (S.DOCUMENT_STATE_INDEXED, "ok")
    assert await hits(stub, "printer jammed") == {"inbox/a"}
    rejected = await stub.RejectDocument(rpb.ReviewDocumentRequest(id="inbox/b",
                                                                   note="stale"))
    assert (rejected.state, rejected.review_note) == (S.DOCUMENT_STATE_REJECTED, "stale")
    got = await stub.GetDocument(rpb.GetDocumentRequest(id="inbox/b"))
    assert (got.state, got.review_note) == (S.DOCUMENT_STATE_REJECTED, "stale")
    assert await hits(stub, "kerberos tickets") == set()
    assert await listed(stub, S.DOCUMENT_STATE_REJECTED, S.DOCUMENT_STATE_INDEXED) == [
        ("inbox/a", S.DOCUMENT_STATE_INDEXED), ("inbox/b", S.DOCUMENT_STATE_REJECTED)]
    status = await stub.Status(rpb.RetrievalStatusRequest())
    assert dict(status.documents_by_state) == {"indexed": 1, "rejected": 1}
    await stub.AddSource(rpb.AddSourceRequest(id="inbox", review_required=False))
    done = await stub.UpsertDocument(rpb.UpsertDocumentRequest(
        source_id="inbox", id="inbox/c", text="vpn tunnel flapping"))
    assert done.document.state == S.DOCUMENT_STATE_INDEXED


async def test_review_on_one_push_and_every_state_shown(
        stub: Stub, retriever: Retriever, monkeypatch: pytest.MonkeyPatch) -> None:
    """review=true holds one push of an ordinary source; an asynchronous one shows pending,
    then processing, then review_required; a failed approval shows failed with the
    reason. Every state of the enum is reached and shown."""
    await stub.AddSource(rpb.AddSourceRequest(id="inbox"))
    seen: set[S.ValueType] = set()
    plain = await stub.UpsertDocument(rpb.UpsertDocumentRequest(
        source_id="inbox", id="inbox/plain", text="nginx logs rotate"))
    seen.add(plain.document.state)
    gate = hold_later_upserts(retriever)
    accepted = await stub.UpsertDocument(rpb.UpsertDocumentRequest(
        source_id="inbox", id="inbox/later", text="vpn tunnel flapping", review=True,
        wait=False))
    assert accepted.document.state == S.DOCUMENT_STATE_PENDING
    order = [accepted.document.state]
    gate.set()
    for _ in range(2000):
        state = (await stub.GetDocument(rpb.GetDocumentRequest(id="inbox/later"))).state
        if state != order[-1]:
            order.append(state)
        if state == S.DOCUMENT_STATE_REVIEW_REQUIRED:
            break
        await asyncio.sleep(0)
    assert order[0] == S.DOCUMENT_STATE_PENDING
    assert order[-1] == S.DOCUMENT_STATE_REVIEW_REQUIRED
    seen.update(order)
    # processing, shown while an approval indexes: its commit is held back.
    commit = Indexes.commit
    commit_gate = hold_commits(monkeypatch)
    approving = asyncio.ensure_future(stub.ApproveDocument(
        rpb.ReviewDocumentRequest(id="inbox/later")))
    for _ in range(2000):
        state = (await stub.GetDocument(rpb.GetDocumentRequest(id="inbox/later"))).state
        if state == S.DOCUMENT_STATE_PROCESSING:
            break
        await asyncio.sleep(0.001)
    seen.add(state)
    assert state == S.DOCUMENT_STATE_PROCESSING
    # Approving what is being processed is refused, naming the state.
    code, details = await code_of(stub.ApproveDocument(
        rpb.ReviewDocumentRequest(id="inbox/later")))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "processing" in details
    commit_gate.set()
    assert (await approving).state == S.DOCUMENT_STATE_INDEXED
    # failed: an approval whose commit fails, with the reason.

    async def broken(self: Indexes, batch: list[object]) -> object:
        raise OSError("disk on fire")

    monkeypatch.setattr(Indexes, "commit", broken)
    held_doc = await stub.UpsertDocument(rpb.UpsertDocumentRequest(
        source_id="inbox", id="inbox/doomed", text="bgp session flap", review=True))
    assert held_doc.document.state == S.DOCUMENT_STATE_REVIEW_REQUIRED
    code, _ = await code_of(stub.ApproveDocument(rpb.ReviewDocumentRequest(id="inbox/doomed")))
    assert code == grpc.StatusCode.INTERNAL
    failed = await stub.GetDocument(rpb.GetDocumentRequest(id="inbox/doomed"))
    assert failed.state == S.DOCUMENT_STATE_FAILED and "disk on fire" in failed.error
    seen.add(failed.state)
    monkeypatch.setattr(Indexes, "commit", commit)
    await stub.UpsertDocument(rpb.UpsertDocumentRequest(
        source_id="inbox", id="inbox/no", text="customer names", review=True))
    seen.add((await stub.RejectDocument(rpb.ReviewDocumentRequest(id="inbox/no"))).state)
    every = {v for v in S.values() if v != S.DOCUMENT_STATE_UNSPECIFIED}
    assert seen == every


async def test_review_refusals_name_the_problem(stub: Stub) -> None:
    """An unknown document is NOT_FOUND; one not awaiting review FAILED_PRECONDITION
    naming its state; a malformed id, an oversized note or an unknown state filter
    INVALID_ARGUMENT."""
    await stub.AddSource(rpb.AddSourceRequest(id="inbox"))
    await stub.UpsertDocument(rpb.UpsertDocumentRequest(
        source_id="inbox", id="inbox/a", text="printer jammed"))
    code, _ = await code_of(stub.ApproveDocument(rpb.ReviewDocumentRequest(id="inbox/zz")))
    assert code == grpc.StatusCode.NOT_FOUND
    code, details = await code_of(stub.RejectDocument(rpb.ReviewDocumentRequest(id="inbox/a")))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert "'inbox/a' is indexed, not review_required" in details
    code, _ = await code_of(stub.ApproveDocument(rpb.ReviewDocumentRequest(id="")))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    await stub.UpsertDocument(rpb.UpsertDocumentRequest(
        source_id="inbox", id="inbox/b", text="held one", review=True))
    code, details = await code_of(stub.RejectDocument(rpb.ReviewDocumentRequest(
        id="inbox/b", note="n" * 3000)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "note" in details
    code, details = await code_of(stub.ListDocuments(rpb.ListDocumentsRequest(states=[42])))  # type: ignore[list-item]
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "state" in details


async def test_only_an_admin_token_approves_or_rejects(
        retriever: Retriever, tmp_path: Path) -> None:
    """With tokens configured, a read token may list documents awaiting review but is
    refused ApproveDocument and RejectDocument (PERMISSION_DENIED, nothing changes); an
    admin token approves."""
    tokens, _, _ = token_files(tmp_path)
    server = grpc.aio.server(interceptors=[AuthInterceptor(load_tokens(tokens))])
    retrieval_pb2_grpc.add_RetrievalServiceServicer_to_server(
        RetrievalServicer(retriever), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = Stub(channel)
            admin = (("authorization", f"Bearer {ADMIN_TOKEN}"),)
            read = (("authorization", f"Bearer {READ_TOKEN}"),)
            await stub.AddSource(rpb.AddSourceRequest(id="inbox", review_required=True),
                                 metadata=admin)
            await stub.UpsertDocument(rpb.UpsertDocumentRequest(
                source_id="inbox", id="inbox/a", text="printer jammed"), metadata=admin)
            waiting = await stub.ListDocuments(rpb.ListDocumentsRequest(
                states=[S.DOCUMENT_STATE_REVIEW_REQUIRED]), metadata=read)
            assert [d.id for d in waiting.documents] == ["inbox/a"]
            for call in (stub.ApproveDocument, stub.RejectDocument):
                code, details = await code_of(call(rpb.ReviewDocumentRequest(id="inbox/a"),
                                                   metadata=read))
                assert code == grpc.StatusCode.PERMISSION_DENIED
                assert "needs a token with the admin role" in details
            got = await stub.GetDocument(rpb.GetDocumentRequest(id="inbox/a"), metadata=read)
            assert got.state == S.DOCUMENT_STATE_REVIEW_REQUIRED
            done = await stub.ApproveDocument(rpb.ReviewDocumentRequest(id="inbox/a"),
                                              metadata=admin)
            assert done.state == S.DOCUMENT_STATE_INDEXED
    finally:
        await server.stop(0)
