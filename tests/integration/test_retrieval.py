"""Retrieval end to end: a real daemon with real children, a runbook corpus on disk, real
gRPC clients; and crash safety with kill -9 at random points during ingest."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from daemon import Daemon
from llamad_protocol.v1 import retrieval_pb2 as rpb
from llamad_protocol.v1 import retrieval_pb2_grpc
from tests.conftest import ROOT
from tests.integration.test_answer import bad_request_fields
from tests.support.corpus import write_corpus
from tests.support.daemon import Clients, config_env, make_daemon

pytestmark = pytest.mark.integration

class Retrieval:
    def __init__(self, c: Clients) -> None:
        self.stub = retrieval_pb2_grpc.RetrievalServiceStub(c.channel)

    async def reindex(self, source: str = "") -> rpb.ReindexProgress:
        msgs = [m async for m in self.stub.Reindex(rpb.ReindexRequest(source_id=source))]
        assert msgs[-1].done
        last: rpb.ReindexProgress = msgs[-1]
        return last

    async def search(self, query: str, top_k: int = 0,
                     filters: rpb.SearchFilters | None = None) -> rpb.SearchResponse:
        resp: rpb.SearchResponse = await self.stub.Search(
            rpb.SearchRequest(query=query, top_k=top_k, filters=filters))
        return resp


@pytest.fixture
async def daemon_with_corpus(tmp_path: Path, llama_server: str
                             ) -> AsyncIterator[tuple[Daemon, Clients, Retrieval, Path]]:
    corpus = tmp_path / "corpus"
    write_corpus(corpus)
    daemon = make_daemon(config_env("llama-server", LLAMAD_STATE_DIR=str(tmp_path / "state"),
                                    LLAMAD_RETRIEVAL_ALLOWED_ROOTS=str(tmp_path)))
    c = Clients(await daemon.start())
    r = Retrieval(c)
    try:
        await c.wait_serving("")
        deadline = time.monotonic() + 20  # vectors need the embedding model's SHA-256
        while not daemon.children["embedding"].setup.model.sha256:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        await r.stub.AddSource(rpb.AddSourceRequest(id="docs", path=str(corpus),
                                                    category="runbook", tags=["ops"]))
        yield daemon, c, r, corpus
    finally:
        await c.close()
        await daemon.shutdown()


async def test_ingest_and_hybrid_search_cites_the_right_runbook(daemon_with_corpus) -> None:  # type: ignore[no-untyped-def]
    """A directory is indexed; a question answered only in one runbook cites its chunk first."""
    _, _, r, _ = daemon_with_corpus
    done = await r.reindex("docs")
    assert (done.seen, done.added, len(done.failed)) == (4, 4, 0)
    result = await r.search("what to do when the disk is full on the web server", top_k=3)
    assert result.mode == rpb.SEARCH_MODE_HYBRID
    assert result.warnings == []
    top = result.hits[0]
    assert top.document_id == "docs/runbooks/web01.md"
    assert top.chunk_id.startswith("docs/runbooks/web01.md#")
    assert top.search_source == rpb.SEARCH_SOURCE_HYBRID
    assert top.HasField("text_rank") and top.HasField("vector_rank")
    assert 0 < top.vector_score <= 1.0
    assert "logrotate" in top.text
    assert top.title == "web01"
    assert top.indexed_at.seconds > 0
    exact = await r.search("CVE-2024-3094")
    assert exact.hits[0].document_id == "docs/runbooks/vpn.md"
    cfg = await r.search("GigabitEthernet0/2")
    assert cfg.hits[0].document_id == "docs/configs/core-sw1.cfg"


async def test_incremental_reindex_does_no_work_for_unchanged_files(daemon_with_corpus) -> None:  # type: ignore[no-untyped-def]
    """Unchanged files cost nothing; a changed file is replaced; a deleted one is removed."""
    _, _, r, corpus = daemon_with_corpus
    await r.reindex("docs")
    again = await r.reindex("docs")
    assert (again.added, again.changed, again.unchanged, again.deleted) == (0, 0, 4, 0)
    (corpus / "runbooks/db02.md").write_text(
        "# db02\n\n## Failover\n\nPromote with pg_ctl promote.\n")
    os.utime(corpus / "runbooks/db02.md", (time.time() + 5, time.time() + 5))
    (corpus / "runbooks/vpn.md").unlink()
    third = await r.reindex("docs")
    assert (third.changed, third.deleted, third.unchanged) == (1, 1, 2)
    result = await r.search("replication lag replay timestamp")
    assert all(h.document_id != "docs/runbooks/vpn.md" for h in result.hits)
    assert not any("pg_last_xact_replay_timestamp" in h.text for h in result.hits)
    promote = await r.search("pg_ctl promote")
    assert promote.hits[0].document_id == "docs/runbooks/db02.md"


async def test_pushed_document_is_redacted_before_indexing(daemon_with_corpus) -> None:  # type: ignore[no-untyped-def]
    """Credentials in a pushed document never reach the index; its state is visible."""
    _, _, r, _ = daemon_with_corpus
    await r.stub.AddSource(rpb.AddSourceRequest(id="notes"))
    secret = "hunter2-" + "q9" * 8
    resp = await r.stub.UpsertDocument(rpb.UpsertDocumentRequest(
        source_id="notes", id="notes/backup-job", title="Backup job",
        text=f"The backup job connects with password={secret} to the NAS nightly.",
        tags=["backup"]))
    assert resp.document.state == rpb.DOCUMENT_STATE_INDEXED
    assert resp.document.redactions >= 1
    hits = (await r.search("backup job NAS nightly")).hits
    assert hits[0].document_id == "notes/backup-job"
    assert secret not in hits[0].text
    assert "[REDACTED:password]" in hits[0].text
    assert (await r.search(secret)).hits == [] or all(
        secret not in h.text for h in (await r.search(secret)).hits)
    doc = await r.stub.GetDocument(rpb.GetDocumentRequest(id="notes/backup-job"))
    assert doc.state == rpb.DOCUMENT_STATE_INDEXED


async def test_filters_apply_inside_both_indexes(daemon_with_corpus) -> None:  # type: ignore[no-untyped-def]
    """A selective filter still returns k hits when k exist."""
    _, _, r, _ = daemon_with_corpus
    await r.reindex("docs")
    await r.stub.AddSource(rpb.AddSourceRequest(id="notes", tags=["misc"]))
    for i in range(6):
        await r.stub.UpsertDocument(rpb.UpsertDocumentRequest(
            source_id="notes", id=f"notes/n{i}", title=f"note {i}",
            text=f"web01 disk note number {i} about nginx logs", tags=["misc"]))
    only_notes = await r.search("web01 disk full nginx", top_k=5,
                                filters=rpb.SearchFilters(sources=["notes"]))
    assert len(only_notes.hits) == 5
    assert {h.source_id for h in only_notes.hits} == {"notes"}
    only_docs = await r.search("web01 disk full nginx", top_k=3,
                               filters=rpb.SearchFilters(tags=["ops"]))
    assert only_docs.hits
    assert {h.source_id for h in only_docs.hits} == {"docs"}


async def test_search_degrades_to_bm25_without_embedding_child(daemon_with_corpus) -> None:  # type: ignore[no-untyped-def]
    """With the embedding child down, search still answers, BM25-only, and says so."""
    daemon, _, r, _ = daemon_with_corpus
    await r.reindex("docs")
    await daemon.children["embedding"].supervisor.stop()
    result = await r.search("disk full web01")
    assert result.mode == rpb.SEARCH_MODE_TEXT
    assert any("BM25-only" in w for w in result.warnings)
    assert result.hits[0].document_id == "docs/runbooks/web01.md"
    assert result.hits[0].search_source == rpb.SEARCH_SOURCE_TEXT
    assert not result.hits[0].HasField("vector_rank")


async def test_bad_retrieval_requests(daemon_with_corpus) -> None:  # type: ignore[no-untyped-def]
    """Bad ids, unknown sources and empty text get clear errors; an absurd top_k is
    clamped to retrieval.max_k with a warning; a vector search the index cannot answer
    yet, or an unknown mode, is refused saying why."""
    _, _, r, _ = daemon_with_corpus
    await r.stub.AddSource(rpb.AddSourceRequest(id="notes"))
    cases = [
        (rpb.UpsertDocumentRequest(source_id="notes", id="notes/../etc/passwd", text="x"),
         grpc.StatusCode.INVALID_ARGUMENT),
        (rpb.UpsertDocumentRequest(source_id="notes", id="notes/a\x07b", text="x"),
         grpc.StatusCode.INVALID_ARGUMENT),
        (rpb.UpsertDocumentRequest(source_id="nope", text="x"), grpc.StatusCode.NOT_FOUND),
        (rpb.UpsertDocumentRequest(source_id="notes", text="   "),
         grpc.StatusCode.INVALID_ARGUMENT),
    ]
    for request, code in cases:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await r.stub.UpsertDocument(request)
        assert err.value.code() == code, err.value.details()
    for k in (21, 10**9):
        clamped = await r.stub.Search(rpb.SearchRequest(query="disk", top_k=k))
        assert len(clamped.hits) <= 20
        assert f"top_k {k} is above the maximum, retrieval.max_k = 20: 20 hits at most" \
            in clamped.warnings
    unknown: Any = 99
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await r.stub.Search(rpb.SearchRequest(query="disk", mode=unknown))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "unknown search mode 99" in (err.value.details() or "")
    weird = await r.search('AND OR NOT /.*/ title:foo "unbalanced ((( a-b * \\')
    assert weird.mode in (rpb.SEARCH_MODE_HYBRID, rpb.SEARCH_MODE_TEXT)



async def test_search_with_each_fusion(daemon_with_corpus) -> None:  # type: ignore[no-untyped-def]
    """rrf, dbsf and convex through the daemon's Search (real MiniLM child): the runbook
    that answers leads; scores are the fused ones over the fusion's ceiling (RRF: first
    in both lists; dbsf and convex: the sum of the weights), best first; per document,
    one hit each. The BM25 list of this small corpus is shorter than its depth, so its
    weight is raised as documented (docs/knowledge-base.md, "Search":
    ``max(0.4, 0.6 * (depth - n + 1) / depth)``), read from the response's own stats.
    An unknown fusion, or a weight out of range, is INVALID_ARGUMENT naming the field."""
    _, _, r, _ = daemon_with_corpus
    await r.reindex("docs")
    query = "what to do when the disk is full on the web server"
    orders = {}
    for fusion in ("rrf", "dbsf", "convex"):
        resp = await r.stub.Search(rpb.SearchRequest(
            query=query, top_k=10, fusion=fusion, text_weight=0.4, vector_weight=0.6))
        assert resp.mode == rpb.SEARCH_MODE_HYBRID
        n, depth = resp.stats.text_candidates, resp.stats.text_depth
        assert 0 < n < depth  # four documents: a short list
        text_weight = max(0.4, 0.6 * (depth - n + 1) / depth)
        ceiling = (text_weight + 0.6) * (1 / 61 if fusion == "rrf" else 1.0)
        top = resp.hits[0]
        assert top.document_id == "docs/runbooks/web01.md", fusion
        assert (top.text_rank, top.vector_rank) == (1, 1), fusion
        fused = [h.fused_score for h in resp.hits]
        assert fused == sorted(fused, reverse=True)
        assert [h.score for h in resp.hits] == pytest.approx([f / ceiling for f in fused])
        if fusion in ("rrf", "convex"):  # first in both lists: the ceiling itself
            assert top.fused_score == pytest.approx(ceiling)
            assert top.score == pytest.approx(1.0)
        orders[fusion] = [h.chunk_id for h in resp.hits]
        grouped = await r.stub.Search(rpb.SearchRequest(
            query=query, top_k=10, fusion=fusion, group_by_document=True))
        docs = [h.document_id for h in grouped.hits]
        assert docs[0] == "docs/runbooks/web01.md"
        assert len(docs) == len(set(docs)) == 4
    assert set(orders["rrf"]) == set(orders["dbsf"]) == set(orders["convex"])
    for request, field in [(rpb.SearchRequest(query="disk", fusion="borda"), "fusion"),
                           (rpb.SearchRequest(query="disk", fusion="dbsf", text_weight=101),
                            "text_weight")]:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await r.stub.Search(request)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert bad_request_fields(err.value) == [field]


def test_acknowledged_writes_survive_kill9_at_random_points(tmp_path: Path,
                                                            llama_server: str) -> None:
    """kill -9 during ingest, three times: every acknowledged document is searchable after
    restart, and the indexes open cleanly."""
    env = {**os.environ, **config_env("llama-server", LLAMAD_GENERATION_ENABLED="false",
                                      LLAMAD_STATE_DIR=str(tmp_path / "state"))}
    rng = random.Random(4711)
    acked: list[str] = []

    def start() -> tuple[subprocess.Popen[bytes], str]:
        import json

        log = tmp_path / f"daemon-{len(acked)}-{time.monotonic_ns()}.log"
        with open(log, "wb") as out:  # a file, not a pipe: nobody has to keep draining it
            proc = subprocess.Popen([sys.executable, "-m", "daemon", "serve"], cwd=ROOT,
                                    env=env, stdout=subprocess.DEVNULL, stderr=out)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            for line in log.read_text().splitlines():
                if '"listening"' in line:
                    return proc, str(json.loads(line)["address"])
            if proc.poll() is not None:
                raise AssertionError(f"daemon exited {proc.returncode}:\n"
                                     f"{log.read_text()[-3000:]}")
            time.sleep(0.05)
        proc.send_signal(signal.SIGUSR1)  # stacks of every thread, to say where it hangs
        time.sleep(1)
        proc.kill()
        proc.wait()
        raise AssertionError(f"daemon did not start in 120 s:\n{log.read_text()[-6000:]}")

    for round_ in range(3):
        proc, address = start()
        try:
            with grpc.insecure_channel(address) as ch:
                stub = retrieval_pb2_grpc.RetrievalServiceStub(ch)
                stub.AddSource(rpb.AddSourceRequest(id="crash"))
                for doc_id in acked:  # everything acknowledged before is still there
                    token = doc_id.rsplit("/", 1)[1]
                    hits = stub.Search(rpb.SearchRequest(query=token, top_k=1)).hits
                    assert hits, f"lost acknowledged {doc_id} after kill -9"
                    assert hits[0].document_id == doc_id
                kill_after = rng.uniform(0.3, 1.5)
                began = time.monotonic()
                i = 0
                # At least 4 writes a round, however slow an upsert is on a loaded
                # machine (at load 13, 6 in three rounds of 0.3-1.5 s): the count below
                # must not depend on the embedding model's speed.
                while i < 4 or time.monotonic() - began < kill_after:
                    token = f"tok{round_}x{i}"
                    doc_id = f"crash/{token}"
                    stub.UpsertDocument(rpb.UpsertDocumentRequest(
                        source_id="crash", id=doc_id, title=token,
                        text=f"{token} " + " ".join(f"word{j}" for j in range(200))))
                    acked.append(doc_id)
                    i += 1
                # Fire the kill while more writes are in flight.
                future = stub.UpsertDocument.future(rpb.UpsertDocumentRequest(
                    source_id="crash", id=f"crash/unacked{round_}", title="x", text="x y z"))
                proc.send_signal(signal.SIGKILL)
                future.exception()
        finally:
            proc.kill()
            proc.wait()
    assert len(acked) > 10
    proc, address = start()
    try:
        # An operator's `kill -USR1` dumps the stacks and the daemon keeps serving.
        proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 10
        logs = sorted(tmp_path.glob("daemon-*.log"), key=lambda p: p.stat().st_mtime)
        while "Thread 0x" not in logs[-1].read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "Thread 0x" in logs[-1].read_text()
        with grpc.insecure_channel(address) as ch:
            stub = retrieval_pb2_grpc.RetrievalServiceStub(ch)
            docs = {d.id for d in stub.ListDocuments(rpb.ListDocumentsRequest()).documents
                    if d.state == rpb.DOCUMENT_STATE_INDEXED}
            assert set(acked) <= docs
            status = stub.Status(rpb.RetrievalStatusRequest())
            assert status.chunks >= len(acked)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
