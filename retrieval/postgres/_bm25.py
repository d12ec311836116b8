"""BM25 in plain SQL for the PostgreSQL store: its terms, its statistics and its ranking.

Analysis is the embedded index's (:mod:`retrieval.store._bm25`), run in Python at ingest with
tantivy's own analyzers, so both stores see the same terms:

* body terms: ``en_stem`` (tantivy's simple tokenizer, tokens of 40 bytes and more
  removed, lowercasing, the English Snowball stemmer), stored as ``b:<term>``;
* exact terms: the ``llamad_exact`` analyzer's technical tokens (those holding
  ``. _ : / @ -``: the only ones a query looks up there), stored as ``x:<term>``.

Each field has its own lengths (the body's count of ``en_stem`` tokens, the exact field's
count of every ``llamad_exact`` token), as tantivy keeps a field norm per field.

Tables (schema versions 4 to 6, :mod:`retrieval.postgres._schema`):

================  ==========================================================================
table             holds
================  ==========================================================================
bm25_docs         one row per chunk: ``body_len``, ``exact_len`` (cascade-deleted with it)
bm25_postings     ``(term, chunk_key)`` -> ``tf``, the field's length ``dl`` and ``impact``
                  (the tf part of BM25 when written), indexed by ``(term, impact DESC)``;
                  deleted with the chunk's ``bm25_docs`` row (a trigger, migration 6)
bm25_df           ``(term, slot)`` -> a part of the term's document frequency
bm25_corpus       ``slot`` -> a part of the chunk count and of each field's total length
================  ==========================================================================

The statistics are kept by statement-level triggers on ``bm25_postings`` and
``bm25_docs`` (transition tables), so every way a chunk leaves (a replacement, a document
or source deleted, a cascade) changes them in the same transaction, exactly. They are
additive: a writing transaction first takes one of :data:`SLOTS` slots (a transaction
advisory lock, the first free one) and adds its deltas to that slot's rows only. Two
writers never update the same statistics row at once, so no update can be lost and no
hot counter row serialises ingest across nodes; a search sums a term's (at most
:data:`SLOTS`) rows.

Ranking: BM25 with tantivy's formula, ``k1`` = 1.2, ``b`` = 0.75 and
``idf = ln(1 + (N - df + 0.5) / (df + 0.5))``; a query's body words are SHOULD clauses
and its technical tokens weigh ``exact_boost`` (2.0), as in the embedded index. The
candidate set is bounded: per query term, the :data:`CANDIDATES_PER_TERM` postings of
highest impact (an index scan); a chunk's score sums the contributions found among them.
A term with fewer postings than the bound is read whole, so scores are exact there; for
commoner terms (low idf) a chunk outside a term's best postings misses that term's small
contribution. With a filter the bound is lifted (a selective filter would otherwise
starve the list). Where it differs from tantivy: document lengths are exact here (tantivy
quantises field norms to one byte, exact up to 40 tokens), and tantivy's statistics
include deleted documents until its segments merge.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import tantivy
from psycopg import sql

from ..store._bm25 import (
    _TECHNICAL,
    MAX_QUERY_TOKENS,
    _words,
    exact_analyzer,
)
from ._connect import Connection

K1 = 1.2
"""tantivy's BM25 term-frequency saturation."""
B = 0.75
"""tantivy's BM25 length normalisation."""
EXACT_BOOST = 2.0
"""Weight of a technical-token match relative to a body word (``TextIndex``'s default)."""
MAX_BODY_TOKEN_BYTES = 40
"""``en_stem`` drops tokens of this many bytes and more."""
SLOTS = 32
"""Statistics slots: how many transactions can add to the statistics at once without
waiting for each other."""
SLOT_LOCK_CLASS = 0x6C6C_6232
"""The first key of the two-key transaction advisory locks that claim a slot."""
CANDIDATES_PER_TERM = 1000
"""Postings read per query term (highest impact first) when no filter is given (the
default of ``PgOptions.bm25_candidates_per_term``). Measured on the four BEIR
collections' 15k chunks: text-list p50 25 ms with 5000, 11 ms with 1000, 4.6 ms with 300."""

LEXICAL_RANKING = "bm25-sql"
"""The name Status shows for this ranker."""

BODY, EXACT = "b:", "x:"

_body = (tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
         .filter(tantivy.Filter.remove_long(MAX_BODY_TOKEN_BYTES))
         .filter(tantivy.Filter.lowercase())
         .filter(tantivy.Filter.stemmer("english"))
         .build())
_exact = exact_analyzer()


