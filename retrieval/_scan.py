"""Directory sources: incremental scans with bounded work and a clear report.

A directory source must live under one of the allowed roots (:func:`check_root`, checked
with symlinks and ``..`` resolved, when the source is added and again at every scan, so a
root later replaced by a symlink to elsewhere is not followed). A scan opens the root
once and walks beneath that descriptor (:class:`~retrieval.extraction._confine.SourceRoot`: no
symlink is ever followed while opening, so a file or directory swapped for a link to
elsewhere between the check and the read is refused, not read; FIFOs, devices and sockets
are skipped), compares each file's size and mtime with what was indexed (an unchanged file
costs one ``stat``), re-ingests changed files (their chunks are replaced atomically), and
removes documents whose files are gone. A problem with one file (an unreadable one, a
name that is not UTF-8, shown with ``\xff`` escapes) is reported for that file and the
scan goes on.

Caps on files and bytes per source (``retrieval.max_files_per_source``, ``max_source_mb``)
make a huge folder degrade predictably. They count the documents the source holds, never
what a scan skips: a new file is added only while the source holds fewer documents (and
bytes) than the caps; past them, new files are not added (the report's ``limit_reached``,
the source's status and a log line say so and how many), and a document already indexed
is never dropped for a cap: it is kept, and refreshed when its file changes. Empty files,
unreadable, unsupported or hidden ones take no room. Room freed by deleted files is used
by the next scan (a scan frees it only after its walk).

If the root's path stops leading to the directory the scan holds open (renamed, removed,
replaced by a symlink) the scan stops with :class:`~retrieval.errors.SourceChanged`,
deleting nothing: it was checked at every directory and again before any deletion.
"""

from __future__ import annotations

import asyncio
import errno
import os
import stat
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath

import structlog

from ._retriever import Retriever
from ._scan_report import ScanReport
from .errors import NotFound, RetrievalError, SourceChanged, SourceDisabled, SourceNotAllowed
from .extraction._confine import SourceRoot, display_name
from .extraction._exclude import DEFAULT_EXCLUDES, ExcludeRules
from .extraction._kinds import kind_for
from .redaction._names import redact_name
from .store._rows import DocumentRow, SourceRow

