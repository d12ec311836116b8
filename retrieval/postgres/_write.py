"""A batch of document replacements in a few statements (the PostgreSQL store's ingest).

The group committer hands :meth:`~retrieval.postgres._store.PostgresStore.replace_documents`
up to ``ingest_workers`` documents at once; each used to cost about ten statements (its
row, its held version, its old chunks' vectors, terms and rows, its new chunks, one
statement per vector), so a batch was a thousand round trips. Here a batch is one
statement per step for all its documents:

====================  =====================================================================
step                  statement(s), for every document of the round at once
====================  =====================================================================
documents             one pipelined ``executemany`` of the upsert (a row's arrays of tags
                      do not pass through ``unnest``)
held versions         one ``DELETE ... WHERE doc_id = ANY``
old chunks            one ``SELECT``; only when some exist: their vectors kept by hash, their
                      BM25 rows and then the chunks deleted (three statements)
new chunks            one ``INSERT ... SELECT FROM unnest(...) RETURNING key, chunk_id``
vectors               one binary ``COPY`` (:func:`copy_vectors`)
====================  =====================================================================

The BM25 rows of the whole batch follow (:func:`~retrieval.postgres._bm25.write_terms`:
one ``COPY`` per table, so each statistics trigger runs once per batch). A document listed
twice in a batch is replaced twice, in order: the batch is cut into rounds in which every
document appears once (:func:`rounds`).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence

import numpy as np

from ..errors import InvalidDocument
from ..store._rows import ChunkRow, DocumentRow, Replacement, StoredChunk
from ._bm25 import delete_terms
from ._connect import Connection
from ._rows import DOCUMENT_UPSERT, document_args
from ._vectors import Space

Item = tuple[DocumentRow, Sequence[ChunkRow]]

COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
"""PostgreSQL's binary COPY signature, flags and (empty) header extension."""
COPY_TRAILER = struct.pack(">h", -1)


def rounds(items: Sequence[Item]) -> Iterator[list[Item]]:
    """``items`` in order, cut where a document comes again (each round lists a document
    once, so its statements can address every document of the round by id)."""
    current: list[Item] = []
    seen: set[str] = set()
    for item in items:
        if item[0].id in seen:
            yield current
            current, seen = [], set()
        current.append(item)
        seen.add(item[0].id)
    if current:
        yield current


def replace_round(conn: Connection, items: Sequence[Item], *, spaces: Sequence[Space],
                  given: dict[int, dict[str, np.ndarray]]) -> list[Replacement]:
    """Make each document's chunks its given ones (each document once in ``items``; the
    caller holds their locks, in its transaction): one :class:`Replacement` per item.

    ``given`` maps a space's id to the vectors by content hash that the new chunks take;
    a chunk whose hash is not given keeps the vector its text had in its document's
    previous version.

    Raises:
        InvalidDocument: a vector of the wrong dimension, or not finite (raised inside
            the transaction: the caller's rollback keeps every previous version).
    """
    ids = [doc.id for doc, _ in items]
    with conn.cursor() as cur:
        cur.executemany(DOCUMENT_UPSERT, [document_args(doc) for doc, _ in items])
    # A version indexed now supersedes one held for review (an approval indexes it).
    conn.execute("DELETE FROM held_documents WHERE doc_id = ANY(%s)", (ids,))
    results = {doc.id: Replacement() for doc, _ in items}
    kept = _remove_old(conn, ids, spaces, results)
    rows = _insert_chunks(conn, items)
    # A text's vector is its entry's (retrieval.postgres._entries): written once, for an
    # entry that has none yet.
    has = set(conn.execute(
        "SELECT chunk_key, space_id FROM chunk_vectors WHERE chunk_key = ANY(%s)",
        ([entry for _, entry in rows.values()],)).fetchall()) if spaces and rows else set()
    pending: dict[Space, tuple[list[int], list[np.ndarray]]] = {}
    for doc, chunks in items:
        result = results[doc.id]
        for c in chunks:
            key, entry = rows[c.chunk_id]
            result.added.append(StoredChunk(
                key, c.chunk_id, doc.id, c.ordinal, c.heading, c.text, c.content_hash,
                doc.title, doc.source_id, doc.path, doc.kind, doc.category, doc.tags,
                doc.indexed_at, doc.mtime_ns, doc.document_date))
            for space in spaces:
                if (entry, space.id) in has:
                    continue
                vector = given[space.id].get(c.content_hash)
                if vector is None:
                    vector = kept.get((doc.id, space.id, c.content_hash))
                if vector is None:
                    continue
                values = np.asarray(vector, dtype=np.float32).reshape(-1)
                if values.shape != (space.dim,):
                    raise InvalidDocument(
                        f"document {doc.id!r}: the vector of chunk {c.chunk_id} has "
                        f"{values.size} dimensions; the corpus's embedding model has "
                        f"{space.dim}")
                if not np.isfinite(values).all():
                    raise InvalidDocument(f"document {doc.id!r}: the vector of chunk "
                                          f"{c.chunk_id} is not finite")
                keys, vectors = pending.setdefault(space, ([], []))
                keys.append(entry)
                vectors.append(values)
                has.add((entry, space.id))
    copy_vectors(conn, pending)
    return [results[doc_id] for doc_id in ids]


