"""Chunking: markdown heading paths and code fences, config blocks, prose overlap, and the
guarantees (bounded, non-empty, numbered, deterministic, covering, balanced) for any input."""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retrieval._chunk import Chunk, chunk_text
from tests.support.chunks import (
    assert_covered,
    assert_guarantees,
    body,
    open_fence_at_end,
)
from tests.support.scaling import assert_linear

KINDS = ("markdown", "config", "text", "html", "pdf")

# --- fixtures ----------------------------------------------------------------------------

NGINX_LINES = [f"    server 10.0.{n // 16}.{n % 16}:8080 max_fails=3 fail_timeout=30s;"
               for n in range(120)]
NESTED_LINES = ["Paste this into the ticket:", "", "```bash", "# not a heading either",
                "systemctl status nginx", "```", "", "Then attach the output."] * 40

RUNBOOK = "\n".join([
    "# Runbooks",
    "",
    "Operational runbooks for the web tier. Each host lists symptoms, checks and fixes.",
    "",
    "## web01",
    "",
    "### Disk full",
    "",
    "Symptoms: nginx answers 500 and `df -h` shows /var at 100%. The access log stops",
    "growing and the load balancer marks the host down after three failed checks. Alerts",
    "fire in this order: disk above 90%, then 5xx rate, then the host-down page.",
    "",
    "First confirm which filesystem is full. On web01 /var is a separate LVM volume, so",
    "the root filesystem can look healthy while /var is not. Do not delete files under",
    "/var/lib/docker by hand! Use the prune commands, or the overlay metadata breaks.",
    "",
    "```bash",
    "# find what grew",
    "du -xh /var | sort -h | tail -20",
    "```",
    "",
    "Usually the culprit is a debug log left on after an incident. Turn the level back",
    "to warn in /etc/app/logging.yaml and reload the service. If the volume is still",
    "above 85% after that, rotate and compress the old logs with logrotate -f, then",
    "check that the cron entry for logrotate is present. If nothing obvious grew, look",
    "for deleted files still held open: lsof +L1 lists them, and restarting the holder",
    "releases the space. As a last resort extend the volume: there are 20 GB free in",
    "the volume group. Record what you did in the incident ticket before closing it.",
    "",
    "Afterwards, check that the alert cleared and that the host is back in the pool. The",
    "load balancer needs two passing checks, which takes about twenty seconds. Then look",
    "at the disk growth graph for the last week to see whether this will happen again.",
    "",
    "### Memory pressure",
    "",
    "Check `free -m` and the OOM killer in `dmesg`. The usual suspect is the JVM heap.",
    "Compare the heap limit in /etc/default/app with the container limit; the heap must",
    "stay at least 512 MB below it. Restart the service only after taking a heap dump.",
    "",
    "web02",
    "-----",
    "",
    "Restart procedure for the load balancer. Drain first, then reload the config below.",
    "",
    '```nginx title="upstream.conf"',
    "upstream app {",
    *NGINX_LINES,
    "}",
    "```",
    "",
    "## Ticket template",
    "",
    "````markdown",
    *NESTED_LINES,
    "````",
    "",
    "## Appendix",
    "",
    "~~~text",
    "captured console output, never closed",
    "# not a heading",
    "## also not a heading",
    "",
])


def cisco_config() -> str:
    """A Cisco IOS export: globals, 48 access ports, a giant ACL, OSPF and vty lines."""
    out = ["!", "! Last configuration change at 10:42:01 UTC Mon Mar 4 2024 by netops", "!",
           "version 15.2", "service timestamps log datetime msec", "hostname core-sw01", "!"]
    for n in range(1, 49):
        out += [f"interface GigabitEthernet1/0/{n}",
                f" description rack{n // 12 + 1} server{n:02d} eth0",
                " switchport access vlan 120",
                " switchport mode access",
                " spanning-tree portfast",
                "!"]
    out.append("ip access-list extended EDGE-IN")
    for n in range(1, 301):
        out.append(f" {n * 10} permit tcp any host 10.1.{n // 250}.{n % 250} eq 443")
    out += [" 9999 deny ip any any log", "!",
            "router ospf 1", " router-id 10.255.0.1", " passive-interface default",
            " network 10.0.0.0 0.255.255.255 area 0", "!",
            "line vty 0 4", " transport input ssh", " login local", "!", "end"]
    return "\n".join(out) + "\n"


