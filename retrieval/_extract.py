"""Turn files into text: Markdown, plain text, HTML, config exports and PDF.

What a hostile or broken file can do here is bounded:

* **Size**: checked with ``stat`` before anything is read, and again while reading.
* **Special files**: only regular files are opened. A path is ``stat``-ed first (a FIFO or
  a device is refused without opening it, so nothing blocks and no device side effect
  happens), then opened non-blocking and checked again with ``fstat`` on the descriptor.
  :func:`extract_file` follows symlinks (its caller trusts the path); files of directory
  sources are opened by :mod:`retrieval._confine` without following any and handed to
  :func:`extract_fd` as a descriptor.
* **Encodings**: UTF-8 (BOM stripped), UTF-16/UTF-32 with a BOM, or a legacy encoding that
  charset-normalizer detects with confidence; anything else is refused with a reason
  instead of being indexed as mojibake.
* **HTML**: a small linear-time tokenizer, not :class:`html.parser.HTMLParser`: the stdlib
  parser of Python 3.11.x before the CVE-2025-6069 fix (gh-135462) is quadratic on
  malformed input (40 KB of ``"<a "`` takes ~20 s on 3.11.7, 20 MB never finishes) and
  raises ``AssertionError`` on ``"<!["``. Nesting depth is bounded (``html_too_deep``).
* **PDF**: parsed by pypdf in a separate process (:mod:`retrieval._pdf_worker`) under a
  memory rlimit, a CPU rlimit, a wall-clock timeout, a page cap and an output cap, so a
  decompression bomb or a parser bug can never crash, hang or bloat the daemon.

Every failure is an :class:`~retrieval.errors.ExtractionError` (with a ``kind``) or an
:class:`~retrieval.errors.InvalidDocument` naming the file.
"""

from __future__ import annotations

import codecs
import contextlib
import html
import json
import math
import os
import re
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import structlog

from . import _pdf_worker
from .errors import ExtractionError, InvalidDocument

__all__ = ["KINDS", "SUFFIXES", "ExtractLimits", "Extracted", "extract_bytes", "extract_fd",
           "extract_file", "kind_for"]

_log = structlog.get_logger("llamad.retrieval")

KINDS = ("markdown", "text", "html", "pdf", "config")

SUFFIXES: dict[str, str] = {
    ".md": "markdown", ".markdown": "markdown",
    ".txt": "text", ".log": "text", ".rst": "text", ".text": "text",
    ".html": "html", ".htm": "html",
    ".cfg": "config", ".conf": "config", ".config": "config", ".ios": "config",
    ".junos": "config",
    ".pdf": "pdf",
}
"""File suffix (lower case) -> kind. Anything else is unsupported."""

_MAX_TITLE_CHARS = 500
_SNIFF_BYTES = 8192
_BINARY_CONTROL_RATIO = 0.30


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
    kind: str          # markdown | text | html | pdf | config


def kind_for(path: PurePosixPath | Path) -> str | None:
    """The kind of a file by its suffix (case-insensitive); None when unsupported."""
    return SUFFIXES.get(path.suffix.lower())


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
    if kind not in KINDS:
        raise InvalidDocument(f"{name}: kind must be one of {', '.join(KINDS)}, not {kind!r}")
    opened = os.fstat(fd)
    _check_regular(opened, name)
    _check_size(opened.st_size, name, limits)
    if kind == "pdf":
        return _extract_pdf(name, limits, stdin_fd=fd)
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
    if kind not in KINDS:
        raise InvalidDocument(f"{name}: kind must be one of {', '.join(KINDS)}, not {kind!r}")
    _check_size(len(data), name, limits)
    if kind == "pdf":
        return _extract_pdf(name, limits, data=data)
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


def _stem(name: str) -> str:
    return PurePosixPath(name.replace("\\", "/")).stem or name


def _extract_data(data: bytes, name: str, kind: str, limits: ExtractLimits) -> Extracted:
    text = _normalise(_decode(data, name, kind))
    if kind == "html":
        title, text = _html_to_text(text, name, limits.html_max_depth)
        text = _normalise(text)
    elif kind == "markdown":
        title = _markdown_title(text)
    else:
        title = ""
    return Extracted(title=_clean_title(title) or _stem(name), text=text, kind=kind)


