"""History sources and their retention on the PostgreSQL store, against a real PostgreSQL
18 + pgvector (tests/support/postgres.py): the embedded store's history tests
(tests/unit/test_history.py) run unchanged on Postgres, on the same manual clock, and two
nodes running retention passes at once on one database delete and count each record
once."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from retrieval import Query, RetrievalLimits, Retriever
from supervisor import ManualClock
from tests.support.embedder import HashEmbedder
from tests.support.postgres import on_postgres, two_nodes
from tests.unit import test_history as embedded

EMBEDDED_TESTS = [
    embedded.test_history_sources_are_validated,
    embedded.test_a_record_without_a_date_is_dated_when_received_and_keeps_it,
    embedded.test_retention_removes_records_past_the_age_from_every_index,
    embedded.test_retention_keeps_the_newest_max_items,
    embedded.test_age_and_count_together_and_other_sources_untouched,
    embedded.test_a_pass_removes_at_most_the_batch_and_the_rest_next_pass,
    embedded.test_the_background_task_runs_a_pass_each_interval_on_the_clock,
    embedded.test_retention_off_runs_no_pass,
    embedded.test_records_are_pushed_like_any_document,
]
# Left out: test_closing_lets_the_deletion_under_way_finish_whole looks inside the
# embedded indexes (tantivy's keys against SQLite's); a Postgres deletion is one
# transaction.


@pytest.mark.parametrize("test", EMBEDDED_TESTS, ids=lambda t: t.__name__)
async def test_the_embedded_history_behaviour_on_postgres(
        test: Callable[..., Awaitable[None]], tmp_path: Path, pg_dsn: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each embedded history test, its retrievers on the PostgreSQL store."""
    pg_retriever = on_postgres(monkeypatch, embedded, pg_dsn)
    clock = ManualClock()
    wanted = inspect.signature(test).parameters
    given: dict[str, Any] = {"clock": clock, "tmp_path": tmp_path}
    if "r" in wanted:  # the unit module's fixture: one retriever, on the clock
        given["r"] = pg_retriever(tmp_path / "index", lambda: HashEmbedder("m"),
                                  RetrievalLimits(retention_interval=60,
                                                  retention_batch=500), clock=clock)
        await given["r"].open()
    try:
        await test(**{name: given[name] for name in wanted})
    finally:
        if "r" in given:
            await given["r"].close()


Nodes = tuple[Retriever, Retriever]


@pytest.fixture
async def nodes(tmp_path: Path, pg_dsn: str) -> AsyncIterator[Nodes]:
    async with two_nodes(tmp_path, pg_dsn, limits=RetrievalLimits(retention_interval=0),
                         clock=ManualClock()) as both:
        yield both


async def test_two_nodes_pruning_at_once_delete_and_count_each_record_once(
        nodes: Nodes) -> None:
    """A history source written through A: passes of both nodes at once remove the
    records beyond max_items once between them, counted once on the source; each node's
    search agrees."""
    a, b = nodes
    await a.add_source("h", history=True, max_items=5)
    assert [s.kind for s in await b.sources()] == ["history"]
    ids = await embedded.push(a, "h", 40, first=1_700_000_000, step=60)
    removed = await asyncio.gather(a.prune(), b.prune(), a.prune(), b.prune())
    assert sum(removed) == 35 and a.pruned + b.pruned == 35
    assert [d.id for d in await b.documents("h")] == ids[35:]
    assert [s.pruned for s in await a.sources()] == [35]
    hits = await b.search("restarted nginx web01", k=50, options=Query(mode="text"))
    assert {h.doc_id for h in hits.hits} == set(ids[35:])
