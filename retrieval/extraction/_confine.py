"""Reading files of a directory source without ever leaving its root.

Checking a path and then opening it is a race: between the two, anyone who can write in
the source can swap the file (or a directory above it) for a symlink to a file outside,
and the open follows it. So a file is never opened by its path. :class:`SourceRoot` holds
an open descriptor of the source's root directory, checked once after opening (its real
path, read back from ``/proc/self/fd``, must be the root that was checked against
``retrieval.allowed_roots``); every file is then opened by walking from that descriptor one
component at a time, each with ``O_NOFOLLOW`` (``openat`` with ``dir_fd``), so no symlink
anywhere on the way is followed, whatever is swapped meanwhile. The opened descriptor
itself is checked again (its real path must lie under the root) and is the only thing read.

A symlink inside a source that points to another file inside it is still indexed: the
scan resolves it to a path relative to the root, and that path is walked the same way.

What this does not stop: a **hard link** is the file itself, not a pointer to it, so a
hard link inside a root to a file outside is read like any other file. With the kernel's
``fs.protected_hardlinks = 1`` (the default on Debian, Ubuntu and every systemd system) a
user can only hard-link files they own or may read and write; ``refuse_hard_links``
refuses every file with more than one link, for sites that want no such files read at all.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
from collections.abc import Callable, Generator, Iterator
from pathlib import Path

from ..errors import ExtractionError, SourceNotAllowed
from ..redaction._names import redact_name

__all__ = ["SourceRoot", "display_name", "protected_hardlinks"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO swapped in after the scan's check cannot block the open (fstat then
# refuses it); O_NOCTTY: a terminal device never becomes our controlling terminal.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
_PROC_FD = Path("/proc/self/fd")


def display_name(name: str) -> str:
    """``name`` printable as UTF-8: bytes that are not valid UTF-8 (which ``os`` hands over
    as lone surrogates) shown as ``\\xff`` escapes, and secrets in it redacted
    (:func:`retrieval.redaction._names.redact_name`)."""
    return redact_name(name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace"))


def protected_hardlinks() -> bool | None:
    """Whether the kernel refuses hard links to files the linking user cannot read and
    write (``fs.protected_hardlinks``); None when it cannot be read."""
    try:
        return Path("/proc/sys/fs/protected_hardlinks").read_text().strip() == "1"
    except OSError:
        return None


def _fd_path(fd: int) -> str | None:
    """The kernel's name for what ``fd`` refers to; None without ``/proc``."""
    try:
        return os.readlink(_PROC_FD / str(fd))
    except OSError:
        return None


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


