"""Extraction (retrieval.extraction._extract) of PDFs, in the PDF worker process: text, titles
(first line, metadata) and pages; image-only, encrypted and malformed PDFs refused with distinct
clear errors; page, output, time and memory caps (decompression bombs fail fast); and a
misbehaving worker (failing, endless, not reading stdin) never hurts the caller.
"""

from __future__ import annotations

import random
import shutil
import sys
import time
import zlib
from pathlib import Path

import pytest
import structlog

from retrieval.extraction import _pdf as _extract_pdf
from retrieval.extraction._extract import ExtractLimits, extract_bytes, extract_file
from tests.support.extraction import fails, write
from tests.support.load import patience
from tests.support.pdf import (
    FONT,
    build_pdf,
    encrypted_pdf,
    image_only_pdf,
    pdf_stream,
    pdf_with_pages,
    text_pdf,
)


def zeros_deflated(size: int) -> bytes:
    """zlib of ``size`` NUL bytes, compressed in 1 MiB steps (never holds ``size`` bytes)."""
    compressor = zlib.compressobj(9)
    chunk = b"\0" * (1 << 20)
    parts = [compressor.compress(chunk) for _ in range(size >> 20)]
    parts.append(compressor.flush())
    return b"".join(parts)


@pytest.fixture(scope="module")
def bomb_300mb() -> bytes:
    """One FlateDecode content stream that inflates to 300 MB (the file is ~300 KB)."""
    return pdf_with_pages([zeros_deflated(300_000_000)], flate=True)


# --- PDF ---------------------------------------------------------------------------------


@pytest.mark.process
def test_pdf_text_and_title_from_first_line(tmp_path: Path) -> None:
    """A text PDF extracts in the worker; without metadata its first line is the title."""
    data = text_pdf(b"Hello runbook", b"Restart nginx")
    got = extract_file(write(tmp_path, "hello.pdf", data))
    assert got.kind == "pdf"
    assert got.title == "Hello runbook"
    assert got.text.split("\n") == ["Hello runbook", "Restart nginx"]
    assert extract_bytes(data, "hello.pdf", "pdf") == got


@pytest.mark.process
def test_pdf_metadata_title_and_pages() -> None:
    """The metadata title wins; pages are separated by a blank line."""
    info = b"<< /Title (Core switch runbook) >>"
    page = b"BT /F1 12 Tf 72 720 Td (%s) Tj ET"
    data = pdf_with_pages([page % b"Page one", page % b"Page two"], info=info)
    got = extract_bytes(data, "sw.pdf", "pdf")
    assert got.title == "Core switch runbook"
    assert got.text == "Page one\n\nPage two"


@pytest.mark.process
def test_pdf_image_only_has_a_distinct_clear_error() -> None:
    """A PDF without a text layer says so, and that OCR is not supported."""
    error = fails("pdf_image_only", lambda: extract_bytes(image_only_pdf(), "scan.pdf", "pdf"))
    assert str(error) == ("scan.pdf: no text layer (scanned/image-only PDF); "
                          "OCR is not supported")


@pytest.mark.process
def test_pdf_encrypted() -> None:
    """A PDF that needs a password is refused as pdf_encrypted; one encrypted with an
    empty user password (owner password only) opens."""
    error = fails("pdf_encrypted", lambda: extract_bytes(encrypted_pdf("s3cret"), "e.pdf", "pdf"))
    assert "password" in str(error)
    assert extract_bytes(encrypted_pdf(""), "open.pdf", "pdf").text == "Hello runbook"


@pytest.mark.parametrize("data", [
    text_pdf(b"Hello runbook")[:150],
    b"%PDF-1.4\n" + random.Random(3).randbytes(3000),
    b"",
    b"<html>not a pdf</html>",
], ids=["truncated", "garbage", "empty", "html"])
@pytest.mark.process
def test_pdf_malformed(data: bytes) -> None:
    """Truncated, garbage, empty or mislabelled files are pdf_malformed, with a reason."""
    error = fails("pdf_malformed", lambda: extract_bytes(data, "bad.pdf", "pdf"))
    assert str(error).startswith("bad.pdf: ")


@pytest.mark.process
def test_pdf_page_cap() -> None:
    """More pages than pdf_max_pages is refused as too_large before extracting any."""
    data = pdf_with_pages([b"BT /F1 12 Tf 72 720 Td (p) Tj ET"] * 3)
    error = fails("too_large",
                  lambda: extract_bytes(data, "long.pdf", "pdf", ExtractLimits(pdf_max_pages=2)))
    assert "3 pages" in str(error)


@pytest.mark.process
def test_pdf_decompression_bomb_fails_fast(bomb_300mb: bytes) -> None:
    """A 300 KB file inflating to 300 MB fails cleanly and fast with default limits."""
    assert len(bomb_300mb) < 1_000_000
    started = time.monotonic()
    error = fails("resource_limit", lambda: extract_bytes(bomb_300mb, "bomb.pdf", "pdf"))
    assert time.monotonic() - started < patience(10.0)
    assert "bomb.pdf" in str(error)


@pytest.mark.process
@pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs prlimit (util-linux)")
def test_pdf_bomb_under_a_small_memory_cap() -> None:
    """Streams that stay under pypdf's per-stream limit but add up are stopped by the
    worker's address-space cap (prlimit), not by the daemon's memory."""
    streams = zeros_deflated(70 << 20)
    kids = 6
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
               b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << "
               b"/F1 4 0 R >> >> /Contents [" + b" ".join(b"%d 0 R" % (5 + i) for i in range(kids))
               + b"] >>", FONT]
    objects += [pdf_stream(streams, b" /Filter /FlateDecode")] * kids
    limits = ExtractLimits(pdf_max_memory=256 << 20, pdf_timeout=20)
    started = time.monotonic()
    error = fails("resource_limit",
                  lambda: extract_bytes(build_pdf(objects), "sum.pdf", "pdf", limits))
    assert time.monotonic() - started < patience(15.0)
    assert "memory" in str(error)


