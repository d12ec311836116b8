"""The document's own date (issue 16): found in Markdown front matter, HTML ``<meta>`` and
PDF metadata (a bad one ignored, nothing failing), the caller's winning over them, stored
with the document, carried on hits, and filtered on by dated_since / dated_until (a
document without a date left out once either is set)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from retrieval import Filters, Query, Retriever
from retrieval.extraction import _pdf as _extract_pdf
from retrieval.extraction import _pdf_worker
from retrieval.extraction._dates import (
    front_matter_date,
    meta_date,
    parse_iso,
    parse_pdf_date,
)
from retrieval.extraction._extract import extract_bytes
from tests.support.embedder import HashEmbedder, scanned
from tests.support.pdf import text_pdf


def ts(text: str) -> int:
    """Unix seconds of an ISO date and time (UTC unless it says)."""
    value = datetime.fromisoformat(text)
    return int((value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp())


# --- parsing ---------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "expected"), [
    ("2024-03-05", ts("2024-03-05T00:00:00")),
    ("2024-03-05T10:30:00Z", ts("2024-03-05T10:30:00")),
    ("2024-03-05 10:30:00+02:00", ts("2024-03-05T08:30:00")),
    ("'2024-03-05T10:30:00.250Z'", ts("2024-03-05T10:30:00")),
    ("2016-03-05 10:30:00 -0500", ts("2016-03-05T15:30:00")),
    ("Tue, 05 Mar 2024 10:30:00 GMT", ts("2024-03-05T10:30:00")),
    ("2024-13-40", None),
    ("last tuesday", None),
    ("", None),
])
def test_iso_dates_and_datetimes_parse_and_garbage_does_not(value: str,
                                                            expected: int | None) -> None:
    """A date is midnight UTC, a naive time UTC, a zone honoured (Jekyll's and RFC 2822's
    forms too); anything else None."""
    assert parse_iso(value) == expected


@pytest.mark.parametrize(("value", "expected"), [
    ("D:20240305103000+01'00'", ts("2024-03-05T09:30:00")),
    ("D:20240305103000Z", ts("2024-03-05T10:30:00")),
    ("D:20240305", ts("2024-03-05T00:00:00")),
    ("20240305103000-05'30", ts("2024-03-05T16:00:00")),
    ("D:2024", ts("2024-01-01T00:00:00")),
    ("D:20241399", None),
    ("yesterday", None),
])
def test_pdf_date_strings_parse(value: str, expected: int | None) -> None:
    """PDF dates, with the optional fields and zones the specification allows."""
    assert parse_pdf_date(value) == expected


def test_front_matter_date_is_read_only_from_the_front_matter() -> None:
    """``date:`` of the leading YAML block (comment dropped); the same line in the body,
    a nested key or a bad value give no date."""
    assert front_matter_date("---\ntitle: Runbook\ndate: 2023-11-02  # first draft\n---\n"
                             "# Body\n") == ts("2023-11-02T00:00:00")
    assert front_matter_date("# Body\n\ndate: 2023-11-02\n") is None
    assert front_matter_date("---\nmeta:\n  date: 2023-11-02\n---\n") is None
    assert front_matter_date("---\ndate: soon\n---\n") is None
    assert front_matter_date("---\ntitle: x\n---\ndate: 2023-11-02\n") is None


def test_meta_tags_name_their_date() -> None:
    """name, property and itemprop name a date; content carries it; other metas none."""
    assert meta_date(' name="dcterms.date" content="2022-07-01"') == ts("2022-07-01T00:00:00")
    assert meta_date(" property='article:published_time' "
                     "content='2022-07-01T12:00:00+00:00' /") == ts("2022-07-01T12:00:00")
    assert meta_date(' content="2022-07-01" NAME=Date') == ts("2022-07-01T00:00:00")
    assert meta_date(' name="description" content="2022-07-01"') is None
    assert meta_date(' name="date" content="not a date"') is None


# --- extraction ------------------------------------------------------------------------


def test_markdown_and_html_extraction_find_the_date() -> None:
    """Extracted Markdown carries its front matter date, HTML its first <meta> date (one
    that does not parse is skipped, not fatal); plain text has none."""
    md = extract_bytes(b"---\ndate: 2021-05-06T07:08:09Z\n---\n# Change log\nrotated keys\n",
                       "log.md", "markdown")
    assert md.date == ts("2021-05-06T07:08:09")
    page = (b"<html><head><title>Outage</title><meta name=\"date\" content=\"garbage\">"
            b"<meta property=\"article:published_time\" content=\"2020-02-03T04:05:06Z\">"
            b"</head><body><p>core switch down</p></body></html>")
    html = extract_bytes(page, "outage.html", "html")
    assert (html.title, html.date) == ("Outage", ts("2020-02-03T04:05:06"))
    assert "core switch down" in html.text
    assert extract_bytes(b"date: 2020-01-01\n", "n.txt", "text").date is None


def test_the_pdf_worker_reports_the_creation_date_and_the_caller_parses_it() -> None:
    """The worker (run in-process here) passes /CreationDate through; the caller turns it
    into seconds, and a broken one into no date (the text is still extracted)."""
    info = b"<< /Title (Runbook) /CreationDate (D:20190102030405+02'00') >>"
    result = _pdf_worker.extract(text_pdf(b"Restart the VPN", info=info), max_pages=10,
                                 max_output=1 << 20)
    assert result["created"] == "D:20190102030405+02'00'"
    title, text, date = _extract_pdf._pdf_result("r.pdf", 0, json.dumps(result).encode(), b"")
    assert (title, date) == ("Runbook", ts("2019-01-02T01:04:05"))
    assert "Restart the VPN" in text
    broken = _pdf_worker.extract(text_pdf(b"Restart", info=b"<< /CreationDate (D:2019x) >>"),
                                 max_pages=10, max_output=1 << 20)
    assert broken["created"] == "D:2019x"
    assert _extract_pdf._pdf_result("r.pdf", 0, json.dumps({**broken, "created": "D:20191399"})
                                    .encode(), b"")[2] is None
    plain = _pdf_worker.extract(text_pdf(b"Restart"), max_pages=10, max_output=1 << 20)
    assert plain["created"] == ""
    assert _extract_pdf._pdf_result("r.pdf", 0, json.dumps(plain).encode(), b"")[2] is None


@pytest.mark.process
def test_a_pdf_file_is_dated_by_its_metadata_end_to_end() -> None:
    """Through the worker process: extract_bytes gives the PDF's creation date."""
    info = b"<< /CreationDate (D:20190102030405Z) >>"
    got = extract_bytes(text_pdf(b"Restart the VPN", info=info), "r.pdf", "pdf")
    assert got.date == ts("2019-01-02T03:04:05")