def juniper_config() -> str:
    """A Juniper brace-style export whose interfaces block is far larger than max_chars."""
    out = ["## Last commit: 2024-03-04 10:42:01 UTC by netops", "version 20.4R3.8;",
           "system {", "    host-name edge-r1;", "    services {", "        ssh;",
           "        netconf {", "            ssh;", "        }", "    }", "}",
           "interfaces {"]
    for n in range(40):
        out += [f"    ge-0/0/{n} {{", f'        description "uplink {n} {{core}}";',
                "        unit 0 {", "            family inet {",
                f"                address 10.{n}.0.1/30;", "            }", "        }", "    }"]
    out += ["}", "protocols {", "    ospf {", "        area 0.0.0.0 {",
            "            interface ge-0/0/0.0;", "        }", "    }", "}"]
    return "\n".join(out) + "\n"


CISCO = cisco_config()
JUNIPER = juniper_config()

WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]
PLAIN = "\n\n".join(
    " ".join(f"{WORDS[(p + n) % len(WORDS)]}{n}" for n in range(p * 500, p * 500 + 450))
    for p in range(3))

SENTENCES = "\n\n".join(
    " ".join(f"Step {p}.{n} restarts the {WORDS[n % len(WORDS)]} service and checks it."
             for n in range(40))
    for p in range(3))


# --- helpers -----------------------------------------------------------------------------

def chunks_with_heading(chunks: list[Chunk], heading: str) -> list[Chunk]:
    return [c for c in chunks if c.heading == heading]


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


# --- prose -------------------------------------------------------------------------------


def test_text_overlap_is_whole_trailing_sentences() -> None:
    """Each chunk after the first repeats whole sentences from the end of the one before,
    within the overlap budget."""
    chunks = chunk_text(SENTENCES, "text", size=400, overlap=120, max_chars=400)
    assert len(chunks) > 10
    overlaps = 0
    for a, b in itertools.pairwise(chunks):
        assert len(b.text) <= 400
        starts = [m.end() for m in re.finditer(r"\. ", b.text)]
        shared = [b.text[:p - 1] for p in starts if a.text.endswith(b.text[:p - 1])]
        if shared:
            overlaps += 1
            assert len(shared[-1]) <= 120
            cut = len(a.text) - len(shared[-1])
            assert a.text[cut - 2:cut] in (". ", "\n\n")
    assert overlaps >= len(chunks) // 2


def test_text_without_punctuation_splits_between_words() -> None:
    """Long unpunctuated paragraphs split at whitespace: no word is ever cut."""
    words = PLAIN.split()
    index = {w: n for n, w in enumerate(words)}
    chunks = chunk_text(PLAIN, "text", size=300, overlap=60, max_chars=300)
    previous_end = 0
    for c in chunks:
        got = c.text.split()
        first = index[got[0]]
        assert got == words[first:first + len(got)]
        repeated = words[first:previous_end]
        assert len(" ".join(repeated)) <= 60
        previous_end = first + len(got)
    assert previous_end == len(words)


def test_text_paragraph_that_fits_is_never_split() -> None:
    """Paragraphs shorter than size each land whole in one chunk."""
    paragraphs = [f"Paragraph {n} " + "word " * (n * 7 % 90) + "end." for n in range(30)]
    chunks = chunk_text("\n\n".join(paragraphs), "text", size=500, overlap=0)
    for p in paragraphs:
        assert any(p in c.text for c in chunks)


