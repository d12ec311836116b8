"""Where children listen: UNIX sockets in a directory only the daemon's user can enter.

A child bound to ``127.0.0.1:N`` answers every local user (any uid can connect to a
loopback port), around llamad's tokens, roles, admission, queueing, redaction and audit.
A UNIX socket is reached through the file system instead: in a directory of mode 0700,
owned by the daemon's user, nobody else can even look it up (``connect`` needs search
permission on every directory of the path). Each launch also gets a random API key (see
:func:`child_key`), so a socket reached some other way still answers nobody without it.

The directory, in order of preference:

* ``$RUNTIME_DIRECTORY/children``: systemd's ``RuntimeDirectory=`` (``/run/llamad``,
  removed with the unit). The unit's directory itself may be open to others (a gRPC
  socket for group members lives there), so the children get their own subdirectory.
* ``$XDG_RUNTIME_DIR/llamad``: a user's own runtime directory.
* otherwise a private ``mkdtemp`` directory under the temporary directory, removed at exit
  when empty.

A directory that exists already must be ours, a real directory (not a symlink), and have
no group or other permission bits; one that is ours with looser bits is tightened to 0700.
A socket path has at most 107 bytes (``sun_path``); a directory too deep for that falls
back to the temporary one.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import secrets
import socket
import stat
import tempfile
import threading
from pathlib import Path

import structlog

_log = structlog.get_logger("llamad.supervisor")

SUN_PATH_MAX = 107
"""The longest UNIX socket path Linux binds (``sun_path`` is 108 bytes with its NUL)."""
_NAME_BYTES = len("0123456789ab.sock")  # what socket_path adds after the directory's "/"
_lock = threading.Lock()


class _Chosen:
    """The directory chosen for this process (None: not yet)."""

    path: Path | None = None


class RuntimeDirError(OSError):
    """The runtime directory is not private to the daemon's user, or cannot be made."""


def child_key() -> str:
    """A random per-launch API key (256 bits), handed to the child in its environment
    (never on its command line, which ``ps`` shows every user)."""
    return secrets.token_urlsafe(32)


def ensure_private(path: Path) -> Path:
    """Create ``path`` (mode 0700) if missing; check that it is ours and private.

    Raises:
        RuntimeDirError: it is not a directory, a symlink, someone else's, or its mode
            cannot be made 0700.
    """
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode):
        raise RuntimeDirError(f"runtime directory {path} is not a directory")
    if info.st_uid != os.geteuid():
        raise RuntimeDirError(
            f"runtime directory {path} belongs to uid {info.st_uid}, not to us "
            f"(uid {os.geteuid()})")
    if stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(path, 0o700)
        if stat.S_IMODE(path.lstat().st_mode) & 0o077:
            raise RuntimeDirError(f"runtime directory {path} cannot be made 0700")
    return path


def _candidates() -> list[Path]:
    found = []
    systemd = os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0]
    if systemd:
        found.append(Path(systemd) / "children")
    xdg = os.environ.get("XDG_RUNTIME_DIR", "")
    if xdg:
        found.append(Path(xdg) / "llamad")
    return found


def _fits(path: Path) -> bool:
    return len(os.fsencode(str(path))) + 1 + _NAME_BYTES <= SUN_PATH_MAX


def _temporary() -> Path:
    made = Path(tempfile.mkdtemp(prefix="llamad-"))  # mode 0700, ours
    if not _fits(made):
        made.rmdir()
        made = Path(tempfile.mkdtemp(prefix="llamad-", dir="/tmp"))

    def remove_if_empty() -> None:
        with contextlib.suppress(OSError):
            made.rmdir()

    atexit.register(remove_if_empty)
    return ensure_private(made)


def runtime_dir() -> Path:
    """The private directory children's sockets go in (chosen once per process).

    Raises:
        RuntimeDirError: a configured directory exists but is not private to us (it is
            never silently replaced by another: a misconfigured ``/run/llamad`` is said).
    """
    with _lock:
        if _Chosen.path is not None and _Chosen.path.is_dir():
            return _Chosen.path
        chosen = None
        for candidate in _candidates():
            if not _fits(candidate):
                _log.warning("runtime directory too deep for a socket path, using a "
                             "temporary one", path=str(candidate))
                continue
            try:
                chosen = ensure_private(candidate)
                break
            except FileNotFoundError:  # its parent is gone (XDG_RUNTIME_DIR of a past login)
                continue
            except PermissionError as exc:  # not ours to write in: the next one
                _log.warning("runtime directory not usable", path=str(candidate),
                             error=str(exc))
                continue
        if chosen is None:
            chosen = _temporary()
        sweep_stale(chosen)
        _Chosen.path = chosen
        return chosen


def socket_path(directory: Path | None = None) -> Path:
    """A new, unused socket path for one launch (random name, short)."""
    directory = runtime_dir() if directory is None else directory
    return directory / f"{secrets.token_hex(6)}.sock"


def remove_socket(path: Path) -> None:
    """Remove a child's socket file, if it is still there."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def sweep_stale(directory: Path) -> int:
    """Remove sockets nobody listens on (a crashed daemon's children); live ones, maybe
    another daemon's of the same user, are left alone. How many were removed."""
    removed = 0
    for entry in directory.glob("*.sock"):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(str(entry))
                continue  # someone answers
            except OSError as exc:
                if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
                    continue
        remove_socket(entry)
        removed += 1
    if removed:
        _log.info("stale child sockets removed", directory=str(directory), count=removed)
    return removed