def _normalise(text: str) -> str:
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text.replace("\x00", "")


def _clean_title(title: str) -> str:
    return " ".join(title.split())[:_MAX_TITLE_CHARS]


# --- encodings ---------------------------------------------------------------------------

_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"),  # before UTF-16 LE
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"),
)
_MAX_LEGACY_CHAOS = 0.2  # charset-normalizer's own default threshold for a usable match


def _decode(data: bytes, name: str, kind: str) -> str:
    for bom, codec in _BOMS:
        if data.startswith(bom):
            try:
                text = data.decode(codec)
            except UnicodeDecodeError as exc:
                # utf-8-sig counts from after the BOM; utf-16 and utf-32 from the start.
                at = exc.start + (len(bom) if codec == "utf-8-sig" else 0)
                raise ExtractionError(
                    f"{name}: starts with a {codec.removesuffix('-sig').upper()} byte-order "
                    f"mark but is not valid {codec.removesuffix('-sig').upper()} "
                    f"(at byte {at})", "encoding") from exc
            _check_controls(text, name, kind)
            return text
    if b"\x00" in data[:_SNIFF_BYTES]:
        raise ExtractionError(
            f"{name}: looks like a binary file (NUL bytes in the first 8 KiB), not {kind} "
            "text (UTF-16 text needs a byte-order mark)", "binary")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = _decode_legacy(data, name)
    _check_controls(text, name, kind)
    return text


def _check_controls(text: str, name: str, kind: str) -> None:
    sample = text[:_SNIFF_BYTES]
    if not sample:
        return
    controls = sum(1 for c in sample if _is_control(c))
    if controls > _BINARY_CONTROL_RATIO * len(sample):
        raise ExtractionError(
            f"{name}: looks like a binary file ({controls} of the first {len(sample)} "
            f"characters are control characters), not {kind} text", "binary")


def _is_control(c: str) -> bool:
    o = ord(c)
    return (o < 32 and c not in "\t\n\r\f\v\x1b") or 0x7F <= o < 0xA0


def _decode_legacy(data: bytes, name: str) -> str:
    """Decode non-UTF-8 bytes when charset-normalizer is confident of a legacy encoding.

    Detection on short texts cannot tell the Latin code pages apart (cp1250, cp1252 and
    cp1257 tie on "Café"); among equally good candidates the Windows code page cp1252,
    then any other cp125x, is preferred: it is what legacy Western text almost always is.
    """
    from charset_normalizer import from_bytes  # noqa: PLC0415 - only for legacy files

    refused = ExtractionError(
        f"{name}: not valid UTF-8, and no legacy encoding was detected with confidence; "
        "convert it to UTF-8", "encoding")
    matches = list(from_bytes(data))
    candidates = [m for m in matches if not m.encoding.lower().startswith("utf")]
    if not candidates or candidates[0].chaos > _MAX_LEGACY_CHAOS:
        raise refused
    best = candidates[0]
    tied = [m for m in candidates if m.chaos <= best.chaos + 0.01]
    order: list[str] = []
    if any("cp1252" in m.could_be_from_charset for m in tied):
        order.append("cp1252")
    order += [m.encoding for m in tied if m.encoding.startswith("cp125")]
    order.append(best.encoding)
    for encoding in order:
        with contextlib.suppress(UnicodeDecodeError, LookupError):
            return data.decode(encoding)
    raise refused


# --- markdown ----------------------------------------------------------------------------

_ATX_H1 = re.compile(r" {0,3}#[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*")
_SETEXT_H1 = re.compile(r" {0,3}=+[ \t]*")
_FENCE = re.compile(r" {0,3}(`{3,}|~{3,})")
_FRONT_MATTER_TITLE = re.compile(r"title[ \t]*:[ \t]*(.+)")


