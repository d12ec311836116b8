"""The retriever: one facade over a store backend, the ingest pipeline and search.

* :mod:`retrieval._interface`: the store interface; :mod:`retrieval._backend` builds one
  of its two backends, ``embedded`` (below) and ``postgres``
  (:mod:`retrieval.postgres._indexes`, a store shared by nodes);
* :mod:`retrieval.store._indexes`: SQLite, tantivy and hnswlib, their write order, reconciliation
  at open and catch-up after a failed write (invariant 7: acknowledged writes survive a
  crash; indexes on disk are never half-written);
* :mod:`retrieval._ingest`: extract → redact → chunk → embed → group commit;
* :mod:`retrieval._backfill`: embeds in the background every chunk without a vector for
  the current embedding model (ingested while it was unavailable, or a new model);
* :mod:`retrieval.search._search`: BM25 ∥ HNSW fused by RRF, BM25-only (and saying so) whenever
  the vector side cannot answer (invariant 6).

Sources (:mod:`retrieval._retriever_sources`) are rows of the store: adding one touches
the store only; removing one removes its documents from every index.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

from ._backend import backend
from ._embedder import EmbedderLookup, EmbedderProvider
from ._ingest import Ingest, content_hash
from ._later import Later
from ._limits import RetrievalLimits
from ._retention import Retention, RetentionClock, SystemClock
from ._retriever_sources import RetrieverSources
from ._review import Review
from ._status import RetrievalStatus
from .errors import (
    NotFound,
    WrongState,
    validate_document_id,
    validate_source_id,
)
from .extraction._confine import SourceRoot
from .postgres._connect import PgOptions
from .postgres._indexes import not_supported
from .redaction._redactor import redact
from .search._search import Query, Search, SearchResult
from .store._bm25 import Filters
from .store._indexes import Indexes
from .store._rows import DocumentRow, SourceRow


class Retriever(RetrieverSources):
    """Hybrid retrieval over a directory of indexes (``root``).

    Writes are serialised by one writer lock; searches never wait for it. A coroutine
    cancelled while its step runs in a worker thread stops waiting, and the step finishes
    there: a write that reached SQLite is committed whole, never half.
    """

    def __init__(self, root: Path, embedder: EmbedderProvider,
                 limits: RetrievalLimits | None = None, *,
                 unavailable_reason: Callable[[], str] | None = None,
                 embedder_for: EmbedderLookup | None = None,
                 clock: RetentionClock | None = None,
                 postgres: PgOptions | None = None) -> None:
        """Args:
            root: the directory of the indexes (embedded store).
            embedder: gives the embedder to use now, or None (search is then BM25-only).
            limits: every limit, named.
            unavailable_reason: says why ``embedder`` gave None, for search warnings.
            embedder_for: gives an embedder of a named model when it is available: while
                the vector index is rebuilt for a new model, queries are embedded by the
                previous one through it (default: only the current embedder answers).
            clock: the time history records are dated and retention runs by (tests
                inject a manual one; default: the system's).
            postgres: use the PostgreSQL store (``retrieval.store = postgres``) instead
                of the embedded one in ``root`` (see :mod:`retrieval.postgres._indexes`).
        """
        self.root = root
        limits = limits or RetrievalLimits()
        self._embedder = embedder
        built = backend(root, postgres, embedder, limits, embedder_for)
        self._backend, self._backfill, self._embedded = built.store, built.backfill, \
            built.embedded
        self._ingest = Ingest(self._backend, embedder, limits,
                              on_other_model=self._backfill.on_other_model)
        self._later = Later(self.upsert, self._ingest.check, lambda: self.limits.max_pending,
                            journal=root / "pending", redact=lambda text: redact(
                                text, hostnames=self.limits.redact_hostnames,
                                ips=self.limits.redact_ips))
        self._search = Search(
            self._backend, embedder, limits,
            unavailable_reason=unavailable_reason or (lambda: "embedding child unavailable"),
            backfill=self._backfill, embedder_for=embedder_for)
        self._clock: RetentionClock = clock or SystemClock()
        self._retention = Retention(self._backend, self._clock, lambda: self.limits)

    @property
    def _indexes(self) -> Indexes:
        """The embedded backend (for tests and benches that look inside it).

        Raises:
            NotSupported: the store is PostgreSQL.
        """
        if self._embedded is None:
            raise not_supported("looking inside the embedded indexes")
        return self._embedded

    @property
    def store_kind(self) -> str:
        """The store backend: ``embedded`` or ``postgres``."""
        return self._backend.kind

    @property
    def limits(self) -> RetrievalLimits:
        """Every limit, named. Assigning new limits applies them to the calls that start
        afterwards (the group commit's batch size stays the one built with)."""
        return self._search.limits

    @limits.setter
    def limits(self, limits: RetrievalLimits) -> None:
        self._ingest.limits = self._search.limits = self._backfill.limits = limits

    @property
    def repaired(self) -> dict[str, int]:
        """What :meth:`open` repaired in tantivy and hnswlib (counts by kind; empty when
        the three stores agreed)."""
        return self._backend.repaired

    # -- life cycle --------------------------------------------------------------------

    async def open(self) -> None:
        """Open (or create) the stores and reconcile them. Idempotent.

        Blocks (in a worker thread) for as long as the reconciliation takes; a cancelled
        caller stops waiting, not the opening.

        Raises:
            IndexCorrupt: a store cannot be opened.
        """
        if self._backend.is_open:
            return
        await asyncio.to_thread(self._backend.open_sync)
        self._retention.start()
        await self._later.recover()  # documents accepted (wait=false) before a crash

    async def close(self) -> None:
        """Stop the background backfill, let the commits under way and queued finish,
        save the vector index and close the stores (each even if another fails)."""
        await self._retention.close()
        await self._later.close()
        await self._backfill.close()
        await self._ingest.close()
        self._search.close()
        async with self._backend.write:
            await asyncio.to_thread(self._backend.close_sync)

    async def flush(self) -> None:
        """Persist the vector index now (it is also saved on close)."""
        await self._backend.flush()

    # -- documents ---------------------------------------------------------------------

    async def upsert(self, source_id: str, title: str, text: str, *, doc_id: str | None = None,
                     kind: str = "text", category: str = "", tags: Sequence[str] = (),
                     path: str = "", mtime_ns: int = 0, size: int = 0,
                     review: bool = False, document_date: int | None = None,
                     received_at: int | None = None,
                     redacted: int | None = None) -> DocumentRow:
        """Index a document (replacing its previous version atomically).

        Its own date (``document_date``, unix seconds) is the caller's, else a Markdown
        text's front matter ``date:``, else, in a history source, when it was first
        received (``received_at``; default: now, on the retriever's clock); otherwise it
        has none.

        Returns once the document is durable in SQLite and searchable by BM25 (and by
        vectors when the embedding child is up). Unchanged content is a no-op. A caller
        cancelled once its commit has begun stops waiting; the commit is not abandoned.

        A new version that fails (here, or its file's extraction in a scan) does not
        withdraw the old one: the last indexed version stays searchable, and the document
        shows state ``failed`` with the reason, its hash, size and mtime still the indexed
        version's, so the next scan or upsert tries again. A refused one (``InvalidDocument``)
        changes nothing at all.

        With ``review`` (or when the source requires review) the document is checked and
        redacted, then held in state ``review_required``: neither chunked nor embedded nor
        searchable until :meth:`approve`; a version indexed before stays searchable
        meanwhile. See :mod:`retrieval._review`.

        ``redacted`` (a journalled ``wait=false`` push, :mod:`retrieval._later`): the
        text and title were redacted when accepted, replacing that many secrets (counted
        in the document's redactions); its size was checked then.

        Raises:
            InvalidDocument: bad ids, kind, or empty or oversized text.
            NotFound: unknown source.
            StorageFull: the disk holding the indexes is full.
        """
        return await self._ingest.upsert(
            source_id, title, text, doc_id=doc_id, kind=kind, category=category, tags=tags,
            path=path, mtime_ns=mtime_ns, size=size, review=review,
            document_date=document_date, redacted=redacted,
            received_at=int(self._clock.wall()) if received_at is None else received_at)

    async def upsert_later(self, source_id: str, title: str, text: str, *,
                           doc_id: str | None = None, kind: str = "text", category: str = "",
                           tags: Sequence[str] = (), review: bool = False,
                           document_date: int | None = None) -> DocumentRow:
        """Accept a document now and index it in the background (see
        :mod:`retrieval._later`): it is returned in state ``pending``; :meth:`document`
        then shows ``processing``, then ``indexed`` (``review_required`` with ``review``
        or a source requiring it) or ``failed`` with the reason.

        Raises:
            InvalidDocument: bad id or kind, empty or oversized text (checked now).
            NotFound: unknown source.
            Busy: ``max_pending`` documents already wait.
        """
        self._backend.require()
        return await self._later.accept(
            source_id, title, text,
            doc_id=doc_id or f"{source_id}/{content_hash(title + chr(0) + text)[:16]}",
            kind=kind, category=category, tags=tags, review=review,
            document_date=document_date, received_at=int(self._clock.wall()))

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

        Raises:
            InvalidDocument: an unsupported file type, or as :meth:`upsert`.
            ExtractionError: the file cannot be turned into text.
        """
        return await self._ingest.ingest_file(source, root, rel, target)

    async def ingest_bytes(self, source_id: str, name: str, data: bytes, kind: str, *,
                           title: str = "", doc_id: str | None = None, category: str = "",
                           tags: Sequence[str] = (), document_date: int | None = None
                           ) -> DocumentRow:
        """Extract pushed bytes of ``kind`` (named ``name`` in messages), then
        :meth:`upsert` them (titled ``title``, else as extraction found; dated
        ``document_date``, else as extraction found).

        Raises:
            ExtractionError: the bytes cannot be turned into text.
            InvalidDocument, NotFound: as :meth:`upsert`.
        """
        return await self._ingest.ingest_bytes(source_id, name, data, kind, title=title,
                                               doc_id=doc_id, category=category, tags=tags,
                                               document_date=document_date,
                                               received_at=int(self._clock.wall()))

    async def delete(self, doc_id: str) -> bool:
        """Remove a document; False if it did not exist."""
        return await self._backend.delete_document(doc_id)

    async def document(self, doc_id: str) -> DocumentRow | None:
        """A document (state ``processing`` while an upsert of it runs; one awaiting
        review shows the version held, its ``indexed_at`` the searchable version's)."""
        store = self._backend.require()
        current = self._ingest.inflight.get(doc_id) or self._later.pending.get(doc_id)
        if current is not None:
            return current
        row = await asyncio.to_thread(store.document, doc_id)
        if row is not None and row.state == "review_required":
            return await asyncio.to_thread(store.held_version, doc_id) or row
        return row

    async def review_texts(self, doc_id: str) -> tuple[str | None, str]:
        """The text held for review of ``doc_id`` (None: none is held) and the text of
        its searchable version, as its chunks say it in order ("" when none is indexed):
        what a reviewer compares."""
        store = self._backend.require()
        held = await asyncio.to_thread(store.held_document, doc_id)
        keys = await asyncio.to_thread(store.document_chunk_keys, doc_id)
        chunks = await asyncio.to_thread(store.chunks_by_keys, keys) if keys else {}
        ordered = sorted(chunks.values(), key=lambda c: c.ordinal)
        return (None if held is None else held[1]), "\n".join(c.text for c in ordered)

    async def documents(self, source_id: str | None = None,
                        states: Sequence[str] = ()) -> list[DocumentRow]:
        """Documents by id (of one source; in one of ``states`` when given), those being
        processed included, those awaiting review as :meth:`document` shows them."""
        store = self._backend.require()
        rows = {d.id: d for d in await asyncio.to_thread(store.documents, source_id)}
        if any(d.state == "review_required" for d in rows.values()):
            rows.update(await asyncio.to_thread(store.held_documents, source_id))
        for doc_id, doc in [*self._later.pending.items(), *self._ingest.inflight.items()]:
            if source_id is None or doc.source_id == source_id:
                rows[doc_id] = doc
        return [rows[k] for k in sorted(rows) if not states or rows[k].state in states]

    async def document_counts(self) -> dict[str, int]:
        """Documents per source id, as :meth:`documents` lists them (those being processed
        or journalled and not stored yet included), without reading them: the database
        counts every other document, in one statement, and those under way (a few,
        however large the corpus) count by their new version's source. A source without
        documents is left out."""
        store = self._backend.require()
        under_way = {**self._later.pending, **self._ingest.inflight}
        counts = await asyncio.to_thread(store.document_counts, list(under_way))
        for doc in under_way.values():
            counts[doc.source_id] = counts.get(doc.source_id, 0) + 1
        return counts

    # -- review ------------------------------------------------------------------------

    async def approve(self, doc_id: str, note: str = "") -> DocumentRow:
        """Index exactly the version of a document held for review (even if its file
        changed since), as an upsert would; returns it ``indexed`` with ``note`` (or
        ``failed`` with the reason). See :mod:`retrieval._review`.

        Raises:
            NotFound: no such document.
            WrongState: the document does not await review (its state is named).
            InvalidDocument: a malformed id, a note over ``MAX_NOTE_CHARS``.
            StorageFull: the disk holding the indexes is full.
        """
        review = self._review()
        await self._awaiting_review(doc_id)
        return await review.approve(doc_id, note)

    async def reject(self, doc_id: str, note: str = "") -> DocumentRow:
        """Reject the version of a document held for review: it leaves every index (a
        version approved before too), its held text is dropped, and it shows
        ``rejected`` with ``note`` until its content changes.

        Raises:
            NotFound, WrongState, InvalidDocument: as :meth:`approve`.
        """
        review = self._review()
        await self._awaiting_review(doc_id)
        return await review.reject(doc_id, note)

    def _review(self) -> Review:
        """The review of documents."""
        return self._ingest.review

    async def _awaiting_review(self, doc_id: str) -> None:
        """Refuse a review of a document that does not await one (one pending or being
        processed included: its new version is not held yet)."""
        validate_document_id(doc_id)
        current = await self.document(doc_id)
        if current is None:
            raise NotFound(f"no document {doc_id!r}")
        if current.state != "review_required":
            raise WrongState(f"document {doc_id!r} is {current.state}, not review_required: "
                             "only a document awaiting review can be approved or rejected")

    # -- search ------------------------------------------------------------------------

    async def search(self, query: str, *, k: int | None = None,
                     filters: Filters | None = None, options: Query | None = None
                     ) -> SearchResult:
        """BM25 top-N ∥ HNSW top-N, fused by (weighted) RRF; top ``k`` hits (above
        ``retrieval.max_k``: clamped, with a warning). ``options`` chooses the mode, a
        score floor, the candidates, the weights and grouping by document (see
        :class:`retrieval.Query`).

        A hybrid search is BM25-only, with a warning saying why, whenever the vector side
        cannot answer; the query embedding is bounded by
        ``retrieval.query_embed_timeout``.

        Raises:
            InvalidDocument: empty or oversized query, k below 1, bad options.
            VectorUnavailable: a vector-mode search that cannot run now.
        """
        return await self._search.search(query, k=k, filters=filters, options=options)

    async def chunk_ids(self, keys: Sequence[int]) -> dict[int, str]:
        """Chunk key -> chunk id, for the keys of a :attr:`SearchResult.fused` list."""
        store = self._backend.require()
        return await asyncio.to_thread(store.chunk_ids, keys)

    # -- vectors for every chunk -------------------------------------------------------

    def backfill(self, *, retry_failed: bool = False) -> bool:
        """Start embedding, in the background, every chunk without a vector for the
        current embedding model (unless a run is under way, nothing is missing or no
        embedder is available); True if a run started. See :mod:`retrieval._backfill`.

        Args:
            retry_failed: embed again the texts the model refused before.
        """
        self._backend.require()
        return self._backfill.start(retry_failed=retry_failed)

    async def backfill_soon(self) -> bool:
        """:meth:`backfill`, its check for chunks without a vector run in a worker thread
        (on a large PostgreSQL corpus it reads every chunk's key): the event loop does
        not wait for it. True if a run started."""
        self._backend.require()
        needed = await asyncio.to_thread(self._backfill.needed)
        return self._backfill.start(needed=needed) if needed else False

    async def reprocess(self, *, document_id: str = "", source_id: str = "") -> tuple[int, str]:
        """Embed now, in the background, the chunks without a vector of the current
        embedding model: one document's, one source's, or (neither given) all; the texts
        the model refused before are tried again. Returns how many chunks the run will
        embed (0 when none is started) and, when none is, why.

        On the PostgreSQL store, on a node whose embedding model is not the shared
        corpus's, it asks for the corpus to be switched to this node's model: every chunk
        is embedded (whatever the scope), and the corpus's model answers searches until
        then (see :mod:`retrieval.postgres._backfill`).

        Raises:
            NotFound: an unknown document or source.
            InvalidDocument: a malformed id.
        """
        store = self._backend.require()
        if document_id:
            validate_document_id(document_id)
            if await asyncio.to_thread(store.document, document_id) is None:
                raise NotFound(f"no document {document_id!r}")
            scope: set[int] | None = await asyncio.to_thread(
                store.document_chunk_keys, document_id)
        elif source_id:
            validate_source_id(source_id)
            if source_id not in {s.id for s in await asyncio.to_thread(store.sources)}:
                raise NotFound(f"no source {source_id!r}")
            scope = await asyncio.to_thread(store.keys_matching, sources=[source_id])
        else:
            scope = None
        if self._embedder() is None:
            return 0, "no embedding model is available now; the backfill runs once it is"
        if self._backfill.running:
            return 0, "a backfill is under way; it embeds these chunks too"
        wanted = await asyncio.to_thread(
            lambda: self._backfill.missing(scope if scope is not None else store.chunk_keys()))
        if not wanted:
            return 0, "every chunk has a vector of the current embedding model"
        if not self._backfill.start(retry_failed=True, only=wanted):
            return 0, "a backfill of this embedding model is under way on another node"
        return len(wanted), ""

    # -- history retention -------------------------------------------------------------

    async def prune(self) -> int:
        """One retention pass now (the background task runs one every
        ``retrieval.retention_interval``); return the records it removed."""
        return await self._retention.run_once()

    @property
    def pruned(self) -> int:
        """History records removed by retention since this retriever was built."""
        return self._retention.pruned

    @property
    def retention(self) -> Retention:
        """The retention task and its counters (for tests and status)."""
        return self._retention

    @property
    def backfill_task(self) -> asyncio.Task[None] | None:
        """The backfill run, if one was started (for waiting on it)."""
        return self._backfill.task

    # -- status ------------------------------------------------------------------------

    async def status(self) -> RetrievalStatus:
        """Sources, chunks, documents by state (those being processed included), the
        vector index's model and size, chunks embedded for the current embedding model
        (else the index's), disk use, what the last open repaired, the backfill and the
        rebuild for a new embedding model (with the model still serving meanwhile).

        Raises:
            RetrievalError: retrieval is not open.
        """
        self._backend.require()
        embedder = self._embedder()
        model = embedder.model_id if embedder is not None else self._backend.vector_model
        status = await self._backend.status(model, processing=len(self._ingest.inflight),
                                            pending=len(self._later.pending.keys()
                                                        - self._ingest.inflight.keys()))
        return dataclasses.replace(status, backfill=self._backfill.status,
                                   rebuild=self._backfill.rebuild(status.chunks,
                                                                  status.embedded_chunks))
