"""Upserts accepted now and indexed in the background (``UpsertDocument`` with
``wait=false``).

A document accepted here is checked at once (source, id, kind, size: what would make it
refused is said before it is accepted), shown in state ``pending`` until its upsert
starts, then ``processing``, then ``indexed`` or ``failed`` with the reason, as
:meth:`retrieval.Retriever.document` shows. Two accepted versions of one document are
indexed in the order they came. At most ``limits.max_pending`` wait at once: past that,
:class:`retrieval.errors.Busy` says to retry.

Durable: an accepted document is written to the journal (one file per document under
``<index dir>/pending``, written to a temporary name, fsync-ed, renamed into place and
the directory fsync-ed) before the acceptance is returned, and its file is removed once
its upsert has ended (indexed, held or failed: the store holds the outcome). A daemon
killed with documents pending (``kill -9``, a power cut) finds their files at its next
start (:meth:`Later.recover`) and indexes them in the order they were accepted; one
indexed just before the kill is indexed again as the same content (no change). Closing
the retriever finishes the ones accepted (the daemon's drain). The journal holds at most
``max_pending`` documents, each at most ``max_document_chars``.

Redacted first (invariant 8): the journal, and the memory holding a pending document,
keep its title and text as the upsert would index them, with the count of secrets the
redaction replaced (``redactions``: the upsert adds it to the document's count, since
redacting again finds none) and the date a Markdown front matter gives, so a document
indexed from the journal is the one indexed at once. A journal file without
``redactions`` (written before) holds the text as pushed: its upsert redacts it then.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import structlog

from .errors import Busy, StoreUnavailable, validate_document_id
from .extraction._dates import front_matter_date
from .redaction._redactor import Redacted, redact
from .store._rows import DocumentRow

_log = structlog.get_logger("llamad.retrieval")

Upsert = Callable[..., Awaitable[DocumentRow]]
Check = Callable[[str, str, str], Awaitable[object]]
"""What refuses a document (source id, text, kind), raising: the upsert's own check."""
Redact = Callable[[str], Redacted]
"""The upsert's redaction of a document's text (its configured rules)."""


