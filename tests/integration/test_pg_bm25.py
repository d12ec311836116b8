"""BM25 in plain SQL on the PostgreSQL store (retrieval/postgres/_bm25.py), against a real
PostgreSQL 18 (tests/support/postgres.py): scores equal a BM25 computed in Python, the
statistics stay exact through adds, replacements and deletes, two nodes writing at once
lose no update (and the check used would see a lost one), and a database made before the
statistics existed gets them at open."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from retrieval.postgres._bm25 import chunk_terms, reference_scores
from retrieval.postgres._connect import PgOptions
from retrieval.postgres._schema import SCHEMA_VERSION, migrate
from retrieval.postgres._store import PostgresStore
from retrieval.store._bm25 import Filters
from retrieval.store._metadata import ChunkRow, DocumentRow, SourceRow
from tests.support.postgres import PgServer

TEXTS = [
    "The disks on web01.example.net are full: rotate the logs and restart nginx.",
    "Network switch GigabitEthernet0/1 flaps; the disk is fine. See CVE-2024-3094.",
    "Restarting nginx after a config change: nginx -s reload, or systemctl restart nginx.",
    "Backups run nightly to 10.0.0.12 with restic; a full disk stops them.",
    "Upgrade to v2.4.1 fixes the memory leak in the worker pool of web01.example.net.",
    "DNS for example.net is served by two resolvers; flush the cache with resolvectl.",
    "Logs rotate daily; logrotate keeps seven compressed logs per service.",
    "The VPN uses WireGuard; peers are listed in /etc/wireguard/wg0.conf.",
    "Disk quotas are per user; repquota -a shows them, edquota changes them.",
    "Kernel 6.1 on the database hosts; the database runs PostgreSQL 18 with pgvector.",
]
QUERIES = ["disk full", "restart nginx", "web01.example.net disk", "the logs",
           "CVE-2024-3094 switch", "database postgresql pgvector kernel", "10.0.0.12 backup",
           "disks disk", "zebra", "rotate logs daily service"]


def doc(doc_id: str, source: str = "docs", title: str = "") -> DocumentRow:
    return DocumentRow(doc_id, source, title=title or f"title of {doc_id}",
                       content_hash=f"h-{doc_id}", indexed_at=1_700_000_000)


def rows(doc_id: str, *texts: str) -> list[ChunkRow]:
    return [ChunkRow(f"{doc_id}#{i}", i, f"part {i}" if i % 2 else "", text,
                     f"{doc_id}:{text}") for i, text in enumerate(texts, start=1)]


@pytest.fixture
def store(pg_dsn: str) -> Iterator[PostgresStore]:
    s = PostgresStore.open(PgOptions(pg_dsn))
    s.upsert_source(SourceRow("docs", "push"))
    s.upsert_source(SourceRow("ops", "push"))
    try:
        yield s
    finally:
        s.close()


def chunk_texts(conn: psycopg.Connection) -> list[tuple[int, str, str, str]]:
    return [(int(k), str(t), str(h), str(x)) for k, t, h, x in conn.execute(
        "SELECT key, title, heading, text FROM chunks ORDER BY key")]


def statistics(conn: psycopg.Connection) -> tuple[dict[str, int], tuple[int, int, int]]:
    """The statistics as the store keeps them: each term's document frequency (terms
    counted in no chunk left out) and (chunks, body length, exact length)."""
    df = {str(t): int(n) for t, n in conn.execute(
        "SELECT term, sum(df) FROM bm25_df GROUP BY term HAVING sum(df) <> 0")}
    corpus = conn.execute("SELECT coalesce(sum(docs), 0), coalesce(sum(body_len), 0), "
                          "coalesce(sum(exact_len), 0) FROM bm25_corpus").fetchone()
    assert corpus is not None
    return df, (int(corpus[0]), int(corpus[1]), int(corpus[2]))


def truth(conn: psycopg.Connection) -> tuple[dict[str, int], tuple[int, int, int]]:
    """The statistics recomputed from the chunks' text now in the database."""
    analysed = [chunk_terms(t, h, x) for _, t, h, x in chunk_texts(conn)]
    df: Counter[str] = Counter()
    for a in analysed:
        df.update(a.tf.keys())
    return dict(df), (len(analysed), sum(a.body_len for a in analysed),
                      sum(a.exact_len for a in analysed))


