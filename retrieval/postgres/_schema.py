"""The PostgreSQL store's schema: its migrations, the pgvector check, vector spaces.

Tables (schema version 1; version 2 adds ``corpus_switch``, version 3 ``held_documents``,
version 4 the BM25 tables of :mod:`retrieval.postgres._bm25` and drops ``chunks.fts``, version 5
drops the postings' primary key, version 7 adds ``sources.exclude`` and ``sources.excluded``,
version 8 ``chunks.entry``: a text's BM25 rows and vectors held once,
:mod:`retrieval.postgres._entries`):

==================  ==========================================================================
table               holds
==================  ==========================================================================
llamad_schema       one row per migration applied: ``version``, ``description``, when
sources             as the embedded store's ``sources`` (``tags`` a ``text[]``)
documents           as its ``documents``: ingest ``state``, ``content_hash``, ``indexed_at``,
                    ``document_date``; ``tags text[]`` (GIN) for the tag filter
chunks              ``key`` (identity: the chunk key, never reused), ``chunk_id`` (the citation
                    key), text, ``heading``, the document's ``title`` (copied: a generated
                    column can only read its own row); up to version 3 also ``fts``, a
                    generated ``tsvector`` of title + heading + text, GIN-indexed
vector_spaces       one row per (embedding model, dimension): its id names its HNSW index
chunk_vectors       (chunk key, space) -> ``embedding vector``; ``dim`` checked against
                    the vector and, through a foreign key, against the space
corpus_model        one row: the embedding model the shared corpus is embedded with
corpus_switch       at most one row: the space the corpus is being switched to (a Reprocess
                    on a node with another model asked for it; :mod:`retrieval.postgres._backfill`)
held_documents      versions awaiting review, one per document: their metadata and the exact
                    (redacted) text approval indexes; never chunked (:mod:`retrieval._review`)
==================  ==========================================================================

pgvector's HNSW needs a fixed dimension, which a column shared by several models cannot
declare. So ``embedding`` is an unconstrained ``vector`` and each space gets a partial
expression index (pgvector's README, "Indexing vectors of different dimensions")::

    CREATE INDEX chunk_vectors_hnsw_<id> ON chunk_vectors
        USING hnsw ((embedding::vector(<dim>)) vector_cosine_ops) WHERE space_id = <id>

A query uses it when it repeats the expression and the predicate, with both numbers as
literals (a parameter would not match the partial index in a generic plan):
``WHERE space_id = <id> ORDER BY embedding::vector(<dim>) <=> $1::vector(<dim>)``.

Migrations run at open, each in its own transaction under
``pg_advisory_xact_lock(MIGRATION_LOCK)``: two nodes starting together take turns, and the
second finds the work done. A database whose version is above :data:`SCHEMA_VERSION` (a
newer llamad migrated it) is refused with :class:`~retrieval.errors.SchemaTooNew`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import psycopg
from psycopg import sql

from ..errors import EmbeddingModelMismatch, SchemaTooNew, StoreUnavailable
from ._bm25 import MIGRATION_6_STATEMENTS
from ._bm25 import MIGRATION_STATEMENTS as BM25_STATEMENTS
from ._connect import Connection
from ._entries import MIGRATION_STATEMENTS as ENTRY_STATEMENTS

MIGRATION_LOCK = 0x6C6C_616D_6164_0001
"""The advisory lock key (bigint) migrations and vector-space creation hold."""

INDEX_BUILD_POLL = 0.05
"""Seconds between tries of the lock of an HNSW index build another node runs."""

MAX_HNSW_DIM = 2000
"""pgvector's HNSW limit for ``vector`` (0.7+): larger embeddings cannot be indexed."""


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    statements: tuple[str, ...]


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "sources, documents, chunks with full text, vectors per model", (
        """CREATE TABLE sources (
            id text PRIMARY KEY,
            kind text NOT NULL,
            root text NOT NULL DEFAULT '',
            category text NOT NULL DEFAULT '',
            tags text[] NOT NULL DEFAULT '{}',
            created_at bigint NOT NULL,
            last_scan bigint,
            last_error text NOT NULL DEFAULT '',
            disabled boolean NOT NULL DEFAULT false,
            review_required boolean NOT NULL DEFAULT false,
            max_age_days integer NOT NULL DEFAULT 0,
            max_items integer NOT NULL DEFAULT 0,
            pruned bigint NOT NULL DEFAULT 0)""",
        """CREATE TABLE documents (
            id text PRIMARY KEY,
            source_id text NOT NULL REFERENCES sources(id) ON DELETE CASCADE,
            path text NOT NULL DEFAULT '',
            title text NOT NULL DEFAULT '',
            kind text NOT NULL DEFAULT 'text',
            category text NOT NULL DEFAULT '',
            tags text[] NOT NULL DEFAULT '{}',
            content_hash text NOT NULL DEFAULT '',
            mtime_ns bigint NOT NULL DEFAULT 0,
            size bigint NOT NULL DEFAULT 0,
            state text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'processing',
                'indexed', 'failed', 'review_required', 'rejected')),
            error text NOT NULL DEFAULT '',
            indexed_at bigint NOT NULL DEFAULT 0,
            redactions integer NOT NULL DEFAULT 0,
            document_date bigint,
            review_note text NOT NULL DEFAULT '')""",
        "CREATE INDEX documents_source_date ON documents(source_id, document_date, id)",
        "CREATE INDEX documents_tags ON documents USING gin (tags)",
        """CREATE TABLE chunks (
            key bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            chunk_id text NOT NULL UNIQUE,
            doc_id text NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
            ordinal integer NOT NULL,
            title text NOT NULL DEFAULT '',
            heading text NOT NULL DEFAULT '',
            text text NOT NULL,
            content_hash text NOT NULL,
            fts tsvector GENERATED ALWAYS AS (to_tsvector('english'::regconfig,
                title || ' ' || heading || ' ' || text)) STORED)""",
        "CREATE INDEX chunks_doc ON chunks(doc_id)",
        "CREATE INDEX chunks_fts ON chunks USING gin (fts)",
        "CREATE INDEX chunks_hash ON chunks(content_hash)",
        """CREATE TABLE vector_spaces (
            id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            model text NOT NULL,
            dim integer NOT NULL CHECK (dim BETWEEN 1 AND 2000),
            created_at timestamptz NOT NULL DEFAULT now(),
            UNIQUE (model, dim),
            UNIQUE (id, dim))""",
        """CREATE TABLE chunk_vectors (
            chunk_key bigint NOT NULL REFERENCES chunks(key) ON DELETE CASCADE,
            space_id integer NOT NULL,
            dim integer NOT NULL,
            embedding vector NOT NULL,
            PRIMARY KEY (chunk_key, space_id),
            FOREIGN KEY (space_id, dim) REFERENCES vector_spaces(id, dim),
            CHECK (vector_dims(embedding) = dim))""",
        "CREATE INDEX chunk_vectors_space ON chunk_vectors(space_id)",
        """CREATE TABLE corpus_model (
            one boolean PRIMARY KEY DEFAULT true CHECK (one),
            space_id integer NOT NULL REFERENCES vector_spaces(id),
            set_at timestamptz NOT NULL DEFAULT now())""",
    )),
    Migration(2, "the embedding model the corpus is being switched to", (
        """CREATE TABLE corpus_switch (
            one boolean PRIMARY KEY DEFAULT true CHECK (one),
            space_id integer NOT NULL REFERENCES vector_spaces(id),
            requested_at timestamptz NOT NULL DEFAULT now())""",
    )),
    Migration(3, "versions held for review", (
        """CREATE TABLE held_documents (
            doc_id text PRIMARY KEY REFERENCES documents(id) ON DELETE CASCADE,
            path text NOT NULL DEFAULT '',
            title text NOT NULL DEFAULT '',
            kind text NOT NULL DEFAULT 'text',
            category text NOT NULL DEFAULT '',
            tags text[] NOT NULL DEFAULT '{}',
            content_hash text NOT NULL,
            mtime_ns bigint NOT NULL DEFAULT 0,
            size bigint NOT NULL DEFAULT 0,
            redactions integer NOT NULL DEFAULT 0,
            document_date bigint,
            held_at bigint NOT NULL,
            text text NOT NULL)""",
    )),
    Migration(4, "BM25 terms and statistics; the tsvector column goes", (
        *BM25_STATEMENTS,
        "DROP INDEX chunks_fts",
        "ALTER TABLE chunks DROP COLUMN fts",
    )),
    Migration(5, "BM25 postings without the (term, chunk) key", (
        # A term's postings are read through bm25_postings_impact; with the key there
        # the planner, before the table's statistics exist, read every posting of a term
        # through it and sorted them (measured: 6 ms a term against the index's 0.3).
        # write_terms writes a (term, chunk) once, and every index costs each ingest.
        "ALTER TABLE bm25_postings DROP CONSTRAINT bm25_postings_pkey",
    )),
    Migration(6, "BM25 postings removed with their chunk by a trigger, not a foreign key",
              MIGRATION_6_STATEMENTS),
    Migration(7, "a directory source's exclude patterns and what its last scan left out", (
        "ALTER TABLE sources ADD COLUMN exclude text[] NOT NULL DEFAULT '{}'",
        "ALTER TABLE sources ADD COLUMN excluded integer NOT NULL DEFAULT 0",
    )),
    Migration(8, "a text several documents hold is stored once (chunks.entry)",
              ENTRY_STATEMENTS),
)
"""Every migration, in order; a new one is appended (never edited once released)."""