@pytest.mark.process
def test_pdf_timeout_kills_the_worker() -> None:
    """Past pdf_timeout the worker is killed and the error is a timeout."""
    started = time.monotonic()
    error = fails("timeout", lambda: extract_bytes(text_pdf(b"x"), "slow.pdf", "pdf",
                                                   ExtractLimits(pdf_timeout=0.01)))
    assert time.monotonic() - started < patience(5.0)
    assert "slow.pdf" in str(error)


@pytest.mark.process
def test_pdf_output_cap() -> None:
    """Text beyond pdf_max_output is refused as resource_limit by the worker itself."""
    data = text_pdf(*[b"line %d of a long page" % i for i in range(40)])
    fails("resource_limit",
          lambda: extract_bytes(data, "big.pdf", "pdf", ExtractLimits(pdf_max_output=200)))


@pytest.mark.process
def test_pdf_from_file_reads_the_checked_descriptor(tmp_path: Path) -> None:
    """extract_file hands the worker the descriptor it checked (its stdin), so replacing
    the path afterwards cannot change what is parsed."""
    path = write(tmp_path, "doc.pdf", text_pdf(b"Checked file"))
    assert extract_file(path).text == "Checked file"


@pytest.mark.process
def test_pdf_without_prlimit_still_works_and_warns_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without prlimit on PATH the worker runs without the memory cap, and says so once."""
    real_which = shutil.which
    monkeypatch.setattr(shutil, "which",
                        lambda cmd: None if cmd == "prlimit" else real_which(cmd))
    monkeypatch.setattr(_extract_pdf, "_warned", _extract_pdf._Warned())
    with structlog.testing.capture_logs() as logs:
        assert extract_bytes(text_pdf(b"ok"), "a.pdf", "pdf").text == "ok"
        assert extract_bytes(text_pdf(b"ok"), "b.pdf", "pdf").text == "ok"
    assert [entry["event"] for entry in logs] == ["pdf_worker_without_memory_limit"]


# --- a misbehaving worker never hurts the caller -----------------------------------------


def fake_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> None:
    """Replace the worker script with ``body`` (Python) for this test."""
    script = tmp_path / "fake_worker.py"
    script.write_text("import os, sys, signal, time\nsys.stdin.buffer.read()\n" + body + "\n")
    monkeypatch.setattr(_extract_pdf, "_WORKER", script)


@pytest.mark.parametrize(("body", "kind"), [
    ("print('not json')", "worker_failed"),
    ("print('[1, 2]')", "worker_failed"),
    ("print('{\"pages\": [1], \"title\": \"t\"}')", "worker_failed"),
    ("print('{\"error_kind\": \"rm -rf\", \"reason\": \"x\"}')", "worker_failed"),
    ("sys.exit(3)", "worker_failed"),
    ("os.kill(os.getpid(), signal.SIGSEGV)", "worker_failed"),
    ("raise MemoryError", "resource_limit"),
    ("os.kill(os.getpid(), signal.SIGKILL)", "resource_limit"),
])
@pytest.mark.process
def test_worker_failures_become_extraction_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str, kind: str
) -> None:
    """Garbage output, a bad exit, a crash or a kill are all ExtractionErrors."""
    fake_worker(tmp_path, monkeypatch, body)
    fails(kind, lambda: extract_bytes(b"%PDF-1.4", "w.pdf", "pdf"))


@pytest.mark.parametrize(("body", "name", "limits", "kind"), [
    pytest.param("signal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True: time.sleep(1)",
                 "hang.pdf", ExtractLimits(pdf_timeout=1.0), "timeout", id="hanging"),
    pytest.param("while True: sys.stdout.buffer.write(b'x' * 65536)",
                 "flood.pdf", ExtractLimits(pdf_max_output=1 << 20), "resource_limit",
                 id="flooding"),
])
@pytest.mark.process
def test_endless_worker_is_stopped_at_its_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str, name: str,
    limits: ExtractLimits, kind: str
) -> None:
    """A worker that never answers (and ignores SIGTERM) is killed at the deadline; one
    printing without end is stopped at the output cap, not buffered."""
    fake_worker(tmp_path, monkeypatch, body)
    started = time.monotonic()
    fails(kind, lambda: extract_bytes(b"%PDF", name, "pdf", limits))
    assert time.monotonic() - started < patience(5.0)


@pytest.mark.process
def test_worker_that_does_not_read_stdin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker exiting before reading its input does not break the caller (EPIPE)."""
    script = tmp_path / "fake_worker.py"
    script.write_text("print('{\"error_kind\": \"pdf_malformed\", \"reason\": \"early\"}')\n")
    monkeypatch.setattr(_extract_pdf, "_WORKER", script)
    error = fails("pdf_malformed",
                  lambda: extract_bytes(b"%PDF" + b"x" * 5_000_000, "e.pdf", "pdf"))
    assert str(error) == "e.pdf: early"


@pytest.mark.process
def test_worker_runs_as_a_module(tmp_path: Path) -> None:
    """``python -m retrieval.extraction._pdf_worker PATH`` prints the JSON result (manual use)."""
    import subprocess

    path = write(tmp_path, "m.pdf", text_pdf(b"Module run"))
    out = subprocess.run(
        [sys.executable, "-m", "retrieval.extraction._pdf_worker", str(path), "--max-bytes",
         "100000", "--max-pages", "10", "--max-output", "100000"],
        capture_output=True, check=True, timeout=60,
    ).stdout
    assert b'"pages": ["Module run' in out