def assert_exact(dsn: str) -> None:
    """The kept statistics and postings equal those recomputed from the chunks' text."""
    with psycopg.connect(dsn) as conn:
        assert statistics(conn) == truth(conn)
        postings = {(str(t), int(k), int(f)) for t, k, f in conn.execute(
            "SELECT term, chunk_key, tf FROM bm25_postings")}
        expected = {(term, key, tf) for key, t, h, x in chunk_texts(conn)
                    for term, tf in chunk_terms(t, h, x).tf.items()}
        assert postings == expected
        assert conn.execute("SELECT count(*) FROM bm25_docs").fetchone() == \
            conn.execute("SELECT count(*) FROM chunks").fetchone()


def test_scores_equal_a_bm25_computed_in_python(store: PostgresStore, pg_dsn: str) -> None:
    """Every query's scores (body words, technical tokens boosted, repeated stems) equal
    the Python reference to 1e-6, in the same order, ties by key."""
    for i, text in enumerate(TEXTS):
        store.replace_documents([(doc(f"d{i}"), rows(f"d{i}", text, TEXTS[(i + 3) % 10]))])
    with psycopg.connect(pg_dsn) as conn:
        corpus = chunk_texts(conn)
    assert len(corpus) == 20
    for query in QUERIES:
        got = store.text_search(query, filters=Filters(), limit=50)
        want = sorted(reference_scores(corpus, query).items(), key=lambda kv: (-kv[1], kv[0]))
        assert [k for k, _ in got] == [k for k, _ in want], query
        assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=1e-6), query
    assert store.text_search("zebra", filters=Filters(), limit=10) == []
    top = store.text_search("CVE-2024-3094", filters=Filters(), limit=3)
    assert "CVE-2024-3094" in store.chunks_by_keys([top[0][0]])[top[0][0]].text


def test_statistics_stay_exact_through_add_replace_and_delete(store: PostgresStore,
                                                               pg_dsn: str) -> None:
    """After each add, replacement, document and source deletion the kept statistics
    equal those recomputed from the text; a replaced or deleted chunk leaves no posting,
    length or count behind, and an empty store's statistics sum to zero."""
    store.replace_documents([(doc("a"), rows("a", TEXTS[0], TEXTS[1])),
                             (doc("b"), rows("b", TEXTS[2]))])
    store.replace_documents([(doc("o", "ops"), rows("o", TEXTS[3], TEXTS[4]))])
    assert_exact(pg_dsn)
    old = store.document_chunk_keys("a")
    store.replace_documents([(doc("a", title="renamed"), rows("a", TEXTS[5]))])
    assert_exact(pg_dsn)
    with psycopg.connect(pg_dsn) as conn:
        for table in ("bm25_postings", "bm25_docs"):
            assert conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE chunk_key = ANY(%s)"
                                        ).format(sql.Identifier(table)),
                                (list(old),)).fetchone() == (0,)
    assert store.delete_document("b") is not None
    assert_exact(pg_dsn)
    store.delete_source("ops")
    assert_exact(pg_dsn)
    assert store.delete_document("a") is not None
    with psycopg.connect(pg_dsn) as conn:
        assert statistics(conn) == ({}, (0, 0, 0))
        for table in ("bm25_postings", "bm25_docs"):
            assert conn.execute(sql.SQL("SELECT count(*) FROM {}").format(
                sql.Identifier(table))).fetchone() == (0,)


def _vocabulary_doc(rng: random.Random, node: str, i: int) -> tuple[DocumentRow,
                                                                    list[ChunkRow]]:
    words = [f"w{rng.randrange(60)}" for _ in range(rng.randrange(5, 40))]
    texts = [" ".join(words), TEXTS[rng.randrange(len(TEXTS))]]
    return doc(f"{node}/{i}"), rows(f"{node}/{i}", *texts)