@dataclass(frozen=True)
class ChunkTerms:
    """One chunk's BM25 view: each field's length and each term's frequency."""

    body_len: int
    exact_len: int
    tf: dict[str, int]   # "b:<term>" / "x:<term>" -> frequency


def body_text(title: str, heading: str, text: str) -> str:
    """The text the embedded index analyses for a chunk (``TextIndex._document``)."""
    return "\n".join(part for part in (title, heading, text) if part)


def chunk_terms(title: str, heading: str, text: str) -> ChunkTerms:
    """Analyse one chunk as the embedded index does."""
    joined = body_text(title, heading, text)
    body = _body.analyze(joined)
    exact = _exact.analyze(joined)
    tf = Counter(BODY + t for t in body)
    tf.update(EXACT + t for t in exact if _TECHNICAL.search(t))
    return ChunkTerms(len(body), len(exact), dict(tf))


def query_terms(query: str, exact_boost: float = EXACT_BOOST) -> dict[str, float]:
    """A query's terms and their weights: each word a body clause (two words with one
    stem count twice, as two tantivy clauses do), each distinct technical token an
    exact clause weighing ``exact_boost``."""
    weights: dict[str, float] = {}
    for word in _words(query):
        for term in _body.analyze(word):
            weights[BODY + term] = weights.get(BODY + term, 0.0) + 1.0
    tokens: dict[str, None] = {}
    for token in _exact.analyze(query):
        if _TECHNICAL.search(token):
            tokens.setdefault(token, None)
            if len(tokens) >= MAX_QUERY_TOKENS:
                break
    for token in tokens:
        weights[EXACT + token] = weights.get(EXACT + token, 0.0) + exact_boost
    return weights


def bm25(tf: int, dl: int, df: int, n: int, avgdl: float) -> float:
    """One term's BM25 contribution (tantivy's formula), the reference of the SQL."""
    idf = math.log(1.0 + (n - df + 0.5) / (df + 0.5))
    return idf * tf * (K1 + 1.0) / (tf + K1 * (1.0 - B + B * dl / avgdl))


def _impact(tf: int, dl: int, avgdl: float) -> float:
    return tf / (tf + K1 * (1.0 - B + B * dl / avgdl)) if avgdl > 0 else 1.0


# -- the schema (migration 4) ----------------------------------------------------------

_DELTA = """CREATE FUNCTION llamad_bm25_slot() RETURNS integer LANGUAGE plpgsql AS $f$
DECLARE
    s integer := nullif(current_setting('llamad.bm25_slot', true), '')::integer;
    first integer := pg_backend_pid() % {slots};
BEGIN
    -- One slot per transaction, claimed with a transaction advisory lock: only its holder
    -- adds to that slot's rows, so no two writers ever update one statistics row at once.
    IF s IS NOT NULL AND pg_try_advisory_xact_lock({cls}, s) THEN
        RETURN s;  -- this transaction's (the lock is re-entrant)
    END IF;
    FOR i IN 0..{slots} - 1 LOOP
        s := (first + i) % {slots};
        IF pg_try_advisory_xact_lock({cls}, s) THEN
            PERFORM set_config('llamad.bm25_slot', s::text, true);
            RETURN s;
        END IF;
    END LOOP;
    PERFORM pg_advisory_xact_lock({cls}, first);  -- every slot busy: wait for one
    PERFORM set_config('llamad.bm25_slot', first::text, true);
    RETURN first;
END $f$"""

