"""The PostgreSQL + pgvector store: the shared knowledge base of several nodes (issue 17).

One transactional store is both the truth and the index: chunks, their BM25 terms and
statistics (:mod:`retrieval.postgres._bm25`), their vectors (pgvector, an HNSW index per
embedding model and dimension) and the documents' metadata for filters live in the same
database, so a document's replacement (old chunks and vectors out, new ones in) is one
transaction and an acknowledged write is durable by Postgres's own guarantees. There is
nothing to reconcile at open, unlike the embedded store (:mod:`retrieval.store._indexes`).

Sync psycopg 3, not asyncio: the embedded :class:`~retrieval.store._metadata.Store` is a sync object
that :mod:`retrieval.store._indexes` and :mod:`retrieval.search._search` call from worker threads
(``asyncio.to_thread``); this one keeps that contract, method for method where the
concepts match, so wiring it is a swap behind a store interface rather than a second
calling convention. Each call takes a connection of its own from a small pool
(:class:`~retrieval.postgres._connect.Pool`): concurrent searches run in parallel on the server.
Cancelling the awaiting coroutine does not stop a statement already sent; the server's
``statement_timeout`` bounds it.

Several nodes may share the database: the schema is migrated under an advisory lock
(:mod:`retrieval.postgres._schema`), one node at a time scans a source
(:class:`~retrieval.postgres._locks.ScanLocks`), and the corpus records its embedding model:
a node embedding with another model is refused
(:class:`~retrieval.errors.EmbeddingModelMismatch`) rather than mixing vector spaces.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Self

import numpy as np
import psycopg
import structlog

from ..errors import (
    EmbeddingModelMismatch,
    StoreUnavailable,
)
from ..store._bm25 import Filters
from ..store._rows import ChunkRow, DocumentRow, Replacement, SourceRow, StoredChunk
from ._bm25 import delete_terms, fill_missing
from ._connect import (
    Connection,
    PgOptions,
    Pool,
    connect,
    describe,
    first_line,
    translated,
)
from ._entries import holders_where, lock_texts, lock_texts_of, resolve, write_entries
from ._history import PgHistory
from ._locks import ScanLocks, document_lock_key
from ._rankers import Ranker, choose
from ._review import PgReview
from ._rows import (
    CHUNK_SELECT,
    DOCUMENT_SELECT,
    SOURCE_SELECT,
    chunk_row,
    document_row,
    source_row,
)
from ._schema import (
    SCHEMA_VERSION,
    ensure_vector_extension,
    ensure_vector_space,
    migrate,
    model_mismatch,
)
from ._search import bm25_extension, filter_sql, vector_search
from ._vectors import PgVectors, locked_spaces
from ._write import replace_round, rounds

_log = structlog.get_logger("llamad.retrieval")

CACHED_VECTORS = (
    "SELECT h.hash, v.embedding::float4[] "
    "FROM unnest(%s::text[]) AS h(hash) CROSS JOIN LATERAL ("
    " SELECT v.embedding FROM chunks c JOIN chunk_vectors v ON v.chunk_key = c.key"
    " AND v.space_id = ANY(ARRAY(SELECT id FROM vector_spaces WHERE model = %s))"
    " WHERE c.content_hash = h.hash LIMIT 1) v")
"""The stored vector of each content hash (``hashes``, ``model``): one ``chunks_hash``
probe a hash (:meth:`PostgresStore.cached_vectors`)."""


@dataclass(frozen=True)
class PgInfo:
    """What the store runs on, for Status."""

    target: str                 # user@host:port/db, never a password
    server_version: str
    pgvector_version: str
    schema_version: int
    lexical_ranking: str        # the lexical ranker in use (_pg_rankers: "bm25-sql", ...)
    bm25_extension: str         # a BM25 extension the server offers ("" none)
    corpus_model: str           # the corpus's embedding model ("" none yet)
    corpus_dim: int
    switch_model: str = ""      # the model the corpus is being switched to ("" none)


class PostgresStore(PgVectors, PgReview, PgHistory):
    """The PostgreSQL store; open with :meth:`open`. Thread-safe (one pooled connection
    per call). Vector spaces over time (the backfill, a switch of embedding model) are
    :class:`~retrieval.postgres._vectors.PgVectors`'s, versions held for review
    :class:`~retrieval.postgres._review.PgReview`'s, history retention's
    :class:`~retrieval.postgres._history.PgHistory`'s."""

    def __init__(self, options: PgOptions, pool: Pool, locks: ScanLocks, info: PgInfo,
                 ranker: Ranker) -> None:
        self.options = options
        self._ranker = ranker
        self.target = info.target
        self._pool = pool
        self._locks = locks
        self._info = info

    # -- life cycle --------------------------------------------------------------------

    @classmethod
    def open(cls, options: PgOptions) -> Self:
        """Connect, check pgvector, create or migrate the schema, detect BM25 extensions.

        Raises:
            StoreUnavailable: a bad DSN, an unreachable server, a refused login, no
                pgvector (each message names the server, never the password).
            SchemaTooNew: the database was migrated by a newer llamad.
        """
        target = describe(options.dsn)
        conn = connect(options)
        try:
            # This connection is the open's own: migrations, the BM25 fill and a lexical
            # extension's set-up (a rewrite of chunks, then an index over every chunk)
            # are whole-corpus work, minutes at a million chunks, and a node opening
            # beside another waits for its migration lock that long. The statement
            # timeout bounds searches and writes, not this (an open cut at 30 s would
            # roll back and start over at every open, never done).
            conn.execute("SET statement_timeout = 0")
            vector_version = ensure_vector_extension(conn, target)
            applied = migrate(conn, target)
            filled = fill_missing(conn)  # chunks written before schema version 4
            ranker = choose(conn, target, options.lexical_ranker,
                            per_term=options.bm25_candidates_per_term)
            row = conn.execute("SHOW server_version").fetchone()
            info = PgInfo(target, str(row[0]) if row else "", vector_version, SCHEMA_VERSION,
                          ranker.name, bm25_extension(conn), "", 0)
        except psycopg.Error as exc:
            raise StoreUnavailable(f"PostgreSQL store {target}: "
                                   f"{first_line(exc)}") from None
        finally:
            conn.close()
        _log.info("postgres store open", store=target, schema_version=SCHEMA_VERSION,
                  migrated=applied, bm25_filled=filled, pgvector=vector_version,
                  lexical_ranking=info.lexical_ranking,
                  bm25_extension=info.bm25_extension or "none")
        return cls(options, Pool(options), ScanLocks(options), info, ranker)

    def close(self) -> None:
        """Release the scan locks and close every connection."""
        self._locks.close()
        self._pool.close()

    @contextlib.contextmanager
    def _conn(self) -> Iterator[Connection]:
        """A pooled connection; psycopg errors come out as retrieval errors."""
        with translated(self.target), self._pool.connection() as conn:
            yield conn

    def info(self) -> PgInfo:
        """Where the store runs and how it ranks (the corpus model, and a switch of it
        under way, read now)."""
        corpus, switch = self.spaces()
        return PgInfo(self._info.target, self._info.server_version,
                      self._info.pgvector_version, self._info.schema_version,
                      self._info.lexical_ranking, self._info.bm25_extension,
                      corpus.model if corpus else "", corpus.dim if corpus else 0,
                      switch.model if switch else "")

    # -- sources -----------------------------------------------------------------------

    def upsert_source(self, source: SourceRow) -> None:
        with self._conn() as conn:
            conn.execute(
                "INSERT INTO sources(id, kind, root, category, tags, created_at, "
                "review_required, max_age_days, max_items, exclude) "
                "VALUES (%s, %s, %s, %s, %s, coalesce(%s, extract(epoch FROM now())::bigint), "
                "%s, %s, %s, %s) "
                "ON CONFLICT (id) DO UPDATE SET kind = excluded.kind, root = excluded.root, "
                "category = excluded.category, tags = excluded.tags, "
                "review_required = excluded.review_required, "
                "max_age_days = excluded.max_age_days, max_items = excluded.max_items, "
                "exclude = excluded.exclude",
                (source.id, source.kind, source.root, source.category, list(source.tags),
                 source.created_at or None, source.review_required,
                 source.max_age_days, source.max_items, list(source.exclude)))

    def source(self, source_id: str) -> SourceRow | None:
        with self._conn() as conn:
            row = conn.execute(SOURCE_SELECT + " WHERE id = %s", (source_id,)).fetchone()
        return None if row is None else source_row(row)

    def sources(self) -> list[SourceRow]:
        with self._conn() as conn:
            return [source_row(r) for r in conn.execute(SOURCE_SELECT + " ORDER BY id")]

    def set_source_disabled(self, source_id: str, disabled: bool) -> bool:
        """Disable or enable a source; False when there is no such source."""
        with self._conn() as conn:
            return conn.execute("UPDATE sources SET disabled = %s WHERE id = %s",
                                (disabled, source_id)).rowcount > 0

    def mark_scanned(self, source_id: str, error: str = "", excluded: int | None = None,
                     ) -> None:
        with self._conn() as conn:
            conn.execute("UPDATE sources SET last_scan = extract(epoch FROM now())::bigint, "
                         "last_error = %s, excluded = coalesce(%s, excluded) WHERE id = %s",
                         (error, excluded, source_id))

    def delete_source(self, source_id: str) -> list[int]:
        """Delete a source, its documents, chunks and vectors (one transaction); return
        the removed chunk keys."""
        with self._conn() as conn, conn.transaction():
            keys = [int(r[0]) for r in conn.execute(
                "SELECT c.key FROM chunks c JOIN documents d ON d.id = c.doc_id "
                "WHERE d.source_id = %s", (source_id,))]
            lock_texts_of(conn, "d.source_id = %s", (source_id,))
            delete_terms(conn, keys)
            conn.execute("DELETE FROM sources WHERE id = %s", (source_id,))
            write_entries(conn, [])  # its texts other documents hold stay, once
        return keys

    # -- documents ---------------------------------------------------------------------

    def document(self, doc_id: str) -> DocumentRow | None:
        with self._conn() as conn:
            row = conn.execute(DOCUMENT_SELECT + " WHERE id = %s", (doc_id,)).fetchone()
        return None if row is None else document_row(row)

    def documents(self, source_id: str | None = None) -> list[DocumentRow]:
        with self._conn() as conn:
            if source_id is None:
                rows = conn.execute(DOCUMENT_SELECT + " ORDER BY id").fetchall()
            else:
                rows = conn.execute(DOCUMENT_SELECT + " WHERE source_id = %s ORDER BY id",
                                    (source_id,)).fetchall()
        return [document_row(r) for r in rows]

    def document_counts(self, leaving_out: Sequence[str] = ()) -> dict[str, int]:
        """Documents per source id, but for those of ``leaving_out`` (sources without any
        left out), counted by the server in one statement."""
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT source_id, COUNT(*) FROM documents WHERE NOT (id = ANY(%s)) "
                "GROUP BY source_id", (list(leaving_out),)).fetchall()
        return {str(source): int(n) for source, n in rows}

    def set_state(self, doc: DocumentRow, state: str, error: str = "") -> None:
        """Record a document's pipeline state (creating the row if needed), chunks kept."""
        with self._conn() as conn:
            conn.execute(
                "INSERT INTO documents(id, source_id, path, title, kind, category, tags, "
                "content_hash, mtime_ns, size, state, error) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, '', %s, %s, %s, %s) "
                "ON CONFLICT (id) DO UPDATE SET state = excluded.state, error = excluded.error",
                (doc.id, doc.source_id, doc.path, doc.title, doc.kind, doc.category,
                 list(doc.tags), doc.mtime_ns, doc.size, state, error))

    def replace_document(self, doc: DocumentRow, chunks: Sequence[ChunkRow],
                         vectors: Sequence[tuple[str, dict[str, np.ndarray]]] = ()
                         ) -> Replacement:
        """Atomically make ``chunks`` the document's chunks and mark it indexed."""
        return self.replace_documents([(doc, chunks)], vectors)[0]

    def replace_documents(
        self,
        items: Sequence[tuple[DocumentRow, Sequence[ChunkRow]]],
        vectors: Sequence[tuple[str, dict[str, np.ndarray]]] = (),
    ) -> list[Replacement]:
        """Replace several documents' chunks and their vectors (in order), all in one
        transaction: when it returns, Postgres has committed every document (the
        acknowledgement point); when it raises, none of them changed.

        ``vectors`` are ``(model, {content hash: vector})``: every vector the new chunks
        should have, cached ones included (a chunk whose hash is not given keeps the
        vector its text had in the document's previous version). The model must be the
        corpus's (:meth:`use_embedding_model`) or the one it is being switched to
        (:meth:`request_switch`).

        Raises:
            EmbeddingModelMismatch: vectors of a model other than the corpus's.
            InvalidDocument: a vector of the wrong dimension, or not finite; a document
                of an unknown source (nothing written).
            StoreUnavailable: the server was lost (the transaction did not commit).
        """
        models = {model for model, vecs in vectors if vecs}
        with self._conn() as conn, conn.transaction():
            # FOR SHARE: the corpus's model, and a switch under way, cannot change under
            # this transaction (a switch's last step waits for it, and sees its chunks).
            corpus, switch = locked_spaces(conn, "share")
            spaces = [s for s in (corpus, switch) if s is not None]
            if models - {s.model for s in spaces}:
                raise self._mismatch(", ".join(sorted(models - {s.model for s in spaces})),
                                     None if corpus is None else (corpus.model, corpus.dim))
            # One statement takes every document's lock, in key order (as every writer).
            conn.execute("SELECT pg_advisory_xact_lock(k) FROM unnest(%s::bigint[]) AS k",
                         (sorted({document_lock_key(doc.id) for doc, _ in items}),))
            # Then their texts', old and new (a text held once: retrieval.postgres._entries).
            lock_texts(conn, [c.content_hash for _, chunks in items for c in chunks]
                       + [str(r[0]) for r in conn.execute(
                           "SELECT content_hash FROM chunks WHERE doc_id = ANY(%s)",
                           ([doc.id for doc, _ in items],))])
            given: dict[int, dict[str, np.ndarray]] = {s.id: {} for s in spaces}
            for model, vecs in vectors:
                for space in spaces:
                    if space.model == model:
                        given[space.id].update(vecs)
            results = [result for part in rounds(items) for result in replace_round(
                conn, part, spaces=spaces, given=given)]
            # The BM25 rows of every document at once: one write per table, so one run
            # of each statistics trigger for the whole batch. A document listed twice
            # replaced its first chunks here already (keys are never reused).
            gone = {k for r in results for k in r.removed}
            write_entries(conn, [(c.key, c.title, c.heading, c.text) for r in results
                                 for c in r.added if c.key not in gone])
            return results

    def delete_document(self, doc_id: str) -> list[int] | None:
        """Delete a document with its chunks and vectors; return its chunk keys, or None
        if it did not exist."""
        with self._conn() as conn, conn.transaction():
            if conn.execute("SELECT 1 FROM documents WHERE id = %s FOR UPDATE",
                            (doc_id,)).fetchone() is None:
                return None
            keys = [int(r[0]) for r in conn.execute(
                "SELECT key FROM chunks WHERE doc_id = %s", (doc_id,))]
            lock_texts_of(conn, "c.doc_id = %s", (doc_id,))
            conn.execute("DELETE FROM documents WHERE id = %s", (doc_id,))
            write_entries(conn, [])
        return keys

    # -- chunks ------------------------------------------------------------------------

    def chunks_by_keys(self, keys: Iterable[int]) -> dict[int, StoredChunk]:
        with self._conn() as conn:
            rows = conn.execute(CHUNK_SELECT + " WHERE c.key = ANY(%s)",
                                (list(keys),)).fetchall()
        return {int(r[0]): chunk_row(r) for r in rows}

    def copies_of(self, hashes: Sequence[str], limit: int) -> dict[str, list[StoredChunk]]:
        with self._conn() as conn:
            # A disabled source's holders are never named (no search admits them).
            return {h: [chunk_row(r) for r in conn.execute(
                CHUNK_SELECT + " WHERE c.content_hash = %s AND NOT EXISTS (SELECT 1 FROM "  # noqa: S608 - fixed clauses, placeholders
                "sources s WHERE s.id = d.source_id AND s.disabled) ORDER BY c.doc_id "
                "LIMIT %s", (h, limit)).fetchall()] for h in dict.fromkeys(hashes)}

    def chunk_count(self) -> int:
        with self._conn() as conn:
            row = conn.execute("SELECT count(*) FROM chunks").fetchone()
        return int(row[0]) if row else 0

    def document_chunk_keys(self, doc_id: str) -> set[int]:
        with self._conn() as conn:
            return {int(r[0]) for r in conn.execute(
                "SELECT key FROM chunks WHERE doc_id = %s", (doc_id,))}

    # -- the embedding model -----------------------------------------------------------

    def corpus_model(self) -> tuple[str, int] | None:
        """The corpus's embedding model and dimension; None before the first."""
        with self._conn() as conn:
            row = conn.execute("SELECT s.model, s.dim FROM corpus_model c JOIN vector_spaces "
                               "s ON s.id = c.space_id").fetchone()
        return None if row is None else (str(row[0]), int(row[1]))

    def use_embedding_model(self, model: str, dim: int) -> int:
        """Check this node's embedding model against the corpus's; the first node to ask
        sets it (its HNSW index created then). Returns the vector space id.

        Raises:
            EmbeddingModelMismatch: the corpus is embedded with another model or
                dimension (both named); nothing is changed.
            ValueError: ``dim`` cannot be indexed by HNSW (above 2000).
        """
        with self._conn() as conn:
            space = ensure_vector_space(conn, model, dim)
            with conn.transaction():
                conn.execute("INSERT INTO corpus_model(space_id) VALUES (%s) "
                             "ON CONFLICT (one) DO NOTHING", (space,))
                row = conn.execute("SELECT s.id, s.model, s.dim FROM corpus_model c JOIN "
                                   "vector_spaces s ON s.id = c.space_id").fetchone()
        if row is None or int(row[0]) != space:
            raise self._mismatch(f"{model} ({dim} dimensions)",
                                 None if row is None else (str(row[1]), int(row[2])))
        return space

    def _mismatch(self, node: str, corpus: tuple[str, int] | None) -> EmbeddingModelMismatch:
        return model_mismatch(self.target, node, corpus)

    def cached_vectors(self, model: str, hashes: Iterable[str]) -> dict[str, np.ndarray]:
        """Vectors of ``model`` already stored for chunks of these texts (by hash).

        Ingest asks this once a document, so it must cost the same at any corpus size.
        The statement is driven by the hashes (one ``chunks_hash`` probe each, then the
        vector's key), and runs unprepared: a join of the three tables planned by cost
        chose, on a corpus not yet analysed (a new database filling up), to read every
        vector of the space and look each one's chunk up, 2.4-3 ms a call at 3,000
        chunks and growing with the corpus (bench/RESULTS.md, "PostgreSQL ingest:
        a lookup that grew with the corpus"); a prepared statement's cached plan would
        keep such a plan after the tables have grown."""
        wanted = sorted(set(hashes))
        if not wanted:
            return {}
        with self._conn() as conn:
            rows = conn.execute(CACHED_VECTORS, (wanted, model), prepare=False).fetchall()
        return {str(h): np.asarray(v, dtype=np.float32) for h, v in rows}

    # -- search ------------------------------------------------------------------------

    def text_search(self, query: str, *, filters: Filters, limit: int
                    ) -> list[tuple[int, float]]:
        """The lexical ranked list (BM25, by the ranker chosen at open:
        :mod:`retrieval.postgres._rankers`), filters applied in the query: ``(key, score)``."""
        where, args = filter_sql(filters)
        with self._conn() as conn:
            # The ranker ranks entries a holder of which passes; each shown under one.
            return resolve(conn, self._ranker.search(
                conn, query, limit, holders_where(where), args,
                filtered=filters != Filters()), where, args)

    def vector_search(self, model: str, vector: np.ndarray, *, filters: Filters,
                      limit: int) -> list[tuple[int, float]]:
        """The vector ranked list of ``model``'s space, filters applied in the query:
        ``(key, cosine distance)``, nearest first.

        Raises:
            EmbeddingModelMismatch: ``model`` is not the corpus's.
            ValueError: ``vector`` has the wrong dimension or is not finite.
        """
        with self._conn() as conn:
            row = conn.execute("SELECT s.id, s.model, s.dim FROM corpus_model c JOIN "
                               "vector_spaces s ON s.id = c.space_id").fetchone()
            if row is None or str(row[1]) != model:
                raise self._mismatch(model, None if row is None else (str(row[1]),
                                                                      int(row[2])))
            where, args = filter_sql(filters)
            return resolve(conn, vector_search(
                conn, int(row[0]), int(row[2]), vector.tolist(), filters=filters,
                limit=limit, ef_search=self.options.ef_search,
                max_scan_tuples=self.options.max_scan_tuples), where, args)

    # -- status ------------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        """As the embedded store's: sources, chunks, ``documents_<state>``."""
        with self._conn() as conn:
            docs = {str(s): int(n) for s, n in conn.execute(
                "SELECT state, count(*) FROM documents GROUP BY state")}
            row = conn.execute("SELECT (SELECT count(*) FROM chunks), "
                               "(SELECT count(*) FROM sources)").fetchone()
        chunks, sources = (int(row[0]), int(row[1])) if row else (0, 0)
        return {"sources": sources, "chunks": chunks,
                **{f"documents_{k}": v for k, v in docs.items()}}

    def embedded_chunks(self, model: str) -> int:
        """Chunks whose text has a vector of ``model`` (held by its entry)."""
        with self._conn() as conn:
            row = conn.execute("SELECT count(*) FROM chunks c JOIN chunk_vectors v ON "
                               "v.chunk_key = c.entry JOIN vector_spaces s ON s.id = "
                               "v.space_id WHERE s.model = %s", (model,)).fetchone()
        return int(row[0]) if row else 0

    def sizes(self, exact_below: int = 50_000) -> tuple[int, int]:
        """``(chunks, the corpus model's vectors)``, cheaply: counted when the server's
        statistics say fewer than ``exact_below`` rows (a count that costs milliseconds),
        else those statistics' live rows (``pg_stat_user_tables.n_live_tup``: every
        node's committed inserts and deletes, reported within about 10 s; reset by a
        crash of the server until autovacuum analyzes). Vectors of every model are counted
        there, so past ``exact_below`` they are capped at the chunks (a switch of model
        under way shows the chunks)."""
        with self._conn() as conn:
            row = conn.execute(
                "SELECT (SELECT n_live_tup FROM pg_stat_user_tables WHERE relid = "
                "'chunks'::regclass), (SELECT n_live_tup FROM pg_stat_user_tables WHERE "
                "relid = 'chunk_vectors'::regclass)").fetchone()
            chunks, vectors = (int(row[0] or 0), int(row[1] or 0)) if row else (0, 0)
            if chunks < exact_below:
                counted = conn.execute("SELECT count(*) FROM chunks").fetchone()
                chunks = int(counted[0]) if counted else 0
            if vectors >= exact_below:
                return chunks, min(vectors, chunks)
            counted = conn.execute(
                "SELECT count(*) FROM chunk_vectors v JOIN corpus_model c "
                "ON c.space_id = v.space_id").fetchone()
            return chunks, int(counted[0]) if counted else 0

    # -- one scanner per source --------------------------------------------------------

    def try_scan_lock(self, source_id: str) -> bool:
        """Take the source's scan lock unless another session (node) holds it; it is
        released by :meth:`release_scan_lock`, :meth:`close`, or this node's death."""
        return self._locks.try_acquire(source_id)

    def holds_scan_lock(self, source_id: str) -> bool:
        """Whether this node still holds the source's scan lock (asked of the server)."""
        return self._locks.holds(source_id)

    def release_scan_lock(self, source_id: str) -> None:
        self._locks.release(source_id)

    def try_lock(self, name: str, key: int) -> bool:
        """Take another session advisory lock (``name``, ``key``: the backfill's) on the
        scan locks' session unless another node holds it; released as a scan lock is."""
        return self._locks.try_acquire(name, key)

    def release_lock(self, name: str, key: int) -> None:
        self._locks.release(name, key)


