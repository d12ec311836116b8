"""Errors raised by the retrieval core, and the source and document id rules.

The tree::

    RetrievalError
    ├── InvalidDocument      bad id, empty text, unsupported type, too large (clear reason)
    ├── ExtractionError      a file could not be turned into text; attrs: reason, kind
    │                        (binary, encoding, too_large, not_regular, timeout,
    │                        resource_limit, worker_failed, pdf_malformed, pdf_encrypted,
    │                        pdf_image_only, html_too_deep, unreadable, hard_link,
    │                        outside_root)
    ├── NotFound             unknown source or document
    ├── WrongState           a document not in the state the call needs (approving one
    │                        not awaiting review); the message names its state
    ├── SourceNotAllowed     a directory source outside the allowed roots (or none set)
    ├── SourceChanged        a directory source's root changed or vanished during a scan
    ├── StorageFull          the disk (or quota) holding the indexes is full
    ├── IndexCorrupt         a store could not be opened or repaired
    ├── SchemaTooNew         a PostgreSQL store migrated by a newer llamad
    ├── StoreUnavailable     the PostgreSQL store cannot be reached, logged into, or lacks
    │                        pgvector (the message names the server, never the password)
    ├── EmbeddingModelMismatch  this node's embedding model is not the shared corpus's
    └── NotSupported         something the configured store backend cannot do (looking
                             inside the embedded indexes on PostgreSQL); names the backend

None of these import or know about gRPC; the daemon maps them to status codes
(``InvalidDocument`` and ``ExtractionError`` to INVALID_ARGUMENT, ``NotFound`` to NOT_FOUND,
``WrongState`` to FAILED_PRECONDITION, ``SourceNotAllowed`` to PERMISSION_DENIED, or
FAILED_PRECONDITION when no root is configured; ``SourceChanged`` to FAILED_PRECONDITION;
``StorageFull`` to RESOURCE_EXHAUSTED; ``IndexCorrupt`` to INTERNAL with its message).
:func:`is_storage_full` recognises a full disk in any error (SQLite's, tantivy's, an
``OSError``), for the paths that do not raise ``StorageFull``.
Every message is one line that can be shown to the caller as is: it names the document and
says what is wrong, never a traceback.
"""

from __future__ import annotations

import errno
import re
import sqlite3
import unicodedata
from typing import Generic, TypeVar

MAX_DOCUMENT_ID_CHARS = 512
"""Longest valid document id, in characters (docs/retrieval.md, "Identifiers")."""

_SOURCE_ID = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")


