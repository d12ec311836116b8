"""Extraction (retrieval._extract): every kind, encodings, binary and oversized files,
special files, hostile HTML and PDFs, and the PDF worker's failure modes; plus the error
tree and the document id rules of retrieval.errors."""

from __future__ import annotations

import os
import random
import shutil
import sys
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
import structlog

from retrieval import _extract_pdf
from retrieval._extract import Extracted, ExtractLimits, extract_bytes, extract_file, kind_for
from retrieval.errors import (
    ExtractionError,
    IndexCorrupt,
    InvalidDocument,
    NotFound,
    RetrievalError,
    validate_document_id,
)
from tests.support.pdf import (
    FONT,
    build_pdf,
    encrypted_pdf,
    image_only_pdf,
    pdf_stream,
    pdf_with_pages,
    text_pdf,
)
from tests.support.scaling import assert_linear

# --- helpers -------------------------------------------------------------------------------


def fails(kind: str, call: Callable[[], object]) -> ExtractionError:
    """Run ``call``, expect an ExtractionError of ``kind``, return it."""
    with pytest.raises(ExtractionError) as info:
        call()
    assert info.value.kind == kind, str(info.value)
    return info.value


def write(tmp_path: Path, name: str, data: bytes | str) -> Path:
    path = tmp_path / name
    path.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return path


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


# --- kinds -------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "kind"), [
    ("a.md", "markdown"), ("a.MARKDOWN", "markdown"), ("a.txt", "text"), ("a.log", "text"),
    ("a.rst", "text"), ("a.text", "text"), ("a.html", "html"), ("a.HTM", "html"),
    ("a.cfg", "config"), ("a.conf", "config"), ("a.config", "config"), ("r1.ios", "config"),
    ("r1.junos", "config"), ("a.pdf", "pdf"), ("a.png", None), ("Makefile", None),
    ("a.md.bak", None), ("notes.md.txt", "text"),
])
def test_kind_for_goes_by_suffix(name: str, kind: str | None) -> None:
    """The kind comes from the suffix, case-insensitively; unknown suffixes are None."""
    assert kind_for(Path(name)) == kind


def test_unsupported_suffix_is_invalid_document(tmp_path: Path) -> None:
    """A file of an unsupported type is refused as an invalid document, naming it."""
    path = write(tmp_path, "logo.png", b"\x89PNG")
    with pytest.raises(InvalidDocument, match=r"logo\.png"):
        extract_file(path)


def test_unknown_kind_for_bytes_is_invalid_document() -> None:
    """extract_bytes refuses a kind outside the five."""
    with pytest.raises(InvalidDocument, match="kind must be one of"):
        extract_bytes(b"x", "a.doc", "word")


def test_markdown_keeps_text_and_takes_first_h1(tmp_path: Path) -> None:
    """Markdown text is kept as written; the title is the first "# " heading."""
    source = "Intro line\n\n## Not this\n# Disk full on web01 #\n\nText\n# Second\n"
    got = extract_file(write(tmp_path, "runbook.md", source))
    assert got == Extracted(title="Disk full on web01", text=source, kind="markdown")


def test_markdown_title_skips_code_fences(tmp_path: Path) -> None:
    """A "# comment" inside a fenced code block is not a heading."""
    source = "```bash\n# restart nginx\nsystemctl restart nginx\n```\n\n# Real title\n"
    assert extract_file(write(tmp_path, "a.md", source)).title == "Real title"


def test_markdown_title_from_front_matter_and_setext(tmp_path: Path) -> None:
    """Front matter ``title:`` wins; a setext "===" heading counts as an H1."""
    front = "---\ntitle: \"From front matter\"\ntags: [a]\n---\n# Heading\n"
    assert extract_file(write(tmp_path, "a.md", front)).title == "From front matter"
    setext = "Setext title\n============\n\nbody\n"
    assert extract_file(write(tmp_path, "b.md", setext)).title == "Setext title"


def test_markdown_without_heading_uses_stem(tmp_path: Path) -> None:
    """No H1: the title is the file stem."""
    assert extract_file(write(tmp_path, "disk-full.md", "just text\n")).title == "disk-full"


@pytest.mark.parametrize("suffix", [".txt", ".log", ".rst", ".text"])
def test_text_kinds_use_the_stem(tmp_path: Path, suffix: str) -> None:
    """Plain text is kept as is and titled by its stem."""
    got = extract_file(write(tmp_path, "notes" + suffix, "Title-ish line\nmore\n"))
    assert got == Extracted(title="notes", text="Title-ish line\nmore\n", kind="text")


