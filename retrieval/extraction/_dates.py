"""A document's own date: found in its text or metadata, as unix seconds.

* Markdown (YAML) front matter: a ``date:`` line (an ISO 8601 date or date and time);
* HTML: the first ``<meta>`` naming a publication or creation date
  (``article:published_time``, ``dcterms.date``, ``date``, ... see :data:`HTML_META_NAMES`);
* PDF: the document information's ``/CreationDate`` (``D:YYYYMMDDHHmmSSOHH'mm'``).

A date without a time is midnight UTC; a time without a zone is UTC. A value that does
not parse, or lies outside what a protobuf ``Timestamp`` can carry (years 1 to 9999), is
ignored: the document then has no date, and nothing fails.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone
from email.utils import parsedate_to_datetime

MIN_SECONDS = -62_135_596_800
"""0001-01-01T00:00:00Z: the earliest time a protobuf Timestamp carries."""
MAX_SECONDS = 253_402_300_799
"""9999-12-31T23:59:59Z: the latest."""

HTML_META_NAMES = frozenset({
    "date", "dcterms.date", "dcterms.created", "dcterms.issued", "dc.date",
    "dc.date.created", "dc.date.issued", "article:published_time", "og:published_time",
    "datepublished", "pubdate", "publish_date", "publication_date", "citation_date",
    "citation_publication_date", "sailthru.date", "parsely-pub-date",
})
"""``<meta>`` ``name``, ``property`` or ``itemprop`` values (lower-cased) that carry the
page's own date; the first one in the page whose ``content`` parses wins."""

_MAX_VALUE = 100  # characters of a date value looked at; longer is not a date


def in_range(seconds: int) -> bool:
    """Whether ``seconds`` is a time a protobuf Timestamp (and so the API) can carry."""
    return MIN_SECONDS <= seconds <= MAX_SECONDS


def _seconds(dt: datetime) -> int | None:
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    try:
        value = int(dt.timestamp())
    except (OverflowError, ValueError, OSError):
        return None
    return value if in_range(value) else None


def parse_iso(value: str) -> int | None:
    """Unix seconds of an ISO 8601 date (``2024-03-05``) or date and time
    (``2024-03-05T10:30:00Z``, ``2024-03-05 10:30:00 -0500`` as Jekyll writes it,
    fractions allowed), or of an RFC 2822 date (``Tue, 05 Mar 2024 10:30:00 GMT``, as some
    pages' ``<meta>`` carry); None when it is none of these."""
    value = value.strip().strip("\"'").strip()
    if not value or len(value) > _MAX_VALUE:
        return None
    try:
        return _seconds(datetime.fromisoformat(value))
    except ValueError:
        pass
    try:
        return _seconds(parsedate_to_datetime(value))
    except (TypeError, ValueError, IndexError):
        return None


_PDF_DATE = re.compile(
    r"(?:D:)?(\d{4})(\d{2})?(\d{2})?(\d{2})?(\d{2})?(\d{2})?"
    r"(?:(Z)|([+-])(\d{2})'?(?:(\d{2})'?)?)?")


def parse_pdf_date(value: str) -> int | None:
    """Unix seconds of a PDF date string (``D:20240305103000+01'00'``; the fields after
    the year are optional, as the PDF specification allows); None when it is not one."""
    m = _PDF_DATE.match(value.strip()[:_MAX_VALUE])
    if m is None:
        return None
    year, month, day, hour, minute, second = (int(g) if g else d for g, d in zip(
        m.groups()[:6], (0, 1, 1, 0, 0, 0), strict=True))
    zone = UTC
    if m.group(8):
        offset = timedelta(hours=int(m.group(9)), minutes=int(m.group(10) or 0))
        if offset >= timedelta(hours=24):
            return None
        zone = timezone(offset if m.group(8) == "+" else -offset)
    try:
        return _seconds(datetime(year, month, day, hour, minute, second, tzinfo=zone))
    except ValueError:
        return None


_FRONT_MATTER_DATE = re.compile(r"date[ \t]*:[ \t]*(.+)")


def front_matter_date(text: str) -> int | None:
    """The ``date:`` of a Markdown document's YAML front matter (the block between a first
    line ``---`` and the next ``---`` or ``...``, within 200 lines); None without one."""
    lines = text.split("\n", 200)[:200]
    if not lines or lines[0].strip() != "---":
        return None
    for line in lines[1:]:
        stripped = line.strip()
        if stripped in {"---", "..."}:
            return None
        if m := _FRONT_MATTER_DATE.fullmatch(line.rstrip()):
            return parse_iso(m.group(1).split(" #", 1)[0])
    return None


_ATTRIBUTE = re.compile(r"""([^\s=/>"']+)(?:\s*=\s*("[^"]*"|'[^']*'|[^\s>"']+))?""")


def meta_date(attributes: str) -> int | None:
    """The date a ``<meta>`` tag carries, given the text between ``<meta`` and ``>``: its
    ``content`` when its ``name``, ``property``, ``itemprop`` or ``http-equiv`` is one of
    :data:`HTML_META_NAMES`; None otherwise. Linear in the text's length."""
    names: list[str] = []
    content: str | None = None
    for m in _ATTRIBUTE.finditer(attributes):
        key = m.group(1).lower()
        raw = m.group(2) or ""
        value = raw[1:-1] if raw[:1] in {'"', "'"} else raw
        if key in {"name", "property", "itemprop", "http-equiv"}:
            names.append(value.strip().lower())
        elif key == "content":
            content = value
    if content is None or not any(n in HTML_META_NAMES for n in names):
        return None
    return parse_iso(content)
