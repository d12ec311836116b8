"""Search stats (issue 30): every Search result says how much each list searched, how
many candidates each gave and fusion kept, and how long each stage took; the sizes are
counted in the background at most every SIZES_EVERY seconds. A real retriever (embedded
store) with a deterministic embedder."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from retrieval import Query, Retriever
from retrieval.search import _stats
from tests.support.embedder import HashEmbedder
from tests.support.eventually import eventually

STAGES = {"filters", "text", "embed", "vector", "fuse", "fetch", "total"}


@pytest.fixture
async def r(tmp_path: Path) -> AsyncIterator[Retriever]:
    retriever = Retriever(tmp_path / "index", lambda: HashEmbedder("m"))
    await retriever.open()
    await retriever.add_source("inbox")
    for i in range(6):
        await retriever.upsert("inbox", f"Note {i}", f"disk full on web0{i}: rotate logs",
                               doc_id=f"inbox/n{i}")
    yield retriever
    await retriever.close()


async def test_a_hybrid_search_reports_both_lists_and_every_stage(r: Retriever) -> None:
    result = await r.search("disk full rotate", k=2)
    st = result.stats
    assert (st.text_chunks, st.vector_chunks) == (6, 6)
    assert (st.text_depth, st.vector_depth) == (100, 100)  # retrieval's default depths
    assert (st.text_candidates, st.vector_candidates) == (6, 6)
    assert st.fused == 6 and len(result.hits) == 2
    assert set(st.stages_ms) == STAGES
    assert all(ms >= 0 for ms in st.stages_ms.values())
    assert st.stages_ms["total"] >= st.stages_ms["fetch"]


async def test_a_text_search_runs_no_vector_stage(r: Retriever) -> None:
    st = (await r.search("web03", k=3, options=Query(mode="text", candidates=4))).stats
    assert (st.text_depth, st.vector_depth, st.vector_candidates) == (4, 0, 0)
    assert st.text_candidates == 1
    assert "embed" not in st.stages_ms and "vector" not in st.stages_ms


async def test_sizes_follow_the_index_in_the_background(
        r: Retriever, monkeypatch: pytest.MonkeyPatch) -> None:
    assert (await r.search("disk", k=1)).stats.text_chunks == 6
    await r.upsert("inbox", "More", "another note about disks", doc_id="inbox/more")
    assert (await r.search("disk", k=1)).stats.text_chunks == 6  # counted < 10 s ago
    monkeypatch.setattr(_stats, "SIZES_EVERY", 0.0)

    async def recounted() -> bool:
        return (await r.search("disk", k=1)).stats.text_chunks == 7
    await eventually(recounted)
