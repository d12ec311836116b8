"""Directory sources: incremental scans with bounded work and a clear report.

A directory source must live under one of the allowed roots (:func:`check_root`, checked
with symlinks and ``..`` resolved, when the source is added and again at every scan, so a
root later replaced by a symlink to elsewhere is not followed). A scan opens the root
once and walks beneath that descriptor (:class:`~retrieval._confine.SourceRoot`: no
symlink is ever followed while opening, so a file or directory swapped for a link to
elsewhere between the check and the read is refused, not read; FIFOs, devices and sockets
are skipped), compares each file's size and mtime with what was indexed (an unchanged file
costs one ``stat``), re-ingests changed files (their chunks are replaced atomically), and
removes documents whose files are gone. Caps on files and bytes per source make a huge
folder degrade predictably. A problem with one file (an unreadable one, a name that is not
UTF-8, shown with ``\xff`` escapes) is reported for that file and the scan goes on.
"""

from __future__ import annotations

import asyncio
import os
import stat
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import structlog

from ._confine import SourceRoot, display_name
from ._kinds import kind_for
from ._redact_names import redact_name
from ._retriever import Retriever
from ._store import DocumentRow, SourceRow
from .errors import NotFound, RetrievalError, SourceDisabled, SourceNotAllowed

_log = structlog.get_logger("llamad.retrieval")


@dataclass
class ScanReport:
    source_id: str
    seen: int = 0
    added: int = 0
    changed: int = 0
    unchanged: int = 0
    deleted: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    # Another node holds the source's scan lock (a shared PostgreSQL store): this one
    # skipped it this round, and nothing else in the report was counted.
    elsewhere: bool = False


