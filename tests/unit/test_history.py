"""History sources and their retention (issue 16): a history source takes pushed records,
each dated (when received unless the caller says); in the background, on the retriever's
(injected, manual) clock, retention removes the records past max_age_days and the oldest
beyond max_items, at most retrieval.retention_batch per pass, from every index, counting
them on the source (persistently) and since start-up."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from retrieval import InvalidDocument, Query, RetrievalLimits, Retriever
from supervisor import ManualClock
from tests.support.embedder import HashEmbedder
from tests.support.eventually import eventually
from tests.support.load import patience

DAY = 86_400


@pytest.fixture
async def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
async def r(tmp_path: Path, clock: ManualClock) -> AsyncIterator[Retriever]:
    retriever = Retriever(tmp_path / "index", lambda: HashEmbedder("m"),
                          RetrievalLimits(retention_interval=60, retention_batch=500),
                          clock=clock)
    await retriever.open()
    yield retriever
    await retriever.close()


async def push(r: Retriever, source: str, n: int, *, first: int, step: int = DAY,
               kind: str = "session") -> list[str]:
    """``n`` records of ``source`` dated ``first``, ``first + step``, ...; their ids."""
    ids = []
    for i in range(n):
        doc = await r.upsert(source, f"record {i}", f"$ systemctl restart nginx\nrecord {i} "
                             "restarted nginx on web01", doc_id=f"{source}/r{i:03d}",
                             kind=kind, document_date=first + i * step)
        ids.append(doc.id)
    return ids


async def ids_of(r: Retriever, source: str) -> list[str]:
    return [d.id for d in await r.documents(source)]


async def searched(r: Retriever, mode: str = "text") -> set[str]:
    result = await r.search("restarted nginx web01", k=20, options=Query(mode=mode))
    return {h.doc_id for h in result.hits}


async def test_history_sources_are_validated(r: Retriever, tmp_path: Path) -> None:
    """history with a path, retention limits without history, or negative ones are
    refused saying why; a history source is of kind history with its limits."""
    with pytest.raises(InvalidDocument, match="no path"):
        await r.add_source("h", root=tmp_path, history=True)
    with pytest.raises(InvalidDocument, match="history sources only"):
        await r.add_source("h", max_age_days=3)
    with pytest.raises(InvalidDocument, match="history sources only"):
        await r.add_source("h", max_items=3)
    with pytest.raises(InvalidDocument, match="negative"):
        await r.add_source("h", history=True, max_items=-1)
    assert await r.sources() == []
    row = await r.add_source("h", history=True, max_age_days=7, max_items=100)
    assert (row.kind, row.max_age_days, row.max_items) == ("history", 7, 100)
    assert [(s.kind, s.max_age_days, s.max_items, s.pruned) for s in await r.sources()] == \
        [("history", 7, 100, 0)]


async def test_a_record_without_a_date_is_dated_when_received_and_keeps_it(
        r: Retriever, clock: ManualClock) -> None:
    """On the clock: a record pushed without a date gets the time it was received (in
    the background too); pushed again unchanged later, it keeps that time; a push
    source's document gets none."""
    await r.add_source("h", history=True)
    await r.add_source("p")
    received = int(clock.wall())
    await r.upsert("h", "one", "$ uptime\n up 3 days", doc_id="h/one", kind="session")
    await r.upsert("p", "doc", "a pushed doc", doc_id="p/doc")
    pending = await r.upsert_later("h", "two", "$ df -h\n/ 91%", doc_id="h/two",
                                   kind="session")
    await clock.advance(500)

    async def indexed() -> bool:
        doc = await r.document("h/two")
        return doc is not None and doc.state == "indexed"

    await eventually(indexed)
    assert pending.state == "pending"
    assert (await r.document("h/one")).document_date == received  # type: ignore[union-attr]
    assert (await r.document("h/two")).document_date == received  # type: ignore[union-attr]
    assert (await r.document("p/doc")).document_date is None  # type: ignore[union-attr]
    await r.upsert("h", "one", "$ uptime\n up 3 days", doc_id="h/one", kind="session")
    assert (await r.document("h/one")).document_date == received  # type: ignore[union-attr]


