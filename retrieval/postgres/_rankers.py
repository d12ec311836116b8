"""The PostgreSQL store's lexical rankers, one chosen when the store opens.

=================  ===========================================================================
ranker             how it ranks
=================  ===========================================================================
``pg_textsearch``  the ``pg_textsearch`` extension's BM25 index (``<@>`` with
                   ``to_bm25query``), k1 = 1.2, b = 0.75, PostgreSQL's parser with an English
                   Snowball stemmer and no stop words (``llamad_english``): host names,
                   addresses and versions stay one token, where tantivy's splits them
``pg_search``      ParadeDB's ``pg_search`` (tantivy inside PostgreSQL): its ``simple``
                   tokenizer with the English stemmer, as the embedded index's ``en_stem``;
                   the query's words OR'ed (``|||``), scored by ``pdb.score``. No boosted
                   technical-token field
``bm25-sql``       :mod:`retrieval.postgres._bm25`: the embedded index's analysis and weights, in
                   plain SQL, on any PostgreSQL
=================  ===========================================================================

``auto`` (the default of :attr:`~retrieval.postgres._connect.PgOptions.lexical_ranker`) takes the
first extension the server offers that this role can install (or that is installed) and
whose index builds, else ``bm25-sql``. Both extensions define an access method named
``bm25``: a database holds one of them, and ``auto`` keeps the one installed. An extension
ranker indexes ``chunks.bm25_body`` (title, heading and text; a generated column added
when the ranker is first set up: neither extension indexes an expression). The plain-SQL
statistics are kept whichever ranker serves, so a database can change ranker at any open.

Every ranked statement (each ranker's, and the vector list's) runs unprepared
(``prepare=False``), so PostgreSQL plans it with its values each time: psycopg prepares a
statement run five times on a connection, and the server may then keep a generic plan.
At 100 000 chunks pg_search's generic plan (the query text a parameter when planned) cost
75 ms where the custom plan cost 9 ms; pg_textsearch's list 25 against 20 ms, bm25-sql's
8.7 against 6.7 (bench/RESULTS.md, "PostgreSQL store at 100k chunks per ranker").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import psycopg
import structlog
from psycopg import sql

from ..errors import StoreUnavailable
from . import _bm25 as _pg_bm25
from ._connect import Connection
from ._schema import MIGRATION_LOCK

_log = structlog.get_logger("llamad.retrieval")

AUTO = "auto"
SQL_RANKER = _pg_bm25.LEXICAL_RANKING
EXTENSIONS = ("pg_textsearch", "pg_search")
"""Extension rankers, in the order ``auto`` tries them."""
RANKERS = (AUTO, *EXTENSIONS, SQL_RANKER)
"""Values of ``lexical_ranker``."""

TEXTSEARCH_INDEX = "chunks_bm25_textsearch"
SEARCH_INDEX = "chunks_bm25_search"
TEXT_CONFIG = "llamad_english"
"""The text search configuration of the ``pg_textsearch`` index: ``english`` with its
stemmer's stop-word list dropped (the embedded index keeps every word)."""
MAX_QUERY_CHARS = 4000
"""Characters of a query an extension ranker sees (the plain-SQL ranker bounds words)."""

_BODY_COLUMN = ("ALTER TABLE chunks ADD COLUMN IF NOT EXISTS bm25_body text GENERATED ALWAYS "
                "AS (title || E'\\n' || heading || E'\\n' || text) STORED")


class Ranker(Protocol):
    """Ranks the lexical list: ``(chunk key, score)``, best first, at most ``limit``;
    ``where``/``args`` are the filter's conditions on ``d`` (documents) and ``filtered``
    whether they select more than the enabled sources."""

    @property
    def name(self) -> str: ...

    def search(self, conn: Connection, query: str, limit: int, where: sql.Composable,
               args: list[object], *, filtered: bool) -> list[tuple[int, float]]: ...


@dataclass(frozen=True)
class SqlRanker:
    per_term: int = _pg_bm25.CANDIDATES_PER_TERM
    name: str = SQL_RANKER

    def search(self, conn: Connection, query: str, limit: int, where: sql.Composable,
               args: list[object], *, filtered: bool) -> list[tuple[int, float]]:
        with conn.transaction():
            # A term's best postings come in impact order from bm25_postings_impact. On a
            # table autovacuum has not analysed yet the planner read them all through a
            # bitmap and sorted them instead (5.4 ms a term against 0.3).
            conn.execute("SELECT set_config('enable_bitmapscan', 'off', true)")
            return _pg_bm25.text_search(conn, query, limit, where, args,
                                        filtered=filtered, per_term=self.per_term)


def _ordered(rows: Sequence[Sequence[object]]) -> list[tuple[int, float]]:
    hits = [(int(str(k)), float(str(s))) for k, s in rows]
    return sorted(hits, key=lambda h: (-h[1], h[0]))  # ties by key, as the other lists


