"""Open a model file only if it is a regular file, and say in one line why not.

``open_regular`` never blocks on a FIFO or device (``stat`` first, then ``O_NONBLOCK`` and
``fstat``); ``os_reason`` turns its ``OSError`` into the reason an ``InvalidModelError``
gives. ``sha256_file`` hashes a file opened the same way.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat

__all__ = ["NotRegularFileError", "open_regular", "os_reason", "sha256_file"]


def sha256_file(path: str | os.PathLike[str], *, chunk: int = 1 << 20) -> str:
    """Return the hex SHA-256 of a regular file's contents, read ``chunk`` bytes at a time.

    Like ``read_gguf_info`` it refuses, without blocking, anything but a regular file.

    Args:
        path: the file.
        chunk: the read size in bytes.

    Returns:
        The lowercase hex digest.

    Raises:
        OSError: the file cannot be opened or read, or is not a regular file (I/O
            errors stay ``OSError`` so callers that hash in the background can ignore
            them; ``read_gguf_info`` is the check that explains what is wrong).
        ValueError: ``chunk`` is not positive.
    """
    if chunk <= 0:
        raise ValueError(f"chunk must be positive, got {chunk}")
    fd, _ = open_regular(os.fspath(path))
    digest = hashlib.sha256()
    view = memoryview(bytearray(chunk))
    with open(fd, "rb", buffering=0, closefd=True) as f:
        while n := f.readinto(view):
            digest.update(view[:n])
    return digest.hexdigest()


class NotRegularFileError(OSError):
    """The path names a directory, FIFO, device or socket; ``strerror`` says which."""


def open_regular(path: str) -> tuple[int, int]:
    """Open ``path`` read-only if it is a regular file; return (fd, size).

    Raises:
        OSError: from ``stat`` or ``open``, or ``NotRegularFileError``.
    """
    _require_regular(path, os.stat(path).st_mode)
    # O_NONBLOCK: if the path is swapped for a FIFO after the stat, open still returns
    # at once instead of waiting for a writer; the fstat below then refuses it.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        _require_regular(path, st.st_mode)
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size


def _require_regular(path: str, mode: int) -> None:
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):
        kind = "a directory"
    elif stat.S_ISFIFO(mode):
        kind = "a FIFO"
    elif stat.S_ISCHR(mode):
        kind = "a character device"
    elif stat.S_ISBLK(mode):
        kind = "a block device"
    elif stat.S_ISSOCK(mode):
        kind = "a socket"
    else:
        kind = "a special file"
    raise NotRegularFileError(errno.EINVAL, f"not a regular file: it is {kind}", path)


def os_reason(exc: OSError) -> str:
    if isinstance(exc, NotRegularFileError):
        return str(exc.strerror)
    reasons = {
        errno.ENOENT: "no such file",
        errno.ELOOP: "symlink loop (too many levels of symbolic links)",
        errno.EACCES: "permission denied",
        errno.EPERM: "operation not permitted",
        errno.ENOTDIR: "a component of the path is not a directory",
        errno.ENAMETOOLONG: "file name too long",
    }
    if exc.errno is not None and exc.errno in reasons:
        return reasons[exc.errno]
    return f"cannot open: {exc.strerror or exc}"