async def test_retention_removes_records_past_the_age_from_every_index(
        r: Retriever, clock: ManualClock) -> None:
    """Records older than max_age_days go (SQLite, BM25 and vectors: neither search finds
    them), the younger stay; counted on the source and since start-up."""
    await r.add_source("h", history=True, max_age_days=3)
    now = int(clock.wall())
    ids = await push(r, "h", 6, first=now - 5 * DAY - 60)  # ages 5d+1m .. 0d+1m
    assert await searched(r) == set(ids)
    assert await r.prune() == 3
    assert await ids_of(r, "h") == ids[3:]
    assert await searched(r, "text") == set(ids[3:])
    assert await searched(r, "vector") == set(ids[3:])
    assert r.pruned == 3
    assert [s.pruned for s in await r.sources()] == [3]
    assert await r.prune() == 0


async def test_retention_keeps_the_newest_max_items(r: Retriever, clock: ManualClock) -> None:
    """Beyond max_items the oldest go, whatever order they were pushed in: the newest
    (by their own date) are kept."""
    await r.add_source("h", history=True, max_items=2)
    now = int(clock.wall())
    await r.upsert("h", "new", "$ ls\nnewest", doc_id="h/new", kind="session",
                   document_date=now)
    await push(r, "h", 3, first=now - 10 * DAY)
    await r.upsert("h", "mid", "$ ls\nsecond newest", doc_id="h/mid", kind="session",
                   document_date=now - DAY)
    assert await r.prune() == 3
    assert await ids_of(r, "h") == ["h/mid", "h/new"]


async def test_age_and_count_together_and_other_sources_untouched(
        r: Retriever, clock: ManualClock, tmp_path: Path) -> None:
    """Both limits: whichever removes more wins (age here, then count); a push source
    with old dated documents and a history source without limits are left alone."""
    now = int(clock.wall())
    await r.add_source("h", history=True, max_age_days=10, max_items=4)
    await r.add_source("free", history=True)
    await r.add_source("p")
    kept_p = await push(r, "p", 2, first=now - 400 * DAY, kind="text")
    kept_free = await push(r, "free", 3, first=now - 400 * DAY)
    ids = await push(r, "h", 8, first=now - 15 * DAY, step=2 * DAY)  # 15d, 13d, ..., 1d
    assert await r.prune() == 4  # count: 8 - 4 = 4 (age alone: 15, 13, 11 = 3)
    assert await ids_of(r, "h") == ids[4:]
    await r.add_source("h", history=True, max_age_days=4, max_items=4)
    assert await r.prune() == 2  # age: 7d and 5d
    assert await ids_of(r, "h") == ids[6:]
    assert await ids_of(r, "p") == kept_p
    assert await ids_of(r, "free") == kept_free
    assert [(s.id, s.pruned) for s in await r.sources()] == [("free", 0), ("h", 6), ("p", 0)]


async def test_a_pass_removes_at_most_the_batch_and_the_rest_next_pass(
        r: Retriever, clock: ManualClock) -> None:
    """retention_batch bounds one pass over all sources; the next passes finish the job,
    oldest first; the counters add up."""
    r.limits = dataclasses.replace(r.limits, retention_batch=3)
    now = int(clock.wall())
    await r.add_source("a", history=True, max_items=1)
    await r.add_source("b", history=True, max_items=1)
    a = await push(r, "a", 5, first=now - 10 * DAY)
    b = await push(r, "b", 3, first=now - 10 * DAY)
    assert await r.prune() == 3
    assert await ids_of(r, "a") == a[3:]
    assert await ids_of(r, "b") == b
    assert await r.prune() == 3
    assert (await ids_of(r, "a"), await ids_of(r, "b")) == (a[4:], b[2:])
    assert await r.prune() == 0
    assert r.pruned == 6
    assert {s.id: s.pruned for s in await r.sources()} == {"a": 4, "b": 2}


