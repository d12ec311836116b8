"""Chunking device configurations: Cisco interface blocks stay whole and are grouped, a
giant ACL is split with its header repeated, no line is repeated across chunks, and Juniper
brace blocks and indented Arista sections stay with their header.
"""

from __future__ import annotations

import re

from retrieval.chunking._chunker import chunk_text
from tests.support.chunk_samples import CISCO, JUNIPER, chunks_with_heading
from tests.support.chunks import assert_covered

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