def _markdown_title(text: str) -> str:
    """Front matter ``title:``, else the first ``# `` (or setext ``===``) heading outside
    code fences; "" when there is none."""
    lines = text.split("\n", 20_000)[:20_000]  # a title is near the top
    start = 0
    if lines and lines[0].strip() == "---":
        for i, line in enumerate(lines[1:200], start=1):
            if line.strip() in {"---", "..."}:
                start = i + 1
                break
            if m := _FRONT_MATTER_TITLE.fullmatch(line.strip()):
                value = m.group(1).strip().strip("\"'")
                if value:
                    return value
    fence = ""
    for i in range(start, len(lines)):
        line = lines[i]
        if m := _FENCE.match(line):
            marker = m.group(1)
            if not fence:
                fence = marker
            elif marker[0] == fence[0] and len(marker) >= len(fence) and \
                    not line.strip()[len(marker):].strip():
                fence = ""
            continue
        if fence:
            continue
        if m := _ATX_H1.fullmatch(line):
            if m.group(1).strip():
                return m.group(1)
            continue
        if line.strip() and i + 1 < len(lines) and _SETEXT_H1.fullmatch(lines[i + 1]):
            return line
    return ""


# --- HTML --------------------------------------------------------------------------------

_MARKUP = re.compile(r"<[A-Za-z/!?]")  # anything else after "<" is text ("a < b", "<3")
_TAG_OPEN = re.compile(r"<(/?)([A-Za-z][^\s/>]*+)")
# The rest of a tag up to its ">", quoted attribute values included. Possessive, so a tag
# with no ">" fails in one pass; per HTML5 an unterminated tag swallows the rest of the
# input, which is what the tokenizer then does.
_TAG_REST = re.compile(r"(?:[^>\"']++|\"[^\"]*+\"|'[^']*+')*+>")
_SPACE = re.compile(r"[ \t\n\f\r]+")

_VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta",
                   "param", "source", "track", "wbr", "keygen", "frame", "basefont",
                   "bgsound", "isindex", "image"})
# End tags that may be omitted: never pushed, so "<p>a<p>b<li>c" does not grow the depth.
_OPTIONAL_END = frozenset({"p", "li", "dt", "dd", "option", "optgroup", "tr", "td", "th",
                           "thead", "tbody", "tfoot", "colgroup", "caption", "rb", "rt",
                           "rtc", "rp", "html", "head", "body"})
_RAW_TEXT = frozenset({"script", "style", "xmp", "iframe", "noembed", "noframes", "textarea",
                       "title", "plaintext"})
_RAW_END = {tag: re.compile(rf"</{tag}[\s/>]", re.IGNORECASE) for tag in _RAW_TEXT}
_DROPPED = frozenset({"script", "style", "noscript", "template", "xmp", "iframe", "noembed",
                      "noframes"})
_IN_HEAD = frozenset({"title", "meta", "link", "style", "script", "noscript", "base",
                      "template"})
_BLOCK = frozenset({
    "address", "article", "aside", "blockquote", "center", "dd", "details", "dialog", "dir",
    "div", "dl", "dt", "fieldset", "figcaption", "figure", "footer", "form", "h1", "h2",
    "h3", "h4", "h5", "h6", "header", "hgroup", "hr", "legend", "li", "main", "menu",
    "nav", "ol", "p", "pre", "section", "summary", "table", "tr", "ul", "caption", "body",
    "html", "listing", "tbody", "thead", "tfoot", "option",
})
_PARAGRAPH = frozenset({"p", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "table", "blockquote",
                        "ul", "ol", "dl", "section", "article", "figure", "hr"})
_PREFORMATTED = frozenset({"pre", "listing", "textarea"})