def _remove_old(conn: Connection, ids: list[str], spaces: Sequence[Space],
                results: dict[str, Replacement]) -> dict[tuple[str, int, str], np.ndarray]:
    """Delete the documents' current chunks (their BM25 rows first, one statement per
    table); return their vectors by ``(document, space id, content hash)``."""
    old = conn.execute("SELECT key, doc_id FROM chunks WHERE doc_id = ANY(%s) ORDER BY key",
                       (ids,)).fetchall()
    if not old:
        return {}
    keys = [int(key) for key, _ in old]
    kept: dict[tuple[str, int, str], np.ndarray] = {}
    if spaces:
        for doc_id, space, content_hash, vector in conn.execute(
                "SELECT c.doc_id, v.space_id, c.content_hash, v.embedding::float4[] "
                "FROM chunks c JOIN chunk_vectors v ON v.chunk_key = c.entry "
                "WHERE c.key = ANY(%s) AND v.space_id = ANY(%s)",
                (keys, [s.id for s in spaces])):
            kept[(str(doc_id), int(space), str(content_hash))] = np.asarray(
                vector, dtype=np.float32)
    delete_terms(conn, keys)
    for key, doc_id in conn.execute("DELETE FROM chunks WHERE key = ANY(%s) "
                                    "RETURNING key, doc_id", (keys,)):
        results[str(doc_id)].removed.append(int(key))
    return kept


def _insert_chunks(conn: Connection, items: Sequence[Item]) -> dict[str, tuple[int, int]]:
    """Insert every document's new chunks in one statement; chunk id -> (key, the key
    of its text's entry: its own when it is the first holder)."""
    columns: tuple[list[object], ...] = ([], [], [], [], [], [], [])
    for doc, chunks in items:
        for c in chunks:
            for column, value in zip(columns, (doc.id, doc.title, c.chunk_id, c.ordinal,
                                               c.heading, c.text, c.content_hash),
                                     strict=True):
                column.append(value)
    if not columns[0]:
        return {}
    # Keys are assigned in the order given (WITH ORDINALITY), as one statement per
    # document assigned them.
    rows = conn.execute(
        "INSERT INTO chunks(chunk_id, doc_id, ordinal, title, heading, text, content_hash) "
        "SELECT u.chunk_id, u.doc_id, u.ordinal, u.title, u.heading, u.text, u.hash "
        "FROM unnest(%s::text[], %s::text[], %s::text[], %s::int[], %s::text[], %s::text[], "
        "%s::text[]) WITH ORDINALITY AS u(doc_id, title, chunk_id, ordinal, heading, text, "
        "hash, n) ORDER BY u.n RETURNING key, chunk_id, entry", columns).fetchall()
    return {str(chunk_id): (int(key), int(entry)) for key, chunk_id, entry in rows}


def copy_vectors(conn: Connection, pending: dict[Space, tuple[list[int], list[np.ndarray]]]
                 ) -> int:
    """Write ``{space: (chunk keys, vectors)}`` to ``chunk_vectors`` with one binary
    ``COPY`` (each vector checked by the caller: the space's dimension, finite); return
    how many rows."""
    parts = [COPY_HEADER]
    count = 0
    for space, (keys, vectors) in pending.items():
        if keys:
            parts.append(_copy_rows(space, keys, np.stack(vectors)))
            count += len(keys)
    if not count:
        return 0
    parts.append(COPY_TRAILER)
    with conn.cursor() as cur, cur.copy(
            "COPY chunk_vectors(chunk_key, space_id, dim, embedding) FROM STDIN "
            "WITH (FORMAT BINARY)") as copy:
        copy.write(b"".join(parts))
    return count


def _copy_rows(space: Space, keys: list[int], vectors: np.ndarray) -> bytes:
    """Binary COPY tuples ``(chunk_key bigint, space_id int, dim int, embedding vector)``.

    A field is its byte length and its value in network order; pgvector's binary
    ``vector`` is its dimension (int16), an unused int16, then the float4s."""
    dim = space.dim
    layout = np.dtype([("fields", ">i2"), ("key_len", ">i4"), ("key", ">i8"),
                       ("space_len", ">i4"), ("space", ">i4"), ("dim_len", ">i4"),
                       ("dim", ">i4"), ("vec_len", ">i4"), ("vec_dim", ">i2"),
                       ("unused", ">i2"), ("vec", ">f4", (dim,))])
    rows = np.zeros(len(keys), dtype=layout)
    rows["fields"] = 4
    rows["key_len"], rows["key"] = 8, keys
    rows["space_len"], rows["space"] = 4, space.id
    rows["dim_len"], rows["dim"] = 4, dim
    rows["vec_len"], rows["vec_dim"] = 4 + 4 * dim, dim
    rows["vec"] = vectors
    return rows.tobytes()
