"""Lanes with a real daemon and a real embedding child: the retriever's background
embeddings queued on the child, an interactive Search's query embedding is let in ahead of
them (its order asserted, never its latency); with lanes off, it waits behind them."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest

from daemon import Daemon
from daemon.models.admission import Admission
from daemon.models.lanes import Lane, LanePolicy
from daemon.services.retrieval_bridge import make_provider
from llamad_protocol.v1 import inference_pb2 as ipb
from llamad_protocol.v1 import inference_pb2_grpc, retrieval_pb2_grpc
from llamad_protocol.v1 import retrieval_pb2 as rpb
from tests.support.corpus import write_corpus
from tests.support.daemon import Clients, config_env, make_daemon

pytestmark = pytest.mark.integration

BACKGROUND_CALLS = 6
# A batch as an ingest sends it (16 chunks), short enough to keep a loaded machine moving.
TEXTS = [f"paragraph {i}: the disk on the web server filled up with logs" for i in range(16)]


def record(adm: Admission) -> list[tuple[str, Lane]]:
    """Log ("arrive", lane) and ("admit", lane) for every call of ``adm`` (the real
    admission of the daemon's embedding child; only observed)."""
    events: list[tuple[str, Lane]] = []
    original = adm.slot

    @contextlib.asynccontextmanager
    async def slot(time_remaining: float | None = None,
                   lane: Lane = Lane.INTERACTIVE) -> AsyncIterator[None]:
        events.append(("arrive", lane))
        async with original(time_remaining, lane):
            events.append(("admit", lane))
            yield

    adm.slot = slot  # type: ignore[method-assign]
    return events


async def wait_for(check: Callable[[], object], what: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.005)


async def search_during_background(daemon: Daemon, stub: retrieval_pb2_grpc.RetrievalServiceStub,
                                   adm: Admission) -> list[tuple[str, Lane]]:
    """Queue BACKGROUND_CALLS of the retriever's embeddings (its own embedder, as ingest and
    backfill call it) on the one-slot child, then Search; the admission events."""
    embedder = make_provider(daemon.router, daemon.children)()
    assert embedder is not None
    events = record(adm)
    background = [asyncio.create_task(embedder.embed(TEXTS)) for _ in range(BACKGROUND_CALLS)]
    await wait_for(lambda: adm.queued == BACKGROUND_CALLS - 1, "background calls queued")
    result = await stub.Search(rpb.SearchRequest(
        query="what to do when the disk is full on the web server", top_k=3))
    assert result.mode == rpb.SEARCH_MODE_HYBRID  # the query was embedded by the child
    assert result.warnings == []
    vectors = await asyncio.gather(*background)
    assert all(len(v) == len(TEXTS) for v in vectors)
    del adm.slot  # the class's own again
    return events


def background_admitted_while_search_waited(events: list[tuple[str, Lane]]) -> int:
    """Background calls let in between the Search's arrival and its admission."""
    arrived = events.index(("arrive", Lane.INTERACTIVE))
    admitted = events.index(("admit", Lane.INTERACTIVE))
    return sum(1 for e in events[arrived:admitted] if e == ("admit", Lane.BACKGROUND))


async def test_a_search_is_admitted_ahead_of_queued_background_embeddings(
        tmp_path: Path, llama_server: str) -> None:
    corpus = tmp_path / "corpus"
    write_corpus(corpus)
    daemon = make_daemon(config_env(
        "llama-server", LLAMAD_STATE_DIR=str(tmp_path / "state"),
        LLAMAD_RETRIEVAL_ALLOWED_ROOTS=str(tmp_path), LLAMAD_GENERATION_ENABLED="false",
        # One slot, none ahead: every embedding call after the first waits in llamad's
        # lanes, where the order is decided. Ageing by time off, so the order does not
        # depend on how fast the child embeds.
        LLAMAD_EMBEDDING_PARALLEL="1", LLAMAD_EMBEDDING_QUEUE_AHEAD="0",
        LLAMAD_LIMITS_LANE_PROMOTE_SECONDS="600",
        # The main child alone: this is the lanes of one child (lane_instance has its own).
        LLAMAD_EMBEDDING_BACKGROUND_INSTANCE="false",
        # The Search waits for the call running on the child: never a timeout here.
        LLAMAD_RETRIEVAL_QUERY_EMBED_TIMEOUT="300"))
    c = Clients(await daemon.start())
    try:
        await c.wait_serving("")
        await wait_for(lambda: daemon.children["embedding"].setup.model.sha256,
                       "the embedding model's SHA-256", 20)
        stub = retrieval_pb2_grpc.RetrievalServiceStub(c.channel)
        await stub.AddSource(rpb.AddSourceRequest(id="docs", path=str(corpus)))
        progress = [m async for m in stub.Reindex(rpb.ReindexRequest(source_id="docs"))]
        assert progress[-1].done and not progress[-1].failed
        adm = daemon.children["embedding"].admission
        assert adm.capacity == 1

        events = await search_during_background(daemon, stub, adm)
        # The Search came while background calls waited, and was let in at the first free
        # slot: before every one of them.
        arrived = events.index(("arrive", Lane.INTERACTIVE))
        waiting = (sum(1 for e in events[:arrived] if e == ("arrive", Lane.BACKGROUND))
                   - sum(1 for e in events[:arrived] if e == ("admit", Lane.BACKGROUND)))
        assert waiting >= BACKGROUND_CALLS - 2, events
        assert background_admitted_while_search_waited(events) == 0, events
        admits = [lane for kind, lane in events if kind == "admit"]
        assert admits.index(Lane.INTERACTIVE) <= 2, admits
        assert len(admits) == BACKGROUND_CALLS + 1

        # The same with lanes off (one FIFO): the Search waits behind every call queued
        # before it. This is what the test above would see without lanes.
        adm.configure(LanePolicy(enabled=False))
        events = await search_during_background(daemon, stub, adm)
        arrived = events.index(("arrive", Lane.INTERACTIVE))
        waiting = (sum(1 for e in events[:arrived] if e == ("arrive", Lane.BACKGROUND))
                   - sum(1 for e in events[:arrived] if e == ("admit", Lane.BACKGROUND)))
        assert background_admitted_while_search_waited(events) == waiting >= 1, events
    finally:
        await c.close()
        await daemon.shutdown()


async def test_a_client_names_its_lane_in_metadata(tmp_path: Path, llama_server: str) -> None:
    """x-llamad-lane: batch is taken; anything but interactive or batch is refused by
    name."""
    daemon = make_daemon(config_env(
        "llama-server", LLAMAD_STATE_DIR=str(tmp_path / "state"),
        LLAMAD_GENERATION_ENABLED="false"))
    c = Clients(await daemon.start())
    try:
        await c.wait_serving("")
        stub = inference_pb2_grpc.InferenceServiceStub(c.channel)
        adm = daemon.children["embedding"].admission
        events = record(adm)
        resp = await stub.Embed(ipb.EmbedRequest(texts=["hello"]),
                                metadata=(("x-llamad-lane", "batch"),))
        assert len(resp.embeddings) == 1
        assert ("admit", Lane.BATCH) in events
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Embed(ipb.EmbedRequest(texts=["hello"]),
                             metadata=(("x-llamad-lane", "background"),))
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "x-llamad-lane" in (refused.value.details() or "")
    finally:
        await c.close()
        await daemon.shutdown()
