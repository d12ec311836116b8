"""Copying an embedded store into the PostgreSQL store (``llamad retrieval migrate``).

Offline: the caller holds the state directory (no daemon writes the embedded store
meanwhile). What is copied, from ``<root>/meta.sqlite3``:

* sources (directory, push and history, with their ``disabled`` flag, review and
  retention settings);
* indexed documents with their chunks and, for the store's embedding model
  (``meta.vector_model``), the cached vector of each chunk's text, in batches of
  ``batch_documents`` documents, each batch one :meth:`PostgresStore.replace_documents`
  transaction: an interruption loses at most the batch in flight;
* the state of documents that are not indexed (``pending``, ``processing``, ``failed``
  with its error), without chunks;
* once every batch is in: the versions held for review, with their exact text (their
  documents ``review_required``, a version indexed before copied as indexed), and the
  rejected documents with the rejected version's hash and the reviewer's note.

What is not copied is said so (:attr:`Migration.skipped`), never silently: cached vectors
of other embedding models (the corpus has one model).

Resumable: a document already in Postgres with the same content hash, indexed, is not
written again, so a rerun after an interruption copies what is left, and a rerun after a
complete run writes nothing. Documents in Postgres that the embedded store lacks are left
alone (another node may have written them).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import structlog

from .errors import EmbeddingModelMismatch, RetrievalError
from .postgres._connect import PgOptions
from .postgres._store import PostgresStore
from .store._metadata import Store
from .store._rows import ChunkRow, DocumentRow

_log = structlog.get_logger("llamad.retrieval")

STORE_FILE = "meta.sqlite3"
"""The embedded store's file in the retrieval root."""


class MigrationRefused(RetrievalError):
    """The migration cannot start: no embedded store, or a Postgres corpus embedded with
    another model (nothing was written)."""


@dataclass
class Migration:
    """What a migration did, and while it runs what it has done so far (``on_progress``
    is given it after each batch).

    Attributes:
        target: the Postgres store (``user@host:port/db``).
        model: the embedding model whose vectors were copied ("" none).
        sources: sources written (upserted).
        documents: indexed documents written, of ``documents_total`` to write, with
            ``chunks`` chunks (of ``chunks_total``) and ``vectors`` vectors; ``states``:
            documents not indexed whose state was written (held for review and rejected
            ones included).
        present: indexed documents already in Postgres with the same content (skipped).
        without_vector: chunks copied without a vector (none cached for the model).
        left_alone: documents in Postgres that the embedded store does not have.
        skipped: one line per kind of thing not copied, saying why.
        complete: False when ``max_batches`` stopped the run early (rerun to finish).
        elapsed: seconds the batches have taken.
    """

    target: str
    model: str = ""
    sources: int = 0
    documents: int = 0
    documents_total: int = 0
    chunks: int = 0
    chunks_total: int = 0
    vectors: int = 0
    states: int = 0
    present: int = 0
    without_vector: int = 0
    left_alone: int = 0
    skipped: list[str] = field(default_factory=list)
    complete: bool = True
    elapsed: float = 0.0

    @property
    def chunks_per_second(self) -> float:
        return self.chunks / self.elapsed if self.elapsed > 0 else 0.0


def open_embedded(root: Path) -> Store:
    """The embedded store in ``root``.

    Raises:
        MigrationRefused: there is none (``root`` or its store file is missing).
    """
    path = root / STORE_FILE
    if not path.is_file():
        raise MigrationRefused(f"no embedded retrieval store at {path}: nothing to migrate "
                               "(is this the daemon's state_dir?)")
    return Store(path)


def migrate_store(root: Path, postgres: PgOptions, *, batch_documents: int = 50,
            max_batches: int = 0,
            on_progress: Callable[[Migration], None] | None = None) -> Migration:
    """Copy the embedded store in ``root`` into the PostgreSQL store (see the module).

    Args:
        root: the retrieval directory (``<state_dir>/retrieval``); nothing may write it
            meanwhile (the caller holds the state directory's lock).
        postgres: how to reach the PostgreSQL store.
        batch_documents: indexed documents per transaction.
        max_batches: stop after this many batches (0: run to the end); the result then
            says ``complete=False``.
        on_progress: called after each batch with the migration so far.

    Raises:
        MigrationRefused: no embedded store; the Postgres corpus is embedded with
            another model or dimension (nothing written).
        StoreUnavailable: the server cannot be reached or was lost (the batch in flight
            is not written; rerun to resume).
        SchemaTooNew: the database was migrated by a newer llamad.
    """
    if batch_documents < 1:
        raise ValueError("batch_documents must be at least 1")
    store = open_embedded(root)
    try:
        pg = PostgresStore.open(postgres)
        try:
            return _copy(store, pg, batch_documents, max_batches, on_progress)
        finally:
            pg.close()
    finally:
        store.close()


