"""Chunking markdown: every chunk starts with its heading path; small sections merge under
the heading they share and long ones overlap by whole sentences; setext and ATX headings,
and code fences (split and re-fenced when long, kept whole and with the text leading into
them when they fit, closed when unterminated, never a source of overlap).
"""

from __future__ import annotations

import re

from retrieval.chunking._chunker import chunk_text
from tests.support.chunk_samples import NESTED_LINES, NGINX_LINES, RUNBOOK, chunks_with_heading
from tests.support.chunks import body, open_fence_at_end

# --- markdown ----------------------------------------------------------------------------


def test_markdown_chunks_start_with_their_heading_path() -> None:
    """Every markdown chunk's text opens with its heading path and a blank line."""
    chunks = chunk_text(RUNBOOK, "markdown")
    assert [c.heading for c in chunks][:4] == [
        "Runbooks", "Runbooks > web01 > Disk full", "Runbooks > web01 > Disk full",
        "Runbooks > web01 > Memory pressure"]
    assert {c.heading for c in chunks[4:]} == {
        "Runbooks > web02", "Runbooks > Ticket template", "Runbooks > Appendix"}
    for c in chunks:
        assert c.text.startswith(c.heading + "\n\n")


def test_markdown_empty_parent_section_folds_into_its_first_subsection() -> None:
    """A heading with no text of its own ("## web01") travels with its first subsection."""
    chunks = chunk_text(RUNBOOK, "markdown")
    assert not chunks_with_heading(chunks, "Runbooks > web01")
    disk = chunks_with_heading(chunks, "Runbooks > web01 > Disk full")
    assert disk[0].text.startswith(
        "Runbooks > web01 > Disk full\n\n## web01\n\n### Disk full\n\nSymptoms:")


def test_markdown_long_section_chunks_overlap_by_whole_sentences() -> None:
    """A section longer than size splits at paragraph or sentence ends, and the next chunk
    repeats whole trailing sentences of the previous one."""
    first, second = chunks_with_heading(chunk_text(RUNBOOK, "markdown"),
                                        "Runbooks > web01 > Disk full")
    repeated = body(second, "markdown", 1200).split("\n\n")[0]
    assert first.text.endswith(repeated)
    assert repeated.startswith("As a last resort extend the volume")
    assert len(repeated) <= 200


SIBLINGS = """## web01

### Disk full

Clean /var. Rotate logs.

### Memory

Restart the JVM.

#### Heap dumps

Take one first.

## web02

### CPU

Check top.

## web03

Fine.

## web04

Also fine.
"""


def test_markdown_small_sections_merge_and_keep_the_shared_heading() -> None:
    """Small sections under one parent share a chunk headed by the path they all share;
    a section under another parent starts a new chunk."""
    chunks = chunk_text(SIBLINGS, "markdown")
    assert [c.heading for c in chunks] == ["web01", "web02 > CPU", ""]
    assert chunks[0].text == "web01\n\n" + SIBLINGS[:SIBLINGS.index("\n\n## web02")]
    assert chunks[2].text == "## web03\n\nFine.\n\n## web04\n\nAlso fine."


def test_markdown_subsections_merge_under_the_first_heading() -> None:
    """A small section followed by its own small subsections keeps its own path."""
    (chunk,) = chunk_text("## Disk\n\nIntro.\n\n### Check\n\ndf -h\n\n### Fix\n\nrotate",
                          "markdown")
    assert chunk.heading == "Disk"


def test_markdown_sections_are_not_merged_when_they_do_not_fit() -> None:
    """With a small size each section is chunked on its own, never sharing a chunk."""
    chunks = chunk_text(SIBLINGS, "markdown", size=40, overlap=10, max_chars=80)
    assert list(dict.fromkeys(c.heading for c in chunks)) == [
        "web01 > Disk full", "web01 > Memory", "web01 > Memory > Heap dumps", "web02 > CPU",
        "web03", "web04"]
    for a, b in [("Rotate", "JVM"), ("JVM", "Take one"), ("Take one", "top"), ("Fine", "Also")]:
        assert not any(a in c.text and b in c.text for c in chunks)


def test_markdown_setext_heading_opens_a_section() -> None:
    """An underlined one-line paragraph ("web02" over "-----") is a level-2 heading."""
    chunks = chunk_text(RUNBOOK, "markdown")
    web02 = chunks_with_heading(chunks, "Runbooks > web02")
    assert web02[0].text.startswith("Runbooks > web02\n\nweb02\n-----\n\nRestart procedure")


def test_markdown_setext_underline_needs_a_one_line_paragraph() -> None:
    """A dash line after a blank line or under a two-line paragraph is not an underline."""
    text = "# Top\n\nline one\nline two\n---\n\n---\n\nlast"
    chunks = chunk_text(text, "markdown")
    assert [c.heading for c in chunks] == ["Top"]
    assert chunks[0].text == "Top\n\n" + text


def test_markdown_hash_lines_inside_fences_are_not_headings() -> None:
    """Shell comments inside fences (closed or not) never become headings."""
    headings = " | ".join(c.heading for c in chunk_text(RUNBOOK, "markdown"))
    assert "find what grew" not in headings
    assert "not a heading" not in headings


