"""A vector rebuild after an embedding-model change: the previous model's index keeps
serving the queries its model can still embed; when it cannot, search is BM25-only and
says so with the rebuild's progress; Status shows the rebuild (issue 16)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest

from clients._convert import retrieval_status
from clients._types import RetrievalStatus as ClientStatus
from clients.cli._verbs import _retrieval_line
from daemon.grpcapi.retrieval_wire import vector_rebuild
from llamad_protocol.v1 import retrieval_pb2 as rpb
from retrieval import (
    Embedder,
    Query,
    RetrievalLimits,
    RetrievalStatus,
    Retriever,
    VectorUnavailable,
)
from tests.support.embedder import DOCS, HashEmbedder, fill
from tests.support.load import patience


class Gated(HashEmbedder):
    """A hash embedder whose batches after the first ``free`` wait until ``gate`` opens
    (a rebuild held mid-way); counts the texts it embedded."""

    def __init__(self, model_id: str, free: int) -> None:
        super().__init__(model_id)
        self.free = free
        self.gate = asyncio.Event()
        self.texts: list[str] = []

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if self.free <= 0:
            await self.gate.wait()
        self.free -= 1
        self.texts.extend(texts)
        return await super().embed(texts)


class Picky(HashEmbedder):
    """A hash embedder that fails every batch but those whose texts contain ``accept``."""

    def __init__(self, model_id: str, accept: str) -> None:
        super().__init__(model_id)
        self.accept = accept

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if not all(self.accept in t for t in texts):
            raise ConnectionError("embedding child went away")
        return await super().embed(texts)


class Models:
    """The embedding models: the current one (what the role serves) and the resident
    ones (what ``embedder_for`` answers for)."""

    def __init__(self, current: Embedder) -> None:
        self.current: Embedder | None = current
        self.resident: dict[str, Embedder] = {current.model_id: current}

    def provider(self) -> Embedder | None:
        return self.current

    def embedder_for(self, model_id: str) -> Embedder | None:
        return self.resident.get(model_id)


async def opened(root: Path, models: Models) -> Retriever:
    r = Retriever(root, models.provider, RetrievalLimits(embed_batch=1),
                  embedder_for=models.embedder_for)
    await r.open()
    await fill(r)
    await r.add_source("more")
    for i in range(3):  # six chunks in all: a rebuild of one chunk per batch has steps
        await r.upsert("more", f"m{i}", f"printer queue {i} stuck on floor {i}",
                       doc_id=f"more/{i}")
    return r


async def rebuild_under_way(r: Retriever, models: Models, new: Gated, *,
                            keep_old: bool) -> None:
    """Switch the role to ``new`` (the old model stays resident if ``keep_old``) and wait
    until the rebuild has embedded its free batches and waits at the gate."""
    old = models.current
    assert old is not None
    models.current = new
    models.resident = {new.model_id: new, **({old.model_id: old} if keep_old else {})}
    assert r.backfill()
    for _ in range(200):
        status = (await r.status()).rebuild
        if status.running and status.done == 2:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the rebuild did not reach its gate: {status}")


async def test_the_previous_model_serves_while_the_rebuild_runs(tmp_path: Path) -> None:
    """Rebuild in progress, the old model still resident: searches are hybrid on the old
    model's vectors (the query embedded by it, not by the new one), vector_model names
    it, and Status shows the rebuild with the old model serving and its progress."""
    old = HashEmbedder("model-a")
    models = Models(old)
    r = await opened(tmp_path, models)
    new = Gated("model-b", free=2)
    await rebuild_under_way(r, models, new, keep_old=True)
    embedded_by_new = len(new.texts)
    calls_before = old.calls
    result = await r.search("nginx logs disk")
    assert result.mode == "hybrid"
    assert result.vector_model == "model-a"
    assert result.hits[0].doc_id == "docs/disk"
    assert result.hits[0].vector_rank == 1
    assert not result.warnings
    assert old.calls == calls_before + 1  # the query, by the old model
    assert len(new.texts) == embedded_by_new  # never by the new one
    vector_only = await r.search("replication lag", options=Query(mode="vector"))
    assert (vector_only.mode, vector_only.vector_model) == ("vector", "model-a")
    assert vector_only.hits[0].doc_id == "docs/db"
    status = await r.status()
    assert status.rebuild.running
    assert (status.rebuild.model, status.rebuild.serving_model) == ("model-b", "model-a")
    assert (status.rebuild.done, status.rebuild.pending) == (2, 4)
    assert status.embedding_model == "model-a"
    line = _retrieval_line(through_the_wire(status))
    assert "rebuilding vectors for model model-b (2 of 6 chunks embedded): model " \
        "model-a serves until then" in line
    new.gate.set()
    await r.close()


def through_the_wire(status: RetrievalStatus) -> ClientStatus:
    """The status as a client gets it: Status's message, read by the client library."""
    msg = rpb.RetrievalStatusResponse(chunks=status.chunks, rebuild=vector_rebuild(
        status.rebuild))
    return retrieval_status(msg)


