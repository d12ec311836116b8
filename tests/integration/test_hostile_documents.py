"""Hostile documents and files against a real daemon (real llama-server children on
SmolLM2 and MiniLM, real gRPC clients on port 0): deeply nested and gigantic HTML, hostile
PDFs (flate bombs, encrypted, image-only), binary files named .md, file bodies and names that
are not UTF-8, NUL and control characters, and document ids with separators and control
characters. Every case gets a clear status code (or a Reindex failure that says why) and
afterwards nothing already stored is lost or changed.

One daemon serves the whole module (the ``hostile`` fixture, tests/integration/conftest.py),
checked ``intact`` after each case. Files go through a directory source of their own
(``hostile``), emptied after each case. Extraction details are unit-tested in
tests/unit/test_extract_*.py; here they are checked end to end: what a Reindex reports, and
that nothing is indexed.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import time
import zlib
from pathlib import Path
from typing import Any

import grpc
import pytest

from llamad_protocol.v1 import answer_pb2 as apb
from llamad_protocol.v1 import inference_pb2 as pb
from llamad_protocol.v1 import retrieval_pb2 as rpb
from tests.support.hostile import INVALID, Hostile, intact, listed, refused
from tests.support.pdf import encrypted_pdf, image_only_pdf, pdf_with_pages, text_pdf

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]


@pytest.fixture
def drop(hostile: Hostile) -> Any:
    """The hostile source's directory, emptied after the case."""
    yield hostile.drop
    for path in hostile.drop.iterdir():
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


async def reindex(h: Hostile) -> rpb.ReindexProgress:
    progress = [m async for m in h.r.Reindex(rpb.ReindexRequest(source_id="hostile"))]
    assert progress[-1].done
    last: rpb.ReindexProgress = progress[-1]
    return last


def failures(report: rpb.ReindexProgress) -> dict[str, str]:
    return {issue.path: issue.reason for issue in report.failed}


# --- documents and files -------------------------------------------------------------------


