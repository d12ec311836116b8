"""Ingest: a document's way in, from file or text to an acknowledged write.

``extract`` (files and pushed bytes) → validate → redact (invariant 8) → chunk (in
characters or tokens, each chunk fitted to the embedding model's context:
:mod:`retrieval._sizing`) → embed (outside any lock; vectors are cached by model and
content hash, and concurrent ingests share embedding requests) → group commit
(concurrent writers share one SQLite transaction and one tantivy commit; see
:mod:`retrieval.store._group`), in the order :mod:`retrieval.store._indexes` keeps crash-consistent.

An embedding failure never fails an ingest: the document is then BM25-only until
reindexed: the background backfill (:mod:`retrieval._backfill`) embeds what has no
vector, and re-embeds everything when the embedding model changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import PurePosixPath

import numpy as np
import structlog

from ._embedder import Embedder, EmbedderProvider
from ._interface import StoreBackend
from ._limits import RetrievalLimits
from ._review import Review
from ._sizing import sized_chunks
from .errors import InvalidDocument, NotFound, RetrievalError, is_storage_full, validate_document_id
from .extraction._confine import SourceRoot, display_name
from .extraction._dates import front_matter_date
from .extraction._extract import Extracted, extract_bytes, extract_fd
from .extraction._kinds import check_kind, kind_for
from .redaction._names import redact_name
from .redaction._redactor import redact
from .store._group import EmbedBatcher, GroupCommitter, Vector
from .store._rows import ChunkRow, DocumentRow, PendingWrite, SourceRow

_log = structlog.get_logger("llamad.retrieval")

def content_hash(text: str) -> str:
    """The SHA-256 of ``text`` (UTF-8), in hex: chunk identity for the embedding cache."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _document_of(write: PendingWrite) -> str:
    """A pending write's key for the group committer: its document's versions are never
    in two batches under way at once."""
    return write.doc.id