def _inside(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
    except ValueError:
        return False
    return True


def _real(path: str) -> Path:
    return Path(os.path.realpath(path))


def check_root(path: str | os.PathLike[str], allowed_roots: Sequence[str]) -> Path:
    """``path`` resolved (symlinks and ``..``), if it lies under one of ``allowed_roots``
    (themselves resolved too): ``/srv/docs/../../etc``, or a symlink inside a root that
    points out of it, is outside.

    Raises:
        SourceNotAllowed: no root is configured, or the path is outside every root; the
            message names the option ``retrieval.allowed_roots``.
    """
    if not allowed_roots:
        raise SourceNotAllowed(
            "directory sources are disabled until retrieval.allowed_roots lists the "
            "directories they may live under", configured=False)
    resolved = Path(path).resolve()
    for root in allowed_roots:
        if _inside(resolved, Path(root).resolve()):
            return resolved
    shown = os.fspath(path)
    if str(resolved) != shown:
        shown += f" (resolved: {resolved})"
    raise SourceNotAllowed(f"{shown} is outside retrieval.allowed_roots "
                           f"({', '.join(allowed_roots)})", configured=True)


def _look(root: Path, rel: str, name: str, dir_fd: int) -> tuple[os.stat_result, str | None] | str:
    """``(stat, symlink target relative to the root or None)`` of a file found by the
    walk, or why it is skipped. Only metadata, for the unchanged-file check: the file is
    read later through :meth:`SourceRoot.open_file`, which follows no link whatever
    happens here meanwhile."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        target = None
        if stat.S_ISLNK(st.st_mode):
            resolved = _real(os.path.join(root, rel))
            if not _inside(resolved, root) or resolved == root:
                return "symlink points outside the source root"
            target = resolved.relative_to(root).as_posix()
            st = os.stat(resolved, follow_symlinks=False)
    except OSError as exc:
        return f"cannot stat: {exc.strerror}"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    return st, target


async def _check(finished: set[asyncio.Task[None]], running: set[asyncio.Task[None]]) -> None:
    """Re-raise the first unexpected failure (disk full, ...) once the other workers
    have stopped: a scan never leaves ingest tasks running behind it."""
    for task in finished:
        exc = task.exception()
        if exc is not None:
            for other in running:
                other.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            raise exc


_SETTLED = frozenset({"indexed", "review_required", "rejected"})
"""States whose file needs no new read while its size and mtime are those recorded: a
version indexed, held for review (the held version's), or rejected (the rejected one's)."""

# One scan per source at a time (per retriever): a scheduled rescan that fires while an
# operator's Reindex runs (a new source has no last scan, so the next round picks it up at
# once) would otherwise read and ingest every new file twice, each replacing the other's
# chunks, and count them twice.
_SCAN_LOCKS: weakref.WeakKeyDictionary[Retriever, dict[str, asyncio.Lock]] = \
    weakref.WeakKeyDictionary()


async def scan_source(retriever: Retriever, source_id: str,
                      progress: Callable[[ScanReport], None] | None = None, *,
                      allowed_roots: Sequence[str] | None = None,
                      since_ns: int | None = None) -> ScanReport:
    """Bring the index in line with the source's directory.

    Scans of one source are serialised: a scan that starts while another runs waits for
    it, then finds what that one indexed unchanged. Cancelling a waiting scan is clean.
    Across the nodes sharing a PostgreSQL store, one scans a source at a time: a node
    whose turn it is not (another holds the source's scan lock) skips it this round and
    returns a report with ``elsewhere`` set (and the reason among ``skipped``, for an
    operator's Reindex).

    Args:
        allowed_roots: when given (the daemon always gives it), the source's root must
            resolve under one of these, or the scan is refused and recorded as failed.
        since_ns: only the files modified at or after this time (ns since the epoch)
            are read again, whatever their size and mtime say (their content hash still
            spares an unchanged text its re-embedding); older indexed files are left as
            they are, without a comparison. New and deleted files count as usual.

    Raises:
        NotFound: no such source, or it is not a directory source.
        SourceDisabled: the source is disabled.
        SourceNotAllowed: the root is outside ``allowed_roots``.
    """
    lock = _SCAN_LOCKS.setdefault(retriever, {}).setdefault(source_id, asyncio.Lock())
    async with lock, retriever.scan_turn(source_id) as mine:
        if not mine:
            _log.debug("source is being scanned by another node; skipped this round",
                       source=source_id)
            return ScanReport(source_id, elsewhere=True, skipped=[(
                ".", "another node sharing the PostgreSQL store is scanning this source "
                "now: skipped this round")])
        return await _scan(retriever, source_id, progress, allowed_roots, since_ns)


async def _scan(retriever: Retriever, source_id: str,
                progress: Callable[[ScanReport], None] | None,
                allowed_roots: Sequence[str] | None, since_ns: int | None) -> ScanReport:
    sources = {s.id: s for s in await retriever.sources()}
    source: SourceRow | None = sources.get(source_id)
    if source is None or source.kind != "directory":
        raise NotFound(f"no directory source {source_id!r}")
    if source.disabled:
        raise SourceDisabled(f"source {source_id!r} is disabled: enable it to scan it "
                             "(its documents are kept)")
    if allowed_roots is not None:
        try:
            root = await asyncio.to_thread(check_root, source.root, allowed_roots)
        except SourceNotAllowed as exc:
            await retriever.mark_scanned(source_id, str(exc))
            raise
    else:
        root = await asyncio.to_thread(Path(source.root).resolve)
    report = ScanReport(source_id)
    if not await asyncio.to_thread(root.is_dir):
        await retriever.mark_scanned(source_id, f"{root} is not a directory")
        raise NotFound(f"source {source_id!r}: {root} is not a directory")
    limits = retriever.limits
    indexed = {d.id: d for d in await retriever.documents(source_id)}
    present: set[str] = set()
    total_bytes = 0
    # Files are extracted, embedded and committed by a pool of workers, bounded by count
    # (ingest_workers) and by file bytes (ingest_inflight_bytes): their chunks share
    # embedding requests and their writes share commits. Worker -> its file's size.
    running: dict[asyncio.Task[None], int] = {}

    async def ingest(rel: str, target: str | None, old: DocumentRow | None) -> None:
        try:
            new = await retriever.ingest_file(source, opened, rel, target)
        except RetrievalError as exc:
            report.failed.append((display_name(rel), str(exc)))
            if old is not None:  # the last indexed version stays searchable, marked failed
                await retriever.mark_failed(old.id, str(exc))
            return
        if old is None:
            report.added += 1
        elif old.content_hash != new.content_hash:
            report.changed += 1
        else:
            report.unchanged += 1
        if progress is not None:
            progress(report)

    async def settle(limit_bytes: int) -> None:
        """Wait for workers until fewer than ingest_workers run and ``limit_bytes`` more
        would stay within ingest_inflight_bytes."""
        while running and (
                len(running) >= max(1, limits.ingest_workers)
                or sum(running.values()) + limit_bytes > limits.ingest_inflight_bytes):
            finished, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for task in finished:
                del running[task]
            await _check(finished, set(running))

    try:
        opened = await asyncio.to_thread(
            SourceRoot, root, refuse_hard_links=limits.refuse_hard_links)
    except SourceNotAllowed as exc:
        await retriever.mark_scanned(source_id, str(exc))
        raise
    except OSError as exc:
        await retriever.mark_scanned(source_id, f"{root} cannot be opened: {exc.strerror}")
        raise NotFound(f"source {source_id!r}: {root} cannot be opened: {exc.strerror}") \
            from exc
    walk = opened.walk()
    try:
        for dir_rel, dir_fd, names, problems in walk:
            report.skipped.extend(problems)
            for name in names:
                rel = f"{dir_rel}/{name}" if dir_rel else name
                if kind_for(PurePosixPath(name)) is None:
                    continue
                found = _look(root, rel, name, dir_fd)
                if isinstance(found, str):
                    report.skipped.append((display_name(rel), found))
                    continue
                st, target = found
                if report.seen >= limits.max_files_per_source:
                    report.skipped.append((display_name(rel), f"more than "
                                           f"{limits.max_files_per_source} files "
                                           "(max_files_per_source)"))
                    continue
                if total_bytes + st.st_size > limits.max_bytes_per_source:
                    report.skipped.append((display_name(rel), "source byte limit reached "
                                           "(max_bytes_per_source)"))
                    continue
                report.seen += 1
                total_bytes += st.st_size
                doc_id = f"{source_id}/{redact_name(rel)}"  # as ingest_file names it
                present.add(doc_id)
                old = indexed.get(doc_id)
                if since_ns is not None and old is not None:
                    stale = st.st_mtime_ns >= since_ns
                else:
                    stale = old is None or old.state not in _SETTLED \
                        or old.mtime_ns != st.st_mtime_ns or old.size != st.st_size
                if not stale:
                    report.unchanged += 1
                    continue
                await settle(st.st_size)
                running[asyncio.create_task(ingest(rel, target, old))] = st.st_size
        if running:
            finished, _ = await asyncio.wait(running)
            await _check(finished, set())
    finally:  # the scan was cancelled or failed: no worker outlives it
        walk.close()
        for task in running:
            task.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)
        opened.close()
    report.failed.sort()
    for doc_id in sorted(set(indexed) - present):
        gone = doc_id.startswith(f"{source_id}/") and indexed[doc_id].path
        if gone and await retriever.delete(doc_id):
            report.deleted += 1
    await retriever.mark_scanned(
        source_id, f"{len(report.failed)} files failed" if report.failed else "")
    _log.info("scanned source", source=source_id, seen=report.seen, added=report.added,
              changed=report.changed, unchanged=report.unchanged, deleted=report.deleted,
              failed=len(report.failed), skipped=len(report.skipped))
    return report
