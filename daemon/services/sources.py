"""Sources of the knowledge base, free of any wire: list (with their document counts),
add, disable or enable, remove, and reindex (rescan directory sources, reporting
progress).

The HTTP API's knowledge-base routes (:mod:`daemon.httpapi._kb`) adapt these; gRPC's
RetrievalService has the same semantics (:mod:`daemon.grpcapi.retrieval`). A bad argument
is :class:`~daemon.errors.InvalidArgument` naming its field (``path``, ``max_items``,
``source_id``...).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from retrieval import (
    ExcludeError,
    Retriever,
    ScanReport,
    SourceRow,
    check_exclude_patterns,
    check_root,
    scan_source,
)

from ..errors import InvalidArgument

PROGRESS_INTERVAL = 0.5
"""Seconds between two progress reports of one source's rescan."""


@dataclass(frozen=True)
class NewSource:
    """A source to add (or update): a directory (``path``), pushed documents (no path),
    or history records (``history``, kept within ``max_age_days`` and ``max_items``)."""

    id: str
    path: str = ""
    category: str = ""
    tags: tuple[str, ...] = ()
    review_required: bool = False
    history: bool = False
    max_age_days: int = 0
    max_items: int = 0
    exclude: tuple[str, ...] = ()


async def listed(retriever: Retriever) -> list[tuple[SourceRow, int]]:
    """Every source with its number of documents (counted, not listed: Status asks for
    this, and a corpus of 100,000 documents read row by row held the interpreter for
    seconds, the searches waiting)."""
    counts = await retriever.document_counts()
    return [(s, counts.get(s.id, 0)) for s in await retriever.sources()]


async def add(retriever: Retriever, source: NewSource,
              allowed_roots: tuple[str, ...]) -> SourceRow:
    """Add or update ``source``; a directory must lie under ``allowed_roots``
    (retrieval.allowed_roots), checked before anything about it is said.

    Raises:
        InvalidArgument: a path that is not absolute, not a directory, outside the roots,
            or given for a history source; retention limits on another kind (naming the
            field).
    """
    if source.history and source.path:
        raise InvalidArgument("a history source holds pushed records: give no path",
                              field="path")
    if not source.history and (source.max_age_days or source.max_items):
        raise InvalidArgument("max_age_days and max_items apply to history sources only "
                              "(set history)",
                              field="max_age_days" if source.max_age_days else "max_items")
    if "\x00" in source.path:
        raise InvalidArgument("path contains a NUL character", field="path")
    if source.exclude and not source.path:
        raise InvalidArgument("exclude patterns apply to directory sources only (give a "
                              "path)", field="exclude")
    try:
        check_exclude_patterns(source.exclude,
                               max_patterns=retriever.limits.max_exclude_patterns,
                               max_chars=retriever.limits.max_exclude_chars)
    except ExcludeError as exc:
        raise InvalidArgument(str(exc), field="exclude") from None
    root = None
    if source.path:
        root = Path(source.path)
        if not root.is_absolute():
            raise InvalidArgument("path must be absolute", field="path")
        # Confinement first: a caller learns nothing about paths outside the roots.
        await asyncio.to_thread(check_root, root, allowed_roots)
        if not root.is_dir():
            raise InvalidArgument(f"{root} is not a directory", field="path")
    before = next((s for s in await retriever.sources() if s.id == source.id), None)
    row = await retriever.add_source(
        source.id, root=root, category=source.category, tags=source.tags,
        review_required=source.review_required, history=source.history,
        max_age_days=source.max_age_days, max_items=source.max_items,
        exclude=source.exclude)
    if before is not None and before.kind == row.kind == "directory" \
            and before.exclude != row.exclude and not before.disabled:
        # New patterns: a scan now removes what they exclude and brings back what they
        # no longer do (the caller is not kept waiting for it; Reindex shows it).
        task = asyncio.create_task(_rescan(retriever, row.id, allowed_roots),
                                   name=f"exclude-rescan-{row.id}")
        _RESCANS.add(task)
        task.add_done_callback(_RESCANS.discard)
    return row


_RESCANS: set[asyncio.Task[None]] = set()
"""Scans started by changed exclude patterns, referenced until they end."""


async def _rescan(retriever: Retriever, source_id: str,
                  allowed_roots: tuple[str, ...]) -> None:
    try:
        await scan_source(retriever, source_id, allowed_roots=allowed_roots)
    except Exception as exc:  # recorded on the source by the scan; logged here
        structlog.get_logger("llamad.retrieval").warning(
            "scan after new exclude patterns failed", source=source_id, error=str(exc)[:200])


async def set_disabled(retriever: Retriever, source_id: str,
                       disabled: bool) -> tuple[SourceRow, int]:
    """Disable a source (kept, neither searched nor rescanned) or enable it; the source
    and its number of documents.

    Raises:
        NotFound: no such source.
    """
    row = await retriever.set_source_disabled(source_id, disabled)
    return row, (await retriever.document_counts()).get(source_id, 0)


async def remove(retriever: Retriever, source_id: str) -> int:
    """Remove a source, its documents and their chunks; the chunks removed."""
    return await retriever.remove_source(source_id)


async def reindex(retriever: Retriever, allowed_roots: Callable[[], tuple[str, ...]], *,
                  source_id: str = "", since_ns: int | None = None,
                  ) -> AsyncIterator[tuple[ScanReport, bool]]:
    """Rescan one directory source, or every enabled one (``source_id`` empty): a report
    at most every :data:`PROGRESS_INTERVAL` seconds while a source is scanned
    (``False``), then its final one (``True``). ``since_ns``: only files changed after.

    Closing the iterator (its caller cancelled, its deadline passed) stops the scan under
    way, rather than let it run on unobserved.

    Raises:
        InvalidArgument: ``source_id`` names no directory source (source_id).
    """
    sources = [s for s in await retriever.sources() if s.kind == "directory"]
    if source_id:
        sources = [s for s in sources if s.id == source_id]
        if not sources:
            raise InvalidArgument(f"no directory source {source_id!r}", field="source_id")
    else:  # all: the disabled ones are not rescanned (one named is refused, saying so)
        sources = [s for s in sources if not s.disabled]
    for source in sources:
        queue: asyncio.Queue[ScanReport] = asyncio.Queue()
        last = 0.0

        def progress(report: ScanReport, q: asyncio.Queue[ScanReport] = queue) -> None:
            nonlocal last
            now = time.monotonic()
            if now - last >= PROGRESS_INTERVAL:
                last = now
                q.put_nowait(report)

        task = asyncio.create_task(scan_source(retriever, source.id, progress,
                                               allowed_roots=allowed_roots(),
                                               since_ns=since_ns))
        try:
            while not task.done():
                getter = asyncio.ensure_future(queue.get())
                try:
                    await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    getter.cancel()
                if getter.done() and not getter.cancelled():
                    yield getter.result(), False
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        yield task.result(), True