def _ingest(dsn: str, node: str, count: int, seed: int, start: threading.Barrier) -> None:
    store = PostgresStore.open(PgOptions(dsn))
    rng = random.Random(seed)
    try:
        start.wait()
        i = 0
        while i < count:
            # Batches of one to four documents, as the group committer makes them; some
            # replace an earlier one (changing its terms), in the batch or alone.
            batch = [_vocabulary_doc(rng, node, j) for j in range(i, min(count, i + 1 +
                                                                       rng.randrange(4)))]
            if i % 7 == 3:
                batch.append(_vocabulary_doc(rng, node, i // 2))
            store.replace_documents(batch)
            i += len(batch) - (i % 7 == 3)
            if i % 5 == 1:
                store.replace_documents([_vocabulary_doc(rng, node, i // 3)])
    finally:
        store.close()


def test_two_nodes_ingesting_at_once_keep_the_statistics_one_node_would(
        store: PostgresStore, pg_dsn: str, pg_server: PgServer) -> None:
    """Two nodes (their own pools) writing documents with shared terms at the same time
    leave the statistics exactly as one node writing the same documents alone does, and
    as the text says."""
    start = threading.Barrier(2)
    nodes = [threading.Thread(target=_ingest, args=(pg_dsn, n, 60, seed, start))
             for n, seed in (("a", 1), ("b", 2))]
    for t in nodes:
        t.start()
    for t in nodes:
        t.join()
    assert_exact(pg_dsn)
    alone = pg_server.create_database()
    try:
        one = PostgresStore.open(PgOptions(pg_server.dsn(alone)))
        one.upsert_source(SourceRow("docs", "push"))
        one.close()
        lone = threading.Barrier(1)
        _ingest(pg_server.dsn(alone), "a", 60, 1, lone)
        _ingest(pg_server.dsn(alone), "b", 60, 2, lone)
        with psycopg.connect(pg_dsn) as both, psycopg.connect(pg_server.dsn(alone)) as solo:
            assert statistics(both) == statistics(solo)
            assert statistics(both)[1][0] == 2 * 60 * 2
    finally:
        pg_server.drop_database(alone)


_NAIVE = """CREATE OR REPLACE FUNCTION llamad_bm25_df_added() RETURNS trigger
LANGUAGE plpgsql AS $f$
DECLARE r record; current bigint;
BEGIN
    FOR r IN SELECT term, count(*) AS n FROM added GROUP BY term ORDER BY term LOOP
        SELECT df INTO current FROM bm25_df WHERE term = r.term AND slot = 0;
        IF current IS NULL THEN
            INSERT INTO bm25_df(term, slot, df) VALUES (r.term, 0, r.n);
        ELSE
            UPDATE bm25_df SET df = current + r.n WHERE term = r.term AND slot = 0;
        END IF;
    END LOOP;
    RETURN NULL;
END $f$"""


def _add_chunk(conn: psycopg.Connection[Any], doc_id: str) -> None:
    """Insert (uncommitted) a document with one chunk of the terms alpha, beta and gamma,
    and its BM25 rows, as the store writes them; the statistics trigger runs."""
    conn.execute("INSERT INTO documents(id, source_id) VALUES (%s, 'docs')", (doc_id,))
    key = conn.execute("INSERT INTO chunks(chunk_id, doc_id, ordinal, text, content_hash) "
                       "VALUES (%s, %s, 1, 'alpha beta gamma', %s) RETURNING key",
                       (f"{doc_id}#1", doc_id, f"h-{doc_id}")).fetchone()
    assert key is not None
    conn.execute("INSERT INTO bm25_docs VALUES (%s, 3, 3)", key)
    conn.execute("INSERT INTO bm25_postings SELECT t, %s, 1, 3, 0.5 FROM "
                 "unnest(ARRAY['b:alpha', 'b:beta', 'b:gamma']) t", key)


def _race(store: PostgresStore, dsn: str) -> None:
    """Two transactions add a chunk with the same terms; the second's statistics update
    runs while the first holds its rows, and waits for the first's commit."""
    store.replace_documents([(doc("seed"), rows("seed", "alpha beta gamma"))])
    first = psycopg.connect(dsn)
    second = psycopg.connect(dsn)
    try:
        _add_chunk(first, "one")

        def other() -> None:
            _add_chunk(second, "two")
            second.commit()

        thread = threading.Thread(target=other)
        thread.start()
        pid = second.info.backend_pid
        deadline = time.monotonic() + 3
        with psycopg.connect(dsn, autocommit=True) as watch:
            while time.monotonic() < deadline and thread.is_alive():
                row = watch.execute("SELECT wait_event_type FROM pg_stat_activity WHERE "
                                    "pid = %s", (pid,)).fetchone()
                if row is not None and row[0] == "Lock":
                    break  # the second waits for the first's row locks
                time.sleep(0.01)
        first.commit()
        thread.join(10)
        assert not thread.is_alive()
    finally:
        first.close()
        second.close()


def test_the_check_sees_a_lost_document_frequency_update(store: PostgresStore,
                                                          pg_dsn: str) -> None:
    """The concurrency check is able to fail: with a naive read-modify-write of the
    document frequency in place of the additive slots, the race loses an update and the
    statistics no longer match the text; with the real triggers the same race is exact."""
    _race(store, pg_dsn)
    assert_exact(pg_dsn)
    with psycopg.connect(pg_dsn) as conn:
        conn.execute("DELETE FROM documents WHERE id IN ('one', 'two', 'seed')")
        conn.execute(_NAIVE)
    _race(store, pg_dsn)
    with psycopg.connect(pg_dsn) as conn:
        kept, _ = statistics(conn)
        real, _ = truth(conn)
    assert real["b:alpha"] == 3
    assert kept["b:alpha"] == 2  # one of the two concurrent increments was lost


def _old_node_chunk(conn: psycopg.Connection[Any], doc_id: str, ordinal: int, text: str
                    ) -> None:
    """A chunk written as a llamad of schema version 3 wrote it (no BM25 rows)."""
    conn.execute("INSERT INTO chunks(chunk_id, doc_id, ordinal, title, heading, text, "
                 "content_hash) VALUES (%s, %s, %s, %s, '', %s, %s)",
                 (f"{doc_id}#{ordinal}", doc_id, ordinal, f"title of {doc_id}", text,
                  f"{doc_id}:{ordinal}"))


def _schema_3(dsn: str) -> None:
    """A database of schema version 3 (before BM25) holding a chunk of each of TEXTS."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        assert migrate(conn, "test", upto=3) == [1, 2, 3]
        conn.execute("INSERT INTO sources(id, kind, created_at) VALUES ('docs', 'push', 0)")
        for i, text in enumerate(TEXTS):
            conn.execute("INSERT INTO documents(id, source_id, title, state) VALUES "
                         "(%s, 'docs', %s, 'indexed')", (f"d{i}", f"title of d{i}"))
            _old_node_chunk(conn, f"d{i}", 1, text)


def test_a_node_from_before_bm25_still_writing_after_the_upgrade(pg_dsn: str) -> None:
    """A node of a llamad before BM25 (schema 3) still running when a new node upgraded
    the database: what it deletes keeps the statistics exact (the chunks' cascade runs
    the triggers), but a chunk it adds gets no BM25 rows (it cannot analyse text) until
    a new node opens again, and its own text search fails (the ``fts`` column is gone).
    Hence the upgrade procedure in docs/scale-out.md: stop such nodes first."""
    _schema_3(pg_dsn)
    store = PostgresStore.open(PgOptions(pg_dsn))
    try:
        assert_exact(pg_dsn)
        with psycopg.connect(pg_dsn, autocommit=True) as old:
            old.execute("DELETE FROM chunks WHERE doc_id = 'd0'")  # its replacement's delete
            assert_exact(pg_dsn)
            old.execute("DELETE FROM documents WHERE id = 'd1'")
            assert_exact(pg_dsn)
            _old_node_chunk(old, "d2", 2, "a zebra crossing near web01.example.net")
            with pytest.raises(psycopg.errors.UndefinedColumn):
                old.execute("SELECT key FROM chunks WHERE fts @@ plainto_tsquery('zebra')")
        with psycopg.connect(pg_dsn) as conn:
            kept, (chunks, _, _) = statistics(conn)
            assert chunks == len(TEXTS) - 2  # the old node's chunk is not counted
            assert "b:zebra" not in kept
        assert store.text_search("zebra", filters=Filters(), limit=5) == []
    finally:
        store.close()
    PostgresStore.open(PgOptions(pg_dsn)).close()  # a new node's next open fills it in
    assert_exact(pg_dsn)


def test_a_database_made_before_bm25_gets_its_statistics_at_open(pg_dsn: str) -> None:
    """A schema-3 database with chunks (ranked by tsvector then) upgrades in place at
    open: the statistics are built for its chunks, its ``fts`` column goes, and searches
    rank them by BM25."""
    _schema_3(pg_dsn)
    store = PostgresStore.open(PgOptions(pg_dsn))
    try:
        assert store.info().schema_version == SCHEMA_VERSION
        assert_exact(pg_dsn)
        with psycopg.connect(pg_dsn) as conn:
            assert statistics(conn)[1][0] == len(TEXTS)
            assert conn.execute("SELECT count(*) FROM information_schema.columns WHERE "
                                "table_name = 'chunks' AND column_name = 'fts'"
                                ).fetchone() == (0,)
            corpus = chunk_texts(conn)
        got = store.text_search("restart nginx", filters=Filters(), limit=5)
        want = sorted(reference_scores(corpus, "restart nginx").items(),
                      key=lambda kv: (-kv[1], kv[0]))[:5]
        assert [k for k, _ in got] == [k for k, _ in want]
    finally:
        store.close()
    PostgresStore.open(PgOptions(pg_dsn)).close()  # reopened: nothing left to build
    assert_exact(pg_dsn)


def test_a_batch_listing_a_document_twice_keeps_the_last_version(store: PostgresStore,
                                                                 pg_dsn: str) -> None:
    """One replace_documents call with two versions of a document (and another document)
    leaves the last version's terms only, the statistics exact."""
    store.replace_documents([(doc("a"), rows("a", TEXTS[0])), (doc("b"), rows("b", TEXTS[1])),
                             (doc("a"), rows("a", TEXTS[2], TEXTS[3]))])
    assert_exact(pg_dsn)
    with psycopg.connect(pg_dsn) as conn:
        assert statistics(conn)[1][0] == 3
    top = store.text_search("CVE-2024-3094", filters=Filters(), limit=1)
    assert store.chunks_by_keys([top[0][0]])[top[0][0]].doc_id == "b"
    # The first version's words (only there) are gone with it.
    assert store.text_search("web01.example.net logs rotate", filters=Filters(),
                             limit=10) == []
    assert store.text_search("restic nightly", filters=Filters(), limit=10) != []


def test_a_disabled_source_holding_the_best_chunks_does_not_empty_the_list(
        store: PostgresStore) -> None:
    """Unfiltered, only the best scored chunks (the limit and a margin) are joined to
    their documents: when a disabled source holds all of them, the search reads the rest
    and still returns the enabled source's chunks, scored as the reference says."""
    store.replace_documents([(doc(f"d{i}"), rows(f"d{i}", "nginx nginx nginx restart"))
                             for i in range(100)])
    store.replace_documents([(doc(f"o{i}", "ops"), rows(f"o{i}", f"nginx once, then {i}"))
                             for i in range(5)])
    assert len(store.text_search("nginx", filters=Filters(), limit=3)) == 3
    assert store.set_source_disabled("docs", True)
    hits = store.text_search("nginx", filters=Filters(), limit=3)
    assert len(hits) == 3
    assert {store.chunks_by_keys([k])[k].doc_id[0] for k, _ in hits} == {"o"}
    assert hits == store.text_search("nginx", filters=Filters(sources=("ops",)), limit=3)


def test_the_postings_read_per_term_are_bounded_unless_a_filter_is_given(
        pg_dsn: str) -> None:
    """``bm25_candidates_per_term`` bounds the postings an unfiltered search reads per
    term (the highest-impact ones: here the shortest chunks); a filtered search reads
    them all; a bound below 1 is refused, naming the option."""
    store = PostgresStore.open(PgOptions(pg_dsn, bm25_candidates_per_term=2))
    try:
        store.upsert_source(SourceRow("docs", "push"))
        store.replace_documents([(doc(f"d{i}"), rows(f"d{i}", "nginx " + "word " * i))
                                 for i in range(10)])
        bounded = store.text_search("nginx", filters=Filters(), limit=10)
        assert [store.chunks_by_keys([k])[k].doc_id for k, _ in bounded] == ["d0", "d1"]
        every = store.text_search("nginx", filters=Filters(sources=("docs",)), limit=10)
        assert len(every) == 10
        assert every[:2] == bounded
    finally:
        store.close()
    with pytest.raises(ValueError, match="bm25_candidates_per_term"):
        PostgresStore.open(PgOptions(pg_dsn, bm25_candidates_per_term=0))