async def test_the_background_task_runs_a_pass_each_interval_on_the_clock(
        tmp_path: Path, clock: ManualClock, r: Retriever) -> None:
    """No pass before the interval has passed on the clock; one per interval after it,
    each bounded by the batch, logging one info line when it pruned; the source's count
    survives a reopen while the since-start-up count starts again."""
    r.limits = dataclasses.replace(r.limits, retention_batch=2)
    await r.add_source("h", history=True, max_items=1)
    ids = await push(r, "h", 4, first=int(clock.wall()) - DAY)

    async def a_pass() -> None:
        passes = r.retention.passes
        await clock.advance(60)

        async def done() -> bool:
            return r.retention.passes > passes

        await eventually(done)

    await clock.advance(59)
    await asyncio.sleep(0.05)
    assert (r.retention.passes, r.pruned) == (0, 0)
    with capture_logs() as logs:
        await a_pass()
        assert await ids_of(r, "h") == ids[2:]
        await a_pass()
        assert await ids_of(r, "h") == ids[3:]
        await a_pass()
    lines = [e for e in logs if e["event"] == "history retention pruned records"]
    assert [(e["log_level"], e["records"]) for e in lines] == [("info", 2), ("info", 1)]
    assert r.pruned == 3
    await r.close()
    again = Retriever(tmp_path / "index", lambda: HashEmbedder("m"), clock=clock)
    await again.open()
    assert ([s.pruned for s in await again.sources()], again.pruned) == ([3], 0)
    await again.close()


async def test_retention_off_runs_no_pass(tmp_path: Path, clock: ManualClock) -> None:
    """retention_interval 0: the task only looks at the interval again; nothing goes."""
    r = Retriever(tmp_path / "index", lambda: HashEmbedder("m"),
                  RetrievalLimits(retention_interval=0), clock=clock)
    await r.open()
    await r.add_source("h", history=True, max_items=1)
    await push(r, "h", 3, first=int(clock.wall()) - DAY)
    await clock.advance(3600)
    await asyncio.sleep(0.05)
    assert (r.retention.passes, len(await ids_of(r, "h"))) == (0, 3)
    await r.close()


async def test_closing_lets_the_deletion_under_way_finish_whole(
        tmp_path: Path, clock: ManualClock) -> None:
    """Closed while a pass waits for the writer lock, retention finishes that source's
    deletion (SQLite, then the text index) before close returns, and runs no more."""
    r = Retriever(tmp_path / "index", lambda: HashEmbedder("m"),
                  RetrievalLimits(retention_interval=60), clock=clock)
    await r.open()
    await r.add_source("h", history=True, max_items=1)
    ids = await push(r, "h", 3, first=int(clock.wall()) - DAY)
    await r._indexes.write.acquire()  # an ingest's commit, say
    await clock.advance(60)
    await asyncio.sleep(0.05)
    closing = asyncio.create_task(r.retention.close())
    await asyncio.sleep(0.05)
    assert not closing.done()
    r._indexes.write.release()
    await asyncio.wait_for(closing, patience(10))
    assert (r.pruned, await ids_of(r, "h")) == (2, ids[2:])
    text = r._indexes.text
    assert text is not None and text.keys() == r._indexes.require().chunk_keys()
    await r.close()


async def test_records_are_pushed_like_any_document(r: Retriever, clock: ManualClock) -> None:
    """A record is redacted like any document; one pushed for review waits, dated when
    received, and is retained like the others (the oldest held one goes first)."""
    await r.add_source("h", history=True, max_items=1)
    received = int(clock.wall())
    await r.upsert("h", "login", "$ mysql -u root --password=Hunter2Secret\nmysql> show "
                   "databases;", doc_id="h/login", kind="session")
    hit = (await r.search("mysql databases", options=Query(mode="text"))).hits[0]
    assert "Hunter2Secret" not in hit.text and "[REDACTED" in hit.text
    held = await r.upsert("h", "deploy", "$ ./deploy.sh prod\ndeployed", doc_id="h/deploy",
                          kind="session", review=True, document_date=received - DAY)
    assert (held.state, held.document_date) == ("review_required", received - DAY)
    assert await r.prune() == 1
    assert await ids_of(r, "h") == ["h/login"]