MIGRATION_STATEMENTS: tuple[str, ...] = (
    """CREATE TABLE bm25_docs (
        chunk_key bigint PRIMARY KEY REFERENCES chunks(key) ON DELETE CASCADE,
        body_len integer NOT NULL,
        exact_len integer NOT NULL)""",
    """CREATE TABLE bm25_postings (
        term text NOT NULL,
        chunk_key bigint NOT NULL REFERENCES bm25_docs(chunk_key) ON DELETE CASCADE,
        tf integer NOT NULL,
        dl integer NOT NULL,
        impact real NOT NULL,
        PRIMARY KEY (term, chunk_key))""",
    "CREATE INDEX bm25_postings_chunk ON bm25_postings(chunk_key)",
    """CREATE INDEX bm25_postings_impact ON bm25_postings(term, impact DESC)
        INCLUDE (chunk_key, tf, dl)""",
    """CREATE TABLE bm25_df (
        term text NOT NULL,
        slot integer NOT NULL,
        df bigint NOT NULL,
        PRIMARY KEY (term, slot))""",
    """CREATE TABLE bm25_corpus (
        slot integer PRIMARY KEY,
        docs bigint NOT NULL,
        body_len bigint NOT NULL,
        exact_len bigint NOT NULL)""",
    _DELTA.format(slots=SLOTS, cls=SLOT_LOCK_CLASS),
    """CREATE FUNCTION llamad_bm25_df_added() RETURNS trigger LANGUAGE plpgsql AS $f$
    DECLARE s integer := llamad_bm25_slot();
    BEGIN
        INSERT INTO bm25_df(term, slot, df)
            SELECT term, s, count(*) FROM added GROUP BY term ORDER BY term
            ON CONFLICT (term, slot) DO UPDATE SET df = bm25_df.df + excluded.df;
        RETURN NULL;
    END $f$""",
    """CREATE FUNCTION llamad_bm25_df_removed() RETURNS trigger LANGUAGE plpgsql AS $f$
    DECLARE s integer := llamad_bm25_slot();
    BEGIN
        INSERT INTO bm25_df(term, slot, df)
            SELECT term, s, -count(*) FROM removed GROUP BY term
            ORDER BY term
            ON CONFLICT (term, slot) DO UPDATE SET df = bm25_df.df + excluded.df;
        RETURN NULL;
    END $f$""",
    """CREATE FUNCTION llamad_bm25_corpus_added() RETURNS trigger LANGUAGE plpgsql AS $f$
    DECLARE s integer := llamad_bm25_slot();
    BEGIN
        INSERT INTO bm25_corpus(slot, docs, body_len, exact_len)
            SELECT s, count(*), coalesce(sum(body_len), 0),
                   coalesce(sum(exact_len), 0) FROM added HAVING count(*) > 0
            ON CONFLICT (slot) DO UPDATE SET docs = bm25_corpus.docs + excluded.docs,
                body_len = bm25_corpus.body_len + excluded.body_len,
                exact_len = bm25_corpus.exact_len + excluded.exact_len;
        RETURN NULL;
    END $f$""",
    """CREATE FUNCTION llamad_bm25_corpus_removed() RETURNS trigger LANGUAGE plpgsql AS $f$
    DECLARE s integer := llamad_bm25_slot();
    BEGIN
        INSERT INTO bm25_corpus(slot, docs, body_len, exact_len)
            SELECT s, -count(*), -coalesce(sum(body_len), 0),
                   -coalesce(sum(exact_len), 0) FROM removed HAVING count(*) > 0
            ON CONFLICT (slot) DO UPDATE SET docs = bm25_corpus.docs + excluded.docs,
                body_len = bm25_corpus.body_len + excluded.body_len,
                exact_len = bm25_corpus.exact_len + excluded.exact_len;
        RETURN NULL;
    END $f$""",
    """CREATE TRIGGER bm25_postings_added AFTER INSERT ON bm25_postings
        REFERENCING NEW TABLE AS added FOR EACH STATEMENT
        EXECUTE FUNCTION llamad_bm25_df_added()""",
    """CREATE TRIGGER bm25_postings_removed AFTER DELETE ON bm25_postings
        REFERENCING OLD TABLE AS removed FOR EACH STATEMENT
        EXECUTE FUNCTION llamad_bm25_df_removed()""",
    """CREATE TRIGGER bm25_docs_added AFTER INSERT ON bm25_docs
        REFERENCING NEW TABLE AS added FOR EACH STATEMENT
        EXECUTE FUNCTION llamad_bm25_corpus_added()""",
    """CREATE TRIGGER bm25_docs_removed AFTER DELETE ON bm25_docs
        REFERENCING OLD TABLE AS removed FOR EACH STATEMENT
        EXECUTE FUNCTION llamad_bm25_corpus_removed()""",
)
"""Migration 4: the tables, the slot function and the triggers that keep the statistics.
(The terms of chunks written before it are added at open: :func:`fill_missing`.)"""

MIGRATION_6_STATEMENTS: tuple[str, ...] = (
    # The foreign key checked every posting written against bm25_docs, one lookup and one
    # queued trigger event a posting (a third of the postings' write time); a statement
    # trigger removes a chunk's postings with its bm25_docs row instead, in the same
    # statement's transaction, however the row goes (delete_terms, a chunk's cascade).
    "ALTER TABLE bm25_postings DROP CONSTRAINT bm25_postings_chunk_key_fkey",
    """CREATE FUNCTION llamad_bm25_postings_of_removed() RETURNS trigger LANGUAGE plpgsql
    AS $f$
    BEGIN
        DELETE FROM bm25_postings p USING removed r WHERE p.chunk_key = r.chunk_key;
        RETURN NULL;
    END $f$""",
    """CREATE TRIGGER bm25_docs_postings_removed AFTER DELETE ON bm25_docs
        REFERENCING OLD TABLE AS removed FOR EACH STATEMENT
        EXECUTE FUNCTION llamad_bm25_postings_of_removed()""",
)
"""Migration 6: a chunk's postings leave with its ``bm25_docs`` row by a trigger, not a
foreign key (postings are written by ``COPY`` without a check each)."""


