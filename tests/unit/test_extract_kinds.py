"""Extraction (retrieval.extraction._extract) by kind and encoding: the kind a file's suffix gives,
markdown titles (first H1, front matter, setext, the stem), text and config kinds, bytes
and files extracted alike, newlines normalised; UTF-8/16/32 with and without BOMs, cp1252
detected, and undecodable text refused as an encoding error with a hint.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from retrieval.errors import ExtractionError, InvalidDocument
from retrieval.extraction._extract import Extracted, extract_bytes, extract_file, kind_for
from tests.support.extraction import fails, write

# --- kinds -------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "kind"), [
    ("a.md", "markdown"), ("a.MARKDOWN", "markdown"), ("a.txt", "text"), ("a.log", "text"),
    ("a.rst", "text"), ("a.text", "text"), ("a.html", "html"), ("a.HTM", "html"),
    ("a.cfg", "config"), ("a.conf", "config"), ("a.config", "config"), ("r1.ios", "config"),
    ("r1.junos", "config"), ("a.pdf", "pdf"), ("a.png", None), ("Makefile", None),
    ("a.md.bak", None), ("notes.md.txt", "text"), ("a.yaml", "yaml"), ("a.YML", "yaml"),
    ("a.json", "json"), ("pyproject.toml", "toml"), ("a.sh", "shell"), ("a.bash", "shell"),
    ("a.zsh", "shell"), ("a.ksh", "shell"), ("a.py", "python"), ("a.pyc", None),
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


@pytest.mark.parametrize(("suffix", "kind"), [
    (".yaml", "yaml"), (".yml", "yaml"), (".json", "json"), (".toml", "toml"),
    (".sh", "shell"), (".bash", "shell"), (".zsh", "shell"), (".ksh", "shell"),
    (".py", "python")])
def test_structured_kinds_are_text_of_their_kind(tmp_path: Path, suffix: str,
                                                 kind: str) -> None:
    """YAML, JSON, TOML, shell and Python files are kept as is, titled by their stem; a
    binary one is refused naming its kind."""
    source = "# deploy\nkey: value\n"
    got = extract_file(write(tmp_path, "deploy" + suffix, source))
    assert got == Extracted(title="deploy", text=source, kind=kind)
    with pytest.raises(ExtractionError, match=f"binary file .*not {kind} text"):
        extract_file(write(tmp_path, "blob" + suffix, b"\x00\x01" * 50))


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