@pytest.mark.parametrize("suffix", [".cfg", ".conf", ".config", ".ios", ".junos"])
def test_config_kinds(tmp_path: Path, suffix: str) -> None:
    """Config exports are text of kind config (redaction happens later, not here)."""
    source = "hostname core-sw1\n!\ninterface GigabitEthernet0/1\n description uplink\n"
    got = extract_file(write(tmp_path, "core-sw1" + suffix, source))
    assert got == Extracted(title="core-sw1", text=source, kind="config")


def test_extract_bytes_matches_extract_file(tmp_path: Path) -> None:
    """Pushed bytes extract the same way as a file; the name's stem is the fallback title."""
    data = b"# T\r\nbody\r\n"
    assert extract_bytes(data, "docs/x/y.md", "markdown") == \
        extract_file(write(tmp_path, "y.md", data))


def test_newlines_normalised_and_nuls_stripped(tmp_path: Path) -> None:
    """CRLF and lone CR become LF; NUL characters past the sniffed prefix are removed."""
    data = b"a\r\nb\rc\n" + b"x" * 9000 + b"\x00tail\n"
    got = extract_file(write(tmp_path, "a.txt", data))
    assert got.text == "a\nb\nc\n" + "x" * 9000 + "tail\n"


# --- encodings ---------------------------------------------------------------------------

UNICODE_SAMPLE = "Café naïve — “quoted” 5€ Straße 日本語 🚀\n"


@pytest.mark.parametrize("encoding", ["utf-8", "utf-8-sig", "utf-16", "utf-16-le-bom",
                                      "utf-16-be-bom", "utf-32"])
def test_unicode_encodings(tmp_path: Path, encoding: str) -> None:
    """UTF-8 with or without BOM and UTF-16/32 with a BOM decode exactly; the BOM is gone."""
    if encoding == "utf-16-le-bom":
        data = b"\xff\xfe" + UNICODE_SAMPLE.encode("utf-16-le")
    elif encoding == "utf-16-be-bom":
        data = b"\xfe\xff" + UNICODE_SAMPLE.encode("utf-16-be")
    else:
        data = UNICODE_SAMPLE.encode(encoding)
    assert extract_file(write(tmp_path, "u.txt", data)).text == UNICODE_SAMPLE


@pytest.mark.parametrize("sample", [
    "Café naïve — “quoted” price 5€. Straße Müller. Ça va? Œuvre, façade, déjà vu.\n" * 5,
    "Café menu\n",
    "Olá, a configuração do servidor está pronta. Não reinicie.\n",
])
def test_cp1252_text_is_detected(tmp_path: Path, sample: str) -> None:
    """Legacy Western text (cp1252) is detected and decoded, even when short."""
    data = sample.encode("cp1252")
    assert extract_file(write(tmp_path, "legacy.txt", data)).text == sample


def test_undecodable_garbage_is_an_encoding_error(tmp_path: Path) -> None:
    """Bytes that are neither UTF-8 nor a confident legacy encoding are refused, naming
    the file."""
    rng = random.Random(7)
    data = bytes(rng.randrange(0x80, 0x100) for _ in range(4000))
    error = fails("encoding", lambda: extract_file(write(tmp_path, "junk.txt", data)))
    assert "junk.txt" in str(error)
    assert "UTF-8" in str(error)


def test_bad_utf16_after_a_bom_is_an_encoding_error(tmp_path: Path) -> None:
    """A UTF-16 BOM followed by an unpaired surrogate is refused, not guessed at."""
    data = b"\xff\xfe" + "ok".encode("utf-16-le") + b"\x00\xd8"
    error = fails("encoding", lambda: extract_file(write(tmp_path, "bad16.txt", data)))
    assert "UTF-16" in str(error)


def test_utf16_without_bom_is_binary_with_a_hint(tmp_path: Path) -> None:
    """UTF-16 without a BOM has NUL bytes: refused as binary, with a hint about BOMs."""
    data = "hello world\n".encode("utf-16-le")
    error = fails("binary", lambda: extract_file(write(tmp_path, "w.txt", data)))
    assert "byte-order mark" in str(error)


# --- binary and size ---------------------------------------------------------------------