_log = structlog.get_logger("llamad.retrieval")


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
        SourceChanged: the path cannot be resolved (a symlink loop).
    """
    if not allowed_roots:
        raise SourceNotAllowed(
            "directory sources are disabled until retrieval.allowed_roots lists the "
            "directories they may live under", configured=False)
    try:
        resolved = Path(path).resolve()
    except RuntimeError as exc:  # Python 3.11 raises this for a symlink loop
        raise SourceChanged(f"{os.fspath(path)} cannot be resolved: {exc}") from None
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
        NotFound: no such source, or it is not a directory source, or its root is not
            a directory (or cannot be opened) when the scan starts.
        SourceDisabled: the source is disabled.
        SourceNotAllowed: the root is outside ``allowed_roots``.
        SourceChanged: the root changed or vanished during the scan (or between its
            check and its open); nothing was deleted.
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


async def _changed(retriever: Retriever, source_id: str, root: Path,
                   why: str) -> SourceChanged:
    """The error of a scan whose root changed, recorded on the source and logged."""
    message = (f"source {source_id!r}: its root {display_name(str(root))} changed during "
               f"the scan ({why}): the scan stopped, nothing beneath the new path was read "
               "and no document was deleted; scan again once the root is back in place")
    _log.warning("source root changed during a scan", source=source_id,
                 root=display_name(str(root)), why=why)
    await retriever.mark_scanned(source_id, message)
    return SourceChanged(message)


async def _open_root(retriever: Retriever, source_id: str, root: Path,
                     refuse_hard_links: bool) -> SourceRoot:
    """The root opened (:class:`SourceRoot`); one that changed since it was checked is
    :class:`SourceChanged`, one that cannot be opened for another reason NotFound."""
    try:
        return await asyncio.to_thread(SourceRoot, root, refuse_hard_links=refuse_hard_links)
    except SourceNotAllowed as exc:  # a directory above it now leads elsewhere
        raise await _changed(retriever, source_id, root, str(exc)) from None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT):  # swapped or gone
            raise await _changed(retriever, source_id, root,
                                 f"it cannot be opened: {exc.strerror}") from None
        await retriever.mark_scanned(source_id, f"{root} cannot be opened: {exc.strerror}")
        raise NotFound(f"source {source_id!r}: {root} cannot be opened: {exc.strerror}") \
            from exc


def _limit_note(files: int, file_cap: int, sized: int, byte_cap: int) -> str:
    """What the source's caps kept out (for the report, the status and the log)."""
    notes = []
    if files:
        notes.append(f"{files} new files not added: the source holds {file_cap} documents "
                     "(retrieval.max_files_per_source)")
    if sized:
        notes.append(f"{sized} new files not added: they would take the source past "
                     f"{byte_cap} bytes (retrieval.max_source_mb)")
    if not notes:
        return ""
    return "; ".join(notes) + "; every document indexed before is kept"


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
    try:
        if allowed_roots is not None:
            root = await asyncio.to_thread(check_root, source.root, allowed_roots)
        else:
            root = await asyncio.to_thread(Path(source.root).resolve)
    except (SourceNotAllowed, SourceChanged) as exc:
        await retriever.mark_scanned(source_id, str(exc))
        raise
    except RuntimeError as exc:  # a symlink loop, with no allowed roots to check
        raise await _changed(retriever, source_id, Path(source.root), str(exc)) from None
    report = ScanReport(source_id)
    if not await asyncio.to_thread(root.is_dir):
        await retriever.mark_scanned(source_id, f"{root} is not a directory")
        raise NotFound(f"source {source_id!r}: {root} is not a directory")
    limits = retriever.limits
    indexed = {d.id: d for d in await retriever.documents(source_id)}
    present: set[str] = set()
    # The caps count what the source holds: the documents indexed before this scan (those
    # whose files are gone free their room at its end) and the new files admitted so far
    # (one that fails gives its room back). Skipped files take none.
    held_files, held_bytes = len(indexed), sum(d.size for d in indexed.values())
    room = {"files": 0, "bytes": 0, "over_files": 0, "over_bytes": 0}
    # Files are extracted, embedded and committed by a pool of workers, bounded by count
    # (ingest_workers) and by file bytes (ingest_inflight_bytes): their chunks share
    # embedding requests and their writes share commits. Worker -> its file's size.
    running: dict[asyncio.Task[None], int] = {}

    def shown(rel: str, kind: str) -> str:
        """``rel`` as a report shows it (escaped, redacted) if it will be listed: the name
        of each of 100,000 skipped files is not worth that work."""
        return display_name(rel) if report.listing(kind) else rel

    async def ingest(rel: str, target: str | None, old: DocumentRow | None,
                     size: int) -> None:
        try:
            new = await retriever.ingest_file(source, opened, rel, target)
        except RetrievalError as exc:
            report.fail(shown(rel, "failed"), str(exc))
            if old is not None:  # the last indexed version stays searchable, marked failed
                await retriever.mark_failed(old.id, str(exc))
            else:  # nothing was added: its room is free again
                room["files"] -= 1
                room["bytes"] -= size
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

    def full(size: int) -> bool:
        return (held_files + room["files"] >= limits.max_files_per_source
                or held_bytes + room["bytes"] + size > limits.max_bytes_per_source)

    async def admit(rel: str, size: int) -> bool:
        """Whether a new file fits the source's caps (counted in if so); why not, in the
        report, if not."""
        if size == 0:
            report.skip(shown(rel, "skipped"), "empty file: nothing to index")
            return False
        while full(size) and running:
            # At a cap with files in flight: wait for them, since one that fails (a
            # binary, a blank text) gives its room back to this one.
            finished, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for task in finished:
                del running[task]
            await _check(finished, set(running))
        if held_files + room["files"] >= limits.max_files_per_source:
            room["over_files"] += 1
            report.skip(shown(rel, "skipped"), f"not added: the source holds "
                        f"{limits.max_files_per_source} documents "
                        "(retrieval.max_files_per_source)")
            return False
        if held_bytes + room["bytes"] + size > limits.max_bytes_per_source:
            room["over_bytes"] += 1
            report.skip(shown(rel, "skipped"), "not added: the source would hold more than "
                        f"{limits.max_bytes_per_source} bytes "
                        "(retrieval.max_source_mb)")
            return False
        room["files"] += 1
        room["bytes"] += size
        return True

    rules = ExcludeRules([*(DEFAULT_EXCLUDES if limits.exclude_defaults else ()),
                          *source.exclude])

    def skip_dir(rel: str) -> bool:
        """An excluded directory is never entered (counted once)."""
        if rules.excluded(rel, is_dir=True):
            report.excluded += 1
            return True
        return False

    opened = await _open_root(retriever, source_id, root, limits.refuse_hard_links)
    moved: str | None = None
    walk = opened.walk(skip_dir if rules else None)
    try:
        for dir_rel, dir_fd, names, problems in walk:
            # One stat per directory: a root renamed or swapped meanwhile stops the scan
            # here, instead of failing each of its files as "outside the source root".
            if (moved := opened.moved()) is not None:
                break
            for path, why in problems:
                report.skip(path, why)
            for name in names:
                rel = f"{dir_rel}/{name}" if dir_rel else name
                if rules and rules.excluded(rel):  # before any stat or open
                    report.excluded += 1
                    continue
                if kind_for(PurePosixPath(name)) is None:
                    continue
                found = _look(root, rel, name, dir_fd)
                if isinstance(found, str):
                    report.skip(shown(rel, "skipped"), found)
                    continue
                st, target = found
                doc_id = f"{source_id}/{redact_name(rel)}"  # as ingest_file names it
                old = indexed.get(doc_id)
                if old is None and not await admit(rel, st.st_size):
                    continue
                report.seen += 1
                present.add(doc_id)
                if since_ns is not None and old is not None:
                    stale = st.st_mtime_ns >= since_ns
                else:
                    stale = old is None or old.state not in _SETTLED \
                        or old.mtime_ns != st.st_mtime_ns or old.size != st.st_size
                if not stale:
                    report.unchanged += 1
                    continue
                await settle(st.st_size)
                running[asyncio.create_task(ingest(rel, target, old, st.st_size))] = \
                    st.st_size
        if running:
            finished, _ = await asyncio.wait(running)
            await _check(finished, set())
            running.clear()
        # Again before deleting anything: a root swapped after its last directory was
        # walked must not make every document look gone.
        moved = moved or opened.moved()
    finally:  # the scan was cancelled or failed: no worker outlives it
        walk.close()
        for task in running:
            task.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)
        opened.close()
    if moved is not None:
        raise await _changed(retriever, source_id, root, moved)
    report.failed.sort()
    for doc_id in sorted(set(indexed) - present):
        gone = doc_id.startswith(f"{source_id}/") and indexed[doc_id].path
        if gone and await retriever.delete(doc_id):
            report.deleted += 1
    report.limit_reached = _limit_note(room["over_files"], limits.max_files_per_source,
                                       room["over_bytes"], limits.max_bytes_per_source)
    if report.limit_reached:
        _log.warning("source limit reached", source=source_id,
                     not_added=room["over_files"] + room["over_bytes"],
                     max_files_per_source=limits.max_files_per_source,
                     max_bytes_per_source=limits.max_bytes_per_source)
    status = [f"{report.failed_total} files failed"] if report.failed_total else []
    await retriever.mark_scanned(source_id, "; ".join(
        [*status, *([report.limit_reached] if report.limit_reached else [])]),
        excluded=report.excluded)
    _log.info("scanned source", source=source_id, seen=report.seen, added=report.added,
              changed=report.changed, unchanged=report.unchanged, deleted=report.deleted,
              failed=report.failed_total, skipped=report.skipped_total,
              excluded=report.excluded,
              limit_reached=bool(report.limit_reached))
    return report