# -- writing -----------------------------------------------------------------------------

def corpus_stats(conn: Connection) -> tuple[int, int, int]:
    """``(chunks, total body length, total exact length)`` as the statistics say."""
    row = conn.execute("SELECT coalesce(sum(docs), 0), coalesce(sum(body_len), 0), "
                       "coalesce(sum(exact_len), 0) FROM bm25_corpus").fetchone()
    return (int(row[0]), int(row[1]), int(row[2])) if row else (0, 0, 0)


def write_terms(conn: Connection, chunks: Sequence[tuple[int, str, str, str]]) -> None:
    """Add the BM25 rows of new chunks ``(key, title, heading, text)``, in the caller's
    transaction (the triggers add them to the statistics there too)."""
    if not chunks:
        return
    analysed = [(key, chunk_terms(title, heading, text))
                for key, title, heading, text in chunks]
    n, body_total, exact_total = corpus_stats(conn)
    n += len(analysed)
    body_total += sum(a.body_len for _, a in analysed)
    exact_total += sum(a.exact_len for _, a in analysed)
    averages = {BODY: body_total / n, EXACT: exact_total / n}
    with conn.cursor() as cur:
        # COPY: no array to build and parse, and one run of each statistics trigger.
        with cur.copy("COPY bm25_docs(chunk_key, body_len, exact_len) FROM STDIN") as copy:
            for key, a in analysed:
                copy.write_row((key, a.body_len, a.exact_len))
        with cur.copy("COPY bm25_postings(term, chunk_key, tf, dl, impact) FROM STDIN"
                      ) as copy:
            for key, a in analysed:
                for term, tf in a.tf.items():
                    dl = a.exact_len if term.startswith(EXACT) else a.body_len
                    copy.write_row((term, key, tf, dl, _impact(tf, dl, averages[term[:2]])))


FILL_BATCH = 500
"""Chunks analysed per transaction when an older database's statistics are built."""


def fill_missing(conn: Connection, batch: int = FILL_BATCH) -> int:
    """Add the BM25 rows of every text's entry that has none (a database made before
    schema version 4); return how many. Each batch is a transaction; the rows are locked, so
    two nodes opening together split the work instead of writing a chunk twice."""
    done = 0
    while True:
        with conn.transaction():
            rows = conn.execute(
                "SELECT c.key, c.title, c.heading, c.text FROM chunks c WHERE "
                "c.entry = c.key AND NOT EXISTS (SELECT 1 FROM bm25_docs d WHERE "
                "d.chunk_key = c.key) ORDER BY c.key "
                "LIMIT %s FOR UPDATE OF c SKIP LOCKED", (batch,)).fetchall()
            if not rows:
                return done
            write_terms(conn, [(int(k), str(t), str(h), str(x)) for k, t, h, x in rows])
            done += len(rows)


# -- ranking ------------------------------------------------------------------------------

def text_search(conn: Connection, query: str, limit: int, where: sql.Composable,
                args: Sequence[object], *, filtered: bool,
                per_term: int = CANDIDATES_PER_TERM) -> list[tuple[int, float]]:
    """The lexical list: ``(chunk key, BM25 score)``, best first (ties by key).

    ``where`` and ``args`` are the filter's conditions on ``d`` (documents); ``filtered``
    says whether they select more than the enabled sources. Unfiltered, each term reads
    its best ``per_term`` postings and only the best scored chunks are joined to their
    documents (:data:`JOIN_MARGIN` more than asked, for a disabled source's chunks); if
    that leaves too few hits while more were scored, the query runs again as a filtered
    one, which reads every posting of each term and joins every candidate."""
    weights = query_terms(query)
    if not weights:
        return []
    terms = sorted(weights)
    params = [terms, [weights[t] for t in terms], *args, limit]
    if not filtered:
        cut = limit + JOIN_MARGIN
        hits, scored = _hits(conn.execute(_statement(where, per_term, cut), params,
                                          prepare=False).fetchall())
        if len(hits) >= limit or scored < cut:
            return hits
    return _hits(conn.execute(_statement(where, None, None), params,
                              prepare=False).fetchall())[0]