@dataclass(frozen=True)
class TextsearchRanker:
    name: str = "pg_textsearch"

    def search(self, conn: Connection, query: str, limit: int, where: sql.Composable,
               args: list[object], *, filtered: bool) -> list[tuple[int, float]]:
        # <@> is a negated BM25 score (ascending order is best first); a chunk matching no
        # query term scores 0 and is not a hit. Unfiltered, the best chunks are taken on
        # chunks alone (the index's ordered scan) and joined after, with a margin for a
        # disabled source's chunks: joined in the same query, the planner scored every
        # chunk and sorted them (14 s at 100 000 chunks, against 3 ms for the scan).
        # The distance selected is the ORDER BY's own expression, bare and with its own
        # parameter (the same text): the parser keeps the two apart, the planner folds
        # both to one constant, and the extension's planner hook then reads the selected
        # one off the index scan (bm25_get_current_score) instead of scoring each row again
        # from its text (about 0.1 ms a row). No filter on the distance: a WHERE on it is
        # scored per row too; a row that matches nothing (only on a plan without the
        # index) is dropped here.
        text = query[:MAX_QUERY_CHARS]
        if not filtered:
            cut = limit + _pg_bm25.JOIN_MARGIN
            rows = conn.execute(_TEXTSEARCH_TOP.format(
                where=where, index=sql.Literal(TEXTSEARCH_INDEX)),
                                [text, text, cut, *args], prepare=False).fetchall()
            scored = sum(1 for _, d, _ in rows if float(str(d)) < 0)
            hits = _matched([(k, d) for k, d, passes in rows if passes])[:limit]
            if len(hits) >= limit or scored < cut:
                return hits
        distance = sql.SQL("c.bm25_body <@> to_bm25query(%s, {})").format(
            sql.Literal(TEXTSEARCH_INDEX))
        statement = sql.SQL(
            "SELECT c.key, {d} FROM chunks c JOIN documents d ON d.id = c.doc_id "
            "WHERE {where} ORDER BY {d} LIMIT %s").format(d=distance, where=where)
        return _matched(conn.execute(statement, [text, *args, text, limit],
                                     prepare=False).fetchall())


def _matched(rows: Sequence[Sequence[object]]) -> list[tuple[int, float]]:
    """``(key, <@> distance)`` rows as hits: the rows that matched a term (distance < 0),
    each with its BM25 score, best first."""
    return _ordered([(k, -float(str(d))) for k, d in rows if float(str(d)) < 0])


# The best chunks on the index alone, each with whether the filter passes it. The
# distance is selected bare (see TextsearchRanker.search), in a subquery rather than a
# CTE: the extension's hook reads the plan's tree, where a CTE's plan is not.
_TEXTSEARCH_TOP = sql.SQL(
    "SELECT c.key, c.distance, {where} FROM (SELECT key, bm25_body <@> to_bm25query(%s, "
    "{index}) AS distance FROM chunks ORDER BY bm25_body <@> to_bm25query(%s, {index}) "
    "LIMIT %s) c")


@dataclass(frozen=True)
class SearchRanker:
    name: str = "pg_search"

    def search(self, conn: Connection, query: str, limit: int, where: sql.Composable,
               args: list[object], *, filtered: bool) -> list[tuple[int, float]]:
        # ||| tokenizes the text as the index does and ORs its terms: no query syntax.
        # Unfiltered, the best chunks are taken on chunks alone (pg_search's top-N scan;
        # a join in the same query turns it into a scan of every match) and joined after,
        # with a margin for a disabled source's chunks; too few left reads them all.
        text = query[:MAX_QUERY_CHARS]
        with conn.transaction():
            # Serial: its parallel scan started two workers per query for a top 25 and
            # took 145 ms where the serial one took 82 (1400 chunks, loaded machine).
            conn.execute("SELECT set_config('max_parallel_workers_per_gather', '0', true)")
            return self._search(conn, text, limit, where, args, filtered=filtered)

    def _search(self, conn: Connection, text: str, limit: int, where: sql.Composable,
                args: list[object], *, filtered: bool) -> list[tuple[int, float]]:
        if not filtered:
            cut = limit + _pg_bm25.JOIN_MARGIN
            rows = conn.execute(_SEARCH_TOP.format(where=where),
                                [text, cut, *args, limit], prepare=False).fetchall()
            hits = _ordered([(k, s) for k, s, _ in rows if k is not None])
            scored = next((int(str(n)) for k, _, n in rows if k is None), 0)
            if len(hits) >= limit or scored < cut:
                return hits
        statement = sql.SQL(
            "SELECT c.key, pdb.score(c.key) FROM chunks c JOIN documents d ON "
            "d.id = c.doc_id WHERE c.bm25_body ||| %s AND {where} "
            "ORDER BY pdb.score(c.key) DESC LIMIT %s").format(where=where)
        return _ordered(conn.execute(statement, [text, *args, limit],
                                     prepare=False).fetchall())


_SEARCH_TOP = sql.SQL(
    "WITH top AS MATERIALIZED (SELECT key, doc_id, pdb.score(key) AS score FROM chunks "
    "WHERE bm25_body ||| %s ORDER BY pdb.score(key) DESC LIMIT %s) "
    "(SELECT c.key, c.score, NULL::bigint FROM top c JOIN documents d ON d.id = c.doc_id "
    "WHERE {where} ORDER BY c.score DESC LIMIT %s) "
    "UNION ALL SELECT NULL, NULL, count(*) FROM top")


