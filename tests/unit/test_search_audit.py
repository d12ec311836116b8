"""The optional Search audit log (issue 16): off by default; when on, one JSON line per
Search with the redacted query, the filters and options, the served mode, the whole fused
candidate list with both ranks, what was returned, and the latency."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from daemon.grpcapi.retrieval import RetrievalServicer
from daemon.telemetry.audit import AuditLog
from llamad_protocol.v1 import retrieval_pb2 as rpb
from llamad_protocol.v1 import retrieval_pb2_grpc
from retrieval import Retriever
from tests.support.embedder import HashEmbedder, filled
from tests.support.inprocess import serving


@pytest.fixture
async def retriever(tmp_path: Path) -> AsyncIterator[Retriever]:
    r = await filled(tmp_path / "index", HashEmbedder("m"))
    yield r
    await r.close()


async def search(r: Retriever, audit: AuditLog | None, request: rpb.SearchRequest
                 ) -> rpb.SearchResponse:
    servicer = RetrievalServicer(r, audit=audit)
    async with serving(lambda s: retrieval_pb2_grpc.add_RetrievalServiceServicer_to_server(
            servicer, s)) as channel:
        found: rpb.SearchResponse = await retrieval_pb2_grpc.RetrievalServiceStub(
            channel).Search(request)
        return found


async def test_each_search_is_one_audit_record(retriever: Retriever, tmp_path: Path) -> None:
    """The record holds the query redacted, the options, the fused list (every candidate,
    with the rank each index gave it) and the hits returned, in order."""
    log = tmp_path / "audit" / "searches.jsonl"
    query = "nginx logs disk password=hunter2Secret9"
    found = await search(retriever, AuditLog(log, 1 << 20, 1), rpb.SearchRequest(
        query=query, top_k=2, text_weight=0.5,
        filters=rpb.SearchFilters(sources=["docs"])))
    [line] = log.read_text().splitlines()
    record = json.loads(line)
    assert record["call"] == "Search"
    assert "hunter2Secret9" not in line
    assert record["query"].startswith("nginx logs disk password=[REDACTED:")
    assert (record["top_k"], record["mode"]) == (2, "hybrid")
    assert record["options"]["text_weight"] == 0.5
    assert record["filters"]["sources"] == ["docs"]
    assert record["returned"] == [h.chunk_id for h in found.hits]
    fused = record["fused"]
    assert len(fused) == 3  # every chunk is a vector candidate here, not only the top 2
    assert [f["chunk_id"] for f in fused[:2]] == record["returned"]
    assert all(f["vector_rank"] for f in fused)
    assert any(f["text_rank"] for f in fused)
    assert record["latency_ms"] > 0


async def test_no_audit_log_by_default(retriever: Retriever, tmp_path: Path) -> None:
    """Without a log configured nothing is written anywhere under the state."""
    await search(retriever, None, rpb.SearchRequest(query="nginx"))
    assert not list(tmp_path.rglob("*.jsonl"))
