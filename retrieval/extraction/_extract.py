"""Turn files into text: Markdown, plain text, HTML, config exports, PDF, and YAML, JSON,
TOML, shell and Python files (read as text, like plain text, and chunked by their
structure).

What a hostile or broken file can do here is bounded:

* **Size**: checked with ``stat`` before anything is read, and again while reading.
* **Special files**: only regular files are opened. A path is ``stat``-ed first (a FIFO or
  a device is refused without opening it, so nothing blocks and no device side effect
  happens), then opened non-blocking and checked again with ``fstat`` on the descriptor.
  :func:`extract_file` follows symlinks (its caller trusts the path); files of directory
  sources are opened by :mod:`retrieval.extraction._confine` without following any and handed to
  :func:`extract_fd` as a descriptor.
* **Encodings** (:mod:`retrieval.extraction._text`): UTF-8 (BOM stripped), UTF-16/UTF-32 with
  a BOM, or a legacy encoding that charset-normalizer detects with confidence; anything
  else is refused with a reason instead of being indexed as mojibake.
* **HTML** (:mod:`retrieval.extraction._html`): a small linear-time tokenizer, not the stdlib
  parser (quadratic on malformed input before CVE-2025-6069's fix); nesting depth is
  bounded (``html_too_deep``).
* **PDF** (:mod:`retrieval.extraction._pdf`): parsed by pypdf in a separate process
  (:mod:`retrieval.extraction._pdf_worker`) under a memory rlimit, a CPU rlimit, a wall-clock
  timeout, a page cap and an output cap, so a decompression bomb or a parser bug can never
  crash, hang or bloat the daemon.

Every failure is an :class:`~retrieval.errors.ExtractionError` (with a ``kind``) or an
:class:`~retrieval.errors.InvalidDocument` naming the file.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..errors import ExtractionError, InvalidDocument
from ._dates import front_matter_date
from ._html import html_document
from ._kinds import KINDS, SUFFIXES, check_kind, kind_for
from ._pdf import extract_pdf
from ._text import clean_title, decode, markdown_title, normalise, stem

__all__ = ["KINDS", "SUFFIXES", "ExtractLimits", "Extracted", "extract_bytes", "extract_fd",
           "extract_file", "kind_for"]

@dataclass(frozen=True)
class ExtractLimits:
    """Bounds on what one file may cost.

    ``pdf_max_memory`` and ``pdf_max_output`` extend the fields of docs/retrieval.md.
    """

    max_bytes: int = 20 * 1024 * 1024      # per file
    pdf_timeout: float = 30.0              # seconds, PDF worker process (wall clock)
    pdf_max_pages: int = 2000
    html_max_depth: int = 500
    pdf_max_memory: int = 1024 * 1024 * 1024  # address space of the PDF worker (RLIMIT_AS)
    pdf_max_output: int = 64 * 1024 * 1024    # bytes of JSON the worker may print


@dataclass(frozen=True)
class Extracted:
    """The text of one file."""

    title: str         # first H1 / <title> / PDF metadata title / file stem
    text: str          # normalised to \n newlines, NUL-free
    kind: str          # one of KINDS: markdown | text | html | pdf | config | yaml | ...
    # The document's own date, unix seconds: Markdown front matter ``date:``, an HTML
    # ``<meta>`` date, a PDF's /CreationDate (None: none, or not a valid date).
    date: int | None = None


def extract_file(path: Path, limits: ExtractLimits = ExtractLimits()) -> Extracted:
    """Read and extract one regular file named by a path the caller trusts (a path
    somebody else can write in is read with :meth:`retrieval.SourceRoot.open_file` and
    :func:`extract_fd` instead). Blocking: call it from a worker thread.

    The file is ``stat``-ed before it is opened: FIFOs, sockets and devices are refused
    at once (never opened, so never blocked on), and so is a file over
    ``limits.max_bytes``.

    Raises:
        InvalidDocument: the suffix is not a supported kind.
        ExtractionError: the file is not regular (``not_regular``), cannot be read
            (``unreadable``), is too large, binary, undecodable, or its content cannot be
            extracted (see :func:`extract_bytes`).
    """
    name = str(path)
    kind = _kind_or_refuse(path, name)
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ExtractionError(f"{name}: cannot be read: {exc.strerror}", "unreadable") from exc
    _check_regular(st, name)
    _check_size(st.st_size, name, limits)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        raise ExtractionError(f"{name}: cannot be read: {exc.strerror}", "unreadable") from exc
    try:
        opened = os.fstat(fd)
        if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
            raise ExtractionError(f"{name}: replaced while being opened", "unreadable")
        return extract_fd(fd, name, kind, limits)
    finally:
        os.close(fd)


def extract_fd(fd: int, name: str, kind: str,
               limits: ExtractLimits = ExtractLimits()) -> Extracted:
    """Extract the file open at ``fd`` (left open: the caller closes it), reading nothing
    but that descriptor: a PDF goes to the worker process as its standard input, never
    as a path it could re-open. Blocking: call it from a worker thread.

    Raises:
        InvalidDocument: ``kind`` is not one of :data:`KINDS`.
        ExtractionError: as :func:`extract_file`.
    """
    check_kind(kind, name)
    opened = os.fstat(fd)
    _check_regular(opened, name)
    _check_size(opened.st_size, name, limits)
    if kind == "pdf":
        return _pdf(name, limits, stdin_fd=fd)
    return _extract_data(_read_bounded(fd, name, limits), name, kind, limits)


def _kind_or_refuse(path: PurePosixPath | Path, name: str) -> str:
    kind = kind_for(path)
    if kind is None:
        raise InvalidDocument(f"{name}: unsupported file type {path.suffix or '(no suffix)'!r}; "
                              f"supported: {', '.join(sorted(SUFFIXES))}")
    return kind


def extract_bytes(
    data: bytes, name: str, kind: str, limits: ExtractLimits = ExtractLimits()
) -> Extracted:
    """Extract text from bytes received from a caller (a pushed document).

    Args:
        data: the raw file content.
        name: a display name for messages; its stem is the fallback title.
        kind: one of :data:`KINDS`.
        limits: size, time and depth bounds.

    Raises:
        InvalidDocument: ``kind`` is not one of :data:`KINDS`.
        ExtractionError: ``too_large``, ``binary``, ``encoding``, ``html_too_deep``,
            ``timeout``, ``resource_limit``, ``worker_failed``, ``pdf_malformed``,
            ``pdf_encrypted``, ``pdf_image_only``.
    """
    check_kind(kind, name)
    _check_size(len(data), name, limits)
    if kind == "pdf":
        return _pdf(name, limits, data=data)
    return _extract_data(data, name, kind, limits)


# --- files -------------------------------------------------------------------------------

_FILE_TYPES = (
    (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
)


def _check_regular(st: os.stat_result, name: str) -> None:
    if stat.S_ISREG(st.st_mode):
        return
    what = next((label for test, label in _FILE_TYPES if test(st.st_mode)), "not a file")
    raise ExtractionError(f"{name}: not a regular file ({what}); only regular files are read",
                          "not_regular")


def _check_size(size: int, name: str, limits: ExtractLimits) -> None:
    if size > limits.max_bytes:
        raise ExtractionError(
            f"{name}: {size} bytes is over the {limits.max_bytes}-byte limit "
            "(retrieval.max_file_mb)", "too_large")


def _read_bounded(fd: int, name: str, limits: ExtractLimits) -> bytes:
    """Read to EOF, but never more than max_bytes + 1 (the file may grow meanwhile)."""
    chunks: list[bytes] = []
    total = 0
    while total <= limits.max_bytes:
        try:
            chunk = os.read(fd, min(1 << 20, limits.max_bytes + 1 - total))
        except OSError as exc:
            raise ExtractionError(f"{name}: cannot be read: {exc.strerror}",
                                  "unreadable") from exc
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    _check_size(total, name, limits)
    return b"".join(chunks)


def _extract_data(data: bytes, name: str, kind: str, limits: ExtractLimits) -> Extracted:
    text = normalise(decode(data, name, kind))
    date = None
    if kind == "html":
        title, text, date = html_document(text, name, limits.html_max_depth)
        text = normalise(text)
    elif kind == "markdown":
        title, date = markdown_title(text), front_matter_date(text)
    else:
        title = ""
    return Extracted(title=clean_title(title) or stem(name), text=text, kind=kind, date=date)


def _pdf(name: str, limits: ExtractLimits, *, data: bytes | None = None,
         stdin_fd: int | None = None) -> Extracted:
    title, text, date = extract_pdf(name, limits, data=data, stdin_fd=stdin_fd)
    return Extracted(title=title, text=text, kind="pdf", date=date)