def test_text_giant_token_is_cut_hard() -> None:
    """A token longer than size (a base64 blob) is cut into size-long pieces."""
    blob = "QUJD" * 1500
    chunks = chunk_text(f"key: {blob} end", "text", size=1000, overlap=100)
    assert [len(c.text) for c in chunks] == [4, 1000, 1000, 1000, 1000, 1000, 1000, 3]
    assert "".join(c.text for c in chunks) == f"key:{blob}end"


@pytest.mark.parametrize("kind", ["text", "html", "pdf"])
def test_plain_kinds_ignore_markdown_syntax(kind: str) -> None:
    """Extracted text has no headings or fences: "#" and "```" lines are plain text."""
    chunks = chunk_text("# not a heading\n```\ncode\n\nmore", kind)
    assert [(c.heading, c.text) for c in chunks] == [("", "# not a heading\n```\ncode\n\nmore")]


# --- config ------------------------------------------------------------------------------


def test_config_interface_blocks_stay_whole_and_are_grouped() -> None:
    """Each interface block (with its "!") is whole in exactly one chunk, several per chunk,
    and the chunk is headed by its first block's header line."""
    chunks = chunk_text(CISCO, "config")
    for n in range(1, 49):
        block = (f"interface GigabitEthernet1/0/{n}\n description rack{n // 12 + 1} "
                 f"server{n:02d} eth0\n")
        holders = [c for c in chunks if block in c.text + "\n"]
        assert len(holders) == 1
    iface = [c for c in chunks if c.heading.startswith("interface ")]
    assert len(iface) < 48 // 3
    for c in iface:
        assert len(c.text) <= 1200
        assert c.text.startswith(c.heading) or c.text.startswith("!")
    assert chunks[0].heading == "version 15.2"
    assert chunks[0].text.startswith("!\n! Last configuration change")


def test_config_giant_acl_is_split_with_its_header_repeated() -> None:
    """An ACL far over max_chars is cut at line boundaries, every piece opening with the
    ACL's header line, every entry kept exactly once and in order."""
    chunks = chunk_text(CISCO, "config", size=1200, max_chars=2000)
    acl = chunks_with_heading(chunks, "ip access-list extended EDGE-IN")
    assert len(acl) >= 10
    entries: list[str] = []
    for c in acl:
        lines = c.text.split("\n")
        assert lines[0] == "ip access-list extended EDGE-IN"
        assert len(c.text) <= 1200
        entries += lines[1:]
    expected = [f" {n * 10} permit tcp any host 10.1.{n // 250}.{n % 250} eq 443"
                for n in range(1, 301)]
    assert entries == [*expected, " 9999 deny ip any any log", "!"]


def test_config_lines_are_not_repeated_across_chunks() -> None:
    """Config chunks have no overlap: apart from repeated headers, each line appears once."""
    chunks = chunk_text(CISCO, "config", size=400, max_chars=600)
    seen: list[str] = []
    for c in chunks:
        lines = c.text.split("\n")
        if lines[0] == c.heading and seen and c.heading in seen:
            lines = lines[1:]
        seen += lines
    source = [line for line in CISCO.split("\n") if line.strip()]
    assert seen == source


def test_config_juniper_brace_blocks() -> None:
    """Brace blocks run until their braces balance (quoted braces ignored); the big one is
    cut between its sub-blocks with its header line repeated; headings drop the "{"."""
    chunks = chunk_text(JUNIPER, "config", size=1200, max_chars=2000)
    assert chunks[0].heading == "version 20.4R3.8;"
    assert chunks[0].text.startswith("## Last commit")
    assert "system {\n    host-name edge-r1;" in chunks[0].text
    interfaces = chunks_with_heading(chunks, "interfaces")
    assert len(interfaces) >= 5
    for c in interfaces:
        assert re.match(r"interfaces \{\n    ge-0/0/\d+ \{\n", c.text)
        assert c.text.endswith("\n    }") or c is interfaces[-1]
        assert "protocols" not in c.text
    assert chunks[-1].heading in ("interfaces", "protocols")
    assert chunks[-1].text.endswith("protocols {\n    ospf {\n        area 0.0.0.0 {\n"
                                    "            interface ge-0/0/0.0;\n        }\n    }\n}")
    assert_covered(JUNIPER, chunks, "config", 1200)


