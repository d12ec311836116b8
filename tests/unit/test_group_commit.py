"""Group commit: concurrent writers share commits, each learns its own outcome, and the
retriever's concurrent upserts are durable, searchable and never interleave versions."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest

from retrieval import Retriever
from retrieval.extraction._confine import SourceRoot
from retrieval.store._group import GroupCommitter
from tests.support.embedder import HashEmbedder


async def test_concurrent_writers_share_commits_and_get_their_own_results() -> None:
    batches: list[list[int]] = []

    async def commit(items: list[int]) -> Sequence[int | BaseException]:
        batches.append(items)
        await asyncio.sleep(0.01)  # an fsync's worth of time: the others queue meanwhile
        return [ValueError(f"odd {i}") if i % 7 == 3 else i * 10 for i in items]

    group: GroupCommitter[int, int] = GroupCommitter(commit, asyncio.Lock(), max_batch=8)
    results = await asyncio.gather(*(group.submit(i) for i in range(40)),
                                   return_exceptions=True)
    for i, result in enumerate(results):
        if i % 7 == 3:
            assert isinstance(result, ValueError) and str(result) == f"odd {i}"
        else:
            assert result == i * 10
    assert sorted(i for b in batches for i in b) == list(range(40))  # each once
    assert all(len(b) <= 8 for b in batches)
    assert len(batches) <= 6  # 1 alone, then the rest in batches of 8


async def test_a_failed_commit_fails_its_batch_only() -> None:
    calls = 0

    async def commit(items: list[str]) -> Sequence[str | BaseException]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise OSError(28, "No space left on device")
        return items

    group: GroupCommitter[str, str] = GroupCommitter(commit, asyncio.Lock())
    with pytest.raises(OSError, match="No space left"):
        await group.submit("a")
    assert await group.submit("b") == "b"


async def test_a_cancelled_writer_does_not_abandon_the_commit() -> None:
    started, release = asyncio.Event(), asyncio.Event()
    committed: list[str] = []

    async def commit(items: list[str]) -> Sequence[str | BaseException]:
        started.set()
        await release.wait()
        committed.extend(items)
        return items

    group: GroupCommitter[str, str] = GroupCommitter(commit, asyncio.Lock())
    writer = asyncio.create_task(group.submit("x"))
    await started.wait()
    writer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await writer
    release.set()
    await group.close()
    assert committed == ["x"]


async def test_one_batch_at_a_time_holds_the_writer_lock() -> None:
    """in_flight 1 (the embedded store's): a commit waits for the writer lock that other
    mutations take."""
    lock = asyncio.Lock()
    batches: list[list[str]] = []

    async def commit(items: list[str]) -> Sequence[str | BaseException]:
        assert lock.locked()
        batches.append(items)
        return items

    group: GroupCommitter[str, str] = GroupCommitter(commit, lock)
    await lock.acquire()
    writer = asyncio.create_task(group.submit("x"))
    await asyncio.sleep(0.01)
    later = asyncio.create_task(group.submit("y"))  # came while the lock was held
    await asyncio.sleep(0.01)
    assert batches == []  # the mutation holding the lock runs first
    lock.release()
    assert (await writer, await later) == ("x", "y")
    assert batches == [["x", "y"]]  # one commit for both


async def test_batches_in_flight_overlap_and_keep_a_documents_versions_in_order() -> None:
    """in_flight 2 (PostgreSQL's): a second batch is written while the first waits on
    the server, without the writer lock; an item whose key (document) is in a batch
    under way waits for it, so two versions of a document never commit concurrently or
    out of order."""
    lock = asyncio.Lock()
    await lock.acquire()  # held elsewhere: concurrent batches do not take it
    gates: list[asyncio.Event] = []
    running: list[list[str]] = []
    overlap: list[tuple[list[str], list[str]]] = []
    order: list[str] = []

    async def commit(items: list[str]) -> Sequence[str | BaseException]:
        overlap.extend((items, other) for other in running)
        running.append(items)
        gate = asyncio.Event()
        gates.append(gate)
        await gate.wait()
        running.remove(items)
        order.extend(items)
        return [item.upper() for item in items]

    group: GroupCommitter[str, str] = GroupCommitter(
        commit, lock, in_flight=2, key=lambda item: item.split(":")[0])
    first = asyncio.create_task(group.submit("a:1"))
    await asyncio.sleep(0)
    later = [asyncio.create_task(group.submit(i)) for i in ("b:1", "a:2", "c:1")]
    await asyncio.sleep(0.01)
    assert running == [["a:1"], ["b:1"]]  # two at once; a:2 and c:1 wait for a slot
    gates[1].set()  # b:1's batch ends: c:1 goes, a:2 still waits for a:1's
    await asyncio.sleep(0.01)
    assert running == [["a:1"], ["c:1"]]
    gates[0].set()
    await asyncio.sleep(0.01)
    assert running == [["c:1"], ["a:2"]]
    gates[2].set()
    gates[3].set()
    assert await first == "A:1"
    assert [await t for t in later] == ["B:1", "A:2", "C:1"]
    assert order.index("a:1") < order.index("a:2")
    assert not any({"a:1", "a:2"} <= {*mine, *other} for mine, other in overlap)
    await group.close()
    lock.release()


async def test_a_commit_cancelled_before_it_ran_fails_its_writers_and_frees_its_slot(
        ) -> None:
    """A loop shutting down cancels tasks that never ran: the batch's writers learn it
    (nobody waits forever) and the next submit still gets a slot."""
    async def commit(items: list[str]) -> Sequence[str | BaseException]:
        return items

    group: GroupCommitter[str, str] = GroupCommitter(commit, asyncio.Lock())
    writer = asyncio.ensure_future(group.submit("x"))
    await asyncio.sleep(0)  # the submit ran: its commit task exists, not yet started
    (task,) = group._running
    task.cancel()
    with pytest.raises(RuntimeError, match="ingest stopped"):
        await writer
    assert await asyncio.wait_for(group.submit("y"), 5) == "y"


def test_concurrent_batches_need_a_key() -> None:
    async def commit(items: list[str]) -> Sequence[str | BaseException]:
        return items

    with pytest.raises(ValueError, match="key"):
        GroupCommitter(commit, asyncio.Lock(), in_flight=2)
    with pytest.raises(ValueError, match="in_flight"):
        GroupCommitter(commit, asyncio.Lock(), in_flight=0, key=str)


async def test_concurrent_upserts_are_grouped_searchable_and_not_interleaved(
        tmp_path: Path) -> None:
    r = Retriever(tmp_path, lambda: HashEmbedder("m"))
    await r.open()
    await r.add_source("docs")
    texts = {f"docs/d{i}": f"token{i} runbook about service number {i}" for i in range(60)}
    await asyncio.gather(*(r.upsert("docs", k, t, doc_id=k) for k, t in texts.items()))
    assert r._ingest.committer.commits < 60
    # One document upserted twice at once: one version wins, whole, never both.
    await asyncio.gather(r.upsert("docs", "v", "alpha " * 50, doc_id="docs/twice"),
                         r.upsert("docs", "v", "beta " * 50, doc_id="docs/twice"))
    for i in (0, 31, 59):
        hits = (await r.search(f"token{i}", k=1)).hits
        assert hits[0].doc_id == f"docs/d{i}"
    alpha = [h for h in (await r.search("alpha", k=20)).hits if h.doc_id == "docs/twice"]
    beta = [h for h in (await r.search("beta", k=20)).hits if h.doc_id == "docs/twice"]
    assert bool(alpha) != bool(beta)
    status = await r.status()
    assert status.documents_by_state["indexed"] == 61
    await r.close()
    # Reopened: nothing to repair (the three stores agreed), and everything is there.
    r2 = Retriever(tmp_path, lambda: HashEmbedder("m"))
    await r2.open()
    assert r2.repaired == {}
    assert (await r2.status()).chunks == status.chunks
    await r2.close()


async def test_a_document_is_processing_while_embedded(tmp_path: Path) -> None:
    gate = asyncio.Event()

    class SlowEmbedder(HashEmbedder):
        async def embed(self, texts: Sequence[str]) -> list[list[float]]:
            await gate.wait()
            return await super().embed(texts)

    r = Retriever(tmp_path, lambda: SlowEmbedder("m"))
    await r.open()
    await r.add_source("docs")
    task = asyncio.create_task(r.upsert("docs", "t", "slow text here", doc_id="docs/slow"))
    for _ in range(100):
        if await r.document("docs/slow") is not None:
            break
        await asyncio.sleep(0.01)
    doc = await r.document("docs/slow")
    assert doc is not None and doc.state == "processing"
    assert [d.state for d in await r.documents("docs")] == ["processing"]
    assert (await r.status()).documents_by_state["processing"] == 1
    gate.set()
    assert (await task).state == "indexed"
    assert (await r.document("docs/slow")).state == "indexed"  # type: ignore[union-attr]
    await r.close()


async def test_concurrent_ingests_share_embedding_requests(tmp_path: Path) -> None:
    """Documents in flight together have their chunks embedded in shared requests of up
    to embed_batch texts (not one request per document), and commits are shared too."""
    from retrieval import RetrievalLimits

    class ChildLikeEmbedder(HashEmbedder):
        async def embed(self, texts: Sequence[str]) -> list[list[float]]:
            await asyncio.sleep(0.02)  # a request takes time: texts queue meanwhile
            return await super().embed(texts)

    embedder = ChildLikeEmbedder("m")
    r = Retriever(tmp_path, lambda: embedder, RetrievalLimits(embed_batch=8,
                                                               embed_concurrency=2))
    await r.open()
    await r.add_source("docs")
    await asyncio.gather(*(r.upsert("docs", f"t{i}", f"word{i} shared text", doc_id=f"docs/{i}")
                           for i in range(40)))
    assert embedder.calls <= 40 // 8 + 2
    assert r._ingest.committer.commits < 40
    assert (await r.status()).vectors == 40
    hits = (await r.search("word17", k=1)).hits
    assert hits[0].doc_id == "docs/17" and hits[0].vector_rank is not None
    await r.close()


async def test_one_bad_text_does_not_fail_the_others_in_its_request() -> None:
    from retrieval.store._group import EmbedBatcher

    sent: list[list[str]] = []

    async def embed(texts: list[str]) -> list[list[float]]:
        sent.append(texts)
        if "bad" in texts:
            raise ValueError("input is too large")
        return [[float(len(t))] for t in texts]

    batcher = EmbedBatcher(embed, batch=8, concurrency=1)
    good, bad = await asyncio.gather(batcher.embed(["a", "bb"]), batcher.embed(["bad"]),
                                     return_exceptions=True)
    assert good == [[1.0], [2.0]]
    assert isinstance(bad, ValueError)
    assert sent[0] == ["a", "bb", "bad"]  # one shared request first


async def test_a_scan_bounds_files_in_flight_by_count_and_bytes(tmp_path: Path) -> None:
    """ingest_workers bounds the files a scan has in flight, ingest_inflight_bytes their
    bytes; a file larger than the byte budget is ingested alone, not refused."""
    from retrieval import RetrievalLimits, scan_source

    root = tmp_path / "docs"
    root.mkdir()
    sizes = {f"f{i:02d}.md": 3000 for i in range(20)} | {"huge.md": 50_000}
    for name, size in sizes.items():
        (root / name).write_text((f"{name} " + "lorem ipsum " * size)[:size])
    r = Retriever(tmp_path / "index", lambda: HashEmbedder("m"),
                  RetrievalLimits(ingest_workers=100, ingest_inflight_bytes=10_000))
    await r.open()
    source = await r.add_source("docs", root=root)
    in_flight: dict[str, int] = {}
    peaks: list[tuple[int, int]] = []  # (files, bytes) whenever one starts
    alone: list[bool] = []
    ingest_file = r.ingest_file

    async def tracked(src: object, root: SourceRoot, rel: str,
                      target: str | None = None) -> object:
        in_flight[rel] = (root.path / rel).stat().st_size
        peaks.append((len(in_flight), sum(in_flight.values())))
        if rel == "huge.md":
            alone.append(len(in_flight) == 1)
        await asyncio.sleep(0.01)
        try:
            return await ingest_file(src, root, rel, target)  # type: ignore[arg-type]
        finally:
            del in_flight[rel]

    r.ingest_file = tracked  # type: ignore[assignment,method-assign]
    report = await scan_source(r, source.id)
    assert report.added == 21 and not report.failed
    assert max(b for f, b in peaks if f > 1) <= 10_000
    assert max(f for f, _ in peaks) == 3  # 3 x 3000 bytes fit in 10,000: a pool, bounded
    assert alone == [True]
    await r.close()
