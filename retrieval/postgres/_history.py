"""The PostgreSQL store's side of history retention: which records of a history source
retention removes, and removing them.

The embedded store's :mod:`retrieval.store._history`, over the same order: a history
source's records by ``document_date``, an undated one (a failed record, say) the oldest,
ties by id. PostgreSQL sorts NULL last, so the undated records and the dated ones are
read apart, each in the order of the index ``documents_source_date`` (source, date, id):
a pass reads about as many rows as it removes, however long the history is.

Several nodes may run passes at once: a record is deleted by one of them only (the other
finds it gone and does not count it), and a source's ``pruned`` grows in the transaction
that deleted, by what it deleted. The deletion takes the records' document locks in key
order first, as a replacement does (:func:`~retrieval.postgres._locks.document_lock_key`), so it
never deadlocks with a batch of ingests of the same records.

A mixin of :class:`~retrieval.postgres._store.PostgresStore` (which provides the connections).
"""

from __future__ import annotations

from ._connect import PgConnected
from ._entries import lock_texts_of, write_entries
from ._locks import document_lock_key


class PgHistory(PgConnected):
    """History retention's queries, for :class:`~retrieval.postgres._store.PostgresStore`."""

    def expired_records(self, source_id: str, *, before: int | None, keep: int,
                        limit: int) -> list[str]:
        """Ids of a history source's records that retention removes, oldest first, at
        most ``limit``: those dated before ``before`` (None: no age limit; an undated
        one counts as older) and the oldest beyond the newest ``keep`` (0: no count
        limit)."""
        if limit <= 0 or (before is None and keep <= 0):
            return []
        want = 0
        # One snapshot for the counts and the ids: counted before another node's pass
        # deleted and listed after it, the oldest of what is left would go too.
        with self._conn() as conn, conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            if before is not None:
                row = conn.execute(
                    "SELECT count(*) FROM (SELECT 1 FROM documents WHERE source_id = %s AND "
                    "(document_date IS NULL OR document_date < %s) LIMIT %s) expired",
                    (source_id, before, limit)).fetchone()
                want = int(row[0]) if row else 0
            if keep > 0:
                row = conn.execute("SELECT count(*) FROM documents WHERE source_id = %s",
                                   (source_id,)).fetchone()
                want = max(want, (int(row[0]) if row else 0) - keep)
            want = min(want, limit)
            if want <= 0:
                return []
            return [str(r[0]) for r in conn.execute(
                "SELECT id FROM ("
                "(SELECT id, 0 AS undated_last, document_date FROM documents "
                " WHERE source_id = %s AND document_date IS NULL ORDER BY id LIMIT %s) "
                "UNION ALL "
                "(SELECT id, 1, document_date FROM documents WHERE source_id = %s "
                " AND document_date IS NOT NULL ORDER BY document_date, id LIMIT %s)"
                ") oldest ORDER BY undated_last, document_date, id LIMIT %s",
                (source_id, want, source_id, want, want))]

    def prune_records(self, source_id: str, ids: list[str]) -> tuple[int, list[int]]:
        """Delete these records of ``source_id`` (their chunks and vectors with them) and
        count them in its ``pruned``, in one transaction; return how many were deleted (a
        record deleted meanwhile, by another node say, is not counted) and their chunk
        keys."""
        with self._conn() as conn, conn.transaction():
            for key in sorted({document_lock_key(i) for i in ids}):
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (key,))
            keys = [int(r[0]) for r in conn.execute(
                "SELECT c.key FROM chunks c JOIN documents d ON d.id = c.doc_id "
                "WHERE d.source_id = %s AND d.id = ANY(%s)", (source_id, ids))]
            lock_texts_of(conn, "d.source_id = %s AND d.id = ANY(%s)", (source_id, ids))
            deleted = conn.execute("DELETE FROM documents WHERE source_id = %s AND "
                                   "id = ANY(%s)", (source_id, ids)).rowcount
            write_entries(conn, [])  # their texts other documents hold stay, once
            if deleted:
                conn.execute("UPDATE sources SET pruned = pruned + %s WHERE id = %s",
                             (deleted, source_id))
        return deleted, keys