def _exists(conn: Connection, relation: str) -> bool:
    return conn.execute("SELECT to_regclass(%s) IS NOT NULL", (relation,)).fetchone() == (True,)


def _body_column(conn: Connection) -> None:
    # Checked first: ALTER TABLE takes its exclusive lock on chunks before IF NOT EXISTS
    # is looked at, and every open of every node comes here.
    if conn.execute("SELECT 1 FROM pg_attribute WHERE attrelid = 'chunks'::regclass AND "
                    "attname = 'bm25_body' AND NOT attisdropped").fetchone() is None:
        conn.execute(_BODY_COLUMN)


def _textsearch_setup(conn: Connection) -> None:
    if _exists(conn, TEXTSEARCH_INDEX):
        return
    conn.execute("CREATE EXTENSION IF NOT EXISTS pg_textsearch")
    if conn.execute("SELECT 1 FROM pg_ts_config WHERE cfgname = %s",
                    (TEXT_CONFIG,)).fetchone() is None:
        conn.execute(sql.SQL("CREATE TEXT SEARCH DICTIONARY {} (TEMPLATE = snowball, "
                             "Language = english)").format(sql.Identifier(TEXT_CONFIG + "_stem")))
        conn.execute(sql.SQL("CREATE TEXT SEARCH CONFIGURATION {} (COPY = english)").format(
            sql.Identifier(TEXT_CONFIG)))
        conn.execute(sql.SQL("ALTER TEXT SEARCH CONFIGURATION {} ALTER MAPPING REPLACE "
                             "english_stem WITH {}").format(
            sql.Identifier(TEXT_CONFIG), sql.Identifier(TEXT_CONFIG + "_stem")))
    _body_column(conn)
    schema = conn.execute("SELECT current_schema()").fetchone()
    config = f"{schema[0] if schema else 'public'}.{TEXT_CONFIG}"
    conn.execute(sql.SQL("CREATE INDEX IF NOT EXISTS {} ON chunks USING bm25(bm25_body) "
                         "WITH (text_config = {}, k1 = {}, b = {})").format(
        sql.Identifier(TEXTSEARCH_INDEX), sql.Literal(config), sql.Literal(_pg_bm25.K1),
        sql.Literal(_pg_bm25.B)))


def _search_setup(conn: Connection) -> None:
    if _exists(conn, SEARCH_INDEX):
        return
    conn.execute("CREATE EXTENSION IF NOT EXISTS pg_search")
    _body_column(conn)
    conn.execute(sql.SQL(
        "CREATE INDEX IF NOT EXISTS {} ON chunks USING bm25(key, "
        "(bm25_body::pdb.simple('stemmer=english'))) WITH (key_field = 'key')").format(
        sql.Identifier(SEARCH_INDEX)))


_SETUP: dict[str, tuple[Callable[[Connection], None], Ranker]] = {
    "pg_textsearch": (_textsearch_setup, TextsearchRanker()),
    "pg_search": (_search_setup, SearchRanker()),
}


def choose(conn: Connection, target: str, wanted: str = AUTO, *,
           per_term: int = _pg_bm25.CANDIDATES_PER_TERM) -> Ranker:
    """The ranker to use, its extension and index set up (under the migration lock, so
    nodes opening together take turns). ``conn`` must not be inside a transaction.

    ``per_term`` bounds the postings ``bm25-sql`` reads per query term.

    Raises:
        ValueError: ``wanted`` is none of :data:`RANKERS`, or ``per_term`` < 1.
        StoreUnavailable: ``wanted`` names an extension this server or role cannot set
            up (says why); ``auto`` falls back to ``bm25-sql`` instead.
    """
    if wanted not in RANKERS:
        raise ValueError(f"lexical_ranker must be one of {', '.join(RANKERS)}, got "
                         f"{wanted!r}")
    if per_term < 1:
        raise ValueError(f"bm25_candidates_per_term must be >= 1, got {per_term}")
    if wanted == SQL_RANKER:
        return SqlRanker(per_term)
    installed = {str(r[0]) for r in conn.execute("SELECT extname FROM pg_extension")}
    available = {str(r[0]) for r in conn.execute(
        "SELECT name FROM pg_available_extensions WHERE name = ANY(%s)",
        (list(EXTENSIONS),))}
    for name in EXTENSIONS if wanted == AUTO else (wanted,):
        others = installed & (set(EXTENSIONS) - {name})
        why = ("the server does not offer it" if name not in available else
               f"{', '.join(sorted(others))} is installed in this database (both define "
               "the access method bm25)" if others else "")
        if not why:
            setup, ranker = _SETUP[name]
            try:
                with conn.transaction():
                    conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
                    setup(conn)
                return ranker
            except psycopg.Error as exc:
                why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if wanted != AUTO:
            raise StoreUnavailable(f"the lexical ranker {name} cannot be used on {target}: "
                                   f"{why}")
        if name in available:
            _log.warning("bm25 extension not used", store=target, extension=name,
                         reason=why)
    return SqlRanker(per_term)
