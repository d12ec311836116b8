"""PDF text extraction, run as a separate process by :mod:`retrieval.extraction._pdf`.

Usage::

    python -m retrieval.extraction._pdf_worker PATH|- --max-bytes N --max-pages N --max-output N

Reads the PDF from PATH (a regular file) or from stdin (``-``) and writes exactly one JSON
object to stdout, then exits 0::

    {"title": "...", "created": "D:2024...", "pages": ["text of page 1", ...]}
    {"error_kind": "pdf_encrypted", "reason": "..."}

``error_kind`` is one of ``pdf_malformed``, ``pdf_encrypted``, ``too_large``,
``resource_limit``, ``not_regular``. Reasons never name the file: the caller does.
``created`` is the information dictionary's ``/CreationDate`` as written ("" without one);
the caller parses it.

The caller runs this under a memory rlimit, a CPU rlimit and a wall-clock timeout, and caps
what it reads from stdout; this module adds the limits it can check itself (input size,
page count, output size, pypdf's own decompression limits) so that the common failures get
a precise reason instead of a kill. A crash, a MemoryError that escapes, or a kill is still
safe: the caller turns any exit without a valid JSON object into an ``ExtractionError``.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import stat
import sys
import warnings
from typing import Any

Result = dict[str, Any]

IMAGE_ONLY_REASON = "no text layer (scanned/image-only PDF); OCR is not supported"


def _error(kind: str, reason: str) -> Result:
    return {"error_kind": kind, "reason": reason}


def _read_input(source: str, max_bytes: int) -> bytes | Result:
    if source == "-":
        data = sys.stdin.buffer.read(max_bytes + 1)
    else:
        # O_NONBLOCK: a FIFO swapped in after the caller's check cannot block the open.
        fd = os.open(source, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
        with open(fd, "rb", closefd=True) as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return _error("not_regular", "not a regular file")
            data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        return _error("too_large", f"larger than the {max_bytes}-byte limit")
    return data


def _clean_title(value: object) -> str:
    if not isinstance(value, str):
        return ""
    return " ".join(value.replace("\x00", "").split())[:500]


def _raw_date(metadata: object) -> str:
    """The ``/CreationDate`` string of a document information dictionary, or ""."""
    get = getattr(metadata, "get", None)
    value = get("/CreationDate") if callable(get) else None
    return str(value).replace("\x00", "")[:100] if isinstance(value, str) else ""


def extract(data: bytes, *, max_pages: int, max_output: int) -> Result:
    """Parse ``data`` with pypdf and return the result object (never raises Exception)."""
    from pypdf import PasswordType, PdfReader  # noqa: PLC0415 - after warnings are silenced
    from pypdf.errors import DependencyError, LimitReachedError  # noqa: PLC0415

    try:
        reader = PdfReader(io.BytesIO(data), strict=False)
        if reader.is_encrypted:
            try:
                opened = reader.decrypt("")
            except DependencyError:
                return _error("pdf_encrypted", "encrypted with AES; reading it needs the "
                                               "'cryptography' package, which is not installed")
            if opened == PasswordType.NOT_DECRYPTED:
                return _error("pdf_encrypted", "encrypted: a password is needed to open it")
        pages = reader.pages
        count = len(pages)
        if count > max_pages:
            return _error("too_large", f"{count} pages, the limit is {max_pages} "
                                       "(retrieval.pdf_max_pages)")
        try:
            title = _clean_title(reader.metadata.title if reader.metadata else None)
        except Exception:  # metadata is optional; a broken info dict is not fatal
            title = ""
        try:
            created = _raw_date(reader.metadata)
        except Exception:  # ditto
            created = ""
        texts: list[str] = []
        failed = 0
        total = 0
        for page in pages:
            try:
                text = page.extract_text()
            except (LimitReachedError, MemoryError, RecursionError):
                raise
            except Exception:  # one bad page does not lose the others
                failed += 1
                text = ""
            total += len(text)
            if total > max_output:
                return _error("resource_limit",
                              f"more than {max_output} characters of text "
                              "(retrieval.pdf_max_output_mb)")
            texts.append(text)
    except LimitReachedError as exc:
        return _error("resource_limit", f"a stream exceeds pypdf's decompression limit "
                                        f"(decompression bomb?): {exc}")
    except MemoryError:
        return _error("resource_limit", "out of memory while parsing (decompression bomb?)")
    except RecursionError:
        return _error("pdf_malformed", "object nesting too deep to parse")
    except Exception as exc:  # pypdf raises many types for damaged files
        detail = " ".join(str(exc).split())[:200] or type(exc).__name__
        return _error("pdf_malformed", f"cannot be parsed: {detail}")
    if count and failed == count:
        return _error("pdf_malformed", "no page could be parsed")
    if not any(t.strip() for t in texts):
        return _error("pdf_image_only", IMAGE_ONLY_REASON)
    return {"title": title, "created": created, "pages": texts}


def _emit(result: Result, max_output: int) -> None:
    # ensure_ascii: the output is ASCII whatever the text (lone surrogates included).
    payload = json.dumps(result, ensure_ascii=True).encode("ascii")
    if len(payload) > max_output:
        payload = json.dumps(_error(
            "resource_limit", f"the extracted text exceeds the {max_output}-byte output limit "
            "(retrieval.pdf_max_output_mb)"
        )).encode("ascii")
    sys.stdout.buffer.write(payload)
    sys.stdout.buffer.flush()


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (0 whenever a JSON object was written)."""
    warnings.simplefilter("ignore")
    logging.disable(logging.CRITICAL)  # pypdf logs every oddity it repairs
    parser = argparse.ArgumentParser(prog="python -m retrieval.extraction._pdf_worker")
    parser.add_argument("source", help="path of the PDF, or - for stdin")
    parser.add_argument("--max-bytes", type=int, required=True)
    parser.add_argument("--max-pages", type=int, required=True)
    parser.add_argument("--max-output", type=int, required=True)
    args = parser.parse_args(argv)
    try:
        data = _read_input(args.source, args.max_bytes)
    except OSError as exc:
        _emit(_error("pdf_malformed", f"cannot be read: {exc.strerror}"), args.max_output)
        return 0
    if isinstance(data, dict):
        _emit(data, args.max_output)
        return 0
    try:
        result = extract(data, max_pages=args.max_pages, max_output=args.max_output)
    except MemoryError:
        result = _error("resource_limit", "out of memory while parsing (decompression bomb?)")
    del data
    _emit(result, args.max_output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
