"""Validate a GGUF model file before a child is launched with it.

A child given a missing, truncated or foreign file fails minutes later with a log line
nobody reads, and the supervisor would retry it forever. ``read_gguf_info`` answers in
milliseconds instead, with one line saying what is wrong, so a bad file opens the circuit
breaker at once (ARCHITECTURE.md, invariant 3).

The parser streams the header through ``os.pread`` windows: it never maps or reads the
tensor data, skips values it does not need (a 262k-entry tokenizer vocabulary costs one
tight loop over length prefixes), and bounds every count and length by a hard cap and by
the bytes left in the file, so a hostile header cannot make it allocate gigabytes or spin.
It applies the same structural checks as llama.cpp's ``gguf_init_from_file_impl``
(``ggml/src/gguf.cpp``): version, duplicate keys, tensor name length, dimension count,
row size a multiple of the block size, contiguous aligned data offsets; and, like
``llama_model_loader``, that every tensor's bytes lie inside the file.

Where each part lives: :mod:`supervisor.gguf._open` (open only a regular file, without
blocking; ``sha256_file``), :mod:`supervisor.gguf._cursor` (the ``pread`` windows) and
:mod:`supervisor.gguf._header` (``GGUFInfo`` and the header checks).
"""

from __future__ import annotations

import os
import threading

from ..errors import InvalidModelError
from ._cursor import Cursor
from ._header import GGUFInfo, parse_header
from ._open import open_regular, os_reason, sha256_file

__all__ = ["GGUFInfo", "read_gguf_info", "sha256_file"]

# The facts of files read before, by identity and version (device, inode, size, mtime):
# an on-demand load validates its file twice (before the launch, and in the supervisor),
# and reading a large vocabulary costs tens of milliseconds each time (29 ms for
# gemma-3-270m). A file that changed in any of those (or its ctime) is read again.
_READ: dict[tuple[str, int, int, int, int, int], GGUFInfo] = {}
_READ_MAX = 64
_READ_LOCK = threading.Lock()  # validations run in worker threads


def read_gguf_info(path: str | os.PathLike[str]) -> GGUFInfo:
    """Check that ``path`` is a complete GGUF model file and return its header facts.

    Reads the header and metadata only (a few megabytes at most, even for a model of
    many gigabytes) and checks that the file is long enough to hold every tensor; a file
    read before and unchanged since (same inode, size and modification time) is not read
    again. It
    never blocks on a FIFO or device: the path is checked with ``stat`` first and opened
    with ``O_NONBLOCK``.

    Args:
        path: the model file.

    Returns:
        The header facts.

    Raises:
        InvalidModelError: the file is missing, not a regular file, unreadable, empty,
            not a GGUF file, of an unsupported version, corrupt, or truncated. Its
            ``reason`` is one line naming what is wrong.
    """
    fspath = os.fspath(path)
    try:
        fd, size = open_regular(fspath)
    except OSError as exc:
        raise InvalidModelError(fspath, os_reason(exc)) from exc
    try:
        if size == 0:
            raise InvalidModelError(fspath, "empty file (0 bytes)")
        st = os.fstat(fd)
        real = os.path.realpath(fspath)
        key = (real, st.st_dev, st.st_ino, size, st.st_mtime_ns, st.st_ctime_ns)
        with _READ_LOCK:
            known = _READ.get(key)
        if known is not None:
            return known
        info = parse_header(Cursor(fd, size, fspath), real)
        with _READ_LOCK:
            if len(_READ) >= _READ_MAX:
                _READ.pop(next(iter(_READ)))
            _READ[key] = info
        return info
    finally:
        os.close(fd)
