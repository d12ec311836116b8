"""Directory sources: incremental scans with bounded work and a clear report.

A directory source must live under one of the allowed roots (:func:`check_root`, checked
with symlinks and ``..`` resolved, when the source is added and again at every scan, so a
root later replaced by a symlink to elsewhere is not followed). A scan walks the source
root (never following a symlink out of it, skipping FIFOs, devices and sockets),
compares each file's size and mtime with what was indexed (an
unchanged file costs one ``stat``), re-ingests changed files (their chunks are replaced
atomically), and removes documents whose files are gone. Caps on files and bytes per
source make a huge folder degrade predictably: what was skipped, and why, is reported.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from ._engine import Retriever
from ._extract import kind_for
from ._store import DocumentRow, SourceRow
from .errors import NotFound, RetrievalError, SourceNotAllowed

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


async def scan_source(retriever: Retriever, source_id: str,
                      progress: Callable[[ScanReport], None] | None = None, *,
                      allowed_roots: Sequence[str] | None = None) -> ScanReport:
    """Bring the index in line with the source's directory.

    Args:
        allowed_roots: when given (the daemon always gives it), the source's root must
            resolve under one of these, or the scan is refused and recorded as failed.

    Raises:
        NotFound: no such source, or it is not a directory source.
        SourceNotAllowed: the root is outside ``allowed_roots``.
    """
    sources = {s.id: s for s in await retriever.sources()}
    source: SourceRow | None = sources.get(source_id)
    if source is None or source.kind != "directory":
        raise NotFound(f"no directory source {source_id!r}")
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

    async def ingest(path: Path, rel: str, old: DocumentRow | None) -> None:
        try:
            new = await retriever.ingest_file(source, path, rel)
        except RetrievalError as exc:
            report.failed.append((rel, str(exc)))
            return
        if old is None:
            report.added += 1
        elif old.content_hash != new.content_hash:
            report.changed += 1
        else:
            report.unchanged += 1
        if progress is not None:
            progress(report)

    try:
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            if dirpath != str(root) and not _inside(_real(dirpath), root):
                # A directory swapped for a symlink while the walk was under way.
                report.skipped.append((Path(dirpath).relative_to(root).as_posix(),
                                       "directory resolves outside the source root"))
                dirnames[:] = []
                continue
            for name in sorted(filenames):
                if name.startswith("."):
                    continue
                path = Path(dirpath) / name
                rel = path.relative_to(root).as_posix()
                if kind_for(path) is None:
                    continue
                try:
                    st = path.lstat()
                    if stat.S_ISLNK(st.st_mode):
                        target = path.resolve()
                        if not _inside(target, root):
                            report.skipped.append((rel, "symlink points outside the source root"))
                            continue
                        st = target.stat()
                except OSError as exc:
                    report.skipped.append((rel, f"cannot stat: {exc.strerror}"))
                    continue
                if not stat.S_ISREG(st.st_mode):
                    report.skipped.append((rel, "not a regular file"))
                    continue
                if report.seen >= limits.max_files_per_source:
                    report.skipped.append((rel, f"more than {limits.max_files_per_source} files "
                                                "(max_files_per_source)"))
                    continue
                if total_bytes + st.st_size > limits.max_bytes_per_source:
                    report.skipped.append((rel, "source byte limit reached (max_bytes_per_source)"))
                    continue
                report.seen += 1
                total_bytes += st.st_size
                doc_id = f"{source_id}/{rel}"
                present.add(doc_id)
                old = indexed.get(doc_id)
                if old is not None and old.state == "indexed" and old.mtime_ns == st.st_mtime_ns \
                        and old.size == st.st_size:
                    report.unchanged += 1
                    continue
                while running and (
                        len(running) >= max(1, limits.ingest_workers)
                        or sum(running.values()) + st.st_size > limits.ingest_inflight_bytes):
                    finished, _ = await asyncio.wait(
                        running, return_when=asyncio.FIRST_COMPLETED)
                    for task in finished:
                        del running[task]
                    await _check(finished, set(running))
                running[asyncio.create_task(ingest(path, rel, old))] = st.st_size
        if running:
            finished, _ = await asyncio.wait(running)
            await _check(finished, set())
    finally:  # the scan was cancelled or failed: no worker outlives it
        for task in running:
            task.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)
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