class _HtmlText:
    """Collects rendered text: collapsed whitespace, newlines at block boundaries."""

    def __init__(self, name: str, max_depth: int) -> None:
        self.name = name
        self.max_depth = max_depth
        self.parts: list[str] = []
        self.newlines = 2            # trailing newlines in parts (2 = start of text)
        self.space = False           # a collapsed space is pending
        self.stack: list[str] = []
        self.dropped = 0             # open elements whose content is dropped
        self.pre = 0                 # open preformatted elements
        self.in_head = False
        self.title: str | None = None
        self.h1: list[str] | None = None
        self.h1_text = ""

    # output

    def text(self, data: str) -> None:
        if self.dropped or not data:
            return
        if self.in_head:
            if not data.strip():
                return
            self.in_head = False     # text in <head> starts the body (HTML5 does the same)
        data = html.unescape(data).replace("\xa0", " ")
        if self.h1 is not None:
            self.h1.append(data)
        if self.pre:
            self.parts.append(data)
            body = data.rstrip("\n")
            self.newlines = len(data) - len(body) if body else self.newlines + len(data)
            self.space = False
            return
        words = _SPACE.sub(" ", data)
        if words.startswith(" "):
            self.space = True
        words = words.strip(" ")
        if not words:
            return
        if self.space and self.newlines == 0:
            self.parts.append(" ")
        self.parts.append(words)
        self.newlines = 0
        self.space = data[-1] in " \t\n\f\r"

    def newline(self, count: int = 1) -> None:
        if self.dropped:
            return
        while self.newlines < count:
            self.parts.append("\n")
            self.newlines += 1
        self.space = False

    def hard_break(self) -> None:
        if not self.dropped and self.newlines < 2:
            self.parts.append("\n")
            self.newlines += 1
            self.space = False

    # structure

    def start(self, tag: str, self_closing: bool) -> None:
        if tag == "head":
            self.in_head = True
            return
        if self.in_head and tag not in _IN_HEAD:
            self.in_head = False
        if tag == "br":
            self.hard_break()
            return
        if tag in ("td", "th"):
            if not self.dropped and self.newlines == 0:
                self.parts.append(" | ")
                self.space = False
            return
        if tag in _BLOCK:
            self.newline(2 if tag in _PARAGRAPH else 1)
        if tag in _VOID or tag in _OPTIONAL_END or self_closing:
            return
        self.stack.append(tag)
        if len(self.stack) > self.max_depth:
            raise ExtractionError(
                f"{self.name}: HTML elements nested deeper than {self.max_depth} levels "
                "(retrieval.html_max_depth)",
                "html_too_deep")
        if tag in _DROPPED:
            self.dropped += 1
        if tag in _PREFORMATTED:
            self.pre += 1
        if tag == "h1" and self.h1 is None and not self.h1_text:
            self.h1 = []

    def end(self, tag: str) -> None:
        if tag == "head":
            self.in_head = False
            return
        if tag not in self.stack:
            if tag in _BLOCK:
                self.newline(2 if tag in _PARAGRAPH else 1)
            return                   # stray or optional end tag
        while self.stack:
            popped = self.stack.pop()
            if popped in _DROPPED:
                self.dropped -= 1
            if popped in _PREFORMATTED:
                self.pre -= 1
            if popped == "h1" and self.h1 is not None:
                self.h1_text = " ".join("".join(self.h1).split())
                self.h1 = None
            if popped == tag:
                break
        if tag in _BLOCK:
            self.newline(2 if tag in _PARAGRAPH else 1)

    def raw(self, tag: str, content: str) -> None:
        """Content of a raw-text element: script, style, ... are dropped; the first
        <title> is the title (never body text); a <textarea> is preformatted text."""
        if tag == "title":
            if self.title is None:
                self.title = " ".join(html.unescape(content).split())
        elif tag == "textarea":
            self.start(tag, self_closing=False)
            self.text(content)
            self.end(tag)

    def result(self) -> tuple[str, str]:
        text = "".join(self.parts).strip("\n")
        return self.title or self.h1_text, text


def _html_to_text(source: str, name: str, max_depth: int) -> tuple[str, str]:
    """(title, text) of an HTML document. Linear time; no recursion."""
    out = _HtmlText(name, max_depth)
    pos, n = 0, len(source)
    while pos < n:
        markup = _MARKUP.search(source, pos)
        if markup is None:
            out.text(source[pos:])
            break
        lt = markup.start()
        if lt > pos:
            out.text(source[pos:lt])
        if source.startswith("<!--", lt):
            end = source.find("-->", lt + 4)
            if end == -1:
                break                # unterminated comment: the rest is comment
            pos = end + 3
            continue
        tag = _TAG_OPEN.match(source, lt)
        if tag is not None:
            rest = _TAG_REST.match(source, tag.end())
            if rest is None:
                break                # unterminated tag: the rest is inside it
            pos = rest.end()
            name_ = tag.group(2).lower()
            if tag.group(1):
                out.end(name_)
                continue
            self_closing = source[pos - 2] == "/" and name_ not in _RAW_TEXT
            if name_ in _RAW_TEXT and name_ != "plaintext":
                found = _RAW_END[name_].search(source, pos)
                out.raw(name_, source[pos : found.start() if found else n])
                if found is None:
                    break
                gt = source.find(">", found.end() - 1)
                pos = n if gt == -1 else gt + 1
                continue
            if name_ == "plaintext":
                out.text(source[pos:].replace("&", "&amp;"))
                break
            out.start(name_, self_closing)
            continue
        # <!DOCTYPE>, <![CDATA[...]]>, <?pi?>, "</ 3>": skipped up to ">" (HTML5 treats
        # them as bogus comments outside foreign content).
        end = source.find(">", lt + 2)
        if end == -1:
            break                    # unterminated: the rest is inside it
        pos = end + 1
    return out.result()