SCHEMA_VERSION = MIGRATIONS[-1].version


def ensure_vector_extension(conn: Connection, target: str) -> str:
    """Make sure pgvector is installed in the database; return its version.

    Raises:
        StoreUnavailable: the server has no pgvector, or it is not installed in this
            database and this role may not install it (says what to run, and as whom).
    """
    row = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'"
                       ).fetchone()
    if row is not None:
        return str(row[0])
    if conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'"
                    ).fetchone() is None:
        raise StoreUnavailable(f"the PostgreSQL server of {target} has no pgvector "
                               "extension: install pgvector (0.7 or later) on it")
    try:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    except psycopg.errors.InsufficientPrivilege:
        raise StoreUnavailable(
            f"pgvector is not installed in {target} and this role may not install it: "
            "run 'CREATE EXTENSION vector;' in that database as a superuser (or the "
            "database owner, where pgvector is trusted)") from None
    row = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'"
                       ).fetchone()
    return str(row[0]) if row is not None else ""


def schema_version(conn: Connection) -> int:
    """The highest migration applied (0 for a database llamad never touched)."""
    if conn.execute("SELECT to_regclass('llamad_schema')").fetchone() == (None,):
        return 0
    row = conn.execute("SELECT coalesce(max(version), 0) FROM llamad_schema").fetchone()
    return int(row[0]) if row is not None else 0


