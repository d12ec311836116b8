"""Secrets in file names (issue 25, item 7): a file called ``AKIA....txt`` or
``token=ghp_....md`` is indexed under a redacted name, the same on every scan, so that
its secret is in no document id, path, chunk id, hit, Status field, scan report or log
line, and a reindex still updates (and a deletion still deletes) its one document.

Every secret here is fake and assembled at run time, so no literal in this file looks like
a live credential to a secret scanner.
"""

from __future__ import annotations

import functools
import random
from pathlib import Path

import structlog

from retrieval import Retriever, scan_source
from retrieval.extraction._confine import display_name
from retrieval.redaction._names import redact_name
from retrieval.redaction._redactor import redact
from tests.support.embedder import HashEmbedder
from tests.support.redaction import ALNUM, fake_body

body = functools.partial(fake_body, random.Random(20261207))
UPPER = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"


def fake_key_id() -> str:
    return "AK" + "IA" + body(UPPER, 16)


def fake_github_token() -> str:
    return "gh" + "p_" + body(ALNUM, 36)


def test_a_secret_in_a_name_becomes_a_marked_placeholder() -> None:
    """Each part of a name is redacted on its own; the placeholder carries a marker of the
    original part and the part's extension is kept; plain names come back as they are."""
    key, token = fake_key_id(), fake_github_token()
    got = redact_name(f"ops/{key}.txt")
    assert key not in got
    assert got.startswith("ops/[REDACTED:aws_key.") and got.endswith("].txt")
    got = redact_name(f"/srv/kb/token={token}/notes.md")
    assert token not in got and got.startswith("/srv/kb/token=[REDACTED:")
    assert got.endswith("]/notes.md")
    assert redact_name("password=Summit2931!.md").endswith("].md")
    for plain in ("notes.txt", "a/b/c.md", "2026-12-01 release notes.md", "", "dir/",
                  "Screenshot 2024-05-01 at 12.30.45.png"):
        assert redact_name(plain) == plain


def test_redacted_names_are_stable_distinct_and_idempotent() -> None:
    """The same name maps to the same redacted name every time (the cache cleared in
    between, as in a new process); names differing only in their secret stay distinct;
    redacting a redacted name, or text quoting it, changes nothing."""
    key = fake_key_id()
    names = [f"{key}.txt", "password=Summit2931!.md", "password=Summit2932!.md",
             f"token={fake_github_token()}.md", f"docs/{fake_key_id()}/{key}.md"]
    first = [redact_name(n) for n in names]
    redact_name.cache_clear()
    assert [redact_name(n) for n in names] == first
    assert len(set(first)) == len(first)
    for name in first:
        assert redact_name(name) == name
        assert redact(f"see {name} for details").text == f"see {name} for details"


def test_display_names_are_redacted() -> None:
    """What scan reports and error messages show of a name is redacted too (and bytes
    that are not UTF-8 are still shown as escapes)."""
    key = fake_key_id()
    assert key not in display_name(f"/srv/kb/{key}.txt")
    assert display_name("bad\udcff.txt") == "bad\\xff.txt"


async def test_a_secret_named_file_through_a_real_ingest(tmp_path: Path) -> None:
    """A directory source with secret-named files: no document id, path, chunk id, hit,
    Status field, scan report entry or log line holds a secret; a changed file updates its
    one document on the next scan, a deleted one is deleted."""
    root = tmp_path / "kb"
    root.mkdir()
    key, token = fake_key_id(), fake_github_token()
    secrets = [key, token, "Summit2931!"]
    (root / f"{key}.txt").write_text("alpha runbook: restart the cache cluster\n")
    (root / f"token={token}.md").write_text("# Bravo\n\nbravo notes on the release train\n")
    (root / "password=Summit2931!.md").write_text("charlie checklist for the audit\n")
    (root / "notes.txt").write_text("delta plain notes\n")
    (root / f"{key}-empty.md").write_text("")  # reported (skipped or failed), by name
    r = Retriever(tmp_path / "index", lambda: HashEmbedder("m"))
    await r.open()
    await r.add_source("kb", root=root)

    def clean(*values: object) -> None:
        for value in values:
            shown = repr(value)
            for secret in secrets:
                assert secret not in shown, (secret, shown[:300])

    with structlog.testing.capture_logs() as logs:
        report = await scan_source(r, "kb")
    assert report.added == 4
    assert len(report.failed) + len(report.skipped) == 1
    clean(report, logs)
    docs = {d.id: d for d in await r.documents("kb")}
    assert len(docs) == 4 and "kb/notes.txt" in docs
    clean(docs)
    for word in ("alpha", "bravo", "charlie"):
        hits = (await r.search(f"{word} cache release audit", k=10)).hits
        assert any(word in h.text for h in hits)
        clean(hits)
    clean(await r.status())

    # A second scan after a change updates the same document; a deletion deletes it.
    (root / f"{key}.txt").write_text("alpha runbook, revised: drain the cache first\n")
    report = await scan_source(r, "kb")
    assert (report.added, report.changed, report.deleted) == (0, 1, 0)
    again = {d.id: d for d in await r.documents("kb")}
    assert again.keys() == docs.keys()
    (root / f"token={token}.md").unlink()
    report = await scan_source(r, "kb")
    assert (report.added, report.changed, report.deleted) == (0, 0, 1)
    assert len(await r.documents("kb")) == 3
    clean(report, await r.documents("kb"))
    await r.close()