# --- PDF ---------------------------------------------------------------------------------

_WORKER = Path(_pdf_worker.__file__).resolve()
_WORKER_KINDS = frozenset({"pdf_malformed", "pdf_encrypted", "pdf_image_only", "too_large",
                           "resource_limit", "not_regular"})
_READ_CHUNK = 65536
_STDERR_KEEP = 4096


@dataclass
class _Warned:
    no_prlimit: bool = False


_warned = _Warned()


def _worker_argv(limits: ExtractLimits) -> list[str]:
    """The worker command: parent-death signal and rlimits first, when the tools exist.

    ``setpriv`` and ``prlimit`` (util-linux) set these up in the child before it execs
    python, instead of a ``preexec_fn``, which is unsafe in a process with threads.
    """
    prefix: list[str] = []
    setpriv = shutil.which("setpriv")
    if setpriv:
        prefix += [setpriv, "--pdeathsig", "KILL", "--"]
    prlimit = shutil.which("prlimit")
    if prlimit:
        cpu = math.ceil(limits.pdf_timeout) + 1
        prefix += [prlimit, f"--as={limits.pdf_max_memory}", f"--cpu={cpu}:{cpu + 1}",
                   "--core=0", "--"]
    elif not _warned.no_prlimit:
        _warned.no_prlimit = True
        _log.warning("pdf_worker_without_memory_limit",
                     reason="prlimit (util-linux) is not on PATH; PDF parsing is bounded by "
                            "the timeout and output cap only")
    # -P: the worker's directory is not put on sys.path; run as a script so that the
    # retrieval package (tantivy, hnswlib, numpy) is not imported under the memory cap.
    return [*prefix, sys.executable, "-P", str(_WORKER), "-",
            "--max-bytes", str(limits.max_bytes), "--max-pages", str(limits.pdf_max_pages),
            "--max-output", str(limits.pdf_max_output)]


def _extract_pdf(name: str, limits: ExtractLimits, *, data: bytes | None = None,
                 stdin_fd: int | None = None) -> Extracted:
    """Run the worker on ``data`` (piped) or on an open file (as its stdin)."""
    try:
        proc = subprocess.Popen(
            _worker_argv(limits),
            stdin=subprocess.PIPE if data is not None else stdin_fd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            process_group=0,
            close_fds=True,
        )
    except OSError as exc:
        raise ExtractionError(f"{name}: the PDF worker cannot be started: {exc}",
                              "worker_failed") from exc
    try:
        out, err, failure = _communicate(proc, data, limits)
    except OSError as exc:
        raise ExtractionError(f"{name}: talking to the PDF worker failed: {exc}",
                              "worker_failed") from exc
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
    if failure == "timeout":
        raise ExtractionError(f"{name}: PDF parsing took longer than {limits.pdf_timeout:g} s "
                              "(retrieval.pdf_timeout)", "timeout")
    if failure == "output":
        raise ExtractionError(f"{name}: PDF text exceeds the {limits.pdf_max_output}-byte "
                              "output limit (retrieval.pdf_max_output_mb)", "resource_limit")
    return _pdf_result(name, proc.returncode, out, err)