def test_config_indented_arista_sections_stay_with_their_header() -> None:
    """Deeper Arista indentation (router bgp / vrf / neighbor) stays in the router block."""
    text = ("router bgp 65000\n   router-id 10.0.0.1\n   vrf PROD\n      neighbor 10.9.9.9 "
            "remote-as 65001\n!\nmanagement api http-commands\n   no shutdown\n")
    (chunk,) = chunk_text(text, "config")
    assert chunk.heading == "router bgp 65000"
    assert chunk.text == text.rstrip("\n")


# --- arguments and edge cases -----------------------------------------------------------


@pytest.mark.parametrize(("size", "overlap", "max_chars"), [
    (0, 0, 10), (-5, 0, 10), (100, -1, 200), (100, 100, 200), (100, 150, 200), (100, 10, 99)])
def test_invalid_arguments_raise_value_error(size: int, overlap: int, max_chars: int) -> None:
    """size > 0, 0 <= overlap < size and max_chars >= size are enforced."""
    with pytest.raises(ValueError, match=r"^(size|overlap|max_chars) must be"):
        chunk_text("text", "text", size=size, overlap=overlap, max_chars=max_chars)


def test_unknown_kind_raises_value_error() -> None:
    """Kinds outside markdown/config/text/html/pdf are refused."""
    with pytest.raises(ValueError, match="unknown kind"):
        chunk_text("text", "docx")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("text", ["", " ", "\n\n\t \n", "\r\n\r\n"])
def test_empty_or_whitespace_text_gives_no_chunks(kind: str, text: str) -> None:
    """Nothing to index gives an empty list."""
    assert chunk_text(text, kind) == []


def test_crlf_is_normalised() -> None:
    """Windows and old-Mac newlines chunk exactly like \\n."""
    assert chunk_text(RUNBOOK.replace("\n", "\r\n"), "markdown") == chunk_text(RUNBOOK,
                                                                               "markdown")
    assert chunk_text(CISCO.replace("\n", "\r"), "config") == chunk_text(CISCO, "config")


@pytest.mark.parametrize(("text", "kind"), [
    (RUNBOOK, "markdown"), (CISCO, "config"), (JUNIPER, "config"), (PLAIN, "text"),
    (SENTENCES, "pdf")])
@pytest.mark.parametrize(("size", "overlap", "max_chars"), [
    (1200, 200, 2000), (300, 50, 300), (64, 0, 64), (10, 9, 10), (1, 0, 1)])
def test_fixtures_keep_the_guarantees(text: str, kind: str, size: int, overlap: int,
                                      max_chars: int) -> None:
    """Every fixture at every size is bounded, non-empty, numbered, deterministic, covering."""
    chunks = chunk_text(text, kind, size=size, overlap=overlap, max_chars=max_chars)
    assert_guarantees(text, kind, size, overlap, max_chars, chunks)
    # Below size // 4 < len(opening + closing fence lines) fences are emitted unfenced, and
    # dropping fence lines on both sides is no longer an exact coverage check.
    if kind != "markdown" or size >= 300:
        assert_covered(text, chunks, kind, size)
        assert not any(open_fence_at_end(c.text) for c in chunks)


# --- performance -------------------------------------------------------------------------

