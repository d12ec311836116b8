"""Disabled sources on the PostgreSQL store, against a real PostgreSQL 18 + pgvector
(tests/support/postgres.py): the embedded store's source tests (tests/unit/test_sources.py)
run unchanged on Postgres, a search naming a disabled source says so ("source … is
disabled: not searched"), and a source disabled through one node is left out, and named
in that warning, on the other."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from retrieval import Filters, Query
from tests.support.embedder import fill
from tests.support.postgres import on_postgres, two_nodes
from tests.unit import test_sources as embedded

EMBEDDED_TESTS = [
    embedded.test_a_disabled_source_is_kept_but_neither_searched_nor_rescanned,
    embedded.test_a_scan_since_a_time_reads_only_the_files_modified_after_it,
]


@pytest.mark.parametrize("test", EMBEDDED_TESTS, ids=lambda t: t.__name__)
async def test_the_embedded_source_behaviour_on_postgres(
        test: Callable[..., Awaitable[None]], tmp_path: Path, pg_dsn: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each embedded source test, its retrievers on the PostgreSQL store."""
    on_postgres(monkeypatch, embedded, pg_dsn)
    assert list(inspect.signature(test).parameters) == ["tmp_path"]
    await test(tmp_path)


async def test_a_source_disabled_through_one_node_is_named_by_the_others_search(
        tmp_path: Path, pg_dsn: str) -> None:
    """Disabled through A: B's search naming it and an enabled source finds only the
    enabled one's documents and names the disabled one; naming it alone finds nothing
    and says so; a search naming no source leaves it out without a warning; enabled
    again through B, A finds it."""
    async with two_nodes(tmp_path, pg_dsn) as (a, b):
        await fill(a)
        await a.add_source("wiki")
        await a.upsert("wiki", "printer", "printer queue stuck on web01 disk", doc_id="wiki/p")
        await a.set_source_disabled("wiki", True)
        both = await b.search("web01 disk", filters=Filters(sources=("docs", "wiki")),
                              options=Query(mode="text"))
        assert {h.doc_id for h in both.hits} == {"docs/disk"}
        assert both.warnings == ["source wiki is disabled: not searched"]
        alone = await b.search("printer queue", filters=Filters(sources=("wiki",)))
        assert (alone.hits, alone.warnings) == ([], ["source wiki is disabled: not searched"])
        unnamed = await b.search("printer queue web01")
        assert "wiki/p" not in {h.doc_id for h in unnamed.hits}
        assert not [w for w in unnamed.warnings if "disabled" in w]
        await b.set_source_disabled("wiki", False)
        again = await a.search("printer queue", filters=Filters(sources=("wiki",)))
        assert ({h.doc_id for h in again.hits}, again.warnings) == ({"wiki/p"}, [])
