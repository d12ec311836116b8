"""Live change detection for directory sources: inotify watches that trigger scans.

A scheduled rescan (``retrieval.rescan_interval``, an hour by default) and a Search's lazy
refresh find changes eventually; this finds them as they happen. One inotify instance
watches every directory of every enabled directory source; a file closed after writing,
moved in or out, created or deleted marks its source changed, and once the changes have
settled (``debounce``: no new event for that long, or ``max_delay`` since the first one,
for a burst that never pauses) the source is scanned once, incrementally: a ``git
checkout`` of 1,000 files is one scan, not 1,000. Events arriving while that scan runs
mark the source again, for one more scan after it.

The scan is the ordinary one (:func:`~retrieval._scan.scan_source`): the watcher reads no
file and decides nothing about what is indexed, so the confinement, symlink, hidden-file
and cap rules are exactly those of every other scan. The directories are found by the
same confined walk (:meth:`SourceRoot.walk`) and each is watched through the descriptor
the walk opened (``/proc/self/fd/N``), never through a path that could be swapped for a
link meanwhile; a root outside ``retrieval.allowed_roots`` is not watched.

A root renamed, deleted or re-created loses its watches (the kernel says so: the root's
watch is dropped); the source is then checked every ``retry`` seconds, and watched and
scanned again as soon as its path leads to a directory. A new subdirectory is watched
before the scan that its creation triggers. Watches are bounded by ``max_dirs`` (and by
the kernel's ``fs.inotify.max_user_watches``): past it, the rest of a tree is left to the
scheduled rescan, with a warning. Where inotify cannot be had at all (not Linux, no
instance left) the watcher says so once and the schedule remains the safety net.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import os
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import structlog

from ._retriever import Retriever
from ._scan import check_root, scan_source
from .extraction._confine import SourceRoot

_log = structlog.get_logger("llamad.retrieval")

# <sys/inotify.h>
IN_CLOSE_WRITE: Final = 0x00000008
IN_MOVED_FROM: Final = 0x00000040
IN_MOVED_TO: Final = 0x00000080
IN_CREATE: Final = 0x00000100
IN_DELETE: Final = 0x00000200
IN_DELETE_SELF: Final = 0x00000400
IN_MOVE_SELF: Final = 0x00000800
IN_Q_OVERFLOW: Final = 0x00004000
IN_IGNORED: Final = 0x00008000
IN_ONLYDIR: Final = 0x01000000
IN_ISDIR: Final = 0x40000000

# What changes a source: a file written and closed, moved in or out, created (an empty file
# or a directory), deleted; the directory itself going away. Not IN_MODIFY: one event per
# write() of a file still being written; its IN_CLOSE_WRITE follows.
WATCHED: Final = (IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
                  | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR)
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name


class Inotify:
    """One inotify instance (non-blocking, close-on-exec), through libc.

    Raises:
        OSError: no inotify here (not Linux) or no instance left
            (``fs.inotify.max_user_instances``).
    """

    def __init__(self) -> None:
        try:  # the C library the interpreter links (no ldconfig run to find it)
            libc = ctypes.CDLL(None, use_errno=True)
            self._add = libc.inotify_add_watch
            self._rm = libc.inotify_rm_watch
            init = libc.inotify_init1
        except (OSError, AttributeError) as exc:
            raise OSError(errno.ENOSYS, f"inotify is not available: {exc}") from None
        self._add.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32)
        self._rm.argtypes = (ctypes.c_int, ctypes.c_int)
        self.fd: int = init(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise _errno_error("inotify_init1")

    def add(self, path: str, mask: int = WATCHED) -> int:
        """The watch descriptor of ``path`` (the same one again for a directory already
        watched)."""
        wd: int = self._add(self.fd, os.fsencode(path), mask)
        if wd < 0:
            raise _errno_error(path)
        return wd

    def remove(self, wd: int) -> None:
        """Stop a watch; one the kernel dropped already is no error."""
        self._rm(self.fd, wd)

    def read(self) -> list[tuple[int, int, str]]:
        """The events waiting, as ``(wd, mask, name)``; none if there are none."""
        events: list[tuple[int, int, str]] = []
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return events
            offset = 0
            while offset + _EVENT.size <= len(data):
                wd, mask, _cookie, size = _EVENT.unpack_from(data, offset)
                offset += _EVENT.size
                name = data[offset:offset + size].rstrip(b"\0")
                offset += size
                events.append((wd, mask, os.fsdecode(name)))

    def close(self) -> None:
        os.close(self.fd)


def _errno_error(what: str) -> OSError:
    code = ctypes.get_errno()
    return OSError(code, os.strerror(code), what)


@dataclass
class _Source:
    """What the watcher knows of one directory source."""

    id: str
    root: Path | None = None          # resolved; None: not watched now (lost, or refused)
    wds: set[int] = field(default_factory=set)
    root_wd: int = -1
    changed_at: float | None = None   # first event not yet scanned (monotonic)
    last_event: float = 0.0
    events: int = 0
    rearm: bool = False               # a directory appeared, or the root went away
    retry_at: float = 0.0             # next look at a root that is not watched
    scanning: asyncio.Task[None] | None = None


class SourceWatcher:
    """Watches every enabled directory source of ``retriever`` and scans a source once
    its changes settle. :meth:`run` until cancelled.

    Args:
        allowed_roots: the roots a source must resolve under (as the scans check).
        debounce: seconds without a new event before a changed source is scanned.
        max_delay: seconds from a source's first unscanned event to its scan at the
            latest, however busy the directory stays.
        retry: seconds between looks at the source list (a source added, disabled or
            removed) and at a root that went away.
        max_dirs: directories watched at most, over all sources.
        clock: monotonic seconds (tests inject their own).
    """

    def __init__(self, retriever: Retriever, allowed_roots: Callable[[], Sequence[str]], *,
                 debounce: float = 0.5, max_delay: float = 5.0, retry: float = 5.0,
                 max_dirs: int = 8192, clock: Callable[[], float] = time.monotonic) -> None:
        self._retriever = retriever
        self._allowed_roots = allowed_roots
        self.debounce, self.max_delay, self.retry = debounce, max_delay, retry
        self.max_dirs = max_dirs
        self._clock = clock
        self._sources: dict[str, _Source] = {}
        # wd -> the sources watching that directory (a source's root may lie inside
        # another's: the kernel gives one watch per directory and instance).
        self._owner: dict[int, set[str]] = {}
        self._wake = asyncio.Event()
        self._inotify: Inotify | None = None
        self._full_warned = False
        self.scans = 0                          # scans this watcher started (for tests)

    @property
    def watched_dirs(self) -> int:
        return len(self._owner)

    async def run(self) -> None:
        """Watch until cancelled. Without inotify, log why once and return: the
        scheduled rescan stays the only way changes are found."""
        try:
            self._inotify = Inotify()
        except OSError as exc:
            _log.warning("live change detection is off: the scheduled rescan "
                         "(retrieval.rescan_interval) finds changes", error=str(exc))
            return
        loop = asyncio.get_running_loop()
        loop.add_reader(self._inotify.fd, self._readable)
        try:
            next_sync = 0.0
            while True:
                now = self._clock()
                if now >= next_sync:
                    await self._sync()
                    next_sync = now + self.retry
                self._start_due_scans()
                timeout = max(0.0, min([next_sync, *self._deadlines()]) - self._clock())
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
        finally:
            loop.remove_reader(self._inotify.fd)
            tasks = [s.scanning for s in self._sources.values() if s.scanning is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._inotify.close()
            self._inotify = None

    def _deadlines(self) -> list[float]:
        out = []
        for s in self._sources.values():
            if s.changed_at is not None and s.scanning is None:
                out.append(min(s.last_event + self.debounce, s.changed_at + self.max_delay))
            if s.root is None:
                out.append(s.retry_at)
        return out

    @property
    def _ino(self) -> Inotify:
        if self._inotify is None:
            raise RuntimeError("the watcher is not running")
        return self._inotify

    def _readable(self) -> None:
        now = self._clock()
        for wd, mask, _name in self._ino.read():
            if mask & IN_Q_OVERFLOW:  # events were lost: every source may have changed
                for s in self._sources.values():
                    self._mark(s, now, rearm=True)
                continue
            owners = [self._sources[sid] for sid in self._owner.get(wd, ())
                      if sid in self._sources]
            if mask & IN_IGNORED:  # the kernel dropped this watch (its directory is gone)
                self._owner.pop(wd, None)
                for source in owners:
                    source.wds.discard(wd)
                    if wd == source.root_wd:
                        self._lose(source, now)
                continue
            rearm = bool(mask & IN_ISDIR and mask & (IN_CREATE | IN_MOVED_TO))
            for source in owners:
                if wd == source.root_wd and mask & (IN_DELETE_SELF | IN_MOVE_SELF):
                    self._lose(source, now)
                self._mark(source, now, rearm=rearm)
        self._wake.set()

    def _mark(self, source: _Source, now: float, *, rearm: bool = False) -> None:
        if source.changed_at is None:
            source.changed_at = now
        source.last_event = now
        source.events += 1
        source.rearm = source.rearm or rearm

    def _lose(self, source: _Source, now: float) -> None:
        """The root went away (renamed, deleted): stop its watches, look again later."""
        if source.root is not None:
            _log.info("source root moved or removed: watching for it to come back",
                      source=source.id)
        self._unwatch(source)
        source.root, source.retry_at = None, now + self.retry

    def _unwatch(self, source: _Source) -> None:
        self._release(source.id, source.wds)
        source.wds = set()
        source.root_wd = -1

    def _release(self, source_id: str, wds: set[int]) -> None:
        """``source_id`` no longer watches ``wds``; a watch no source holds is removed."""
        for wd in wds:
            owners = self._owner.get(wd)
            if owners is None:
                continue
            owners.discard(source_id)
            if not owners:
                del self._owner[wd]
                self._ino.remove(wd)

    async def _sync(self) -> None:
        """Follow the source list: watch new enabled directory sources, drop the others,
        and look again at roots that were not there."""
        wanted = {s.id: s for s in await self._retriever.sources()
                  if s.kind == "directory" and not s.disabled}
        for gone in set(self._sources) - set(wanted):
            source = self._sources.pop(gone)
            self._unwatch(source)
            if source.scanning is not None:
                source.scanning.cancel()
        now = self._clock()
        for sid, row in wanted.items():
            source = self._sources.setdefault(sid, _Source(sid))
            if source.root is None and now >= source.retry_at:
                first = source.retry_at == 0.0
                if await self._arm(source, row.root) and not first:
                    self._mark(source, now)  # back after a gap: what changed meanwhile?

    async def _arm(self, source: _Source, root: str) -> bool:
        """Watch every directory of the source (again); False if its root cannot be
        watched now (looked at again in ``retry`` seconds)."""
        try:
            resolved = await asyncio.to_thread(check_root, root, self._allowed_roots())
            wds = await asyncio.to_thread(self._watch_tree, source.id, resolved)
        except Exception as exc:
            source.root, source.retry_at = None, self._clock() + self.retry
            _log.debug("source not watched", source=source.id, error=str(exc)[:200])
            return False
        source.root, source.rearm = resolved, False
        source.root_wd = wds[0]
        for wd in wds:
            self._owner.setdefault(wd, set()).add(source.id)
        self._release(source.id, source.wds - set(wds))  # moved out of the tree since
        source.wds = set(wds)
        return True

    def _watch_tree(self, source_id: str, root: Path) -> list[int]:
        """Watch descriptors of the root (first) and every directory the confined walk
        enters, each added through the walk's own descriptor."""
        opened = SourceRoot(root)
        wds: list[int] = []
        try:
            for _rel, fd, _names, _problems in opened.walk():
                if fd < 0:
                    continue
                if self.watched_dirs + len(wds) >= self.max_dirs:
                    if not self._full_warned:
                        self._full_warned = True
                        _log.warning("live change detection watches at most "
                                     "retrieval.watch_max_dirs directories: the rest are "
                                     "rescanned on schedule", source=source_id,
                                     watch_max_dirs=self.max_dirs)
                    break
                try:
                    wds.append(self._ino.add(f"/proc/self/fd/{fd}"))
                except OSError as exc:
                    if exc.errno != errno.ENOSPC or not wds:
                        raise
                    if not self._full_warned:  # fs.inotify.max_user_watches
                        self._full_warned = True
                        _log.warning("the kernel's inotify watch limit is reached "
                                     "(fs.inotify.max_user_watches): the rest are "
                                     "rescanned on schedule", source=source_id)
                    break
        finally:
            opened.close()
        if not wds:
            raise OSError(errno.ENOENT, "the root could not be entered")
        return wds

    def _start_due_scans(self) -> None:
        now = self._clock()
        for source in self._sources.values():
            if source.changed_at is None or source.scanning is not None \
                    or source.root is None:
                continue
            if now < min(source.last_event + self.debounce,
                         source.changed_at + self.max_delay):
                continue
            source.scanning = asyncio.create_task(self._scan(source),
                                                  name=f"watch-scan-{source.id}")

    async def _scan(self, source: _Source) -> None:
        events, waited = source.events, self._clock() - (source.changed_at or 0.0)
        source.changed_at, source.events = None, 0
        try:
            if source.rearm and source.root is not None:
                rows = {s.id: s for s in await self._retriever.sources()}
                if source.id in rows:
                    await self._arm(source, rows[source.id].root)
            self.scans += 1
            _log.info("source changed: scanning", source=source.id, events=events,
                      waited_ms=round(waited * 1000))
            await scan_source(self._retriever, source.id,
                              allowed_roots=self._allowed_roots())
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the next event, or the schedule, tries again
            _log.warning("scan after a change failed", source=source.id,
                         error=str(exc)[:200])
        finally:
            source.scanning = None
            self._wake.set()