def _refuse_newer(version: int, target: str) -> None:
    if version > SCHEMA_VERSION:
        raise SchemaTooNew(f"the PostgreSQL store {target} has schema version {version}, "
                           f"newer than this llamad knows ({SCHEMA_VERSION}): upgrade llamad "
                           "on this node (no node writes to a schema it does not know)")


def migrate(conn: Connection, target: str, upto: int = SCHEMA_VERSION) -> list[int]:
    """Bring the schema up to :data:`SCHEMA_VERSION` (or ``upto``: tests make an older
    schema with it); return the versions applied now.

    Each migration is one transaction under the migration lock that re-reads the version
    first: a node that waited for another's migration skips it.

    Raises:
        SchemaTooNew: the database was migrated by a newer llamad.
    """
    _refuse_newer(schema_version(conn), target)
    applied: list[int] = []
    for migration in MIGRATIONS:
        if migration.version > upto:
            break
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            conn.execute("""CREATE TABLE IF NOT EXISTS llamad_schema (
                version integer PRIMARY KEY,
                description text NOT NULL,
                applied_at timestamptz NOT NULL DEFAULT now())""")
            current = schema_version(conn)
            _refuse_newer(current, target)
            if current >= migration.version:
                continue
            for statement in migration.statements:
                conn.execute(statement.encode())
            conn.execute("INSERT INTO llamad_schema(version, description) VALUES (%s, %s)",
                         (migration.version, migration.description))
            applied.append(migration.version)
    return applied


def hnsw_index_name(space_id: int) -> str:
    return f"chunk_vectors_hnsw_{int(space_id)}"