def _copy(store: Store, pg: PostgresStore, batch_documents: int, max_batches: int,
          on_progress: Callable[[Migration], None] | None) -> Migration:
    result = Migration(pg.target)
    model = store.get_meta("vector_model") or ""
    dim = int(store.get_meta("vector_dim") or 0)
    if model and dim:
        try:
            pg.use_embedding_model(model, dim)
        except EmbeddingModelMismatch as exc:
            raise MigrationRefused(f"{exc}; re-embed one side or migrate into another "
                                   "database") from None
        result.model = model
    result.skipped.extend(_other_models(store, model))

    for source in store.sources():
        pg.upsert_source(source)
        if source.disabled:
            pg.set_source_disabled(source.id, True)
        result.sources += 1

    present = {d.id: d for d in pg.documents()}
    embedded = store.documents()
    ids = {d.id for d in embedded}
    result.left_alone = sum(1 for doc_id in present if doc_id not in ids)
    to_index: list[DocumentRow] = []
    reviewed: list[DocumentRow] = []  # held or rejected: written after the batches
    for doc in embedded:
        mine = present.get(doc.id)
        if doc.state in ("review_required", "rejected"):
            reviewed.append(doc)
            if doc.state == "review_required" and doc.indexed_at and (
                    mine is None or mine.state not in ("indexed", "review_required")
                    or mine.content_hash != doc.content_hash):
                to_index.append(doc)  # the version searchable while one is held
            elif doc.state == "review_required" and doc.indexed_at:
                result.present += 1
        elif doc.state != "indexed":
            if mine is None or (mine.state, mine.error) != (doc.state, doc.error):
                pg.set_state(doc, doc.state, doc.error)
                result.states += 1
        elif mine is not None and mine.state == "indexed" \
                and mine.content_hash == doc.content_hash:
            result.present += 1
        else:
            to_index.append(doc)
    chunk_keys = {d.id: store.document_chunk_keys(d.id) for d in to_index}
    result.documents_total = len(to_index)
    result.chunks_total = sum(len(k) for k in chunk_keys.values())
    start = time.monotonic()
    for batches, i in enumerate(range(0, len(to_index), batch_documents)):
        if max_batches and batches >= max_batches:
            result.complete = False
            break
        batch = to_index[i:i + batch_documents]
        items: list[tuple[DocumentRow, list[ChunkRow]]] = []
        hashes: set[str] = set()
        for doc in batch:
            stored = sorted(store.chunks_by_keys(chunk_keys[doc.id]).values(),
                            key=lambda c: c.ordinal)
            items.append((doc, [ChunkRow(c.chunk_id, c.ordinal, c.heading, c.text,
                                         c.content_hash) for c in stored]))
            hashes.update(c.content_hash for c in stored)
        vectors: dict[str, np.ndarray] = store.cached_vectors(model, hashes) \
            if result.model else {}
        pg.replace_documents(items, [(model, vectors)] if vectors else [])
        n_chunks = sum(len(chunks) for _, chunks in items)
        with_vector = sum(1 for _, chunks in items for c in chunks
                          if c.content_hash in vectors)
        result.documents += len(items)
        result.chunks += n_chunks
        result.vectors += with_vector
        result.without_vector += n_chunks - with_vector
        result.elapsed = time.monotonic() - start
        if on_progress is not None:
            on_progress(result)
    result.elapsed = time.monotonic() - start
    if result.complete:  # a replacement drops a held version: holds come after them all
        result.states += sum(_copy_review(store, pg, doc, present.get(doc.id))
                             for doc in reviewed)
    _log.info("retrieval store migrated", store=result.target, documents=result.documents,
              chunks=result.chunks, present=result.present, complete=result.complete)
    return result


def _copy_review(store: Store, pg: PostgresStore, doc: DocumentRow,
                 mine: DocumentRow | None) -> bool:
    """Write a document's review state: the version it holds for review (with its
    text), or its rejection (the rejected version's metadata and hash, the note); False
    when Postgres has it already."""
    if doc.state == "rejected":
        if mine is not None and (mine.state, mine.content_hash, mine.review_note) == (
                "rejected", doc.content_hash, doc.review_note):
            return False
        pg.hold_document(doc, "")  # then rejected: its metadata become the row's
        pg.reject_document(doc.id, doc.review_note)
        return True
    held = store.held_document(doc.id)
    if held is None:  # a state without its held version: nothing to hold
        return False
    version, text = held
    theirs = pg.held_version(doc.id)
    if theirs is not None and theirs.content_hash == version.content_hash:
        return False
    pg.hold_document(version, text)
    return True


def _other_models(store: Store, model: str) -> list[str]:
    """The note on cached vectors of models other than the store's current one."""
    others = [m for m, n in store.vector_models().items() if m != model and n]
    if not others:
        return []
    return [f"cached vectors of other embedding models ({', '.join(sorted(others))}): not "
            "copied (the Postgres corpus holds one model's vectors)"]
