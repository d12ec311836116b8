"""One scanner per source across the nodes sharing a PostgreSQL store.

A node rescans a directory source only while it holds that source's advisory lock,
``pg_try_advisory_lock(key)``, taken on a connection of its own that it keeps open (a
session lock, not a transaction one: a scan spans many transactions). Postgres releases
the lock when that session ends: a clean release, the node's exit, kill -9 (the socket
closes), or, for a node that vanished from the network, the TCP keepalives of
:func:`retrieval.postgres._connect.connect` giving up on it (about a minute). A second node
asking meanwhile is told no at once and skips the scan; it never waits.

The key is the first 8 bytes of ``sha256("llamad.scan:" + source id)`` as a signed bigint:
the same on every node and every Postgres version (``hashtext`` is neither promised).
"""

from __future__ import annotations

import contextlib
import hashlib
import threading

import psycopg
import structlog

from ..errors import StoreUnavailable
from ._connect import Connection, PgOptions, connect, describe, first_line

_log = structlog.get_logger("llamad.retrieval")


def scan_lock_key(source_id: str) -> int:
    """The advisory lock key of a source (a signed 64-bit integer)."""
    digest = hashlib.sha256(b"llamad.scan:" + source_id.encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def document_lock_key(doc_id: str) -> int:
    """The transaction advisory lock key a replacement of the document holds: writers of
    one batch take theirs in key order, so two nodes writing overlapping batches queue
    instead of deadlocking on each other's rows."""
    digest = hashlib.sha256(b"llamad.document:" + doc_id.encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def backfill_lock_key(model: str) -> int:
    """The session advisory lock key of the backfill of ``model``'s vectors: one node at a
    time embeds the chunks a vector space lacks (:mod:`retrieval.postgres._backfill`)."""
    digest = hashlib.sha256(b"llamad.backfill:" + model.encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def backfill_lock_name(model: str) -> str:
    """The name :class:`ScanLocks` holds the backfill lock of ``model`` under (a source id
    never holds ``:``, so it never meets a scan lock's name)."""
    return f"backfill:{model}"


def review_lock_key(doc_id: str) -> int:
    """The session advisory lock key one review operation of a document holds (hold,
    approve, reject: one at a time across the nodes; not :func:`document_lock_key`, which
    the approval's own replacement takes)."""
    digest = hashlib.sha256(b"llamad.review:" + doc_id.encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def review_lock_name(doc_id: str) -> str:
    """The name :class:`ScanLocks` holds a document's review lock under."""
    return f"review:{doc_id}"


class ScanLocks:
    """The scan locks this node holds, on one dedicated session (the backfill's locks too,
    named by :func:`backfill_lock_name`). Thread-safe."""

    def __init__(self, options: PgOptions) -> None:
        self._options = options
        self._conn: Connection | None = None
        self._held: set[str] = set()
        self._lock = threading.Lock()

    def _session(self) -> Connection:
        """The lock session; a new one if the old one broke (its locks went with it)."""
        if self._conn is None or self._conn.closed or self._conn.broken:
            if self._held:
                _log.warning("scan lock session lost; its locks were released by the "
                             "server", sources=sorted(self._held),
                             store=describe(self._options.dsn))
                self._held.clear()
            self._conn = connect(self._options)
        return self._conn

    def try_acquire(self, source_id: str, key: int | None = None) -> bool:
        """Take the source's scan lock (or the lock named ``source_id`` with ``key``) if no
        session holds it; True when this node now holds it (also when it already did).

        Raises:
            StoreUnavailable: the server cannot be reached.
        """
        with self._lock:
            if source_id in self._held and self._alive():
                # Already held: asking Postgres again would stack a second hold that
                # one release would not undo.
                return True
            conn = self._session()
            try:
                row = conn.execute("SELECT pg_try_advisory_lock(%s)",
                                   (scan_lock_key(source_id) if key is None else key,)
                                   ).fetchone()
            except psycopg.Error as exc:
                self._alive()  # forget the session (and its locks) if it broke
                raise StoreUnavailable(f"scan lock for source {source_id} not taken: "
                                       f"{first_line(exc)}") from None
            taken = bool(row and row[0])
            if taken:
                self._held.add(source_id)
            return taken

    def holds(self, source_id: str) -> bool:
        """Whether this node's session holds the source's lock now, asked of the server
        (a long scan checks it between batches: a lost session lost its locks)."""
        key = scan_lock_key(source_id) & 0xFFFF_FFFF_FFFF_FFFF
        with self._lock:
            conn = self._conn
            if conn is None or source_id not in self._held or not self._alive():
                return False
            row = conn.execute(
                "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' "
                "AND pid = pg_backend_pid() AND granted AND objsubid = 1 "
                "AND classid::bigint = %s AND objid::bigint = %s)",
                (key >> 32, key & 0xFFFF_FFFF)).fetchone()
            return bool(row and row[0])

    def _alive(self) -> bool:
        """Whether the lock session still answers; when it does not, the locks it held
        are gone (the server released them), and are forgotten here too."""
        if self._conn is None or self._conn.closed or self._conn.broken:
            return False
        try:
            self._conn.execute("SELECT 1")
        except psycopg.Error:
            _log.warning("scan lock session lost; the server released its locks",
                         sources=sorted(self._held), store=describe(self._options.dsn))
            self._held.clear()
            with contextlib.suppress(psycopg.Error):
                self._conn.close()
            self._conn = None
            return False
        return True

    def release(self, source_id: str, key: int | None = None) -> None:
        """Release the source's scan lock (or the lock named ``source_id`` with ``key``;
        nothing if this node does not hold it)."""
        with self._lock:
            if source_id not in self._held:
                return
            self._held.discard(source_id)
            if self._conn is None or self._conn.closed or self._conn.broken:
                return  # the session is gone, and its locks with it
            with contextlib.suppress(psycopg.Error):
                self._conn.execute("SELECT pg_advisory_unlock(%s)",
                                   (scan_lock_key(source_id) if key is None else key,))

    def held(self) -> frozenset[str]:
        """The sources whose scan lock this node holds (as far as it knows)."""
        with self._lock:
            return frozenset(self._held)

    def close(self) -> None:
        """End the session: every lock it held is released."""
        with self._lock:
            self._held.clear()
            if self._conn is not None:
                with contextlib.suppress(psycopg.Error):
                    self._conn.close()
                self._conn = None