def test_binary_file_named_md_is_refused(tmp_path: Path) -> None:
    """A PNG renamed to .md is refused clearly: binary, naming the file and the kind."""
    png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)) * 4
    error = fails("binary", lambda: extract_file(write(tmp_path, "diagram.md", png)))
    assert "diagram.md" in str(error)
    assert "binary" in str(error)
    assert "markdown" in str(error)


def test_control_characters_without_nuls_are_binary(tmp_path: Path) -> None:
    """More than 30% control characters means binary even without NUL bytes."""
    data = bytes([1, 2, 3, 4, 5, 6, 0x41]) * 500
    fails("binary", lambda: extract_file(write(tmp_path, "ctl.log", data)))


def test_ansi_colours_in_logs_are_text(tmp_path: Path) -> None:
    """Escape sequences in a coloured log do not make it binary."""
    data = b"\x1b[31mERROR\x1b[0m disk full on /var\n" * 50
    assert "ERROR" in extract_file(write(tmp_path, "app.log", data)).text


def test_too_large_is_refused_by_stat_before_reading(tmp_path: Path) -> None:
    """A file over max_bytes is refused from its size alone (a sparse 1 TiB file is
    refused instantly)."""
    path = tmp_path / "huge.txt"
    with path.open("wb") as f:
        f.truncate(1 << 40)
    started = time.monotonic()
    error = fails("too_large", lambda: extract_file(path))
    assert time.monotonic() - started < 1.0
    assert "huge.txt" in str(error)
    small = ExtractLimits(max_bytes=10)
    fails("too_large", lambda: extract_file(write(tmp_path, "a.txt", b"x" * 11), small))
    assert extract_file(write(tmp_path, "b.txt", b"x" * 10), small).text == "x" * 10


def test_too_large_bytes(tmp_path: Path) -> None:
    """extract_bytes checks the size before anything else, PDFs included."""
    small = ExtractLimits(max_bytes=10)
    fails("too_large", lambda: extract_bytes(b"x" * 11, "a.md", "markdown", small))
    fails("too_large", lambda: extract_bytes(b"%PDF-" + b"x" * 11, "a.pdf", "pdf", small))


# --- special files -----------------------------------------------------------------------


def no_block(call: Callable[[], object], seconds: float = 5.0) -> BaseException | None:
    """Run ``call`` in a thread; fail if it does not return within ``seconds``."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "extraction blocked"
    return outcome[0]


@pytest.mark.timeout(20)
def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    """A FIFO named like a document returns not_regular at once: never opened, so it
    cannot block waiting for a writer."""
    fifo = tmp_path / "pipe.md"
    os.mkfifo(fifo)
    error = no_block(lambda: extract_file(fifo))
    assert isinstance(error, ExtractionError)
    assert error.kind == "not_regular"
    assert "FIFO" in str(error)


@pytest.mark.timeout(20)
def test_symlink_to_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    """Following a symlink does not get around the check."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    link = tmp_path / "notes.txt"
    link.symlink_to(fifo)
    error = no_block(lambda: extract_file(link))
    assert isinstance(error, ExtractionError)
    assert error.kind == "not_regular"


def test_devices_and_directories_are_refused(tmp_path: Path) -> None:
    """Character devices and directories are not regular files."""
    link = tmp_path / "null.txt"
    link.symlink_to("/dev/null")
    assert "character device" in str(fails("not_regular", lambda: extract_file(link)))
    folder = tmp_path / "folder.md"
    folder.mkdir()
    assert "directory" in str(fails("not_regular", lambda: extract_file(folder)))


def test_symlink_to_regular_file_is_followed(tmp_path: Path) -> None:
    """Which symlinks to hand over is the caller's decision; a symlink given is followed."""
    target = write(tmp_path, "real.md", "# Real\n")
    link = tmp_path / "link.md"
    link.symlink_to(target)
    assert extract_file(link).title == "Real"


def test_missing_and_dangling_paths_are_unreadable(tmp_path: Path) -> None:
    """A missing file or a dangling symlink is an unreadable-file error, not a crash."""
    fails("unreadable", lambda: extract_file(tmp_path / "missing.md"))
    link = tmp_path / "dangling.md"
    link.symlink_to(tmp_path / "nowhere")
    fails("unreadable", lambda: extract_file(link))


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files regardless of mode")
def test_unreadable_file(tmp_path: Path) -> None:
    """A file without read permission is unreadable, with the OS reason."""
    path = write(tmp_path, "secret.md", "x")
    path.chmod(0)
    assert "ermission" in str(fails("unreadable", lambda: extract_file(path)))