async def test_without_the_previous_model_search_is_text_only_and_says_why(
        tmp_path: Path) -> None:
    """Rebuild in progress, the old model gone: searches are BM25-only, vector_model is
    empty and the warning names the rebuild, its progress and the missing model; vector
    mode is refused naming the same; Status shows no model serving."""
    old = HashEmbedder("model-a")
    models = Models(old)
    r = await opened(tmp_path, models)
    new = Gated("model-b", free=2)
    await rebuild_under_way(r, models, new, keep_old=False)
    result = await r.search("nginx logs disk")
    assert (result.mode, result.vector_model) == ("text", "")
    assert result.hits[0].doc_id == "docs/disk"
    assert result.hits[0].vector_rank is None
    [warning] = result.warnings
    assert "rebuilt for embedding model model-b (2 of 6 chunks embedded)" in warning
    assert "model-a, which is not available" in warning
    assert warning.endswith("results are BM25-only")
    with pytest.raises(VectorUnavailable, match="rebuilt for embedding model model-b"):
        await r.search("nginx logs disk", options=Query(mode="vector"))
    full = await r.status()
    status = full.rebuild
    assert (status.running, status.model, status.serving_model) == (True, "model-b", "")
    assert "searches are BM25-only until then" in _retrieval_line(through_the_wire(full))
    new.gate.set()
    await r.close()


async def test_when_the_rebuild_completes_the_new_model_answers(tmp_path: Path) -> None:
    """Once every chunk has a vector of the new model the index is its: searches are
    hybrid with vector_model the new model, and Status shows no rebuild."""
    old = HashEmbedder("model-a")
    models = Models(old)
    r = await opened(tmp_path, models)
    new = Gated("model-b", free=2)
    await rebuild_under_way(r, models, new, keep_old=True)
    new.gate.set()
    assert r.backfill_task is not None
    await asyncio.wait_for(r.backfill_task, patience(10))
    result = await r.search("nginx logs disk")
    assert (result.mode, result.vector_model) == ("hybrid", "model-b")
    assert result.hits[0].doc_id == "docs/disk"
    assert not result.warnings
    status = await r.status()
    assert status.embedding_model == "model-b"
    assert status.rebuild.model == ""
    assert not status.rebuild.running
    await r.close()


async def test_a_rebuild_not_under_way_shows_the_cached_progress(tmp_path: Path) -> None:
    """A rebuild whose run stopped (the new model failed): Status shows it due, not
    running, with the chunks already embedded for the new model as done, and the old
    model serving while it is resident."""
    old = HashEmbedder("model-a")
    models = Models(old)
    r = await opened(tmp_path, models)
    new = Picky("model-b", accept="again")
    models.current, models.resident = new, {"model-a": old, "model-b": new}
    await r.upsert("docs", "vpn", DOCS["vpn"] + " again", doc_id="docs/vpn")  # by model-b
    assert r.backfill_task is not None  # started by the upsert; stops at the first failure
    await asyncio.wait_for(r.backfill_task, patience(10))
    status = await r.status()
    assert status.backfill.last_error
    assert (status.rebuild.running, status.rebuild.model, status.rebuild.serving_model) == (
        False, "model-b", "model-a")
    assert (status.rebuild.done, status.rebuild.pending) == (1, 5)
    del models.resident["model-a"]
    assert (await r.status()).rebuild.serving_model == ""
    await r.close()


async def test_with_one_model_at_a_time_the_default_lookup_is_the_current_one(
        tmp_path: Path) -> None:
    """Without an ``embedder_for``, only the current embedder answers: after a model
    change the old index cannot be queried, so search is BM25-only naming the rebuild."""
    current: list[HashEmbedder] = [HashEmbedder("model-a")]
    r = Retriever(tmp_path, lambda: current[0])
    await r.open()
    await fill(r)
    assert (await r.search("nginx logs disk")).vector_model == "model-a"
    current[0] = HashEmbedder("model-b")
    during = await r.search("nginx logs disk")
    assert (during.mode, during.vector_model) == ("text", "")
    assert any("rebuilt for embedding model model-b" in w for w in during.warnings)
    assert r.backfill_task is not None
    await asyncio.wait_for(r.backfill_task, patience(10))
    assert (await r.search("nginx logs disk")).vector_model == "model-b"
    await r.close()