async def test_deeply_nested_and_gigantic_html(hostile: Hostile, drop: Path) -> None:
    """100k nested divs and tens of MB of HTML, pushed or in a scanned directory, are
    refused with the limit that stops them; pushed HTML is indexed as text, not markup."""
    h = hostile
    deep = "<html><body>" + "<div>" * 100_000 + "deep text" + "</div>" * 100_000
    started = time.monotonic()
    await refused(h.r.UpsertDocument(rpb.UpsertDocumentRequest(
        source_id="seed", id="seed/deep", kind="html", text=deep)), INVALID,
        "seed/deep: HTML elements nested deeper than 500 levels (retrieval.html_max_depth)")
    assert time.monotonic() - started < 10
    wordy = "<html><body><p>" + "lorem ipsum " * 500_000 + "</p></body></html>"
    await refused(h.r.UpsertDocument(rpb.UpsertDocumentRequest(
        source_id="seed", id="seed/wordy", kind="html", text=wordy)), INVALID,
        "the limit is 5000000 (retrieval.max_document_chars)")
    await refused(h.r.UpsertDocument(rpb.UpsertDocumentRequest(
        source_id="seed", id="seed/gigantic", kind="html",
        text="<p>hello</p>" * (30_000_000 // 12))),
        grpc.StatusCode.RESOURCE_EXHAUSTED, "larger than max")
    for doc_id in ("seed/deep", "seed/wordy", "seed/gigantic"):
        await refused(h.r.GetDocument(rpb.GetDocumentRequest(id=doc_id)),
                      grpc.StatusCode.NOT_FOUND)

    (drop / "deep.html").write_text(deep)
    with open(drop / "gigantic.html", "wb") as fh:
        fh.write(b"<p>hello world</p>\n" * (30_000_000 // 19))
    report = await reindex(h)
    assert report.added == 0
    failed = failures(report)
    assert "HTML elements nested deeper than 500 levels (retrieval.html_max_depth)" in \
        failed["deep.html"]
    assert "bytes is over the 20971520-byte limit (retrieval.max_file_mb)" in \
        failed["gigantic.html"]

    # Markup pushed as kind html is indexed as its text: no tags, no script.
    page = ("<html><head><title>Pager runbook</title><script>var leak = 'scriptonly';"
            "</script></head><body><h1>Pager</h1><p>Acknowledge the page within "
            "<b>five</b> minutes. Keyword lilacgarnet.</p></body></html>")
    doc = (await h.r.UpsertDocument(rpb.UpsertDocumentRequest(
        source_id="seed", id="seed/pager", kind="html", text=page))).document
    assert (doc.state, doc.title, doc.kind) == (rpb.DOCUMENT_STATE_INDEXED, "Pager runbook",
                                                "html")
    hit = (await h.r.Search(rpb.SearchRequest(query="lilacgarnet", top_k=1))).hits[0]
    assert hit.document_id == "seed/pager"
    assert "Acknowledge the page within five minutes." in hit.text
    assert "<" not in hit.text and "scriptonly" not in hit.text
    scripted = await h.r.Search(rpb.SearchRequest(query="scriptonly"))
    assert all("scriptonly" not in x.text for x in scripted.hits)
    assert (await h.r.DeleteDocument(rpb.DeleteDocumentRequest(id="seed/pager"))).deleted
    await intact(h)


def flate_bomb(size: int) -> bytes:
    """A zlib stream inflating to ``size`` NUL bytes, built directly (instantly, ~size/1000
    bytes): one dynamic-Huffman deflate block whose codes are a literal NUL and "repeat
    258 bytes at distance 1", each one bit long, so its body is all zero bytes."""
    out = bytearray(b"\x78\x01")
    acc = n = 0

    def put(value: int, count: int) -> None:  # deflate packs fields least significant first
        nonlocal acc, n
        acc |= value << n
        n += count
        while n >= 8:
            out.append(acc & 0xFF)
            acc >>= 8
            n -= 8

    def code(value: int, length: int) -> None:  # Huffman codes go most significant first
        put(int(format(value, f"0{length}b")[::-1], 2), length)

    put(1, 1)
    put(2, 2)                                  # the final block, dynamic Huffman codes
    put(286 - 257, 5)
    put(0, 5)
    put(18 - 4, 4)                             # 286 lit/len codes, 1 distance code
    lengths = {18: 1, 1: 2, 2: 2}              # code-length codes: 18 "0", 1 "10", 2 "11"
    for symbol in (16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1):
        put(lengths.get(symbol, 0), 3)
    code(3, 2)                                 # literal 0: length 2
    code(0, 1)
    put(138 - 11, 7)                           # literals 1..138 unused
    code(0, 1)
    put(117 - 11, 7)                           # literals 139..255 unused
    code(3, 2)                                 # 256, end of block: length 2
    code(0, 1)
    put(28 - 11, 7)                            # lengths 257..284 unused
    code(2, 2)                                 # 285, "length 258": length 1
    code(2, 2)                                 # distance 1: length 1
    code(2, 2)                                 # the literal NUL ("10")
    repeats = (size - 1) // 258
    zeros = 2 * repeats                        # each repeat is "0" + "0"
    out.append(acc & 0xFF)
    zeros -= 8 - n
    out += bytes(zeros // 8)
    acc, n = 0, zeros % 8
    code(3, 2)                                 # end of block ("11")
    if n:
        out.append(acc & 0xFF)
    out += (((1 + 258 * repeats) % 65521) << 16 | 1).to_bytes(4, "big")  # Adler-32
    return bytes(out)


async def test_hostile_pdfs(hostile: Hostile, drop: Path) -> None:
    """Malformed, truncated, mislabelled, encrypted, image-only PDFs and a decompression
    bomb (one FlateDecode stream inflating to 2 GiB) each fail with their own reason,
    quickly, and the daemon's memory does not grow by the bomb."""
    h = hostile
    bomb = flate_bomb(2 << 30)
    inflater = zlib.decompressobj()
    head = inflater.decompress(bomb, 64 << 20)
    assert head == bytes(64 << 20) and inflater.unconsumed_tail  # more than 64 MiB to come
    assert len(bomb) < 3_000_000
    (drop / "malformed.pdf").write_bytes(b"%PDF-1.4\n" + random.Random(3).randbytes(3000))
    (drop / "truncated.pdf").write_bytes(text_pdf(b"Hello runbook")[:150])
    (drop / "html.pdf").write_bytes(b"<html><body>not a pdf</body></html>")
    (drop / "encrypted.pdf").write_bytes(encrypted_pdf("s3cret"))
    (drop / "scan.pdf").write_bytes(image_only_pdf())
    (drop / "bomb.pdf").write_bytes(pdf_with_pages([bomb], flate=True))
    rss = _rss()
    started = time.monotonic()
    report = await reindex(h)
    assert time.monotonic() - started < 60
    assert _rss() - rss < 200 << 20
    assert (report.seen, report.added) == (6, 0)
    failed = failures(report)
    assert set(failed) == {"malformed.pdf", "truncated.pdf", "html.pdf", "encrypted.pdf",
                           "scan.pdf", "bomb.pdf"}
    for name in ("malformed.pdf", "truncated.pdf", "html.pdf"):
        assert f"{name}: cannot be parsed" in failed[name]
    assert "encrypted: a password is needed to open it" in failed["encrypted.pdf"]
    assert "no text layer (scanned/image-only PDF); OCR is not supported" in failed["scan.pdf"]
    assert "decompression" in failed["bomb.pdf"]
    for reason in failed.values():
        assert str(drop) in reason and reason.isprintable()
    assert [d for d in await listed(h) if d.startswith("hostile/")] == []
    await intact(h)


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def test_binary_files_named_md(hostile: Hostile, drop: Path) -> None:
    """Executables, images and random bytes named .md are refused as binary, saying so;
    a FIFO named .md is skipped without being opened (the scan does not block)."""
    h = hostile
    rng = random.Random(11)
    (drop / "tool.md").write_bytes(b"\x7fELF\x02\x01\x01\x00" + rng.randbytes(20_000))
    (drop / "diagram.md").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + rng.randbytes(4000))
    (drop / "noise.md").write_bytes(bytes(rng.randrange(1, 32) for _ in range(9000)))
    (drop / "wide.md").write_bytes("# Notes in UTF-16\n\nno BOM\n".encode("utf-16-le"))
    os.mkfifo(drop / "pipe.md")
    report = await asyncio.wait_for(reindex(h), 60)
    assert report.added == 0
    failed = failures(report)
    for name in ("tool.md", "diagram.md", "wide.md"):
        assert f"{name}: looks like a binary file (NUL bytes in the first 8 KiB), not " \
               "markdown text" in failed[name]
    assert "byte-order mark" in failed["wide.md"]
    assert "control characters), not markdown text" in failed["noise.md"]
    assert {i.path: i.reason for i in report.skipped} == {"pipe.md": "not a regular file"}
    await intact(h)


async def test_invalid_utf8_in_file_bodies(hostile: Hostile, drop: Path) -> None:
    """A file that is not UTF-8 and not a confidently detected legacy encoding is refused
    with "convert it to UTF-8"; a broken file after a byte-order mark says where."""
    h = hostile
    rng = random.Random(7)
    (drop / "junk.md").write_bytes(bytes(rng.randrange(0x80, 0x100) for _ in range(4000)))
    (drop / "bom8.txt").write_bytes(b"\xef\xbb\xbfgood start \xc3\x28 then broken")
    (drop / "bom16.txt").write_bytes(b"\xff\xfe" + "ok".encode("utf-16-le") + b"\x00\xd8")
    report = await reindex(h)
    assert report.added == 0
    failed = failures(report)
    assert "not valid UTF-8, and no legacy encoding was detected with confidence; convert " \
           "it to UTF-8" in failed["junk.md"]
    assert "starts with a UTF-8 byte-order mark but is not valid UTF-8 (at byte 14)" in \
        failed["bom8.txt"]
    assert "starts with a UTF-16 byte-order mark but is not valid UTF-16" in failed["bom16.txt"]
    await intact(h)


async def test_file_names_that_are_not_utf8(hostile: Hostile, drop: Path) -> None:
    """A file (or directory) whose name is not valid UTF-8 does not stop the scan: it is
    reported as skipped with its name escaped, the other files are indexed, and the source
    records its scan."""
    h = hostile
    raw_drop = os.fsencode(drop)
    with open(raw_drop + b"/bad\xff\xfe.txt", "wb") as f:
        f.write(b"a file with a bad name\n")
    os.mkdir(raw_drop + b"/dir\xc3\x28")
    with open(raw_drop + b"/dir\xc3\x28/inside.md", "wb") as f:
        f.write(b"# Inside\n\nunder a bad directory name\n")
    (drop / "fine.md").write_text("# Fine\n\nA fine file. Keyword tangerinewalrus.\n")
    report = await asyncio.wait_for(reindex(h), 60)
    assert (report.seen, report.added, list(report.failed)) == (1, 1, [])
    assert {i.path: i.reason for i in report.skipped} == {
        "bad\\xff\\xfe.txt": "file name is not valid UTF-8; rename it to index it",
        "dir\\xc3(": "directory name is not valid UTF-8; rename it to index it"}
    sources = {s.id: s for s in (await h.r.ListSources(rpb.ListSourcesRequest())).sources}
    assert sources["hostile"].HasField("last_scan") and sources["hostile"].last_error == ""
    found = await h.r.Search(rpb.SearchRequest(query="tangerinewalrus", top_k=1))
    assert [hit.document_id for hit in found.hits] == ["hostile/fine.md"]
    await h.r.DeleteDocument(rpb.DeleteDocumentRequest(id="hostile/fine.md"))
    await intact(h)


async def test_nul_and_control_characters(hostile: Hostile) -> None:
    """NUL characters (valid UTF-8, so they pass the wire) are refused in prompts, texts to
    embed and questions; in a pushed document they are dropped, as from a file, so no
    store, index or prompt carries them."""
    h = hostile
    inf = h.c.inference
    await refused(inf.Generate(pb.GenerateRequest(prompt="a\x00b")), INVALID,
                  "prompt contains a NUL character")
    await refused(inf.Chat(pb.ChatRequest(messages=[pb.ChatMessage(
        role=pb.CHAT_ROLE_USER, content="a\x00b")])), INVALID,
        "messages[0].content contains a NUL character")
    await refused(inf.Embed(pb.EmbedRequest(texts=["ok", "a\x00b"])), INVALID,
                  "texts[1] contains a NUL character")
    await refused(h.ask.Ask(apb.AskRequest(question="why\x00?")), INVALID,
                  "question or attachment contains a NUL character")
    doc = (await h.r.UpsertDocument(rpb.UpsertDocumentRequest(
        source_id="seed", id="seed/nul", title="Night\x00 shift",
        text="Page the\x00 on-call\x00 engineer \x01\x1b[1mnow\x1b[0m. Keyword ochreferret."))
        ).document
    assert (doc.state, doc.title) == (rpb.DOCUMENT_STATE_INDEXED, "Night shift")
    hit = (await h.r.Search(rpb.SearchRequest(query="ochreferret", top_k=1))).hits[0]
    assert hit.document_id == "seed/nul"
    assert "Page the on-call engineer" in hit.text and "\x00" not in hit.text
    assert (await h.r.DeleteDocument(rpb.DeleteDocumentRequest(id="seed/nul"))).deleted
    await intact(h)


# --- document ids --------------------------------------------------------------------------


async def test_document_ids_with_separators_and_control_characters(hostile: Hostile) -> None:
    """Ids that would escape or confuse (absolute, .., empty segments, backslashes,
    control characters, over-long) are refused by Upsert, Get and Delete alike, saying
    which rule, with the id escaped in a one-line message; nested ids with '/' work."""
    h = hostile
    cases = [
        ("/etc/passwd", "document id starts with '/'"),
        ("seed/../../etc/passwd", "document id has a '..' segment"),
        ("..", "document id has a '..' segment"),
        ("seed//x", "document id has an empty segment"),
        ("seed/x/", "document id has an empty segment"),
        ("seed\\..\\x", "document id contains a backslash (use '/')"),
        ("seed/a\x00b", "document id contains a control character (U+0000): 'seed/a\\x00b'"),
        ("seed/a\nb", "document id contains a control character (U+000A): 'seed/a\\nb'"),
        ("seed/a\rb", "control character (U+000D)"),
        ("seed/\x1b[31mred", "control character (U+001B)"),
        ("seed/a\x7fb", "control character (U+007F)"),
        ("seed/a\u0085b", "control character (U+0085)"),
        ("seed/" + "s" * 508, "document id is 513 characters long, the limit is 512"),
    ]
    for doc_id, reason in cases:
        for kind in ("text", "html"):
            await refused(h.r.UpsertDocument(rpb.UpsertDocumentRequest(
                source_id="seed", id=doc_id, text="<p>some text</p>", kind=kind)),
                INVALID, reason)
        await refused(h.r.GetDocument(rpb.GetDocumentRequest(id=doc_id)), INVALID, reason)
        await refused(h.r.DeleteDocument(rpb.DeleteDocumentRequest(id=doc_id)), INVALID, reason)
    await refused(h.r.GetDocument(rpb.GetDocumentRequest()), INVALID, "document id is empty")
    await refused(h.r.AddSource(rpb.AddSourceRequest(id="evil", path="/tmp/\x00x")), INVALID,
                  "path contains a NUL character")
    for source_id in ("../x", "Seed", "a/b", "a\nb", ""):
        await refused(h.r.AddSource(rpb.AddSourceRequest(id=source_id)), INVALID,
                      "must be 1-64 characters of a-z, 0-9, '_' and '-'")
    nested = "seed/runbooks/network/core/sw1.md"
    doc = (await h.r.UpsertDocument(rpb.UpsertDocumentRequest(
        source_id="seed", id=nested, text="Core switch notes. Keyword tealpagoda."))).document
    assert (doc.id, doc.state) == (nested, rpb.DOCUMENT_STATE_INDEXED)
    assert (await h.r.GetDocument(rpb.GetDocumentRequest(id=nested))).id == nested
    assert (await h.r.DeleteDocument(rpb.DeleteDocumentRequest(id=nested))).deleted
    await intact(h)