# --- HTML --------------------------------------------------------------------------------


DEFAULT_LIMITS = ExtractLimits()


def html(source: str, name: str = "page.html", limits: ExtractLimits = DEFAULT_LIMITS
         ) -> Extracted:
    return extract_bytes(source.encode("utf-8"), name, "html", limits)


def test_html_drops_scripts_styles_and_head() -> None:
    """script, style, noscript, template and head content are dropped; <title> is the title
    and not body text."""
    got = html("""<!DOCTYPE html><html><head><title>Disk &amp; inode runbook</title>
        <meta charset="utf-8"><style>body { color: red }</style>
        <script>var password = "x"; if (a < b) { alert("</p>") }</script></head>
        <body><noscript>Enable JS</noscript><template><p>tpl</p></template>
        <!-- a comment --><p>Check <b>df -h</b> first.</p></body></html>""")
    assert got.title == "Disk & inode runbook"
    assert got.text == "Check df -h first."
    assert got.kind == "html"


def test_html_entities_and_whitespace() -> None:
    """Entities are decoded (named, numeric, hex; &nbsp; as a space); runs of whitespace
    collapse outside <pre>, which keeps its layout."""
    got = html("<p>a &lt; b &amp;&amp; c &gt; d &#8212; &#x2603;&nbsp;ok  \n  spaced</p>"
               "<pre>  line 1\n    line 2</pre><p>after</p>")
    assert got.text == "a < b && c > d — ☃ ok spaced\n\n  line 1\n    line 2\n\nafter"


def test_html_block_elements_become_newlines() -> None:
    """Blocks start new lines, headings and paragraphs are separated by a blank line,
    <br> breaks a line, table cells are separated."""
    got = html("<h1>Title</h1><p>one<br>two</p><ul><li>a</li><li>b</ul>"
               "<table><tr><td>host</td><td>web01</td></tr><tr><td>ip</td><td>x</td></tr>"
               "</table><div>d1</div><div>d2</div><span>in</span><span>line</span>")
    assert got.text == ("Title\n\none\ntwo\n\na\nb\n\nhost | web01\nip | x\n\nd1\nd2\ninline")
    assert got.title == "Title"


def test_html_title_falls_back_to_h1_then_stem() -> None:
    """Without <title> the first <h1> is the title; without either, the name's stem."""
    assert html("<body><h1> First  <i>heading</i></h1><h1>Second</h1>").title == \
        "First heading"
    assert html("<p>no headings</p>", name="docs/ops/restart.html").title == "restart"


def test_html_unclosed_script_drops_the_rest() -> None:
    """An unterminated <script> swallows the rest of the document, as in a browser."""
    assert html("<p>kept</p><script>var a = 1; <p>not text").text == "kept"


def test_html_odd_markup_is_tolerated() -> None:
    """CDATA, processing instructions, bogus end tags, stray "<" and unclosed tags do not
    raise (html.parser raises AssertionError on "<![")."""
    got = html("<![CDATA[x]]><?php echo 1 ?></ 3>a < b <3 <p>ok</p></nope><div unclosed")
    assert got.text == "a < b <3\n\nok"


def nested(depth: int) -> str:
    return "<div>" * depth + "deep" + "</div>" * depth


def test_html_deep_nesting_fails_fast() -> None:
    """100,000 nested <div>s fail cleanly with html_too_deep, not recursion, and in linear
    time (12,500 to 100,000 levels)."""
    assert_linear(nested, lambda source: fails("html_too_deep", lambda: html(source)), 12_500)
    error = fails("html_too_deep", lambda: html(nested(100_000), name="deep.html"))
    assert "deep.html" in str(error)
    assert "500" in str(error)


def test_html_depth_limit_is_configurable_and_ignores_implicit_ends() -> None:
    """The depth counts open elements only: 100,000 <p>/<li> without end tags are flat."""
    assert html("<div>" * 10 + "x", limits=ExtractLimits(html_max_depth=10)).text == "x"
    fails("html_too_deep", lambda: html("<div>" * 11, limits=ExtractLimits(html_max_depth=10)))
    flat = html("<ul>" + "<li>item<p>para" * 100_000 + "</ul>")
    assert flat.text.count("item") == 100_000