class SourceRoot:
    """An open, checked descriptor of a source's root directory.

    Use as a context manager (or call :meth:`close`); the descriptor stays valid even if
    the root's path is renamed or swapped for a symlink meanwhile: files are opened
    beneath what was checked, not beneath what the path names now. Thread-safe: a
    :meth:`close` while a worker thread is still opening a file (its task was cancelled,
    but threads cannot be) takes effect when that open returns, so the descriptor number
    is never reused under it.
    """

    def __init__(self, path: Path, *, refuse_hard_links: bool = False) -> None:
        """Open ``path``, which the caller has resolved (no symlink in it) and checked.

        Raises:
            SourceNotAllowed: ``path`` changed between the check and the open (a component
                was swapped for a symlink), so what is open is not what was checked.
            OSError: it cannot be opened as a directory.
        """
        self.path = path
        self.refuse_hard_links = refuse_hard_links
        self._lock = threading.Lock()
        self._users = 0
        self._closing = False
        self._fd = os.open(path, _DIR_FLAGS)
        real = _fd_path(self._fd)
        if real is not None and real != str(path):
            os.close(self._fd)
            raise SourceNotAllowed(f"{path} changed while being opened (it now leads to "
                                   f"{display_name(real)}); not scanned", configured=True)
        self._real = real or str(path)
        held = os.fstat(self._fd)
        self._identity = (held.st_dev, held.st_ino)

    def moved(self) -> str | None:
        """Why :attr:`path` no longer leads to the directory this holds open (it was
        renamed or removed, or replaced by a symlink or another directory), or None while
        it still does. What is open stays readable either way; a scan uses this to stop,
        rather than report every file of a moved root as outside it (or gone)."""
        try:
            now = os.stat(self.path, follow_symlinks=False)
        except OSError as exc:
            return f"it is gone ({exc.strerror})"
        if stat.S_ISLNK(now.st_mode):
            return "it was replaced by a symlink"
        if (now.st_dev, now.st_ino) != self._identity:
            return "it was renamed, or replaced by another directory or file"
        return None

    def close(self) -> None:
        """Close the descriptor (once no open is under way). Idempotent."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            if self._users == 0:
                os.close(self._fd)

    def __enter__(self) -> SourceRoot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _using(self) -> Iterator[int]:
        with self._lock:
            if self._closing:
                raise ExtractionError("the scan ended before the file was read", "unreadable")
            self._users += 1
        try:
            yield self._fd
        finally:
            with self._lock:
                self._users -= 1
                if self._closing and self._users == 0:
                    os.close(self._fd)

    def _open(self, rel: str, last_flags: int) -> int:
        """Open ``rel`` ("" for the root itself) component by component, following no
        symlink."""
        parts = rel.split("/") if rel else []
        if any(p in ("", ".", "..") for p in parts):
            raise ExtractionError(f"{display_name(rel)}: not a plain relative path",
                                  "unreadable")
        with self._using() as root_fd:
            if not parts:
                return os.open(".", last_flags, dir_fd=root_fd)
            fds: list[int] = []
            try:
                at = root_fd
                for part in parts[:-1]:
                    at = os.open(part, _DIR_FLAGS, dir_fd=at)
                    fds.append(at)
                return os.open(parts[-1], last_flags, dir_fd=at)
            finally:
                for opened in fds:
                    os.close(opened)

    def open_file(self, rel: str) -> int:
        """Open the regular file at ``rel`` (a relative POSIX path, no ``.`` or ``..``)
        beneath the root, following no symlink, and return its descriptor (the caller
        closes it). Blocking: call it from a worker thread.

        Raises:
            ExtractionError: ``unreadable`` (missing, permission, a symlink or a
                non-directory on the way, so swapped since the scan looked),
                ``not_regular``, ``hard_link`` (more than one link, with
                ``refuse_hard_links``), or ``outside_root`` (the opened file's real path is
                not under the root: the walk cannot get there, checked anyway).
        """
        shown = display_name(str(self.path / rel))
        if not rel:
            raise ExtractionError("(empty path): not a plain relative path", "unreadable")
        try:
            fd = self._open(rel, _FILE_FLAGS)
        except OSError as exc:
            raise ExtractionError(f"{shown}: cannot be read: {_why(exc)}", "unreadable") \
                from exc
        try:
            self._check_opened(fd, shown)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def walk(self, skip_dir: Callable[[str], bool] | None = None,
             ) -> Generator[tuple[str, int, list[str], list[tuple[str, str]]], None, None]:
        """Every directory beneath the root, depth first in name order, as
        ``(relative path, its descriptor, file names, problems)``. Hidden entries (a
        leading ``.``) are left out, and so is a directory (relative path) for which
        ``skip_dir`` says True: it is never entered. Directories are entered through
        :meth:`open_file`'s walk, so a symlink to a directory, or a directory swapped for
        a symlink or a FIFO meanwhile, is never entered. File names include symlinks and
        special files: the caller ``lstat``-s them at the descriptor. Problems are
        ``(escaped path, reason)`` for directories that could not be entered or whose names
        are not UTF-8. The descriptor is valid until the next item is asked for.
        """
        pending = [""]
        while pending:
            rel = pending.pop()
            try:
                fd = self._open(rel, _DIR_FLAGS | os.O_NONBLOCK)
            except (OSError, ExtractionError) as exc:
                why = _why(exc) if isinstance(exc, OSError) else exc.reason
                yield rel, -1, [], [(display_name(rel), f"directory not read: {why}")]
                continue
            try:
                dirs: list[str] = []
                files: list[str] = []
                problems: list[tuple[str, str]] = []
                with os.scandir(fd) as entries:
                    for entry in entries:
                        if entry.name.startswith("."):
                            continue
                        path = f"{rel}/{entry.name}" if rel else entry.name
                        try:
                            is_dir = entry.is_dir(follow_symlinks=False)
                        except OSError:
                            continue  # gone since it was listed
                        if not _utf8(entry.name):
                            what = "directory" if is_dir else "file"
                            problems.append((display_name(path), f"{what} name is not valid "
                                             "UTF-8; rename it to index it"))
                        elif is_dir:
                            if skip_dir is None or not skip_dir(path):
                                dirs.append(path)
                        else:
                            files.append(entry.name)
                pending.extend(sorted(dirs, reverse=True))
                yield rel, fd, sorted(files), sorted(problems)
            finally:
                os.close(fd)

    def _check_opened(self, fd: int, shown: str) -> None:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ExtractionError(f"{shown}: not a regular file; only regular files are read",
                                  "not_regular")
        if self.refuse_hard_links and st.st_nlink > 1:
            raise ExtractionError(
                f"{shown}: has {st.st_nlink} hard links; retrieval.refuse_hard_links refuses "
                "files that may be linked from outside the source", "hard_link")
        real = _fd_path(fd)
        if real is not None and not _inside(real, self._real):
            raise ExtractionError(f"{shown}: resolves outside the source root; not read",
                                  "outside_root")


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _why(exc: OSError) -> str:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return ("a symlink or another non-directory is on its path (changed since the scan "
                "looked?); links are not followed out of a source")
    return exc.strerror or str(exc)
