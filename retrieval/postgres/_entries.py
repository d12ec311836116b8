"""A text held by several documents is stored once in the PostgreSQL store (issue 30), as
in the embedded one (:mod:`retrieval.store._entries`).

Every document keeps its ``chunks`` rows; ``chunks.entry`` names its text's *indexed
holder*, the one chunk of that text (content hash) with BM25 rows (``bm25_docs``,
``bm25_postings``, counted once in the statistics) and vectors (``chunk_vectors``).
Triggers keep it in the writing transaction, however a chunk comes or goes (a
replacement, a document, source or record deleted, a rejection, a cascade):

* before a chunk is inserted: it takes its text's entry, or is the entry when it is the
  first holder;
* after the indexed holder is deleted (at the end of the statement: the other rows the
  statement deletes are gone): the oldest remaining holder is promoted, the vectors move
  to it (the trigger is named to fire before the foreign key's cascade would delete them),
  and it is listed in ``entry_promoted``; :func:`write_promoted` writes its BM25 rows
  (its own title and heading) before the transaction commits (the old entry's went with
  it, out of the statistics).

Both take a transaction advisory lock per text (:data:`ENTRY_LOCK_CLASS`,
``hashtext(content_hash)``): two writers of one text on two connections take turns, and
the second sees the first's holder (one entry). Writers take their texts' locks up front
in one sorted statement (:func:`lock_texts`), so two batches sharing texts queue instead
of deadlocking.

Search: the lists rank entries; a filter applies to the holders (:func:`holders_where`:
an entry passes when one of its holders does) and a hit is shown under an admitted holder
(:func:`resolve`: the indexed one if it passes, else the oldest that does).
"""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import sql

from ._bm25 import write_terms
from ._connect import Connection

ENTRY_LOCK_CLASS = 0x6C6C_6533
"""The first key of the two-key transaction advisory locks a text's writers take."""

_INSERT = """CREATE FUNCTION llamad_entry_insert() RETURNS trigger LANGUAGE plpgsql AS $f$
    DECLARE e bigint;
    BEGIN
        PERFORM pg_advisory_xact_lock({cls}, hashtext(new.content_hash));
        SELECT min(entry) INTO e FROM chunks WHERE content_hash = new.content_hash;
        new.entry := coalesce(e, new.key);
        RETURN new;
    END $f$"""

_PROMOTE = """CREATE FUNCTION llamad_entry_promote() RETURNS trigger LANGUAGE plpgsql AS $f$
    DECLARE e bigint;
    BEGIN
        IF old.entry IS DISTINCT FROM old.key THEN
            RETURN NULL;
        END IF;
        PERFORM pg_advisory_xact_lock({cls}, hashtext(old.content_hash));
        SELECT min(key) INTO e FROM chunks WHERE content_hash = old.content_hash;
        IF e IS NOT NULL THEN
            UPDATE chunks SET entry = e WHERE content_hash = old.content_hash;
            UPDATE chunk_vectors v SET chunk_key = e WHERE v.chunk_key = old.key
                AND NOT EXISTS (SELECT 1 FROM chunk_vectors x WHERE x.chunk_key = e
                                AND x.space_id = v.space_id);
            INSERT INTO entry_promoted(key) VALUES (e) ON CONFLICT DO NOTHING;
        END IF;
        RETURN NULL;
    END $f$"""

MIGRATION_STATEMENTS: tuple[str, ...] = (
    "ALTER TABLE chunks ADD COLUMN entry bigint",
    """UPDATE chunks c SET entry = m.first FROM (SELECT content_hash, min(key) AS first
        FROM chunks GROUP BY content_hash) m WHERE m.content_hash = c.content_hash""",
    "CREATE INDEX chunks_entry ON chunks(entry)",
    # A copy's vector where its entry has none is kept on the entry; then the copies'
    # vectors and BM25 rows go (the statistics triggers count them out).
    """INSERT INTO chunk_vectors(chunk_key, space_id, dim, embedding)
        SELECT DISTINCT ON (c.entry, v.space_id) c.entry, v.space_id, v.dim, v.embedding
        FROM chunks c JOIN chunk_vectors v ON v.chunk_key = c.key WHERE c.entry <> c.key
        AND NOT EXISTS (SELECT 1 FROM chunk_vectors e WHERE e.chunk_key = c.entry
                        AND e.space_id = v.space_id)
        ORDER BY c.entry, v.space_id, c.key""",
    """DELETE FROM chunk_vectors v USING chunks c
        WHERE c.key = v.chunk_key AND c.entry <> c.key""",
    "DELETE FROM bm25_docs b USING chunks c WHERE c.key = b.chunk_key AND c.entry <> c.key",
    """CREATE TABLE entry_promoted (
        key bigint PRIMARY KEY REFERENCES chunks(key) ON DELETE CASCADE)""",
    _INSERT.format(cls=ENTRY_LOCK_CLASS),
    _PROMOTE.format(cls=ENTRY_LOCK_CLASS),
    """CREATE TRIGGER chunks_entry_insert BEFORE INSERT ON chunks
        FOR EACH ROW EXECUTE FUNCTION llamad_entry_insert()""",
    # Named to sort before the "RI_ConstraintTrigger_..." of chunk_vectors' foreign key:
    # triggers of one event fire by name, and the cascade would delete the vectors.
    """CREATE TRIGGER "A_chunks_entry_promote" AFTER DELETE ON chunks
        FOR EACH ROW EXECUTE FUNCTION llamad_entry_promote()""",
)
"""Migration 8: ``chunks.entry``, a store's copies out of the BM25 rows and vectors, the
triggers."""


