"""The two ranked lists of the PostgreSQL store, filters inside both queries.

Lexical list: BM25 in plain SQL, :mod:`retrieval.postgres._bm25` (this module gives it the
filter conditions). A BM25 extension (``pg_textsearch``, ParadeDB's ``pg_search``) the
server offers is detected at open (:func:`bm25_extension`) and reported.

Vector list: cosine distance ``<=>`` on the space's partial HNSW index
(:mod:`retrieval.postgres._schema`), with ``hnsw.ef_search`` and ``hnsw.iterative_scan =
strict_order`` set for the transaction only: with a filter, pgvector 0.8 keeps walking the
graph until ``limit`` rows pass it (up to ``hnsw.max_scan_tuples``) instead of filtering a
fixed top-k, so a selective filter still gets its nearest chunks, in exact order.

Filters (:class:`~retrieval.store._bm25.Filters`) are SQL conditions on the documents holding
the chunk's text in both queries (a text is stored once: :mod:`retrieval.postgres._entries`);
a disabled source's chunks are never returned.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from psycopg import sql

from ..store._bm25 import Filters
from ._connect import Connection
from ._entries import holders_where

BM25_EXTENSIONS = ("pg_search", "pg_textsearch")
"""BM25 extensions looked for, in order of preference."""

def bm25_extension(conn: Connection) -> str:
    """The first of :data:`BM25_EXTENSIONS` the server offers ("" when none)."""
    rows = conn.execute("SELECT name FROM pg_available_extensions WHERE name = ANY(%s)",
                        (list(BM25_EXTENSIONS),)).fetchall()
    found = {str(r[0]) for r in rows}
    return next((name for name in BM25_EXTENSIONS if name in found), "")


def filter_sql(filters: Filters) -> tuple[sql.Composable, list[object]]:
    """The WHERE conditions on ``d`` (documents) and their parameters: any of the values
    within a field, every field; a disabled source never passes."""
    where: list[sql.Composable] = [sql.SQL(
        "NOT EXISTS (SELECT 1 FROM sources s WHERE s.id = d.source_id AND s.disabled)")]
    args: list[object] = []
    for column, values in (("source_id", filters.sources), ("kind", filters.kinds),
                           ("category", filters.categories)):
        if values:
            where.append(sql.SQL("d.{} = ANY(%s)").format(sql.Identifier(column)))
            args.append(list(values))
    if filters.tags:
        where.append(sql.SQL("d.tags && %s::text[]"))
        args.append(list(filters.tags))
    for condition, value in (("d.indexed_at >= %s", filters.since),
                             ("d.indexed_at <= %s", filters.until),
                             ("d.document_date >= %s", filters.dated_since),
                             ("d.document_date <= %s", filters.dated_until)):
        if value is not None:
            where.append(sql.SQL(condition))
            args.append(value)
    if filters.doc_ids is not None:
        where.append(sql.SQL("d.id = ANY(%s)"))
        args.append(sorted(filters.doc_ids))
    return sql.SQL(" AND ").join(where), args


def vector_search(conn: Connection, space_id: int, dim: int, vector: Sequence[float],
                  *, filters: Filters, limit: int, ef_search: int,
                  max_scan_tuples: int) -> list[tuple[int, float]]:
    """The vector list: ``(chunk key, cosine distance)``, nearest first.

    Raises:
        ValueError: ``vector`` is not ``dim`` finite numbers.
    """
    values = np.asarray(vector, dtype=np.float32).reshape(-1)
    if values.shape != (dim,) or not np.isfinite(values).all():
        raise ValueError(f"the query vector must be {dim} finite numbers, got shape "
                         f"{values.shape}")
    cut = limit + VECTOR_JOIN_MARGIN
    with conn.transaction():
        conn.execute("SELECT set_config('hnsw.ef_search', %s, true), "
                     "set_config('hnsw.iterative_scan', 'strict_order', true), "
                     "set_config('hnsw.max_scan_tuples', %s, true)",
                     (str(max(ef_search, min(cut, 1000))), str(max_scan_tuples)))
        if filters == Filters():
            # Unfiltered, the nearest vectors are taken on the index alone and joined to
            # their holders after (a margin for a disabled source's): joined in the same
            # query, the planner's semi-join to the holders left the HNSW scan and
            # measured every vector (1.8 s at 100 000 chunks against 9 ms for the scan).
            top, top_args = vector_top_statement(space_id, dim)
            rows = conn.execute(top, [values.tolist(), cut, *top_args, limit],
                                prepare=False).fetchall()
            hits = [(int(k), float(d)) for k, d, _ in rows if k is not None]
            found = next((int(n) for k, _, n in rows if k is None), 0)
            if len(hits) >= limit or found < cut:
                return hits
        statement, args = vector_statement(space_id, dim, filters)
        rows = conn.execute(statement, [values.tolist(), *args, limit],
                            prepare=False).fetchall()
    return [(int(key), float(distance)) for key, distance in rows]


VECTOR_JOIN_MARGIN = 64
"""Nearest vectors taken beyond the ``limit`` asked for, unfiltered, before they are joined
to their holders (a disabled source's are dropped there)."""


def _vector_parts(dim: int, filters: Filters
                  ) -> tuple[sql.Composable, sql.Composable, list[object]]:
    """The vector cast of ``dim`` and the filter as a condition on the entry ``c`` (a
    text's vector is its entry's; a holder passes) with its parameters."""
    where, args = filter_sql(filters)
    return sql.SQL("::vector({})").format(sql.Literal(dim)), holders_where(where), args


def vector_top_statement(space_id: int, dim: int) -> tuple[sql.Composed, list[object]]:
    """The unfiltered vector list: the nearest ``cut`` vectors of the space on its HNSW
    index alone (materialized), then those some holder in an enabled source holds,
    nearest first, and one row more, ``(NULL, NULL, n)``: how many the scan gave.
    Parameters: the query vector, ``cut``, the returned arguments, the limit."""
    cast, where, args = _vector_parts(dim, Filters())
    return sql.SQL(
        "WITH q AS (SELECT %s::float4[]{cast} AS v), top AS MATERIALIZED ("
        "SELECT v.chunk_key, v.embedding{cast} <=> q.v AS distance FROM q, chunk_vectors v "
        "WHERE v.space_id = {space} ORDER BY v.embedding{cast} <=> q.v LIMIT %s) "
        "(SELECT t.chunk_key, t.distance, NULL::bigint FROM top t "
        "JOIN chunks c ON c.key = t.chunk_key WHERE {where} ORDER BY t.distance LIMIT %s) "
        "UNION ALL SELECT NULL, NULL, count(*) FROM top").format(
            cast=cast, space=sql.Literal(space_id), where=where), args


def vector_statement(space_id: int, dim: int,
                     filters: Filters) -> tuple[sql.Composed, list[object]]:
    """The vector list's query and its filter parameters: the query vector (a list of
    floats) comes before them and the limit after. The space and dimension are literals,
    so the statement matches the space's partial HNSW index in any plan."""
    cast, where, args = _vector_parts(dim, filters)
    return sql.SQL(
        "SELECT v.chunk_key, v.embedding{cast} <=> q.v AS distance "
        "FROM (SELECT %s::float4[]{cast} AS v) q, chunk_vectors v "
        "JOIN chunks c ON c.key = v.chunk_key JOIN documents d ON d.id = c.doc_id "
        "WHERE v.space_id = {space} AND {where} "
        "ORDER BY v.embedding{cast} <=> q.v LIMIT %s").format(
            cast=cast, space=sql.Literal(space_id), where=where), args