class Later:
    """The background upserts of one retriever; ``journal`` (a directory, made 0700 if
    missing) keeps them across a crash, None keeps them in memory only; ``redact`` is the
    upsert's redaction of a text (titles are redacted as the upsert does, by default
    rules)."""

    def __init__(self, upsert: Upsert, check: Check, max_pending: Callable[[], int],
                 journal: Path | None = None, redact: Redact = redact) -> None:
        self._upsert = upsert
        self._check = check
        self._redact = redact
        self._max_pending = max_pending
        self._journal = journal
        self._seq = -1                                  # the last journal number used
        self.pending: dict[str, DocumentRow] = {}   # accepted, not started
        self._tasks: dict[str, asyncio.Task[None]] = {}  # the latest per document
        self._running: set[asyncio.Task[None]] = set()   # all of them

    async def accept(self, source_id: str, title: str, text: str, *, doc_id: str, kind: str,
                     category: str, tags: Sequence[str], document_date: int | None = None,
                     received_at: int | None = None, review: bool = False) -> DocumentRow:
        """Check the document as its upsert would, write it to the journal, then queue
        the upsert; return the document in state ``pending`` (with ``review``, held for
        review once processed).

        Raises:
            InvalidDocument: a bad id or kind, an empty or oversized text.
            NotFound: an unknown source.
            Busy: ``max_pending`` documents already wait.
            OSError: the journal cannot be written (a full disk): nothing was accepted.
        """
        validate_document_id(doc_id)
        await self._check(source_id, text, kind)
        self._refuse_if_busy()
        if document_date is None and kind == "markdown":
            document_date = front_matter_date(text)  # read from the text as pushed
        # CPU work linear in the text: in a thread, as the upsert's own redaction.
        cleaned = await asyncio.to_thread(self._redact, text)
        entry = {"source_id": source_id, "title": redact(title).text,
                 "text": cleaned.text, "redactions": cleaned.total, "doc_id": doc_id,
                 "kind": kind, "category": category, "tags": list(tags),
                 "document_date": document_date, "received_at": received_at,
                 "review": review}
        self._refuse_if_busy()  # others may have been queued meanwhile
        if self._journal is None:
            return self._queue(entry, None)
        # Numbered and queued at once, on the loop, so that the journal's order (a restart
        # replays it) is the order the upserts run in, however the concurrent writes end;
        # the upsert starts once its file is written. A caller that goes away meanwhile
        # does not stop the write: what reaches the journal is indexed, now or at restart.
        saved = self._next_path()
        written: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        row = self._queue(entry, saved, written)
        write = asyncio.ensure_future(asyncio.to_thread(_write, saved, entry))

        def settle(done: asyncio.Future[None]) -> None:
            if done.cancelled() or done.exception() is not None:
                written.cancel()  # not in the journal: never indexed
            else:
                written.set_result(None)
        write.add_done_callback(settle)
        await asyncio.shield(write)
        return row

    def _refuse_if_busy(self) -> None:
        waiting = len(self._running)
        if waiting >= self._max_pending():
            raise Busy(f"{waiting} documents already wait to be indexed "
                       f"(retrieval.max_pending_upserts); retry shortly, or wait=true")

    def _queue(self, entry: dict[str, Any], saved: Path | None,
               written: asyncio.Future[None] | None = None) -> DocumentRow:
        row = DocumentRow(entry["doc_id"], entry["source_id"], "", entry["title"],
                          entry["kind"], entry["category"], tuple(entry["tags"]), "", 0, 0,
                          "pending", "", int(time.time()), 0, entry["document_date"])
        self.pending[row.id] = row
        previous = self._tasks.get(row.id)
        task = asyncio.create_task(self._run(row, entry, previous, saved, written),
                                   name=f"upsert-{row.id}")
        self._tasks[row.id] = task
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return row

    async def _run(self, row: DocumentRow, entry: dict[str, Any],
                   previous: asyncio.Task[None] | None, saved: Path | None,
                   written: asyncio.Future[None] | None) -> None:
        try:
            if written is not None:
                await written  # cancelled: its file could not be written
        except asyncio.CancelledError:
            if self.pending.get(row.id) is row:
                del self.pending[row.id]
            if self._tasks.get(row.id) is asyncio.current_task():
                del self._tasks[row.id]
            raise
        if previous is not None:  # an earlier version of this document goes first
            await asyncio.gather(previous, return_exceptions=True)
        try:  # pending until the ingest shows it processing (its state then wins)
            await self._upsert(row.source_id, row.title, entry["text"], doc_id=row.id,
                               kind=row.kind, category=row.category, tags=row.tags,
                               document_date=row.document_date,
                               received_at=entry["received_at"], review=bool(entry["review"]),
                               redacted=entry.get("redactions"))
        except asyncio.CancelledError:
            raise  # not ended: the journal keeps it for the next start
        except StoreUnavailable as exc:  # nothing recorded it: the next start tries again
            _log.warning("background upsert failed: the store is unavailable; kept for "
                         "the next start", document=row.id, error=str(exc)[:200])
            saved = None
        except Exception as exc:  # the upsert recorded it as failed; logged here
            _log.warning("background upsert failed", document=row.id, error=str(exc)[:200])
        finally:
            if self.pending.get(row.id) is row:
                del self.pending[row.id]
            if self._tasks.get(row.id) is asyncio.current_task():
                del self._tasks[row.id]
        if saved is not None:
            await asyncio.to_thread(saved.unlink, missing_ok=True)

    # -- the journal -------------------------------------------------------------------

    def _entries(self) -> list[Path]:
        if self._journal is None or not self._journal.is_dir():
            return []
        return sorted(p for p in self._journal.iterdir()
                      if p.suffix == ".json" and p.stem.isdigit())

    def _next_path(self) -> Path:
        """The journal file of the next accepted document (numbers go on from the files
        there, so a restart never reuses one). On the loop: a directory listing once."""
        journal = self._journal
        if journal is None:
            raise RuntimeError("no journal")
        if self._seq < 0:
            journal.mkdir(mode=0o700, parents=True, exist_ok=True)
            entries = self._entries()
            self._seq = int(entries[-1].stem) if entries else 0
        self._seq += 1
        return journal / f"{self._seq:012d}.json"

    async def recover(self) -> int:
        """Queue the documents a previous run accepted and did not finish (their journal
        files), in the order they were accepted; how many. A file that cannot be read is
        set aside (renamed ``*.bad``) with a warning."""
        entries = await asyncio.to_thread(self._entries)
        count = 0
        for path in entries:
            try:
                entry = json.loads(await asyncio.to_thread(path.read_bytes))
                if not isinstance(entry, dict):
                    raise ValueError("not an object")
                self._queue(entry, path)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                _log.warning("a pending document's journal file cannot be read: set aside",
                             file=path.name, error=str(exc)[:200])
                with contextlib.suppress(OSError):
                    path.rename(path.with_suffix(".bad"))
                continue
            count += 1
        if entries:
            self._seq = max(self._seq, int(entries[-1].stem))
        if count:
            _log.info("indexing documents accepted before a restart", documents=count)
        return count

    async def close(self) -> None:
        """Finish the upserts accepted (they were acknowledged as pending)."""
        while self._running:
            with contextlib.suppress(Exception):
                await asyncio.gather(*list(self._running), return_exceptions=True)


def _write(final: Path, entry: dict[str, Any]) -> None:
    """Write one accepted document durably at ``final``: a temporary name, fsync, rename,
    then the directory fsync-ed."""
    tmp = final.with_name(f".{final.name}.tmp")
    data = json.dumps(entry, ensure_ascii=False).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, final)
    _fsync_dir(final.parent)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