class RetrievalError(Exception):
    """Base of every error raised by ``retrieval``.

    Attributes:
        reason: the one-line message (also ``str(error)``).
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class InvalidDocument(RetrievalError):
    """The caller handed over something that cannot become a document.

    A bad id, empty text, an unsupported file type, a document over the size limit.
    Permanent: retrying the same input cannot help.

    Attributes:
        field: the argument at fault as the call names it (``query``, ``k``,
            ``min_score``), where one is; None otherwise. The daemon's APIs name it to
            their callers, never reading it from the message.
    """

    def __init__(self, reason: str, *, field: str | None = None) -> None:
        super().__init__(reason)
        self.field = field


class ExtractionError(RetrievalError):
    """A file could not be turned into text. Permanent for the same bytes.

    Attributes:
        reason: one line naming the file and saying what is wrong with it.
        kind: a short machine-readable cause, for metrics and for the document's error
            column: ``binary``, ``encoding``, ``too_large``, ``not_regular``, ``timeout``,
            ``resource_limit``, ``worker_failed``, ``pdf_malformed``, ``pdf_encrypted``,
            ``pdf_image_only``, ``html_too_deep``, ``unreadable``, ``hard_link``
            (refused by ``retrieval.refuse_hard_links``), ``outside_root``.
    """

    def __init__(self, reason: str, kind: str) -> None:
        self.kind = kind
        super().__init__(reason)

    def __repr__(self) -> str:
        return f"ExtractionError({self.reason!r}, kind={self.kind!r})"


class NotFound(RetrievalError):
    """An unknown source or document."""


class WrongState(RetrievalError):
    """A document is not in the state the call needs: approving or rejecting one that
    does not await review. The message names the state it is in."""


class Busy(RetrievalError):
    """Too many documents already wait to be indexed in the background: retry shortly."""


class VectorUnavailable(RetrievalError):
    """A vector search that cannot run now: no embedding model, a vector index of another
    model (being rebuilt), none yet, or the query could not be embedded. The message
    says which; a hybrid or text search still works."""


class SourceDisabled(RetrievalError):
    """A scan of a disabled source (enable it first; its documents are kept)."""


class SourceNotAllowed(RetrievalError):
    """A directory source whose path (symlinks and ``..`` resolved) is not under one of
    the allowed roots.

    Attributes:
        configured: False when no root is configured at all (directory sources are off).
    """

    def __init__(self, reason: str, *, configured: bool) -> None:
        self.configured = configured
        super().__init__(reason)


class SourceChanged(RetrievalError):
    """A directory source's root was renamed, removed or replaced (by a symlink, say)
    while it was being scanned, or cannot be resolved (a symlink loop). The scan stopped:
    nothing beneath the new path was read and no document was deleted; the message names
    the source and its root. Scan again once the root is back in place."""


class StorageFull(RetrievalError):
    """No space left (or the quota reached) where the indexes live: the write was not made
    (or, if SQLite already holds it, the derived indexes catch up on a later write).
    Documents indexed before are intact and searchable; retry once space is freed."""


class IndexCorrupt(RetrievalError):
    """A store (SQLite, tantivy or hnswlib) could not be opened or repaired."""


class SchemaTooNew(RetrievalError):
    """The PostgreSQL store's schema was migrated by a newer llamad than this one: it is
    refused rather than written with an older idea of its tables (upgrade this node)."""


class StoreUnavailable(RetrievalError):
    """The PostgreSQL store cannot be used: a malformed DSN, an unreachable server, a
    refused login, or no pgvector extension. The message names the server (never the
    password) and says what to fix; retrying helps only when the server was down."""


class EmbeddingModelMismatch(RetrievalError):
    """This node's embedding model (or its dimension) differs from the one the shared
    corpus is embedded with: its vectors would not be comparable, so none are written or
    searched. The message names both models."""


class NotSupported(RetrievalError):
    """Something the configured store backend cannot do (looking inside the embedded
    indexes with ``retrieval.store = postgres``): refused, never silently ignored. The
    message names the backend."""


_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
# How a full disk reads once SQLite or tantivy (Rust's io::Error, "os error 28") made a
# message of it.
_FULL_WORDS = ("no space left on device", "disk quota exceeded", "database or disk is full",
               "(os error 28)", "(os error 122)")


def is_storage_full(exc: BaseException) -> bool:
    """Whether ``exc``, or an error it was raised from or while handling, is a full disk
    or an exceeded quota."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, StorageFull):
            return True
        if isinstance(current, OSError) and current.errno in _FULL_ERRNOS:
            return True
        if isinstance(current, sqlite3.Error) and \
                getattr(current, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
            return True
        if any(words in str(current).lower() for words in _FULL_WORDS):
            return True
        current = current.__cause__ or current.__context__
    return False


def validate_source_id(source_id: str) -> str:
    """Check a source id (``[a-z0-9][a-z0-9_-]{0,63}``) and return it unchanged.

    Raises:
        InvalidDocument: the id breaks the rule.
    """
    if not _SOURCE_ID.fullmatch(source_id):
        raise InvalidDocument(
            f"source id {source_id!r} must be 1-64 characters of a-z, 0-9, '_' and '-', "
            "starting with a letter or digit"
        )
    return source_id


def validate_document_id(doc_id: str) -> str:
    """Check a document id against the rules of docs/retrieval.md and return it unchanged.

    Valid ids are 1..512 characters, with ``/`` separating segments, and have no control
    characters, no backslash, no leading ``/``, no empty segment (so no trailing ``/`` and
    no ``//``) and no ``..`` segment. Unpaired surrogates are refused too: they cannot be
    stored or sent as UTF-8.

    Raises:
        InvalidDocument: the id breaks a rule; the reason says which one.
    """
    if not isinstance(doc_id, str):
        raise InvalidDocument(f"document id must be a string, not {type(doc_id).__name__}")
    if not doc_id:
        raise InvalidDocument("document id is empty")
    shown = _show(doc_id)
    if len(doc_id) > MAX_DOCUMENT_ID_CHARS:
        raise InvalidDocument(
            f"document id is {len(doc_id)} characters long, the limit is "
            f"{MAX_DOCUMENT_ID_CHARS}: {shown}"
        )
    for ch in doc_id:
        category = unicodedata.category(ch)
        if category == "Cc":
            raise InvalidDocument(
                f"document id contains a control character (U+{ord(ch):04X}): {shown}"
            )
        if category == "Cs":
            raise InvalidDocument(
                f"document id contains an unpaired surrogate (U+{ord(ch):04X}): {shown}"
            )
    if "\\" in doc_id:
        raise InvalidDocument(f"document id contains a backslash (use '/'): {shown}")
    if doc_id.startswith("/"):
        raise InvalidDocument(f"document id starts with '/': {shown}")
    segments = doc_id.split("/")
    if "" in segments:
        raise InvalidDocument(f"document id has an empty segment ('//' or a trailing '/'): "
                              f"{shown}")
    if ".." in segments:
        raise InvalidDocument(f"document id has a '..' segment: {shown}")
    return doc_id


def _show(doc_id: str, limit: int = 80) -> str:
    """The id quoted for a message: escaped (no raw control characters) and shortened."""
    text = doc_id if len(doc_id) <= limit else doc_id[:limit] + "..."
    return repr(text)


T = TypeVar("T")


def opened(part: T | None) -> T:
    """``part`` of an open store.

    Raises:
        RetrievalError: it is None: the store is not open.
    """
    if part is None:
        raise RetrievalError("retrieval is not open")
    return part


class StoreHolder(Generic[T]):
    """What both store backends (:class:`~retrieval._interface.StoreBackend`) derive from
    the store they hold while open (``store``: None when closed)."""

    store: T | None

    @property
    def is_open(self) -> bool:
        """Whether :meth:`open_sync` ran and :meth:`close_sync` did not since."""
        return self.store is not None

    def require(self) -> T:
        """The store (:func:`opened`)."""
        return opened(self.store)