SECTION = """## Host web{n:05d}

### Disk full

When /var fills up, nginx stops writing access logs and the health check fails. Check
usage first. Then find what grew. Rotate the logs if they are the culprit!

```bash
# find big files
du -xh /var | sort -h | tail -20
journalctl --vacuum-size=500M
```

1. Stop the writer.
2. Truncate the file: `: > /var/log/big.log`.
3. Start the writer again and watch `df -h`.

### Memory

Look at `free -m` and the OOM killer in `dmesg`. The usual suspect is the JVM heap.

"""


def runbooks(size: int) -> str:
    """Markdown runbooks of about ``size`` characters."""
    parts = ["# Runbooks\n\n"]
    total, n = 0, 0
    while total < size:
        parts.append(SECTION.format(n=n))
        total += len(parts[-1])
        n += 1
    return "".join(parts)


def test_megabytes_of_markdown_chunk_in_linear_time() -> None:
    """Runbooks chunk in linear time: 8x the text, about 8x the CPU (4 MB measured ~0.2 s;
    absolute speed is bench/'s business)."""
    assert len(chunk_text(runbooks(4_000_000), "markdown")) > 4_000
    assert_linear(runbooks, lambda text: chunk_text(text, "markdown"), 500_000)


PATHOLOGICAL: dict[str, tuple[Callable[[int], str], str]] = {
    "one-giant-fence": (lambda n: "```\n" + "x = 1\n" * n + "```\n", "markdown"),
    "one-giant-token": (lambda n: "a" * (5 * n), "markdown"),
    "one-giant-paragraph": (lambda n: "word " * (n // 2), "text"),
    "sentences": (lambda n: "Short one. " * (n // 2), "markdown"),
    "one-config-block": (lambda n: "interface Gi0/1\n" + " permit ip any any\n" * (n // 4),
                         "config"),
    "heading-run": (lambda n: "# h\n" * (n // 4), "markdown"),
}


@pytest.mark.parametrize("name", sorted(PATHOLOGICAL))
def test_pathological_shapes_chunk_in_linear_time(name: str) -> None:
    """One giant fence, token, paragraph, block or heading run chunks in linear time, and
    every chunk stays bounded."""
    make, kind = PATHOLOGICAL[name]
    assert all(len(c.text) <= 2000 for c in chunk_text(make(400_000), kind))
    assert_linear(make, lambda text: chunk_text(text, kind), 50_000)


# --- properties --------------------------------------------------------------------------

LINES = ["# Title", "## Sub", "### Deep", "Setext", "===", "---", "```", "```py", "~~~",
         "````md", "    indented", "- item", "1. step", "", "", "Sentence one. Two!",
         "interface Gi0/1", " ip address 10.0.0.1 255.255.255.0", "!", "system {", "}",
         '    description "a { b";', "## Last commit", "/* note */", "end"]
ALPHABET = st.one_of(st.sampled_from(list("ab .!?\n\t#=-`~{}!\"')x")),
                     st.characters(exclude_categories=["Cs"]))
ANY_TEXT = st.one_of(
    st.text(ALPHABET, max_size=800),
    st.lists(st.one_of(st.sampled_from(LINES), st.text(ALPHABET, max_size=120)),
             max_size=60).map("\n".join))


@st.composite
def params(draw: st.DrawFn) -> tuple[int, int, int]:
    size = draw(st.one_of(st.integers(1, 40), st.integers(41, 600)))
    overlap = draw(st.integers(0, size - 1))
    max_chars = size + draw(st.one_of(st.just(0), st.integers(0, 600)))
    return size, overlap, max_chars


@settings(max_examples=200, deadline=None)
@given(text=ANY_TEXT, kind=st.sampled_from(KINDS), args=params())
def test_any_text_keeps_the_guarantees(text: str, kind: str,
                                       args: tuple[int, int, int]) -> None:
    """For any text, kind and valid arguments: bounded, non-empty, numbered, deterministic."""
    size, overlap, max_chars = args
    chunks = chunk_text(text, kind, size=size, overlap=overlap, max_chars=max_chars)
    assert_guarantees(text, kind, size, overlap, max_chars, chunks)
    assert (chunks == []) == (not text.strip())


@settings(max_examples=200, deadline=None)
@given(text=ANY_TEXT, kind=st.sampled_from(KINDS), args=params())
def test_any_text_is_covered(text: str, kind: str, args: tuple[int, int, int]) -> None:
    """Every non-whitespace character lands in a chunk, in order (fence lines aside)."""
    if kind == "markdown":  # backticks and tildes make fence lines, checked separately
        text = text.replace("`", "'").replace("~", "-")
    size, overlap, max_chars = args
    chunks = chunk_text(text, kind, size=size, overlap=overlap, max_chars=max_chars)
    assert_covered(text, chunks, kind, size)


PROSE_WORDS = st.sampled_from(["disk", "full", "nginx", "restart", "10.0.0.1", "check",
                               "web01", "logs", "x" * 70, "the", "and", "rotate"])


@st.composite
def markdown_docs(draw: st.DrawFn) -> tuple[str, list[str]]:
    """A markdown document of headings, paragraphs and fences, and its heading titles."""
    out: list[str] = []
    titles: list[str] = []
    for k in range(draw(st.integers(1, 14))):
        part = draw(st.sampled_from(["atx", "setext", "para", "para", "fence", "list"]))
        if part in ("atx", "setext"):
            title = f"T{k} " + " ".join(draw(st.lists(PROSE_WORDS, min_size=1, max_size=3)))
            titles.append(title)
            if part == "atx":
                out.append("#" * draw(st.integers(1, 4)) + " " + title)
            else:
                out += ["", title, draw(st.sampled_from(["===", "---", "-----"]))]
        elif part == "para":
            words = draw(st.lists(PROSE_WORDS, min_size=1, max_size=200))
            ends = draw(st.lists(st.sampled_from([" ", " ", ". ", "\n", "! "]),
                                 min_size=len(words), max_size=len(words)))
            out += ["", "".join(w + e for w, e in zip(words, ends, strict=True)).strip()]
        elif part == "list":
            out += ["", *(f"- {w}" for w in draw(st.lists(PROSE_WORDS, min_size=1,
                                                            max_size=30)))]
        else:
            marker = draw(st.sampled_from(["```", "````", "~~~", "~~~~"]))
            info = draw(st.sampled_from(["", "bash", "python title=x", "{.yaml}"]))
            inner = st.one_of(PROSE_WORDS, st.just("# comment"), st.just("```"),
                              st.just("~~~"), st.just(""))
            code = draw(st.lists(inner, max_size=120))
            closed = draw(st.booleans())
            out += ["", " " * draw(st.integers(0, 4)) + marker + info, *code]
            if closed:
                out.append(marker)
    return "\n".join(out), titles


@settings(max_examples=200, deadline=None)
@given(doc=markdown_docs(), size=st.integers(128, 1500), data=st.data())
def test_markdown_docs_are_balanced_covered_and_titled(
        doc: tuple[str, list[str]], size: int, data: st.DataObject) -> None:
    """Generated runbooks: fences balanced in every chunk, full coverage, every heading
    title in some chunk, every chunk heading a path of titles."""
    text, titles = doc
    overlap = data.draw(st.integers(0, size - 1))
    max_chars = size + data.draw(st.integers(0, 1500))
    chunks = chunk_text(text, "markdown", size=size, overlap=overlap, max_chars=max_chars)
    assert_guarantees(text, "markdown", size, overlap, max_chars, chunks)
    assert_covered(text, chunks, "markdown", size)
    heading_lines = {line.strip().lstrip("#").strip() for line in text.split("\n")}
    for c in chunks:
        assert not open_fence_at_end(body(c, "markdown", size))
        if c.heading:
            assert set(c.heading.split(" > ")) <= heading_lines
    for title in titles:  # a longer title line may be cut (say, as content of a fence)
        if len(title) + 6 <= size // 4:
            assert any(title in c.text for c in chunks)
