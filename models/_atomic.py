"""Replace a file atomically: write beside it, fsync, rename over it, fsync the directory.

A reader (the daemon, a concurrent ``verify``) sees either the old file or the complete
new one, never a prefix; a crash leaves at most a hidden ``.NAME.*.tmp`` file, which
``prepare`` removes on its next run.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["atomic_path", "remove_stale_temps"]

_TMP_SUFFIX = ".tmp"


@contextlib.contextmanager
def atomic_path(dest: Path, *, mode: int = 0o644) -> Iterator[Path]:
    """Yield a temporary path beside ``dest``; on a clean exit make it ``dest`` atomically.

    The caller writes (and may check) the temporary file inside the ``with`` block. On an
    exception the temporary file is removed and ``dest`` is left untouched.

    Args:
        dest: the final path; its directory must exist.
        mode: permission bits for the result (the temporary file is created 0600).
    """
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=_TMP_SUFFIX, dir=dest.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        os.chmod(tmp, mode)
        _fsync(tmp)
        os.replace(tmp, dest)
        _fsync(dest.parent, os.O_DIRECTORY)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def remove_stale_temps(directory: Path) -> list[Path]:
    """Remove temporary files that an interrupted ``atomic_path`` left in ``directory``.

    Only call this while holding the directory's lock, or a live writer loses its file.
    """
    removed = []
    for path in directory.glob(f".*{_TMP_SUFFIX}"):
        if path.is_file():
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed.append(path)
    return removed


def _fsync(path: Path, flags: int = 0) -> None:
    """Flush ``path`` to disk; ``flags`` adds ``os.O_DIRECTORY`` for a directory."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
