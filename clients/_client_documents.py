"""The blocking client's calls about your documents: RetrievalService (sources, documents,
search) and AnswerService (grounded answers); :class:`clients.Client` inherits them."""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import datetime
from typing import Unpack

from llamad_protocol.v1 import retrieval_pb2

from . import _convert as cv
from . import _requests as rq
from ._base import SyncBase
from ._channel import DEFAULT, Timeout
from ._stream import AskStream, Stream
from ._types import (
    Document,
    DocumentState,
    ReindexProgress,
    Reprocessed,
    RetrievalStatus,
    SearchResult,
    Source,
)


class DocumentCalls(SyncBase):
    """:class:`clients.Client`'s RetrievalService and AnswerService calls (its base)."""

    # --- RetrievalService -----------------------------------------------------------------

    def search(
        self, query: str, *, timeout: Timeout = DEFAULT, **options: Unpack[rq.SearchOptions]
    ) -> SearchResult:
        """Hybrid search (BM25 and vectors fused; BM25 only without embeddings).

        Args:
            top_k: hits to return (0: the daemon's default, 5; above its maximum,
                clamped, with a warning).
            sources, kinds, categories, tags: keep only hits matching any of each
                (tags: any of them).
            indexed_since, indexed_until: keep hits indexed within this window.
            mode: ``hybrid``, ``text`` (BM25 only) or ``vector`` (vectors only; refused
                when they cannot answer, never degraded).
            min_score: drop hits whose ``score`` (the fused score normalised to [0, 1];
                the cosine similarity in vector mode) is below it.
            candidates: candidates each index contributes (0: the daemon's default).
            text_weight, vector_weight: the lists' weights in the fusion.
            group_by_document: one hit per document, fused per document (its other
                candidate chunks in ``other_chunk_ids``).
            fusion: ``rrf``, ``dbsf`` or ``convex`` ("": the daemon's
                ``retrieval.fusion``).
            dated_since, dated_until: keep hits whose document's own date
                (``document_date``) is within this window; documents without a date are
                left out once either is set.

        Raises:
            InvalidArgument: an empty or oversized query, bad options.
            FailedPrecondition: a vector search that cannot run now.

        Example:
            >>> for hit in Client().search("disk full web01").hits:          # doctest: +SKIP
            ...     print(hit.chunk_id, hit.title, round(hit.fused_score, 3))
        """
        request = rq.search(query, **options)
        return cv.search_result(self._unary(self._retrieval.Search, request, timeout))

    def upsert_document(
        self, source_id: str, text: str = "", *, timeout: Timeout = DEFAULT,
        **options: Unpack[rq.UpsertOptions],
    ) -> Document:
        """Index a document of a push source, replacing its previous version atomically;
        returns once it is durable and searchable. Idempotent.

        Args:
            source_id: a push source (see :meth:`add_source` without a path).
            document_id: your id for it; empty derives one from the content.
            kind: ``markdown``, ``text``, ``html``, ``config``, ``yaml``, ``json``,
                ``toml``, ``shell``, ``python`` or ``session`` (a shell transcript:
                commands with their output); chunked by its structure.
            content, content_type: the document as a file's bytes instead of ``text`` (a
                PDF: ``application/pdf``; ``text/html``, ``text/markdown``,
                ``text/plain``, ``application/json``, ``application/yaml``,
                ``application/toml``, ``text/x-shellscript``, ``text/x-python``...),
                extracted as such a file would be.
            wait: False returns at once with the document ``pending`` (checked, not yet
                indexed); :meth:`get_document` then shows its state.
            review: hold it for review (state ``review_required``: stored, not searchable)
                until :meth:`approve_document`, even if its source does not require
                review (one that does holds every document).
            document_date: the document's own date (a history record's time; default:
                what its content says, if anything: front matter, ``<meta>``, PDF
                metadata; in a history source, when the daemon receives it).

        Example:
            >>> llamad = Client()                                             # doctest: +SKIP
            >>> llamad.add_source("notes")                                    # doctest: +SKIP
            >>> doc = llamad.upsert_document("notes", "web01 disk is full",   # doctest: +SKIP
            ...                              title="web01")
        """
        request = rq.upsert_document(source_id, text, **options)
        resp = self._unary(self._retrieval.UpsertDocument, request, timeout)
        return cv.document(resp.document)

    def delete_document(self, document_id: str, *, timeout: Timeout = DEFAULT) -> bool:
        """Delete a document; return whether it existed."""
        request = retrieval_pb2.DeleteDocumentRequest(id=document_id)
        return bool(self._unary(self._retrieval.DeleteDocument, request, timeout).deleted)

    def get_document(self, document_id: str, *, timeout: Timeout = DEFAULT) -> Document:
        """A document's metadata and pipeline state.

        Raises:
            NotFound: no document with this id.
        """
        request = retrieval_pb2.GetDocumentRequest(id=document_id)
        return cv.document(self._unary(self._retrieval.GetDocument, request, timeout))

    def list_documents(self, source_id: str = "", *, states: Sequence[DocumentState] = (),
                       timeout: Timeout = DEFAULT) -> list[Document]:
        """Every document of a source (or of every source); with ``states``, only those
        in one of them (``["review_required"]``: the documents awaiting review)."""
        request = retrieval_pb2.ListDocumentsRequest(
            source_id=source_id, states=cv.document_state_enums(states))
        resp = self._unary(self._retrieval.ListDocuments, request, timeout)
        return [cv.document(d) for d in resp.documents]

    def approve_document(self, document_id: str, note: str = "", *,
                         timeout: Timeout = DEFAULT) -> Document:
        """Approve a document awaiting review (admin): exactly the version held is
        indexed (even if its file changed since) and returned ``indexed``, or ``failed``
        with the reason; ``note`` is kept on it.

        Raises:
            NotFound: no such document.
            FailedPrecondition: it does not await review (the message names its state).
            PermissionDenied: the token is not an admin's.
        """
        request = retrieval_pb2.ReviewDocumentRequest(id=document_id, note=note)
        return cv.document(self._unary(self._retrieval.ApproveDocument, request, timeout))

    def reject_document(self, document_id: str, note: str = "", *,
                        timeout: Timeout = DEFAULT) -> Document:
        """Reject a document awaiting review (admin): it leaves search (a version
        approved before too) and stays ``rejected``, with ``note``, until its content
        changes (a changed version goes back to review).

        Raises:
            NotFound, FailedPrecondition, PermissionDenied: as :meth:`approve_document`.
        """
        request = retrieval_pb2.ReviewDocumentRequest(id=document_id, note=note)
        return cv.document(self._unary(self._retrieval.RejectDocument, request, timeout))

    def add_source(self, source_id: str, path: str | os.PathLike[str] = "", *,
                   category: str = "", tags: Sequence[str] = (),
                   review_required: bool = False, history: bool = False,
                   max_age_days: int = 0, max_items: int = 0,
                   exclude: Sequence[str] = (),
                   timeout: Timeout = DEFAULT) -> Source:
        """Add (or update) a source: a directory to scan, or without ``path`` a source of
        pushed documents (with ``history``: of time-ordered records, such as shell
        sessions pushed with kind ``session``). Call :meth:`reindex` to scan a directory.

        Args:
            path: absolute path of a directory on the daemon's machine.
            review_required: every new or changed document waits in
                ``review_required`` until :meth:`approve_document`; adding the source
                again turns it on or off (documents indexed already stay indexed).
            history, max_age_days, max_items: a history source (no ``path``): its
                records are deleted in the background once older than ``max_age_days``
                or beyond the newest ``max_items`` (0: unlimited).
            exclude: a directory source's gitignore-style patterns (``private/``,
                ``*.bak``, ``/drafts``, ``!keep.pem``) of files and directories its scans
                leave out, after the daemon's built-in key and credential defaults;
                adding the source again replaces them.

        Example:
            >>> from clients import Client
            >>> llamad = Client()
            >>> llamad.add_source("runbooks", "/srv/runbooks")        # doctest: +SKIP
            >>> progress = list(llamad.reindex("runbooks"))          # doctest: +SKIP
        """
        request = rq.add_source(source_id, path, category=category, tags=tags,
                                review_required=review_required, history=history,
                                max_age_days=max_age_days, max_items=max_items,
                                exclude=exclude)
        return cv.source(self._unary(self._retrieval.AddSource, request, timeout))

    def remove_source(self, source_id: str, *, timeout: Timeout = DEFAULT) -> int:
        """Remove a source and its documents; return how many chunks were removed."""
        request = retrieval_pb2.RemoveSourceRequest(id=source_id)
        resp = self._unary(self._retrieval.RemoveSource, request, timeout)
        return int(resp.chunks_removed)

    def list_sources(self, *, timeout: Timeout = DEFAULT) -> list[Source]:
        """Every source, with its document count and last scan."""
        resp = self._unary(self._retrieval.ListSources, retrieval_pb2.ListSourcesRequest(),
                           timeout)
        return [cv.source(s) for s in resp.sources]

    def set_source_disabled(self, source_id: str, disabled: bool = True, *,
                            timeout: Timeout = DEFAULT) -> Source:
        """Disable a source (its documents are kept, but neither searched nor rescanned),
        or with ``disabled=False`` enable it again.

        Raises:
            NotFound: unknown source.
        """
        request = retrieval_pb2.SetSourceDisabledRequest(id=source_id, disabled=disabled)
        return cv.source(self._unary(self._retrieval.SetSourceDisabled, request, timeout))

    def reindex(self, source_id: str = "", *, since: datetime | None = None,
                timeout: Timeout = DEFAULT) -> Stream[ReindexProgress]:
        """Rescan directory sources (all, or one) incrementally, streaming progress: at
        most two messages a second per source, then one with ``done`` set. With
        ``since``, only the files modified since then are read again (even when their
        size and mtime match the index); older ones are left as they are.

        Raises:
            InvalidArgument: ``source_id`` is not a directory source.
        """
        request = retrieval_pb2.ReindexRequest(source_id=source_id,
                                               since=cv.timestamp(since))
        return Stream(self._call(self._retrieval.Reindex, request, timeout),
                      cv.reindex_progress)

    def retrieval_status(self, *, timeout: Timeout = DEFAULT) -> RetrievalStatus:
        """Sizes of the retrieval index: sources, documents by state, chunks, vectors,
        and the background embedding of chunks without vectors."""
        resp = self._unary(self._retrieval.Status, retrieval_pb2.RetrievalStatusRequest(),
                           timeout)
        return cv.retrieval_status(resp)

    def reprocess(self, *, document_id: str = "", source_id: str = "",
                  timeout: Timeout = DEFAULT) -> Reprocessed:
        """Embed, in the background, the chunks without a vector of the current embedding
        model: one document's, one source's, or all (neither given); the texts the model
        refused before are tried again. Progress is in :meth:`retrieval_status`.

        Raises:
            NotFound: an unknown document or source.
            InvalidArgument: both ids given, or a malformed one.
        """
        request = retrieval_pb2.ReprocessRequest(document_id=document_id, source_id=source_id)
        return cv.reprocessed(self._unary(self._retrieval.Reprocess, request, timeout))

    # --- AnswerService --------------------------------------------------------------------

    def ask(
        self, question: str, *, timeout: Timeout = DEFAULT, **options: Unpack[rq.AskOptions]
    ) -> AskStream:
        """A grounded answer about your documents, streamed, with its sources.

        The stream yields :class:`~clients.AskText` events as the answer is generated,
        then one :class:`~clients.AskSources` (citations ``S1``..``Sn`` in rank order),
        then one :class:`~clients.AskDone` (usage, prompt SHA-256, cache, mode).

        Args:
            top_k: sources to retrieve (0: the daemon's default, 5).
            history: recent conversation turns, oldest first.
            task: ``answer``, ``explain_output``, ``diagnose`` or ``summarize``.
            attachment: text the question is about (e.g. a command's output).
            no_cache: skip the daemon's response cache.
            model: the catalog name or an alias of the generation model that answers
                (empty: the default); ``AskDone.model_name`` says which did.
            mode: how the sources are searched (see :meth:`search`).
            dated_since, dated_until: only sources whose document's own date is within
                this window (see :meth:`search`).
            dry_run: generate nothing: the stream yields an :class:`~clients.AskPlan`
                (every hit and whether it was kept, the prompt's sections, redacted, and
                its tokens) instead of text, then the sources and done.

        Raises:
            OutOfRange: the question, template and task cannot fit the context.

        Example:
            >>> from clients import Client
            >>> llamad = Client()
            >>> result = llamad.ask("Fix disk full on web01?").collect()  # doctest: +SKIP
            >>> print(result.answer)                                      # doctest: +SKIP
            >>> for c in result.citations:                                # doctest: +SKIP
            ...     print(f"[{c.label}] {c.title} — {c.path}")
        """
        request = rq.ask(question, **options)
        return AskStream(self._call(self._answer.Ask, request, timeout), cv.ask_event)