def lock_texts(conn: Connection, hashes: Sequence[str]) -> None:
    """Take the texts' locks (as the triggers do), in one sorted statement."""
    if hashes:
        conn.execute("SELECT pg_advisory_xact_lock(%s, k) FROM unnest(ARRAY(SELECT DISTINCT "
                     "hashtext(h) FROM unnest(%s::text[]) AS h ORDER BY 1)) AS k",
                     (ENTRY_LOCK_CLASS, list(hashes)))


def lock_texts_of(conn: Connection, where: str, args: Sequence[object]) -> None:
    """Take the locks of the texts of the chunks ``where`` selects (a condition on ``c``,
    chunks, and ``d``, their documents), before deleting them."""
    conn.execute(
        "SELECT pg_advisory_xact_lock(%s, k) FROM unnest(ARRAY(SELECT DISTINCT "  # noqa: S608 - fixed clauses, placeholders
        "hashtext(c.content_hash) FROM chunks c JOIN documents d ON d.id = c.doc_id "
        f"WHERE {where} ORDER BY 1)) AS k", (ENTRY_LOCK_CLASS, *args))


def write_entries(conn: Connection, added: Sequence[tuple[int, str, str, str]]) -> None:
    """Write the BM25 rows the transaction's entries lack: those of ``added`` (new
    chunks ``(key, title, heading, text)``) that are their text's entry, and the holders
    promoted (``entry_promoted``, consumed)."""
    keys = [key for key, *_ in added]
    fresh = {int(r[0]) for r in conn.execute(
        "SELECT key FROM chunks WHERE key = ANY(%s) AND entry = key", (keys,))} \
        if keys else set()
    rows = [c for c in added if c[0] in fresh]
    promoted = conn.execute(
        "DELETE FROM entry_promoted p USING chunks c WHERE c.key = p.key "
        "RETURNING c.key, c.title, c.heading, c.text, c.entry = c.key").fetchall()
    if promoted:
        conn.execute("DELETE FROM bm25_docs WHERE chunk_key = ANY(%s)",
                     ([int(r[0]) for r in promoted],))
        rows += [(int(k), str(t), str(h), str(x)) for k, t, h, x, entry in promoted
                 if entry and int(k) not in fresh]
    write_terms(conn, rows)


def holders_where(where: sql.Composable) -> sql.Composable:
    """A filter's conditions on ``d`` made a condition on the entry ``c``: some holder of
    its text passes them (a chunk that is not an entry never does)."""
    return sql.SQL("EXISTS (SELECT 1 FROM chunks h JOIN documents d ON d.id = h.doc_id "
                   "WHERE h.entry = c.key AND {})").format(where)


def resolve(conn: Connection, hits: list[tuple[int, float]], where: sql.Composable,
            args: Sequence[object]) -> list[tuple[int, float]]:
    """``hits`` (entry keys) under the holder the filter shows: the indexed holder if it
    passes, else the oldest that does (an entry none passes is dropped)."""
    if not hits:
        return hits
    shown = {int(e): int(k) for e, k in conn.execute(sql.SQL(
        "SELECT DISTINCT ON (h.entry) h.entry, h.key FROM chunks h "
        "JOIN documents d ON d.id = h.doc_id WHERE h.entry = ANY(%s) AND {} "
        "ORDER BY h.entry, h.key <> h.entry, h.key").format(where),
        [[key for key, _ in hits], *args])}
    return [(shown[key], score) for key, score in hits if key in shown]
