"""Issue 16, defect 1, on a real daemon with a real MiniLM child: documents ingested
while the embedding model is unavailable are BM25-only, and get their vectors in the
background once it is back (search turns hybrid); Reprocess says what it started."""

from __future__ import annotations

import asyncio
import time

import pytest

from llamad_protocol.v1 import control_pb2, retrieval_pb2, retrieval_pb2_grpc
from tests.support.daemon import EMB, config_env, serving

pytestmark = pytest.mark.integration

DOCS = {
    "disk": "web01 disk full: rotate the nginx logs, then check df -h and the journal size",
    "db": "db02 replication lag: check the replay timestamp and the WAL sender state",
    "vpn": "vpn tunnel flapping: tune dead peer detection and the rekey margin",
}


async def wait_for_vectors(stub: retrieval_pb2_grpc.RetrievalServiceStub,
                           timeout: float = 120.0) -> retrieval_pb2.RetrievalStatusResponse:
    deadline = time.monotonic() + timeout
    while True:
        status: retrieval_pb2.RetrievalStatusResponse = await stub.Status(
            retrieval_pb2.RetrievalStatusRequest())
        if status.chunks and status.vectors == status.chunks:
            return status
        assert time.monotonic() < deadline, f"vectors never caught up: {status}"
        await asyncio.sleep(0.2)


async def test_documents_ingested_without_embeddings_get_vectors_when_it_returns() -> None:
    """With the embedding role disabled, pushed documents are indexed BM25-only and
    Reprocess says there is no model to embed with; once the role runs the real MiniLM
    child again, the backfill gives every chunk its vector, search is hybrid, and a
    second Reprocess finds nothing left to do."""
    env = config_env("llama-server", LLAMAD_EMBEDDING_MODE="disabled",
                     LLAMAD_GENERATION_MODE="disabled",
                     LLAMAD_RETRIEVAL_BACKFILL_INTERVAL="0.5")
    async with serving(env) as (_, clients):
        stub = retrieval_pb2_grpc.RetrievalServiceStub(clients.channel)
        await stub.AddSource(retrieval_pb2.AddSourceRequest(id="runbooks"))
        for key, text in DOCS.items():
            await stub.UpsertDocument(retrieval_pb2.UpsertDocumentRequest(
                source_id="runbooks", id=f"runbooks/{key}", title=key, text=text))
        before = await stub.Status(retrieval_pb2.RetrievalStatusRequest())
        assert (before.chunks, before.vectors) == (3, 0)
        refused = await stub.Reprocess(retrieval_pb2.ReprocessRequest())
        assert refused.chunks == 0
        assert "no embedding model" in refused.reason

        switched = [p async for p in clients.control.SetMode(control_pb2.SetModeRequest(
            role=EMB, mode=control_pb2.INFERENCE_MODE_EMBEDDED))]
        assert switched[-1].stage == control_pb2.SWAP_STAGE_DONE

        after = await wait_for_vectors(stub)
        assert after.embedded_chunks == 3
        assert after.embedding_model.startswith("all-MiniLM-L6-v2")
        result = await stub.Search(retrieval_pb2.SearchRequest(
            query="nginx logs filling the disk", top_k=3))
        assert result.mode == retrieval_pb2.SEARCH_MODE_HYBRID
        assert result.hits[0].document_id == "runbooks/disk"
        assert result.hits[0].HasField("vector_rank")
        again = await stub.Reprocess(retrieval_pb2.ReprocessRequest(source_id="runbooks"))
        assert (again.chunks, again.reason) == (
            0, "every chunk has a vector of the current embedding model")
