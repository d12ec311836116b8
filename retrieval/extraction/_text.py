"""Text out of bytes: encodings, binary refusal, newlines, titles, and the Markdown title.

UTF-8 (BOM stripped), UTF-16/UTF-32 with a BOM, or a legacy encoding that
charset-normalizer detects with confidence; anything else is refused with a reason
(``encoding``) instead of being indexed as mojibake, and so is text that is mostly control
characters (``binary``). Shared by the HTML and PDF extractors for titles and newlines.
"""

from __future__ import annotations

import codecs
import contextlib
import re
from pathlib import PurePosixPath

from ..errors import ExtractionError

_MAX_TITLE_CHARS = 500
_SNIFF_BYTES = 8192
_BINARY_CONTROL_RATIO = 0.30


def stem(name: str) -> str:
    """The file stem of a display name (the fallback title)."""
    return PurePosixPath(name.replace("\\", "/")).stem or name


def normalise(text: str) -> str:
    """Line ends made LF (from CRLF and CR); NUL characters removed."""
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text.replace("\x00", "")


def clean_title(title: str) -> str:
    """Whitespace collapsed, at most 500 characters."""
    return " ".join(title.split())[:_MAX_TITLE_CHARS]


# --- encodings ---------------------------------------------------------------------------

_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"),  # before UTF-16 LE
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"),
)
_MAX_LEGACY_CHAOS = 0.2  # charset-normalizer's own default threshold for a usable match


def decode(data: bytes, name: str, kind: str) -> str:
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


def markdown_title(text: str) -> str:
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
