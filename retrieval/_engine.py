"""The retriever: ingest pipeline and hybrid search over the three stores.

Writes are serialised (one writer; tantivy allows one per index directory) and follow one
order: embed (outside any lock; vectors are cached by model and content hash) → SQLite
transaction (the acknowledgement point) → tantivy commit → hnswlib. A crash between those
steps leaves SQLite ahead of the derived indexes; :meth:`Retriever.open` reconciles them
from SQLite (whatever is missing is re-added from stored text and cached vectors, whatever
is extra is removed) and logs what it repaired.

Search never fails because of the vector side: without an embedding child (down,
disabled, or a vector index built for another model), it is BM25-only and says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hashlib
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Protocol

import numpy as np
import structlog

from ._bm25 import Filters, IndexedChunk, TextIndex
from ._chunk import chunk_text
from ._confine import SourceRoot, display_name
from ._extract import Extracted, ExtractLimits, extract_bytes
from ._fusion import rrf
from ._group import EmbedBatcher, GroupCommitter, Vector
from ._redact import redact
from ._store import ChunkRow, DocumentRow, Replacement, SourceRow, Store, StoredChunk
from ._vectors import VectorIndex
from .errors import (
    InvalidDocument,
    NotFound,
    RetrievalError,
    StorageFull,
    is_storage_full,
    validate_document_id,
)

_log = structlog.get_logger("llamad.retrieval")

_SOURCE_ID = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
KINDS = ("markdown", "text", "html", "pdf", "config")


class Embedder(Protocol):
    """The embedding child, as the retriever needs it."""

    @property
    def model_id(self) -> str:
        """Identifies the vector space (vectors of different models never mix)."""
        ...

    async def embed(self, texts: Sequence[str]) -> Sequence[Vector]:
        """One L2-normalised vector per text. Raises on any failure."""
        ...

    async def count_tokens(self, text: str) -> int:
        """Tokens the embedding model sees for ``text``."""
        ...

    @property
    def context(self) -> int:
        """Most tokens one input may have."""
        ...


EmbedderProvider = Callable[[], "Embedder | None"]


@dataclass(frozen=True)
class RetrievalLimits:
    """Every limit of retrieval, named (the daemon's config sets them)."""

    chunk_size: int = 1200
    chunk_overlap: int = 200
    max_chunk_chars: int = 2000
    embed_batch: int = 32
    embed_concurrency: int = 2      # embedding requests ingest keeps in flight
    ingest_workers: int = 128       # documents of a directory scan in flight at once
    ingest_inflight_bytes: int = 64 * 1024**2  # ... and their file bytes, at most
    max_commit_batch: int = 256     # documents per group commit
    text_candidates: int = 25
    vector_candidates: int = 25
    rrf_k: int = 60
    default_k: int = 5
    max_k: int = 20
    max_query_chars: int = 2000
    max_document_chars: int = 5_000_000
    max_files_per_source: int = 20_000
    max_bytes_per_source: int = 2 * 1024**3
    query_embed_timeout: float = 5.0
    redact_hostnames: bool = False
    redact_ips: bool = False
    refuse_hard_links: bool = False  # files with more than one link (see _confine)
    extract: ExtractLimits = field(default_factory=ExtractLimits)


@dataclass(frozen=True)
class Hit:
    """One search hit; ``chunk_id`` is its citation key."""

    chunk_id: str
    doc_id: str
    title: str
    source_id: str
    path: str
    heading: str
    text: str
    snippet: str
    search_source: str              # text | vector | hybrid
    fused_score: float
    text_rank: int | None
    text_score: float | None
    vector_rank: int | None
    vector_score: float | None      # cosine similarity
    indexed_at: int


@dataclass(frozen=True)
class SearchResult:
    hits: list[Hit]
    mode: str                       # hybrid | text
    warnings: list[str]


@dataclass(frozen=True)
class _Pending:
    """A document ready to commit: its chunks and their vectors."""

    doc: DocumentRow
    rows: list[ChunkRow]
    model: str                          # the embedding model of the vectors ("" none)
    cached: dict[str, np.ndarray]       # by content hash, from the embedding cache
    fresh: dict[str, np.ndarray]        # embedded now; cached by this commit


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def validate_source_id(source_id: str) -> str:
    if not _SOURCE_ID.fullmatch(source_id):
        raise InvalidDocument(
            f"source id {source_id!r} must be 1-64 characters of a-z, 0-9, '_' and '-', "
            "starting with a letter or digit"
        )
    return source_id


def snippet(text: str, query: str, width: int = 240) -> str:
    """A window of ``text`` around the first query term it contains."""
    lowered = text.lower()
    best = -1
    for term in sorted(set(re.findall(r"\w{3,}", query.lower())), key=len, reverse=True):
        best = lowered.find(term)
        if best >= 0:
            break
    start = max(0, best - width // 3) if best >= 0 else 0
    piece = " ".join(text[start:start + width].split())
    return ("…" if start > 0 else "") + piece + ("…" if start + width < len(text) else "")


class Retriever:
    """Hybrid retrieval over a directory of indexes (``root``)."""

    def __init__(self, root: Path, embedder: EmbedderProvider,
                 limits: RetrievalLimits | None = None, *,
                 unavailable_reason: Callable[[], str] | None = None) -> None:
        """Args:
            root: the directory of the indexes.
            embedder: gives the embedder to use now, or None (search is then BM25-only).
            limits: every limit, named.
            unavailable_reason: says why ``embedder`` gave None, for search warnings.
        """
        self.root = root
        self.limits = limits or RetrievalLimits()
        self._embedder = embedder
        self._unavailable = unavailable_reason or (lambda: "embedding child unavailable")
        self._write = asyncio.Lock()
        self._store: Store | None = None
        self._text: TextIndex | None = None
        self._vectors: VectorIndex | None = None
        self._vector_model = ""
        self._vectors_dirty = False
        self._rebuild: asyncio.Task[None] | None = None
        self.repaired: dict[str, int] = {}
        # Documents being processed: their state is shown from here (SQLite keeps the
        # last committed version, which a crash mid-processing must leave as it was).
        self._inflight: dict[str, DocumentRow] = {}
        self._batcher: EmbedBatcher | None = None
        self._batcher_model = ""
        self._committer: GroupCommitter[_Pending, DocumentRow] = GroupCommitter(
            self._commit_batch, self._write, max_batch=self.limits.max_commit_batch)
        # SQLite holds a write that tantivy or hnswlib failed to take (a full disk, say):
        # the next write first brings them in line (see _catch_up).
        self._behind = False

    # -- life cycle --------------------------------------------------------------------

    async def open(self) -> None:
        """Open (or create) the stores and reconcile them. Idempotent."""
        if self._store is not None:
            return
        await asyncio.to_thread(self._open_sync)

    def _open_sync(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        store = Store(self.root / "meta.sqlite3")
        text = TextIndex(self.root / "bm25")
        self._vector_model = store.get_meta("vector_model") or ""
        dim = int(store.get_meta("vector_dim") or 0)
        vectors = VectorIndex(self.root / "vectors.hnsw", dim) if dim else None
        self._store, self._text, self._vectors = store, text, vectors
        self._reconcile()

    def _reconcile(self) -> None:
        """Make tantivy and hnswlib agree with SQLite; count what was repaired."""
        store, text = self._require()
        truth = store.chunk_keys()
        in_text = text.keys()
        extra, missing = in_text - truth, truth - in_text
        if extra:
            text.delete_keys(extra)
        if missing:
            text.add([self._indexed(c) for c in store.chunks_by_keys(missing).values()])
        if extra or missing:
            text.commit()
        repaired = {"text_removed": len(extra), "text_added": len(missing)}
        if self._vectors is not None:
            in_vec = self._vectors.keys()
            v_extra = in_vec - truth
            if v_extra:
                self._vectors.delete(v_extra)
            v_missing = truth - in_vec
            added = self._add_cached_vectors(v_missing) if v_missing else 0
            if v_extra or added:
                self._vectors.save()
            repaired |= {"vectors_removed": len(v_extra), "vectors_added": added}
        self.repaired = {k: v for k, v in repaired.items() if v}
        if self.repaired:
            _log.warning("indexes repaired from SQLite", **self.repaired)

    def _add_cached_vectors(self, keys: set[int]) -> int:
        store, _ = self._require()
        if self._vectors is None or not self._vector_model:
            return 0
        chunks = store.chunks_by_keys(keys)
        cached = store.cached_vectors(self._vector_model, (c.content_hash for c in chunks.values()))
        pairs = [(k, cached[c.content_hash]) for k, c in chunks.items() if c.content_hash in cached]
        if pairs:
            self._vectors.add([k for k, _ in pairs], np.stack([v for _, v in pairs]))
        return len(pairs)

    async def close(self) -> None:
        if self._rebuild is not None and not self._rebuild.done():
            self._rebuild.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._rebuild
        await self._committer.close()  # commits under way finish; none is cut short
        async with self._write:
            await asyncio.to_thread(self._close_sync)

    def _close_sync(self) -> None:
        # Each store is closed even if another fails (a full disk must not turn a clean
        # shutdown into a crash). An unsaved vector index is no loss: the previous file
        # is intact, and the next start re-adds what it lacks from SQLite's cache.
        for what, close in (
                ("vector index not saved; the next start re-adds its vectors from SQLite",
                 self._save_vectors),
                ("text index not closed cleanly", self._text_close),
                ("metadata store not closed cleanly", self._store_close)):
            try:
                close()
            except Exception as exc:
                _log.warning(what, error=str(exc)[:300])
        self._store = self._text = self._vectors = None

    def _save_vectors(self) -> None:
        if self._vectors is not None and self._vectors_dirty:
            self._vectors.save()

    def _text_close(self) -> None:
        if self._text is not None:
            self._text.close()

    def _store_close(self) -> None:
        if self._store is not None:
            self._store.close()

    def _catch_up(self) -> None:
        """After a failed write left SQLite ahead: bring tantivy and hnswlib in line
        (the start-up reconciliation, run again; Status keeps the start-up's counts)."""
        at_start = self.repaired
        try:
            self._reconcile()
        finally:
            self.repaired = at_start
        self._behind = False

    def _storage_full(self) -> StorageFull:
        return StorageFull(f"no space left on the disk holding the retrieval indexes "
                           f"({self.root}): free space, then retry; documents indexed "
                           "before are intact")

    def _require(self) -> tuple[Store, TextIndex]:
        if self._store is None or self._text is None:
            raise RetrievalError("retrieval is not open")
        return self._store, self._text

    async def flush(self) -> None:
        """Persist the vector index now (it is also saved on close)."""
        async with self._write:
            if self._vectors is not None and self._vectors_dirty:
                await asyncio.to_thread(self._vectors.save)
                self._vectors_dirty = False

    # -- sources -----------------------------------------------------------------------

    async def add_source(self, source_id: str, *, root: Path | None = None, category: str = "",
                         tags: Sequence[str] = ()) -> SourceRow:
        """Add (or update) a source: a directory to scan, or (root None) pushed documents."""
        validate_source_id(source_id)
        row = SourceRow(source_id, "directory" if root is not None else "push",
                        str(root) if root is not None else "", category, tuple(tags),
                        int(time.time()))
        store, _ = self._require()
        await asyncio.to_thread(store.upsert_source, row)
        return row

    async def sources(self) -> list[SourceRow]:
        store, _ = self._require()
        return await asyncio.to_thread(store.sources)

    async def mark_scanned(self, source_id: str, error: str = "") -> None:
        """Record that a source was just scanned (and its error, if the scan failed)."""
        store, _ = self._require()
        await asyncio.to_thread(store.mark_scanned, source_id, error)

    async def remove_source(self, source_id: str) -> int:
        """Remove a source and everything indexed from it; return the chunks removed."""
        store, _ = self._require()
        async with self._write:
            if await asyncio.to_thread(store.source, source_id) is None:
                raise NotFound(f"no source {source_id!r}")
            keys = await asyncio.to_thread(store.delete_source, source_id)
            await asyncio.to_thread(self._drop_keys, keys)
        return len(keys)

    # -- documents ---------------------------------------------------------------------

    async def upsert(self, source_id: str, title: str, text: str, *, doc_id: str | None = None,
                     kind: str = "text", category: str = "", tags: Sequence[str] = (),
                     path: str = "", mtime_ns: int = 0, size: int = 0) -> DocumentRow:
        """Index a document (replacing its previous version atomically).

        Returns once the document is durable in SQLite and searchable by BM25 (and by
        vectors when the embedding child is up). Unchanged content is a no-op.

        Raises:
            InvalidDocument: bad ids, kind, or empty or oversized text.
            NotFound: unknown source.
        """
        store, _ = self._require()
        if kind not in KINDS:
            raise InvalidDocument(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
        if not text.strip():
            raise InvalidDocument("document text is empty")
        if len(text) > self.limits.max_document_chars:
            raise InvalidDocument(f"document has {len(text)} characters; the limit is "
                                  f"{self.limits.max_document_chars} "
                                  "(retrieval.max_document_chars)")
        source = await asyncio.to_thread(store.source, source_id)
        if source is None:
            raise NotFound(f"no source {source_id!r}; add it first")
        doc_id = validate_document_id(
            doc_id or f"{source_id}/{_hash(title + chr(0) + text)[:16]}")
        cleaned = redact(text, hostnames=self.limits.redact_hostnames,
                         ips=self.limits.redact_ips)
        clean_title = redact(title).text[:500]
        content_hash = _hash(clean_title + "\x00" + cleaned.text + "\x00" + kind)
        existing = await asyncio.to_thread(store.document, doc_id)
        doc = DocumentRow(
            doc_id, source_id, path, clean_title, kind, category or source.category,
            tuple(tags) or source.tags, content_hash, mtime_ns, size, "processing", "",
            int(time.time()), sum(cleaned.counts.values()))
        if self._behind:
            async with self._write:
                try:
                    if self._behind:
                        await asyncio.to_thread(self._catch_up)
                except Exception as exc:
                    if is_storage_full(exc):
                        raise self._storage_full() from exc
                    raise
        if existing is not None and existing.state == "indexed" and \
                existing.content_hash == content_hash and existing.category == doc.category \
                and existing.tags == doc.tags:
            return existing
        self._inflight[doc_id] = doc
        try:
            pieces = chunk_text(cleaned.text, kind, size=self.limits.chunk_size,
                                overlap=self.limits.chunk_overlap,
                                max_chars=self.limits.max_chunk_chars)
            pieces = await self._fit_embedding_context(pieces, kind)
            rows = [ChunkRow(f"{doc_id}#{i}", i, p.heading, p.text, _hash(p.text))
                    for i, p in enumerate(pieces, start=1)]
            model, cached, fresh = await self._vectors_for(rows)
            indexed = await self._committer.submit(_Pending(doc, rows, model, cached, fresh))
        except Exception as exc:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(store.set_state, doc, "failed", str(exc)[:500])
            if is_storage_full(exc):
                raise self._storage_full() from exc
            raise
        finally:
            if self._inflight.get(doc_id) is doc:
                del self._inflight[doc_id]
        return indexed

    async def _commit_batch(self, batch: list[_Pending]) -> list[DocumentRow]:
        """Commit documents together (the writer lock is held): one SQLite transaction,
        one tantivy commit, one round of hnswlib updates."""
        models = {p.model for p in batch if p.model and (p.cached or p.fresh)}
        if self._vectors is not None and models - {self._vector_model}:
            # Vectors of another model than the index's: they stay cached (this commit
            # stores them) for the background rebuild, and never enter this index. With
            # no index yet, _store_batch makes the first one.
            self._start_rebuild()
        if self._behind:
            await asyncio.to_thread(self._catch_up)
        now = int(time.time())
        docs = [dataclasses.replace(p.doc, state="indexed", indexed_at=now) for p in batch]
        replacements = await asyncio.to_thread(
            self._store_batch, docs, batch)
        try:
            await asyncio.to_thread(self._apply_batch, replacements, batch)
        except Exception:
            # SQLite (the truth) has the batch and tantivy or hnswlib does not: searches
            # may miss it until the next write has caught them up.
            self._behind = True
            raise
        return docs

    def _store_batch(self, docs: list[DocumentRow],
                     batch: list[_Pending]) -> list[Replacement]:
        store, _ = self._require()
        fresh: dict[str, dict[str, np.ndarray]] = {}
        for p in batch:
            if p.fresh:
                fresh.setdefault(p.model, {}).update(p.fresh)
        replacements = store.replace_documents(
            [(d, p.rows) for d, p in zip(docs, batch, strict=True)], sorted(fresh.items()))
        if self._vectors is None:
            first = next((p for p in batch if p.model and (p.cached or p.fresh)), None)
            if first is not None:
                dim = len(next(iter({**first.cached, **first.fresh}.values())))
                self._use_vector_model(first.model, dim)
        return replacements

    def _apply_batch(self, replacements: list[Replacement], batch: list[_Pending]) -> None:
        """The derived indexes follow SQLite: net of every replacement, in order (a
        document upserted twice in one batch keeps only its second version)."""
        _, text = self._require()
        removed: set[int] = set()
        added: dict[int, StoredChunk] = {}
        vectors: dict[str, np.ndarray] = {}
        for replacement, pending in zip(replacements, batch, strict=True):
            for key in replacement.removed:
                removed.add(key)
                added.pop(key, None)
            for chunk in replacement.added:
                added[chunk.key] = chunk
            if pending.model == self._vector_model:
                vectors.update(pending.cached)
                vectors.update(pending.fresh)
        if removed:
            text.delete_keys(sorted(removed))
        text.add([self._indexed(c) for c in added.values()])
        text.commit()
        if self._vectors is not None:
            if removed:
                self._vectors.delete(sorted(removed))
            pairs = [(c.key, vectors[c.content_hash]) for c in added.values()
                     if c.content_hash in vectors]
            if pairs:
                self._vectors.add([k for k, _ in pairs], np.stack([v for _, v in pairs]))
            self._vectors_dirty = True

    async def _fit_embedding_context(self, pieces: list, kind: str) -> list:  # type: ignore[type-arg]
        """Split chunks the embedding model could not take in one piece, until each fits.

        Token density varies within a text (a line of emoji costs a byte-level BPE model a
        token per byte), so the smaller pieces are checked again; a piece whose tokens
        cannot be counted is kept as it is.
        """
        embedder = self._embedder()
        if embedder is None:
            return pieces
        out = []
        todo = list(reversed(pieces))
        while todo:
            piece = todo.pop()
            # No tokenizer makes more tokens than UTF-8 bytes, plus two special tokens.
            if len(piece.text.encode("utf-8")) + 2 <= embedder.context:
                out.append(piece)
                continue
            try:
                tokens = await embedder.count_tokens(piece.text)
            except Exception:
                out.append(piece)
                continue
            if tokens <= embedder.context or len(piece.text) < 2:
                out.append(piece)
                continue
            # Re-chunk this piece smaller, in proportion to how far over it is (and always
            # smaller than it was, so this ends).
            size = max(1, min(len(piece.text) - 1,
                              int(len(piece.text) * embedder.context / tokens * 0.9)))
            smaller = chunk_text(piece.text, "text", size=size, overlap=min(100, size // 4),
                                 max_chars=size)
            todo.extend(type(piece)(0, s.text, piece.heading) for s in reversed(smaller))
        return out

    async def _vectors_for(
        self, rows: Sequence[ChunkRow]
    ) -> tuple[str, dict[str, np.ndarray], dict[str, np.ndarray]]:
        """``(model, cached, fresh)`` vectors for the rows' texts: cached ones, and the
        rest embedded now (batched; at most ``embed_concurrency`` requests in flight
        across concurrent ingests). Empty when the embedding child is unavailable or
        fails: the document is then BM25-only until reindexed."""
        embedder = self._embedder()
        store, _ = self._require()
        if embedder is None or not rows:
            return "", {}, {}
        model = embedder.model_id
        hashes = {r.content_hash: r.text for r in rows}
        cached = await asyncio.to_thread(store.cached_vectors, model, hashes)
        todo = [(h, t) for h, t in hashes.items() if h not in cached]
        fresh: dict[str, np.ndarray] = {}
        try:
            got = await self._batcher_for(embedder).embed([t for _, t in todo])
            fresh.update({h: np.asarray(v, dtype=np.float32)
                          for (h, _), v in zip(todo, got, strict=True)})
        except Exception as exc:
            _log.warning("embedding failed; indexing BM25-only", error=str(exc)[:200])
            return "", {}, {}
        return model, cached, fresh

    def _batcher_for(self, embedder: Embedder) -> EmbedBatcher:
        """The batcher of this embedder: concurrent ingests' texts share requests of up
        to ``embed_batch`` texts, ``embed_concurrency`` in flight."""
        model = embedder.model_id
        if self._batcher is None or self._batcher_model != model:
            async def send(texts: list[str]) -> Sequence[Vector]:
                # The provider's embedder of the moment (a restarted child is a new
                # client), as long as it is still this model.
                current = self._embedder()
                if current is None or current.model_id != model:
                    raise RetrievalError("the embedding model changed while ingesting")
                return await current.embed(texts)

            self._batcher = EmbedBatcher(send, batch=self.limits.embed_batch,
                                         concurrency=self.limits.embed_concurrency)
            self._batcher_model = model
        return self._batcher

    def _start_rebuild(self) -> None:
        if self._rebuild is None or self._rebuild.done():
            self._rebuild = asyncio.create_task(self._rebuild_vectors(), name="vector-rebuild")

    async def _rebuild_vectors(self) -> None:
        """The embedding model changed: embed every chunk with the new model (cached by
        content hash, so unchanged text is embedded once per model), then switch to a
        vector index of the new model in one step. Search is BM25-only meanwhile (the
        old index cannot be queried without the old model) and says why."""
        store, _ = self._require()
        embedder = self._embedder()
        if embedder is None:
            return
        model = embedder.model_id
        _log.warning("embedding model changed; rebuilding the vector index in the background",
                     old=self._vector_model, new=model)
        began = time.monotonic()
        dim = 0
        try:
            batches = await asyncio.to_thread(lambda: list(store.iter_chunks(batch=512)))
            for chunks in batches:
                hashes = {c.content_hash: c.text for c in chunks}
                cached = await asyncio.to_thread(store.cached_vectors, model, hashes)
                todo = [(h, t) for h, t in hashes.items() if h not in cached]
                if cached and not dim:
                    dim = len(next(iter(cached.values())))
                for i in range(0, len(todo), self.limits.embed_batch):
                    part = todo[i:i + self.limits.embed_batch]
                    got = await embedder.embed([t for _, t in part])
                    fresh = {h: np.asarray(v, dtype=np.float32)
                             for (h, _), v in zip(part, got, strict=True)}
                    dim = dim or len(got[0])
                    await asyncio.to_thread(store.put_vectors, model, fresh)
        except Exception as exc:
            _log.warning("vector rebuild interrupted; BM25-only until it completes",
                         error=str(exc)[:200])
            return
        if not dim:
            return
        async with self._write:
            current = self._embedder()
            if current is None or current.model_id != model:
                return  # the model changed again; the next trigger starts over
            await asyncio.to_thread(self._use_vector_model, model, dim)
        _log.info("vector index rebuilt", model=model,
                  vectors=self._vectors.count() if self._vectors else 0,
                  seconds=round(time.monotonic() - began, 1))

    def _use_vector_model(self, model: str, dim: int) -> None:
        """Make the vector index ``model``'s: a fresh index built from the cached vectors
        of every chunk (vectors of two models never share an index)."""
        store, _ = self._require()
        if self._vectors is not None and self._vector_model == model:
            return
        path = self.root / "vectors.hnsw"
        for stale in (path, path.with_suffix(".hnsw.json")):
            stale.unlink(missing_ok=True)
        self._vectors = VectorIndex(path, dim)
        self._vector_model = model
        self._add_cached_vectors(store.chunk_keys())
        self._vectors.save()
        store.set_meta("vector_model", model)
        store.set_meta("vector_dim", str(dim))

    def _drop_keys(self, keys: Sequence[int]) -> None:
        _, text = self._require()
        if not keys:
            return
        text.delete_keys(keys)
        text.commit()
        if self._vectors is not None:
            self._vectors.delete(keys)
            self._vectors_dirty = True

    @staticmethod
    def _indexed(c: StoredChunk) -> IndexedChunk:
        return IndexedChunk(c.key, c.doc_id, c.source_id, c.kind, c.category, c.tags,
                            c.indexed_at, c.title, c.heading, c.text)

    async def delete(self, doc_id: str) -> bool:
        """Remove a document; False if it did not exist."""
        store, _ = self._require()
        async with self._write:
            keys = await asyncio.to_thread(store.delete_document, doc_id)
            if keys is None:
                return False
            await asyncio.to_thread(self._drop_keys, keys)
        return True

    async def document(self, doc_id: str) -> DocumentRow | None:
        """A document (state ``processing`` while an upsert of it runs)."""
        store, _ = self._require()
        inflight = self._inflight.get(doc_id)
        if inflight is not None:
            return inflight
        return await asyncio.to_thread(store.document, doc_id)

    async def documents(self, source_id: str | None = None) -> list[DocumentRow]:
        """Documents by id (of one source), those being processed included."""
        store, _ = self._require()
        rows = {d.id: d for d in await asyncio.to_thread(store.documents, source_id)}
        for doc_id, doc in list(self._inflight.items()):
            if source_id is None or doc.source_id == source_id:
                rows[doc_id] = doc
        return [rows[k] for k in sorted(rows)]

    async def ingest_file(self, source: SourceRow, root: SourceRoot, rel: str,
                          target: str | None = None) -> DocumentRow:
        """Extract, then :meth:`upsert`, one file of a directory source.

        The file is opened beneath ``root``'s descriptor without following any symlink
        (:meth:`SourceRoot.open_file`) and only that descriptor is read; its size and
        mtime come from the same descriptor.

        Args:
            rel: the file's path under the root: the document's id and path.
            target: where a symlink at ``rel`` leads, relative to the root (the scan
                resolved it and found it inside); None when ``rel`` is the file itself.
        """
        from ._extract import extract_fd, kind_for  # noqa: PLC0415 - keeps import light

        kind = kind_for(PurePosixPath(rel))
        if kind is None:
            raise InvalidDocument(f"{display_name(rel)}: unsupported file type")
        limits = self.limits.extract

        def read() -> tuple[Extracted, os.stat_result]:
            fd = root.open_file(target or rel)
            try:
                return extract_fd(fd, display_name(rel), kind, limits), os.fstat(fd)
            finally:
                os.close(fd)

        extracted, st = await asyncio.to_thread(read)
        return await self.upsert(source.id, extracted.title, extracted.text,
                                 doc_id=f"{source.id}/{rel}", kind=extracted.kind,
                                 path=str(root.path / rel), mtime_ns=st.st_mtime_ns,
                                 size=st.st_size)

    async def ingest_bytes(self, source_id: str, name: str, data: bytes, kind: str,
                           **fields: object) -> DocumentRow:
        extracted = await asyncio.to_thread(extract_bytes, data, name, kind,
                                            self.limits.extract)
        return await self.upsert(source_id, extracted.title, extracted.text,
                                 kind=extracted.kind, **fields)  # type: ignore[arg-type]

    # -- search ------------------------------------------------------------------------

    async def search(self, query: str, *, k: int | None = None,
                     filters: Filters | None = None) -> SearchResult:
        """BM25 top-N ∥ HNSW top-N, fused by RRF; top ``k`` hits.

        Raises:
            InvalidDocument: empty or oversized query, k out of range.
        """
        store, text = self._require()
        k = self.limits.default_k if k is None else k
        if not 1 <= k <= self.limits.max_k:
            raise InvalidDocument(f"k must be in 1..{self.limits.max_k} (retrieval.max_k), "
                                  f"got {k}")
        if not query.strip():
            raise InvalidDocument("query is empty")
        if len(query) > self.limits.max_query_chars:
            raise InvalidDocument(f"query has {len(query)} characters; the limit is "
                                  f"{self.limits.max_query_chars} (retrieval.max_query_chars)")
        filters = filters or Filters()
        n_text = max(self.limits.text_candidates, k)
        n_vec = max(self.limits.vector_candidates, k)
        warnings: list[str] = []
        vector_task = asyncio.create_task(self._vector_search(query, n_vec, filters, warnings))
        text_hits = await asyncio.to_thread(text.search, query, filters=filters, limit=n_text)
        vec_hits = await vector_task
        mode = "hybrid" if vec_hits is not None else "text"
        fused = rrf([[key for key, _ in text_hits], [key for key, _ in (vec_hits or [])]],
                    k=self.limits.rrf_k)[:k]
        text_rank = {key: i for i, (key, _) in enumerate(text_hits, start=1)}
        text_score = dict(text_hits)
        vec_rank = {key: i for i, (key, _) in enumerate(vec_hits or [], start=1)}
        vec_sim = {key: 1.0 - dist for key, dist in (vec_hits or [])}
        chunks = await asyncio.to_thread(store.chunks_by_keys, [key for key, _ in fused])
        hits = []
        for key, score in fused:
            c = chunks.get(key)
            if c is None:  # deleted between the index read and now
                continue
            in_text, in_vec = key in text_rank, key in vec_rank
            hits.append(Hit(
                c.chunk_id, c.doc_id, c.title, c.source_id, c.path, c.heading, c.text,
                snippet(c.text, query),
                "hybrid" if in_text and in_vec else ("text" if in_text else "vector"),
                score, text_rank.get(key), text_score.get(key), vec_rank.get(key),
                vec_sim.get(key), c.indexed_at))
        return SearchResult(hits, mode, warnings)

    async def _vector_search(self, query: str, n: int, filters: Filters,
                             warnings: list[str]) -> list[tuple[int, float]] | None:
        embedder = self._embedder()
        if embedder is None:
            warnings.append(f"{self._unavailable()}: results are BM25-only")
            return None
        if self._vectors is None or self._vector_model != embedder.model_id:
            if self._vectors is not None:
                self._start_rebuild()
                warnings.append("the vector index belongs to another embedding model and is "
                                "being rebuilt: results are BM25-only")
            else:
                warnings.append("no vectors indexed yet: results are BM25-only")
            return None
        try:
            vectors = await asyncio.wait_for(embedder.embed([query]),
                                             self.limits.query_embed_timeout)
        except Exception as exc:
            warnings.append(f"query embedding failed ({type(exc).__name__}): results are "
                            "BM25-only")
            return None
        allowed = await self._allowed_keys(filters)
        vector = np.asarray(vectors[0], dtype=np.float32)
        index = self._vectors
        return await asyncio.to_thread(
            index.search, vector, n, None if allowed is None else allowed.__contains__)

    async def _allowed_keys(self, filters: Filters) -> set[int] | None:
        if filters == Filters():
            return None
        store, _ = self._require()
        return await asyncio.to_thread(functools.partial(
            store.keys_matching, sources=filters.sources, kinds=filters.kinds,
            categories=filters.categories, tags=filters.tags, since=filters.since,
            until=filters.until))

    def _disk_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.root.rglob("*") if p.is_file())

    # -- status ------------------------------------------------------------------------

    async def status(self) -> dict[str, object]:
        store, _ = self._require()
        counts = await asyncio.to_thread(store.counts)
        embedder = self._embedder()
        model = embedder.model_id if embedder is not None else self._vector_model
        embedded = await asyncio.to_thread(store.embedded_chunks, model) if model else 0
        if self._inflight:
            counts["documents_processing"] = len(self._inflight)
        return {
            **counts,
            "embedding_model": self._vector_model,
            "embedded_chunks": embedded,
            "vectors": self._vectors.count() if self._vectors is not None else 0,
            "disk_bytes": await asyncio.to_thread(self._disk_bytes),
            "repaired": dict(self.repaired),
        }
