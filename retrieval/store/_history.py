"""The metadata store's side of dates and history retention: which documents a date range
holds, which records of a history source retention removes, and removing them.

A history source's records are ordered by their ``document_date`` (SQLite sorts NULL
first: an undated row, a failed record say, is the oldest), ties by id; the index
``documents_source_date`` on ``(source_id, document_date, id)`` (made by
:meth:`retrieval.store._metadata.Store._migrate`) serves that order, so a
retention pass reads about as many rows as it removes, however long the history is.
Records past ``max_age_days`` and those beyond the newest ``max_items`` are always a prefix
of that order: one pass removes the first ``n`` of it.

These are the store's own queries, kept apart from :mod:`retrieval.store._metadata` (its size): they
use its connection, its lock and its write transaction as its methods do, and are its
methods too (:class:`HistoryStore`: the calls the PostgreSQL store answers,
:mod:`retrieval.postgres._history`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from ._metadata import Store


class HistoryStore:
    """Retention's queries as methods of :class:`retrieval.store._metadata.Store`."""

    def expired_records(self, source_id: str, *, before: int | None, keep: int,
                        limit: int) -> list[str]:
        """See :func:`expired_records`."""
        return expired_records(cast("Store", self), source_id, before=before, keep=keep,
                               limit=limit)

    def prune_records(self, source_id: str, ids: list[str]) -> tuple[int, list[int]]:
        """See :func:`prune_records`."""
        return prune_records(cast("Store", self), source_id, ids)


def bounded(where: list[str], args: list[object], *bounds: tuple[str, int | None]) -> None:
    """Add to ``where`` (and its value to ``args``) each bound's clause, one ``?`` each,
    whose value is given (None: unbounded)."""
    for clause, value in bounds:
        if value is not None:
            where.append(clause)
            args.append(value)


def dated_documents(store: Store, since: int | None, until: int | None) -> set[str]:
    """Ids of the documents whose own date lies in ``[since, until]`` (either bound may be
    None; a document without a date is never in it)."""
    where: list[str] = ["document_date IS NOT NULL"]
    args: list[object] = []
    bounded(where, args, ("document_date >= ?", since), ("document_date <= ?", until))
    with store._lock:
        return {str(r[0]) for r in store._db.execute(
            f"SELECT id FROM documents WHERE {' AND '.join(where)}", args)}  # noqa: S608 - fixed clauses, placeholders


def expired_records(store: Store, source_id: str, *, before: int | None, keep: int,
                    limit: int) -> list[str]:
    """Ids of a history source's records that retention removes, oldest first, at most
    ``limit``: those dated before ``before`` (None: no age limit) and the oldest beyond
    the newest ``keep`` (0: no count limit)."""
    if limit <= 0 or (before is None and keep <= 0):
        return []
    want = 0
    with store._lock:
        if before is not None:
            want = int(store._db.execute(
                "SELECT COUNT(*) FROM (SELECT 1 FROM documents WHERE source_id = ? AND "
                "(document_date IS NULL OR document_date < ?) LIMIT ?)",
                (source_id, before, limit)).fetchone()[0])
        if keep > 0:
            total = int(store._db.execute(
                "SELECT COUNT(*) FROM documents WHERE source_id = ?",
                (source_id,)).fetchone()[0])
            want = max(want, total - keep)
        want = min(want, limit)
        if want <= 0:
            return []
        return [str(r[0]) for r in store._db.execute(
            "SELECT id FROM documents WHERE source_id = ? ORDER BY document_date, id "
            "LIMIT ?", (source_id, want))]


def prune_records(store: Store, source_id: str, ids: list[str]) -> tuple[int, list[int]]:
    """Delete these records of ``source_id`` and count them in its ``pruned``, in one
    transaction; return how many were deleted (a record deleted meanwhile is not counted)
    and their chunk keys, for the derived indexes."""
    keys: list[int] = []
    deleted = 0
    with store._transaction():
        for i in range(0, len(ids), 500):
            part = ids[i:i + 500]
            marks = ",".join("?" * len(part))
            keys += [int(r[0]) for r in store._db.execute(
                f"SELECT c.key FROM chunks c JOIN documents d ON d.id = c.doc_id "  # noqa: S608 - placeholders only
                f"WHERE d.source_id = ? AND d.id IN ({marks})", [source_id, *part])]
            deleted += store._db.execute(
                f"DELETE FROM documents WHERE source_id = ? AND id IN ({marks})",  # noqa: S608 - placeholders only
                [source_id, *part]).rowcount
        if deleted:
            store._db.execute("UPDATE sources SET pruned = pruned + ? WHERE id = ?",
                              (deleted, source_id))
    return deleted, keys
