"""One daemon per state directory: an exclusive lock on ``<state_dir>/llamad.lock``.

Two daemons on one state directory would fight over its indexes, audit log and socket.
The daemon takes an exclusive ``flock`` on the lock file before it opens anything else in
the directory, writes its pid into it, and holds it for its lifetime. A second daemon is
refused with :class:`StateDirInUse`, naming the directory and the holder's pid (the CLI
exits with status 2, as for other configuration errors).

The kernel drops a ``flock`` when the last descriptor of the open file goes away, so a
daemon that dies — ``kill -9`` included — never leaves a stale lock behind; the file
itself stays (removing it would race a daemon opening it), and its old pid is harmless:
it is read only while a live daemon holds the lock, after that daemon has rewritten it.
The descriptor is close-on-exec, so children never inherit the lock. ``flock`` locks
belong to the open file, not the process: two daemons in one process exclude each other
too.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path

__all__ = ["LOCK_NAME", "StateDirInUse", "StateLock"]

LOCK_NAME = "llamad.lock"
# Between a holder's flock and its pid write there is a moment when the file is empty:
# a second daemon arriving then waits this long for the pid before naming none.
_PID_WAIT = 1.0


class StateDirInUse(OSError):
    """Another live process holds the state directory's lock.

    Attributes:
        state_dir: the directory (absolute).
        pid: the holder's pid, or None if it could not be read.
    """

    def __init__(self, state_dir: Path, pid: int | None) -> None:
        self.state_dir = state_dir
        self.pid = pid
        holder = f"pid {pid}" if pid is not None else "another process"
        super().__init__(f"state directory {state_dir} in use by {holder} "
                         f"(it holds {state_dir / LOCK_NAME}); stop it, or give this "
                         "daemon its own state_dir")


class StateLock:
    """The exclusive lock on a state directory, held from :meth:`acquire` to :meth:`release`."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir.absolute()
        self.path = self.state_dir / LOCK_NAME
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._fd is not None

    def acquire(self) -> None:
        """Create the state directory if need be, lock it, and write our pid.

        Does not block: the lock is free, or this fails at once. Idempotent while held.

        Raises:
            StateDirInUse: another open file (another daemon) holds the lock.
            OSError: the directory or the lock file cannot be created or written (one
                line naming the path).
        """
        if self._fd is not None:
            return
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o750)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o640)
        except OSError as exc:
            raise OSError(f"cannot lock the state directory: {exc.filename or self.path}: "
                          f"{exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            os.close(fd)
            raise StateDirInUse(self.state_dir, pid) from None
        except OSError as exc:
            os.close(fd)
            raise OSError(f"cannot lock {self.path}: {exc.strerror or exc}") from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as exc:
            os.close(fd)  # drops the lock
            raise OSError(f"cannot write {self.path}: {exc.strerror or exc}") from None
        self._fd = fd

    def release(self) -> None:
        """Drop the lock (closing the file). Idempotent."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def _read_pid(fd: int) -> int | None:
    deadline = time.monotonic() + _PID_WAIT
    while True:
        try:
            text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        except OSError:
            return None
        if text.isdigit():
            return int(text)
        if text or time.monotonic() >= deadline:
            return None
        time.sleep(0.02)