def test_markdown_atx_variants() -> None:
    """Up to three spaces of indent, closing hashes stripped, ``#tag`` and 4-space indents
    are text."""
    text = "   ## Title ##\n\nbody\n\n#tag is text\n\n    # indented code\n\n####### seven"
    (chunk,) = chunk_text(text, "markdown")
    assert chunk.heading == "Title"
    assert chunk.text == "Title\n\n" + text


def test_markdown_long_fence_is_split_and_refenced() -> None:
    """A fence over max_chars is cut at line boundaries, each piece re-fenced with the
    original marker and info string, and the code comes back whole and in order."""
    chunks = chunk_text(RUNBOOK, "markdown")
    opener = '```nginx title="upstream.conf"'
    pieces = [c for c in chunks if opener in c.text]
    assert len(pieces) > 2
    code: list[str] = []
    for c in pieces:
        assert len(c.text) <= 2000
        lines = c.text[c.text.index(opener):].split("\n")
        end = lines.index("```")
        code += lines[1:end]
    assert code == ["upstream app {", *NGINX_LINES, "}"]


def test_markdown_nested_looking_fence_content_stays_inside_its_fence() -> None:
    """Inner ``` lines of a ```` fence are content: the pieces re-fence with ```` and
    keep every inner line."""
    chunks = chunks_with_heading(chunk_text(RUNBOOK, "markdown"), "Runbooks > Ticket template")
    assert len(chunks) > 2
    inner: list[str] = []
    for c in chunks:
        lines = body(c, "markdown", 1200).split("\n")
        assert lines[0] == "````markdown" or c is chunks[0]
        assert lines[-1] == "````"
        start = lines.index("````markdown") + 1
        inner += lines[start:-1]
        assert not open_fence_at_end(c.text)
    assert inner == NESTED_LINES


def test_markdown_unterminated_fence_runs_to_the_end_and_is_closed() -> None:
    """An unclosed ~~~ fence swallows the rest of the document and gets a closing line."""
    (appendix,) = chunks_with_heading(chunk_text(RUNBOOK, "markdown"), "Runbooks > Appendix")
    assert appendix.text == ("Runbooks > Appendix\n\n## Appendix\n\n~~~text\n"
                             "captured console output, never closed\n# not a heading\n"
                             "## also not a heading\n~~~")


def test_markdown_fence_stays_with_the_text_leading_into_it() -> None:
    """A fence that fits max_chars joins the chunk before it, stretching it past size."""
    fence = "```yaml\n" + "\n".join(f"key{n}: value{n}" for n in range(60)) + "\n```"
    prose = " ".join(f"Sentence {n} explains the deployment." for n in range(25))
    text = f"# Deploy\n\n{prose}\n\nApply this file:\n\n{fence}\n\nDone."
    chunks = chunk_text(text, "markdown")
    assert len(chunks[0].text) > 1200
    assert chunks[0].text.endswith("Apply this file:\n\n" + fence)
    assert chunks[1].text == "Deploy\n\nDone."


def test_markdown_fence_that_does_not_fit_starts_a_new_chunk_whole() -> None:
    """A fence that would push the chunk past max_chars starts the next chunk, whole, after
    at most ``overlap`` characters of the sentences before it."""
    fence = "```yaml\n" + "\n".join(f"key{n}: value{n}" for n in range(110)) + "\n```"
    prose = " ".join(f"Sentence {n} explains the deployment." for n in range(40))
    text = f"# Deploy\n\n{prose}\n\n{fence}\n\nDone."
    chunks = chunk_text(text, "markdown")
    holders = [c for c in chunks if "```yaml" in c.text]
    assert len(holders) == 1
    assert len(holders[0].text) <= 2000
    before, _, after = body(holders[0], "markdown", 1200).partition(fence)
    assert re.fullmatch(r"(Sentence \d+ explains the deployment\. ?)+\n\n", before)
    assert len(before) <= 202
    assert after == ""


def test_markdown_overlap_never_comes_from_a_fence() -> None:
    """The chunk after a fence starts with new prose, not with repeated code."""
    code = "```sh\n" + "\n".join(f"echo step{n}. done." for n in range(12)) + "\n```"
    after = " ".join(f"Afterwards check {n}." for n in range(20))
    chunks = chunk_text(f"# S\n\n{code}\n\n{after}", "markdown", size=200, overlap=80,
                        max_chars=400)
    assert "```sh" in chunks[0].text
    for c in chunks[1:]:
        assert "echo" not in c.text
        assert body(c, "markdown", 200).startswith("Afterwards check")


def test_markdown_preamble_has_no_heading() -> None:
    """Text before the first heading is its own chunk with heading ""."""
    chunks = chunk_text("Preface line.\n\n# One\n\nBody.", "markdown")
    assert [(c.heading, c.text) for c in chunks] == [
        ("", "Preface line."), ("One", "One\n\n# One\n\nBody.")]


def test_markdown_long_heading_path_is_cut() -> None:
    """A heading path longer than half of size is cut with an ellipsis in the text only."""
    title = "x" * 300
    chunks = chunk_text(f"# {title}\n\nbody", "markdown", size=200, overlap=0)
    assert {c.heading for c in chunks} == {title}
    assert all(c.text.startswith("x" * 97 + "…\n\n") for c in chunks)
    assert chunks[0].text == "x" * 97 + "…\n\n#"