def _hits(rows: Sequence[Sequence[object]]) -> tuple[list[tuple[int, float]], int]:
    """The hits of a :func:`_statement`, and how many chunks it scored (its last row)."""
    hits = [(int(str(key)), float(str(score))) for key, score, _ in rows if key is not None]
    scored = next((int(str(n)) for key, _, n in rows if key is None), 0)
    return hits, scored


JOIN_MARGIN = 64
"""Scored chunks joined to their documents beyond the ``limit`` asked for, unfiltered."""


def _statement(where: sql.Composable, per_term: int | None, cut: int | None
               ) -> sql.Composed:
    # MATERIALIZED: the statistics are read once per query term, not once per posting
    # (an inlined CTE repeats its subquery in every row that reads it).
    bound = sql.SQL("") if per_term is None else sql.SQL("LIMIT {}").format(
        sql.Literal(per_term))
    top = sql.SQL("") if cut is None else sql.SQL("LIMIT {}").format(sql.Literal(cut))
    return sql.SQL("""
WITH corpus AS MATERIALIZED (
    SELECT coalesce(sum(docs), 0)::float8 AS n, coalesce(sum(body_len), 0)::float8 AS bl,
           coalesce(sum(exact_len), 0)::float8 AS xl FROM bm25_corpus),
q AS MATERIALIZED (
    SELECT t.term, t.weight,
           (SELECT coalesce(sum(f.df), 0) FROM bm25_df f WHERE f.term = t.term)::float8 AS df
    FROM unnest(%s::text[], %s::float8[]) AS t(term, weight)),
w AS MATERIALIZED (
    SELECT q.term, q.weight * ln(1 + (corpus.n - q.df + 0.5) / (q.df + 0.5)) AS idf,
           CASE WHEN left(q.term, 2) = {exact} THEN corpus.xl ELSE corpus.bl END
               / corpus.n AS avgdl
    FROM q, corpus WHERE q.df > 0 AND corpus.n > 0),
hits AS (
    SELECT p.chunk_key, w.idf * p.tf * {k1p1}
               / (p.tf + {k1} * (1 - {b} + {b} * p.dl / w.avgdl)) AS part
    FROM w CROSS JOIN LATERAL (
        SELECT chunk_key, tf, dl FROM bm25_postings p
        WHERE p.term = w.term ORDER BY p.impact DESC {bound}) p),
top AS MATERIALIZED (
    SELECT chunk_key, sum(part) AS score FROM hits GROUP BY chunk_key
    ORDER BY score DESC, chunk_key {top})
(SELECT s.chunk_key, s.score, NULL::bigint FROM top s
 JOIN chunks c ON c.key = s.chunk_key JOIN documents d ON d.id = c.doc_id
 WHERE {where}
 ORDER BY s.score DESC, s.chunk_key LIMIT %s)
UNION ALL SELECT NULL, NULL, count(*) FROM top""").format(
        exact=sql.Literal(EXACT), k1p1=_float8(K1 + 1.0), k1=_float8(K1), b=_float8(B),
        bound=bound, top=top, where=where)


def _float8(value: float) -> sql.Composed:
    # A bare 1.2 is a numeric literal: the per-posting arithmetic would run in numeric.
    return sql.SQL("{}::float8").format(sql.Literal(value))


def reference_scores(chunks: Iterable[tuple[int, str, str, str]], query: str
                     ) -> dict[int, float]:
    """BM25 computed in Python over ``(key, title, heading, text)`` chunks: the reference
    the SQL ranking is tested against (every chunk matching any query term)."""
    analysed = {key: chunk_terms(t, h, x) for key, t, h, x in chunks}
    n = len(analysed)
    if n == 0:
        return {}
    averages = {BODY: sum(a.body_len for a in analysed.values()) / n,
                EXACT: sum(a.exact_len for a in analysed.values()) / n}
    scores: dict[int, float] = {}
    for term, weight in query_terms(query).items():
        df = sum(1 for a in analysed.values() if term in a.tf)
        for key, a in analysed.items():
            if term in a.tf:
                dl = a.exact_len if term.startswith(EXACT) else a.body_len
                scores[key] = scores.get(key, 0.0) + weight * bm25(
                    a.tf[term], dl, df, n, averages[term[:2]])
    return scores


def delete_terms(conn: Connection, keys: Sequence[int]) -> None:
    """Remove the BM25 rows of chunks about to be deleted in one statement (the chunks'
    cascade would also do it, but one statement, and one run of each trigger, per
    chunk); their postings go with them (``bm25_docs_postings_removed``)."""
    if keys:
        conn.execute("DELETE FROM bm25_docs WHERE chunk_key = ANY(%s)", (list(keys),))