@pytest.mark.parametrize(("prefix", "unit"), [
    ("", "<!--"), ("", "<a "), ("", "</"), ("", "<!["), ("", "<?"), ("", "&#"), ("", "<!"),
    ('<a href="', "x"), ("", "<x"), ("<script>", "</scrip"), ("", "<"), ("<p ", "a=b "),
])
def test_html_hostile_inputs_are_linear(prefix: str, unit: str) -> None:
    """Inputs that make html.parser quadratic on Python 3.11.7 (40 KB of "<a " takes ~20 s
    there) extract in linear time here: 8x the text (250 kB to 2 MB), about 8x the CPU."""
    assert_linear(lambda size: prefix + unit * (size // len(unit)), html, 250_000)


def test_gigantic_html_within_max_bytes() -> None:
    """A ~19 MB page of ordinary markup extracts completely."""
    row = "<tr><td>web01</td><td>10.0.0.12</td><td>ok &amp; healthy</td></tr>\n"
    source = "<html><body><table>" + row * (19_000_000 // len(row)) + "</table>"
    got = html(source)
    assert got.text.count("web01 | 10.0.0.12 | ok & healthy") == 19_000_000 // len(row)


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
    assert time.monotonic() - started < 10.0
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
    assert time.monotonic() - started < 15.0
    assert "memory" in str(error)


@pytest.mark.process
def test_pdf_timeout_kills_the_worker() -> None:
    """Past pdf_timeout the worker is killed and the error is a timeout."""
    started = time.monotonic()
    error = fails("timeout", lambda: extract_bytes(text_pdf(b"x"), "slow.pdf", "pdf",
                                                   ExtractLimits(pdf_timeout=0.01)))
    assert time.monotonic() - started < 5.0
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
    assert time.monotonic() - started < 5.0


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
    """``python -m retrieval._pdf_worker PATH`` prints the JSON result (manual use)."""
    import subprocess

    path = write(tmp_path, "m.pdf", text_pdf(b"Module run"))
    out = subprocess.run(
        [sys.executable, "-m", "retrieval._pdf_worker", str(path), "--max-bytes", "100000",
         "--max-pages", "10", "--max-output", "100000"],
        capture_output=True, check=True, timeout=60,
    ).stdout
    assert b'"pages": ["Module run' in out


# --- retrieval.errors --------------------------------------------------------------------


def test_error_tree() -> None:
    """Every retrieval error is a RetrievalError; ExtractionError carries reason and kind."""
    for cls in (InvalidDocument, ExtractionError, NotFound, IndexCorrupt):
        assert issubclass(cls, RetrievalError)
    error = ExtractionError("a.md: binary", "binary")
    assert (error.reason, error.kind, str(error)) == ("a.md: binary", "binary", "a.md: binary")
    assert NotFound("no source 'x'").reason == "no source 'x'"


@pytest.mark.parametrize("doc_id", [
    "docs/runbooks/web01.md", "a", "docs/a b/ü.md", "docs/" + "x" * 507, "src/.hidden",
    "docs/a..b", "docs/...",
])
def test_valid_document_ids(doc_id: str) -> None:
    """Ids within the rules are returned unchanged."""
    assert validate_document_id(doc_id) == doc_id


@pytest.mark.parametrize(("doc_id", "reason"), [
    ("", "empty"),
    ("x" * 513, "513 characters"),
    ("docs\\a.md", "backslash"),
    ("docs/../etc/passwd", "'..' segment"),
    ("..", "'..' segment"),
    ("docs/a/..", "'..' segment"),
    ("/etc/passwd", "starts with '/'"),
    ("docs//a.md", "empty segment"),
    ("docs/", "empty segment"),
    ("docs/a\x00.md", "control character (U+0000)"),
    ("docs/a\n.md", "control character (U+000A)"),
    ("docs/a\x7f", "control character (U+007F)"),
    ("docs/a\x85", "control character (U+0085)"),
    ("docs/\ud800", "unpaired surrogate"),
])
def test_invalid_document_ids(doc_id: str, reason: str) -> None:
    """Each rule is enforced with a reason naming it; the id is shown escaped."""
    with pytest.raises(InvalidDocument) as info:
        validate_document_id(doc_id)
    assert reason in str(info.value)
    assert "\x00" not in str(info.value)
    assert "\n" not in str(info.value)
