"""Lazy refresh (issue 16): a Search rescans, in the background, the directory sources it
covers whose last scan is older than retrieval.refresh_min_interval — at most once per
interval, never two at once, never a disabled source — on an injected clock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from daemon.grpcapi.retrieval import RetrievalServicer
from llamad_protocol.v1 import retrieval_pb2 as rpb
from llamad_protocol.v1 import retrieval_pb2_grpc
from retrieval import Retriever
from tests.support.embedder import scanned
from tests.support.inprocess import serving
from tests.support.load import patience


class Wall:
    """Seconds since the epoch, moved by the test."""

    def __init__(self) -> None:
        self.now = 2_000_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def kb(tmp_path: Path) -> AsyncIterator[tuple[Retriever, Path]]:
    r, root = await scanned(tmp_path, {"disk.txt": "web01 disk full: rotate the nginx logs\n"})
    yield r, root
    await r.close()


async def test_a_search_rescans_a_stale_source_at_most_once_per_interval(
        kb: tuple[Retriever, Path]) -> None:
    """Within the interval a search leaves the source alone; past it, the search starts
    one background rescan (the file added meanwhile is found by the next search), and
    the next searches within the new interval start none."""
    r, root = kb
    wall = Wall()
    wall.now = float((await r.sources())[0].last_scan or 0) + 10
    scans: list[str] = []
    servicer = RetrievalServicer(r, allowed_roots=lambda: (str(root.parent),),
                                 refresh_interval=lambda: 600.0, wall=wall)
    original = servicer.search_service._rescan

    async def counted(source_id: str) -> None:
        scans.append(source_id)
        await original(source_id)

    servicer.search_service._rescan = counted  # type: ignore[method-assign]
    async with serving(lambda s: retrieval_pb2_grpc.add_RetrievalServiceServicer_to_server(
            servicer, s)) as channel:
        stub = retrieval_pb2_grpc.RetrievalServiceStub(channel)
        (root / "vpn.txt").write_text("vpn tunnel flapping: tune dead peer detection\n")
        await stub.Search(rpb.SearchRequest(query="vpn tunnel"))
        assert scans == []
        wall.now += 600
        first = await stub.Search(rpb.SearchRequest(query="vpn tunnel"))
        assert scans == ["kb"]
        assert "kb/vpn.txt" not in [h.document_id for h in first.hits]  # it did not wait
        await asyncio.wait_for(servicer.search_service._refreshes["kb"], patience(10))
        after = await stub.Search(rpb.SearchRequest(query="vpn tunnel"))
        assert after.hits[0].document_id == "kb/vpn.txt"
        wall.now += 599
        await stub.Search(rpb.SearchRequest(query="vpn tunnel"))
        assert scans == ["kb"]
        await r.set_source_disabled("kb", True)
        wall.now += 10_000
        await stub.Search(rpb.SearchRequest(query="vpn tunnel"))
        assert scans == ["kb"]
    await servicer.close()


async def test_no_refresh_when_the_interval_is_zero(kb: tuple[Retriever, Path]) -> None:
    """refresh_min_interval = 0 turns the refresh off, however old the last scan."""
    r, _ = kb
    wall = Wall()
    wall.now += 10**9
    servicer = RetrievalServicer(r, refresh_interval=lambda: 0.0, wall=wall)
    async with serving(lambda s: retrieval_pb2_grpc.add_RetrievalServiceServicer_to_server(
            servicer, s)) as channel:
        await retrieval_pb2_grpc.RetrievalServiceStub(channel).Search(
            rpb.SearchRequest(query="disk"))
    assert servicer.search_service._refreshes == {}
