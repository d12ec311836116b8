"""Documents of the knowledge base, free of any wire: push (text, or a file's bytes with
its media type), get, delete, list, review (approve, reject) and reprocess.

The HTTP API's knowledge-base routes (:mod:`daemon.httpapi._kb`) adapt these; gRPC's
RetrievalService has the same semantics (:mod:`daemon.grpcapi.retrieval`). A bad argument
is :class:`~daemon.errors.InvalidArgument` naming its field as the request does
(``content_type``, ``text``, ``id``, ``document_id``...).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from retrieval import (
    DocumentRow,
    InvalidDocument,
    NotFound,
    Retriever,
    extract_bytes,
    validate_document_id,
)

from ..errors import InvalidArgument

CONTENT_TYPES = {
    "application/pdf": "pdf", "text/html": "html", "application/xhtml+xml": "html",
    "text/markdown": "markdown", "text/plain": "text", "application/json": "json",
    "application/yaml": "yaml", "text/yaml": "yaml", "application/toml": "toml",
    "text/x-shellscript": "shell", "application/x-sh": "shell", "text/x-python": "python"}
"""The media types a pushed document's bytes may have, and the kind each is read as (as
gRPC's UpsertDocument takes them)."""

STATES = ("pending", "processing", "indexed", "failed", "review_required", "rejected")
"""A document's states, as the retriever names them."""


@dataclass(frozen=True)
class Push:
    """A document to index: its text, or a file's bytes (``content``) with their media
    type; the rest as gRPC's UpsertDocumentRequest carries it."""

    source_id: str
    id: str = ""
    title: str = ""
    text: str = ""
    content: bytes = b""
    content_type: str = ""
    kind: str = ""
    category: str = ""
    tags: tuple[str, ...] = ()
    review: bool = False
    document_date: int | None = None
    """Unix seconds (None: what the document's metadata says, if anything)."""
    wait: bool = True
    """Return once indexed (False: once accepted, state ``pending``)."""


def check_id(doc_id: str, field: str = "id") -> str:
    """``doc_id`` if a document can have it.

    Raises:
        InvalidArgument: naming ``field``, saying which rule the id breaks.
    """
    try:
        return validate_document_id(doc_id)
    except InvalidDocument as exc:
        raise InvalidArgument(str(exc), field=field) from None


def media_kind(content_type: str) -> str:
    """The document kind of a media type (parameters such as ``charset`` ignored).

    Raises:
        InvalidArgument: a media type the knowledge base does not read (content_type).
    """
    media = content_type.split(";", maxsplit=1)[0].strip().lower()
    if media not in CONTENT_TYPES:
        raise InvalidArgument(f"content_type {content_type[:100]!r} is not one of "
                              f"{', '.join(sorted(CONTENT_TYPES))}", field="content_type")
    return CONTENT_TYPES[media]


async def push(retriever: Retriever, doc: Push) -> DocumentRow:
    """Index ``doc`` (or queue it, ``wait`` False); its row as stored.

    Pushed text is indexed as it is (NULs dropped, as from files); HTML, and a file's
    bytes, are extracted as such a file would be (with the date their metadata carries
    unless the caller gave one). Cancelling the call while ``wait`` may leave the
    document indexed: an upsert is acknowledged only by its answer.

    Raises:
        InvalidArgument: text and content both given, an unknown media type, a bad id.
    """
    if doc.id:
        check_id(doc.id)  # before the work, not after
    if doc.content and doc.text:
        raise InvalidArgument("give text or content, not both", field="content")
    kind = media_kind(doc.content_type) if doc.content and doc.content_type \
        else (doc.kind or "text")
    # NULs go, as they do from files: no store, index or prompt should carry them.
    title, text = doc.title.replace("\x00", ""), doc.text.replace("\x00", "")
    date = doc.document_date
    if doc.content or kind == "html":
        extracted = await asyncio.to_thread(
            extract_bytes, doc.content or text.encode("utf-8"),
            doc.id or title or "document", kind, retriever.limits.extract)
        title, text, kind = title or extracted.title, extracted.text, extracted.kind
        date = extracted.date if date is None else date
    upsert = retriever.upsert if doc.wait else retriever.upsert_later
    return await upsert(doc.source_id, title, text, doc_id=doc.id or None, kind=kind,
                        category=doc.category, tags=doc.tags, review=doc.review,
                        document_date=date)


async def get(retriever: Retriever, doc_id: str) -> DocumentRow:
    """The document ``doc_id``.

    Raises:
        InvalidArgument: an id no document can have (id).
        NotFound: no such document.
    """
    check_id(doc_id)
    row = await retriever.document(doc_id)
    if row is None:
        raise NotFound(f"no document {doc_id!r}")
    return row


async def delete(retriever: Retriever, doc_id: str) -> bool:
    """Remove the document ``doc_id`` and its chunks; whether it existed.

    Raises:
        InvalidArgument: an id no document can have (id).
    """
    check_id(doc_id)
    return await retriever.delete(doc_id)


async def listed(retriever: Retriever, source_id: str = "",
                 states: tuple[str, ...] = ()) -> list[DocumentRow]:
    """The documents of ``source_id`` (empty: every source) in ``states`` (empty: any)."""
    return list(await retriever.documents(source_id or None, states))


async def review(retriever: Retriever, doc_id: str, note: str = "", *,
                 approve: bool) -> DocumentRow:
    """Decide on a document held for review: approved, it is indexed; rejected, it is
    kept but never indexed (``note``: why, kept on it either way).

    Raises:
        InvalidArgument: an id no document can have (id).
        NotFound: no such document.
        FailedPrecondition: it is not held for review.
    """
    check_id(doc_id)
    decide = retriever.approve if approve else retriever.reject
    return await decide(doc_id, note)


async def reprocess(retriever: Retriever, *, document_id: str = "",
                    source_id: str = "") -> tuple[int, str]:
    """Embed now, in the background, the chunks without a vector of the current embedding
    model: one document's, one source's, or every one (neither given); returns how many
    chunks the run takes and, when none, why (:meth:`retrieval.Retriever.reprocess`).

    Raises:
        InvalidArgument: both given (source_id), or a bad document id (document_id).
    """
    if document_id and source_id:
        raise InvalidArgument("give document_id or source_id, not both", field="source_id")
    if document_id:
        check_id(document_id, "document_id")
    return await retriever.reprocess(document_id=document_id, source_id=source_id)