def index_build_lock_key(space_id: int) -> int:
    """The session advisory lock key the build of a space's HNSW index holds."""
    return MIGRATION_LOCK + 0x1_0000 + int(space_id)


def ensure_vector_space(conn: Connection, model: str, dim: int, *, m: int = 16,
                        ef_construction: int = 64) -> int:
    """The id of the (model, dimension) space, created with its HNSW index if new.

    The index is built with ``CREATE INDEX CONCURRENTLY``: a space added beside another
    model's vectors (a switch of embedding model) does not block writes while the build
    scans the table. One node builds it at a time (a session advisory lock, taken by
    polling: a session waiting inside a statement would hold a snapshot the concurrent
    build waits for); a build left invalid by a failure is dropped and made again.
    ``conn`` must not be inside a transaction.

    Raises:
        ValueError: ``dim`` is outside 1..:data:`MAX_HNSW_DIM`.
    """
    if not 1 <= dim <= MAX_HNSW_DIM:
        raise ValueError(f"embedding dimension must be in 1..{MAX_HNSW_DIM} for an HNSW "
                         f"index, got {dim}")
    row = conn.execute("SELECT id FROM vector_spaces WHERE model = %s AND dim = %s",
                       (model, dim)).fetchone()
    if row is None:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            row = conn.execute(
                "INSERT INTO vector_spaces(model, dim) VALUES (%s, %s) ON CONFLICT "
                "(model, dim) DO UPDATE SET model = excluded.model RETURNING id",
                (model, dim)).fetchone()
        if row is None:  # RETURNING after an upsert always returns the row
            raise RuntimeError("vector_spaces upsert returned no row")
    space = int(row[0])
    if _index_valid(conn, space) is not True:
        _build_index(conn, space, dim, m, ef_construction)
    return space


def _index_valid(conn: Connection, space: int) -> bool | None:
    """Whether the space's HNSW index is valid (None: there is none)."""
    row = conn.execute("SELECT i.indisvalid FROM pg_class c JOIN pg_index i ON "
                       "i.indexrelid = c.oid WHERE c.relname = %s",
                       (hnsw_index_name(space),)).fetchone()
    return None if row is None else bool(row[0])


def _build_index(conn: Connection, space: int, dim: int, m: int, ef_construction: int
                 ) -> None:
    key = index_build_lock_key(space)
    while not (row := conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()) \
            or not row[0]:
        time.sleep(INDEX_BUILD_POLL)  # another node builds it
    try:
        valid = _index_valid(conn, space)
        if valid:
            return  # the other node's build, done
        name = sql.Identifier(hnsw_index_name(space))
        # A build can take longer than the statement timeout of the pool's connections.
        shown = conn.execute("SHOW statement_timeout").fetchone()
        conn.execute("SET statement_timeout = 0")
        try:
            if valid is False:  # a build that failed (no other runs: this node holds the lock)
                conn.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(name))
            conn.execute(sql.SQL(
                "CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON chunk_vectors USING hnsw "
                "((embedding::vector({dim})) vector_cosine_ops) WITH (m = {m}, "
                "ef_construction = {efc}) WHERE space_id = {space}").format(
                    name=name, dim=sql.Literal(dim), m=sql.Literal(m),
                    efc=sql.Literal(ef_construction), space=sql.Literal(space)))
        finally:
            conn.execute("SELECT set_config('statement_timeout', %s, false)",
                         (str(shown[0]) if shown else "0",))
    finally:
        conn.execute("SELECT pg_advisory_unlock(%s)", (key,))


def model_mismatch(target: str, node: str,
                   corpus: tuple[str, int] | None) -> EmbeddingModelMismatch:
    """The refusal of a node whose embedding model (``node``, as shown) is not the
    corpus's (``(model, dim)``, or None before the first), naming both."""
    if corpus is None:
        return EmbeddingModelMismatch(
            f"the shared corpus {target} has no embedding model yet: call "
            f"use_embedding_model before writing vectors of {node}")
    return EmbeddingModelMismatch(
        f"this node's embedding model is {node}, but the shared corpus {target} is "
        f"embedded with {corpus[0]} ({corpus[1]} dimensions): its vectors would not be "
        f"comparable, so this node neither writes nor searches vectors; configure "
        f"{corpus[0]} as its embedding model")