def _communicate(proc: subprocess.Popen[bytes], data: bytes | None,
                 limits: ExtractLimits) -> tuple[bytes, bytes, str | None]:
    """Feed stdin and drain stdout and stderr concurrently, within the deadline and the
    output cap. Returns (stdout, stderr tail, failure) with failure None, "timeout" or
    "output"."""
    deadline = time.monotonic() + limits.pdf_timeout
    out = bytearray()
    err = bytearray()
    view = memoryview(data) if data is not None else memoryview(b"")
    offset = 0
    stdin = proc.stdin
    with selectors.DefaultSelector() as sel:
        assert proc.stdout is not None  # noqa: S101 - created with PIPE
        assert proc.stderr is not None  # noqa: S101 - created with PIPE
        for stream in (proc.stdout, proc.stderr):
            os.set_blocking(stream.fileno(), False)
            sel.register(stream, selectors.EVENT_READ)
        if stdin is not None:
            os.set_blocking(stdin.fileno(), False)
            if len(view):
                sel.register(stdin, selectors.EVENT_WRITE)
            else:
                stdin.close()
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return bytes(out), bytes(err), "timeout"
            for key, _ in sel.select(remaining):
                ready, fd = key.fileobj, key.fd
                if stdin is not None and ready is stdin:
                    try:
                        offset += os.write(fd, view[offset : offset + _READ_CHUNK])
                    except (BlockingIOError, InterruptedError):
                        continue
                    except BrokenPipeError:
                        offset = len(view)
                    if offset >= len(view):
                        sel.unregister(stdin)
                        stdin.close()
                    continue
                try:
                    chunk = os.read(fd, _READ_CHUNK)
                except (BlockingIOError, InterruptedError):
                    continue
                if not chunk:
                    sel.unregister(ready)
                    continue
                if ready is proc.stdout:
                    out += chunk
                    if len(out) > limits.pdf_max_output + _READ_CHUNK:
                        return bytes(out), bytes(err), "output"
                else:
                    err += chunk
                    del err[:-_STDERR_KEEP]
    try:
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return bytes(out), bytes(err), "timeout"
    return bytes(out), bytes(err), None


def _pdf_result(name: str, returncode: int, out: bytes, err: bytes) -> Extracted:
    if returncode != 0:
        tail = err.decode("utf-8", "replace").strip().splitlines()
        last = tail[-1][:200] if tail else ""
        if returncode in (-signal.SIGKILL, -signal.SIGXCPU) or "MemoryError" in last:
            raise ExtractionError(
                f"{name}: the PDF worker hit its memory or CPU limit "
                "(retrieval.pdf_max_memory_mb, retrieval.pdf_timeout) "
                f"(exit {returncode}{': ' + last if last else ''})", "resource_limit")
        raise ExtractionError(
            f"{name}: the PDF worker failed (exit {returncode}{': ' + last if last else ''})",
            "worker_failed")
    try:
        result = json.loads(out)
    except ValueError as exc:
        raise ExtractionError(f"{name}: the PDF worker printed no valid result",
                              "worker_failed") from exc
    if not isinstance(result, dict):
        raise ExtractionError(f"{name}: the PDF worker printed no valid result",
                              "worker_failed")
    if "error_kind" in result:
        kind, reason = result.get("error_kind"), result.get("reason")
        if kind not in _WORKER_KINDS or not isinstance(reason, str):
            raise ExtractionError(f"{name}: the PDF worker printed no valid result",
                                  "worker_failed")
        raise ExtractionError(f"{name}: {reason}", str(kind))
    pages, title = result.get("pages"), result.get("title")
    if not isinstance(pages, list) or not all(isinstance(p, str) for p in pages) or \
            not isinstance(title, str):
        raise ExtractionError(f"{name}: the PDF worker printed no valid result",
                              "worker_failed")
    text = _normalise("\n\n".join(p.strip("\n") for p in pages))
    # JSON may carry lone surrogates (from broken font maps): make the text valid UTF-8.
    text = text.encode("utf-8", "replace").decode("utf-8")
    title = _clean_title(title.encode("utf-8", "replace").decode("utf-8"))
    if not title:
        title = next((line.strip() for line in text.split("\n", 200) if line.strip()), "")
    return Extracted(title=_clean_title(title) or _stem(name), text=text, kind="pdf")