# --- stored, searched, filtered ------------------------------------------------------------


async def test_dates_are_stored_the_callers_winning_and_hits_carry_them(
        tmp_path: Path) -> None:
    """A scanned Markdown file is dated by its front matter; a pushed one by the caller
    when given (over its front matter), else by its front matter; a text without either
    has none; hits carry each document's date; a re-push with a new date re-dates it."""
    r, _ = await scanned(tmp_path,
                         {"a.md": "---\ndate: 2022-01-01\n---\n# A\nnginx reload steps\n"})
    await r.add_source("push")
    front = "---\ndate: 2022-06-01\n---\nnginx reload for pushed docs\n"
    await r.upsert("push", "B", front, doc_id="push/b", kind="markdown",
                   document_date=ts("2023-03-03T03:03:03"))
    await r.upsert("push", "C", front, doc_id="push/c", kind="markdown")
    await r.upsert("push", "D", "nginx reload without a date", doc_id="push/d")
    dates = {d.id: d.document_date for d in await r.documents()}
    assert dates == {"kb/a.md": ts("2022-01-01T00:00:00"),
                     "push/b": ts("2023-03-03T03:03:03"),
                     "push/c": ts("2022-06-01T00:00:00"), "push/d": None}
    found = (await r.search("nginx reload", k=10)).hits
    # push/b and push/c hold the same text: one hit, naming the other as a holder.
    holders = {h.doc_id: h.also_in for h in found}
    assert sorted([*holders, *holders.get("push/b", ()), *holders.get("push/c", ())]) == \
        sorted(dates)
    assert {h.doc_id: h.document_date for h in found} == \
        {doc: date for doc, date in dates.items() if doc in holders}
    await r.upsert("push", "B", front, doc_id="push/b", kind="markdown",
                   document_date=ts("2024-04-04T00:00:00"))
    assert (await r.document("push/b")).document_date == ts("2024-04-04T00:00:00")  # type: ignore[union-attr]
    await r.close()


async def test_dated_since_and_until_filter_both_indexes_and_drop_undated(
        tmp_path: Path) -> None:
    """Each bound alone and both together keep exactly the documents dated inside them,
    in text and vector mode; a document without a date is left out once a bound is set,
    and included without bounds."""
    r = Retriever(tmp_path / "index", lambda: HashEmbedder("m"))
    await r.open()
    await r.add_source("ops")
    for name, date in (("jan", "2024-01-10"), ("feb", "2024-02-10"), ("mar", "2024-03-10")):
        await r.upsert("ops", name, f"disk alert on web01 in {name}", doc_id=f"ops/{name}",
                       document_date=ts(f"{date}T00:00:00"))
    await r.upsert("ops", "undated", "disk alert on web01 undated", doc_id="ops/undated")

    async def found(mode: str, dated_since: int | None = None,
                    dated_until: int | None = None) -> set[str]:
        result = await r.search("disk alert web01", k=10, options=Query(mode=mode),
                                filters=Filters(dated_since=dated_since,
                                                dated_until=dated_until))
        return {h.doc_id for h in result.hits}

    feb = ts("2024-02-01T00:00:00")
    mar = ts("2024-03-01T00:00:00")
    for mode in ("text", "vector"):
        assert await found(mode) == {"ops/jan", "ops/feb", "ops/mar", "ops/undated"}
        assert await found(mode, dated_since=feb) == {"ops/feb", "ops/mar"}
        assert await found(mode, dated_until=mar) == {"ops/jan", "ops/feb"}
        assert await found(mode, dated_since=feb, dated_until=mar) == {"ops/feb"}
        assert await found(mode, dated_since=ts("2030-01-01T00:00:00")) == set()
    await r.close()