class Ingest:
    """The ingest pipeline over a store backend (:mod:`retrieval._interface`)."""

    def __init__(self, indexes: StoreBackend, embedder: EmbedderProvider,
                 limits: RetrievalLimits, *, on_other_model: Callable[[], object]) -> None:
        """Args:
            on_other_model: called when a commit brings vectors of another model than
                the index's (it starts the background re-embedding).
        """
        self._indexes = indexes
        self._embedder = embedder
        self.limits = limits
        self._on_other_model = on_other_model
        # Documents being processed: their state is shown from here (SQLite keeps the
        # last committed version, which a crash mid-processing must leave as it was).
        self.inflight: dict[str, DocumentRow] = {}
        self.review = Review(indexes, self.index, self.processing)
        self._batcher: EmbedBatcher | None = None
        self._batcher_model = ""
        self.committer: GroupCommitter[PendingWrite, DocumentRow] = GroupCommitter(
            self._commit_batch, indexes.write, max_batch=limits.max_commit_batch,
            in_flight=indexes.commits_in_flight, key=_document_of)

    async def close(self) -> None:
        """Wait for the commits under way (none is cut short) and those queued."""
        await self.committer.close()

    # -- documents ---------------------------------------------------------------------

    async def upsert(self, source_id: str, title: str, text: str, *, doc_id: str | None = None,
                     kind: str = "text", category: str = "", tags: Sequence[str] = (),
                     path: str = "", mtime_ns: int = 0, size: int = 0,
                     document_date: int | None = None,
                     received_at: int | None = None,
                     review: bool = False, redacted: int | None = None) -> DocumentRow:
        """Index a document (replacing its previous version atomically), or hold it for
        review (``review``, or its source requires it); see
        :meth:`retrieval.Retriever.upsert`. ``redacted``: the text was redacted before
        (a journalled push, :mod:`retrieval._later`), replacing that many secrets; its
        size was checked then (placeholders can lengthen it)."""
        limits = self.limits
        store = self._indexes.require()
        source = await self.check(source_id, text, kind, sized=redacted is None)
        doc_id = validate_document_id(
            doc_id or f"{source_id}/{content_hash(title + chr(0) + text)[:16]}")
        # Redaction and chunking are CPU work linear in the text (a 20 MB push is seconds):
        # they run in a thread, so the event loop keeps serving other calls meanwhile.
        cleaned = await asyncio.to_thread(redact, text, hostnames=limits.redact_hostnames,
                                          ips=limits.redact_ips)
        clean_title = redact(title).text[:500]
        digest = content_hash(clean_title + "\x00" + cleaned.text + "\x00" + kind)
        existing = await asyncio.to_thread(store.document, doc_id)
        if document_date is None and kind == "markdown":
            document_date = front_matter_date(text)
        if document_date is None and source.kind == "history":
            # A record's time is when it was first received: a re-push keeps it.
            document_date = existing.document_date if existing is not None and \
                existing.document_date is not None else \
                received_at if received_at is not None else int(time.time())
        doc = DocumentRow(
            doc_id, source_id, path, clean_title, kind, category or source.category,
            tuple(tags) or source.tags, digest, mtime_ns, size, "processing", "",
            int(time.time()), sum(cleaned.counts.values()) + (redacted or 0), document_date)
        await self._indexes.catch_up()
        if existing is not None and existing.state == "indexed" and \
                existing.content_hash == digest and existing.category == doc.category \
                and existing.tags == doc.tags and existing.document_date == document_date:
            return existing
        if review or source.review_required:
            return await self.review.hold(doc, cleaned.text)
        return await self.index(doc, cleaned.text)

    async def index(self, doc: DocumentRow, text: str) -> DocumentRow:
        """Chunk, embed and commit ``doc`` with its redacted ``text`` (replacing its
        previous version atomically), shown ``processing`` meanwhile. A failure leaves the
        document ``failed`` with the reason; its indexed version stays searchable."""
        limits = self.limits
        doc_id = doc.id
        async with self.processing(doc):
            pieces = await sized_chunks(text, doc.kind, limits, self._embedder())
            rows = [ChunkRow(f"{doc_id}#{i}", i, p.heading, p.text, content_hash(p.text))
                    for i, p in enumerate(pieces, start=1)]
            model, cached, fresh = await self._vectors_for(rows)
            indexed = await self.committer.submit(PendingWrite(doc, rows, model, cached, fresh))
        return indexed

    @contextlib.asynccontextmanager
    async def processing(self, doc: DocumentRow) -> AsyncIterator[None]:
        """Show ``doc`` as ``processing`` for the body (indexing it, or holding it for
        review); a failure leaves it ``failed`` with the reason (a full disk raised as
        :class:`StorageFull`, saying what to do)."""
        store = self._indexes.require()
        self.inflight[doc.id] = doc
        try:
            yield
        except Exception as exc:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(store.set_state, doc, "failed", str(exc)[:500])
            if is_storage_full(exc):
                raise self._indexes.storage_full() from exc
            raise
        finally:
            if self.inflight.get(doc.id) is doc:
                del self.inflight[doc.id]

    async def check(self, source_id: str, text: str, kind: str, *,
                    sized: bool = True) -> SourceRow:
        """What refuses a document before any work: its kind, empty or oversized text
        (not ``sized``: measured before), an unknown source; returns the source.

        Raises:
            InvalidDocument, NotFound: the refusal, saying why.
        """
        store = self._indexes.require()
        check_kind(kind)
        if not text.strip():
            raise InvalidDocument("document text is empty")
        if sized and len(text) > self.limits.max_document_chars:
            raise InvalidDocument(f"document has {len(text)} characters; the limit is "
                                  f"{self.limits.max_document_chars} "
                                  "(retrieval.max_document_chars)")
        source = await asyncio.to_thread(store.source, source_id)
        if source is None:
            raise NotFound(f"no source {source_id!r}; add it first")
        return source

    async def ingest_file(self, source: SourceRow, root: SourceRoot, rel: str,
                          target: str | None = None) -> DocumentRow:
        """Extract one file of a directory source, then :meth:`upsert` it; see
        :meth:`retrieval.Retriever.ingest_file`."""
        kind = kind_for(PurePosixPath(rel))
        if kind is None:
            raise InvalidDocument(f"{display_name(rel)}: unsupported file type")
        limits = self.limits.extract

        def read() -> tuple[Extracted, os.stat_result]:
            fd = root.open_file(target or rel)
            try:
                return extract_fd(fd, display_name(str(root.path / rel)), kind, limits), \
                    os.fstat(fd)
            finally:
                os.close(fd)

        extracted, st = await asyncio.to_thread(read)
        # A secret in the file's name is kept out of its id, path and chunk ids.
        return await self.upsert(source.id, extracted.title, extracted.text,
                                 doc_id=f"{source.id}/{redact_name(rel)}", kind=extracted.kind,
                                 path=redact_name(str(root.path / rel)), mtime_ns=st.st_mtime_ns,
                                 size=st.st_size, document_date=extracted.date)

    async def ingest_bytes(self, source_id: str, name: str, data: bytes, kind: str, *,
                           title: str = "", doc_id: str | None = None, category: str = "",
                           tags: Sequence[str] = (), document_date: int | None = None,
                           received_at: int | None = None) -> DocumentRow:
        """Extract pushed bytes of ``kind``, then :meth:`upsert` them (titled ``title``,
        else as extraction found; dated ``document_date``, else as extraction found)."""
        extracted = await asyncio.to_thread(extract_bytes, data, name, kind,
                                            self.limits.extract)
        return await self.upsert(source_id, title or extracted.title, extracted.text,
                                 kind=extracted.kind, doc_id=doc_id, category=category,
                                 tags=tags, document_date=document_date if document_date
                                 is not None else extracted.date, received_at=received_at)

    # -- committing --------------------------------------------------------------------

    async def _commit_batch(self, batch: list[PendingWrite]) -> list[DocumentRow]:
        """The group committer's commit (the writer lock held when one batch is written
        at a time)."""
        indexes = self._indexes
        models = {p.model for p in batch if p.has_vectors}
        if indexes.vector_model and models - {indexes.vector_model}:
            # Vectors of another model than the index's: they stay cached (this commit
            # stores them) for the background re-embedding, and never enter this index.
            # With no index yet, the commit makes the first one.
            self._on_other_model()
        return await indexes.commit(batch)

    # -- embedding ---------------------------------------------------------------------

    async def _vectors_for(
        self, rows: Sequence[ChunkRow]
    ) -> tuple[str, dict[str, np.ndarray], dict[str, np.ndarray]]:
        """``(model, cached, fresh)`` vectors for the rows' texts: cached ones, and the
        rest embedded now (batched; at most ``embed_concurrency`` requests in flight
        across concurrent ingests). Empty when the embedding child is unavailable or
        fails: the document is then BM25-only until reindexed."""
        embedder = self._embedder()
        store = self._indexes.require()
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
