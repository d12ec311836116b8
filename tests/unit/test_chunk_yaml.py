"""Chunking YAML: top-level keys with their nested blocks and the comments above them,
a block too big for a chunk cut between sub-keys with its key path atop each piece,
block scalars and compact sequences read right, and any document chunked, parsed or
not.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from retrieval.chunking._chunker import chunk_text
from tests.support.chunk_samples import COMPOSE, data_files
from tests.support.chunks import assert_covered, assert_guarantees
from tests.support.scaling import assert_linear


def test_a_big_block_is_cut_between_sub_keys_under_its_key_path() -> None:
    """services.web.environment, far over max_chars, is cut between its keys; each piece
    opens with the key path and holds whole ``KEY: value`` lines, all of them in order,
    the last piece too (it takes nothing from outside the block)."""
    chunks = chunk_text(COMPOSE, "yaml", size=1200, overlap=0, max_chars=2000)
    env = [c for c in chunks if c.heading == "services.web.environment"]
    assert len(env) >= 4
    seen: list[str] = []
    for c in env:
        assert c.text.startswith("services.web.environment\n\n      UPSTREAM_")
        assert len(c.text) <= 1200
        seen += c.text.split("\n")[2:]
    assert all(line.startswith("      UPSTREAM_") and line.endswith("/health")
               for line in seen)
    numbers = [int(line[15:18]) for line in seen]
    assert numbers == list(range(numbers[0], 120)) and len(numbers) > 80
    after = chunks[chunks.index(env[-1]) + 1]  # the tail took nothing from outside
    assert after.heading == "services.db" and after.text.startswith("services.db\n\n  db:")


def test_small_blocks_stay_whole_and_comments_go_with_their_key() -> None:
    """The keys before the big block share the first chunk, whole; the comment above
    ``web:`` is in the same chunk as ``web:``; a block scalar's key-like line is text."""
    chunks = chunk_text(COMPOSE, "yaml", size=1200, overlap=0, max_chars=2000)
    first = chunks[0]
    assert first.heading == ""
    assert first.text.startswith('# Compose file for the web tier\nversion: "3.8"\n'
                                 "services:\n  # the front end\n  web:\n")
    assert ('    ports:\n    - "80:80"\n    - "443:443"\n    command: |\n'
            "      nginx -g 'daemon off;'\n      key: not a key\n") in first.text
    assert not any(c.heading.endswith(".key") for c in chunks)


def test_headings_are_key_paths_with_element_indexes() -> None:
    """At a small size the paths name the keys, the sequence elements by index."""
    chunks = chunk_text(COMPOSE, "yaml", size=60, overlap=0, max_chars=60)
    headings = {c.heading for c in chunks}
    assert "services.web.environment.UPSTREAM_007" in headings
    assert "services.web.command" in headings
    ports = next(c for c in chunks if '- "443:443"' in c.text)
    assert ports.heading in ("services.web.ports", "services.web")
    assert chunks[-1].heading == "data.items[1]"
    assert chunks[-1].text == "data.items[1]\n\n    - name: b\n      value: 2"
    assert_guarantees(COMPOSE, "yaml", 60, 0, 60, chunks)  # each opens with its path


def test_a_block_that_fits_max_chars_is_never_cut() -> None:
    """A top-level block over size but within max_chars is a chunk of its own."""
    text = "a: 1\nbig:\n" + "".join(f"  k{n}: {'v' * 20}\n" for n in range(50)) + "z: 2\n"
    chunks = chunk_text(text, "yaml", size=800, overlap=0, max_chars=2000)
    big = [c for c in chunks if "  k0: " in c.text]
    assert len(big) == 1 and "  k49: " in big[0].text
    assert big[0].heading == "big" and big[0].text.startswith("big\n\nbig:\n  k0:")


def _dump(value: object, indent: int) -> list[str]:
    """Block-style YAML lines for nested dicts, lists and scalars."""
    pad = " " * indent
    if isinstance(value, dict):
        out: list[str] = []
        for k, v in value.items():
            if isinstance(v, (dict, list)) and v:
                out += [f"{pad}{k}:", *_dump(v, indent + 2)]
            else:
                out.append(f"{pad}{k}: {v!r}")
        return out
    if isinstance(value, list):
        out = []
        for v in value:
            inner = _dump(v, indent + 2)
            out += [f"{pad}- {inner[0].lstrip()}" if inner else f"{pad}- ~", *inner[1:]]
        return out
    return [f"{pad}{value!r}"]


@st.composite
def documents(draw: st.DrawFn) -> str:
    """Random block-style YAML documents, with comments and block scalars."""
    leaf = st.one_of(st.integers(), st.text(max_size=30), st.booleans(), st.none())
    value = st.recursive(leaf, lambda inner: st.one_of(
        st.lists(inner, max_size=6),
        st.dictionaries(st.text("abcxyz_-. #", min_size=1, max_size=12), inner,
                        max_size=6)), max_leaves=60)
    data = draw(st.dictionaries(st.text("abcdef", min_size=1, max_size=8), value,
                                min_size=1, max_size=8))
    lines = _dump(data, 0)
    for _ in range(draw(st.integers(0, 4))):
        at = draw(st.integers(0, len(lines)))
        lines.insert(at, draw(st.sampled_from(["# note", "  # deeper", "run: |",
                                               "  - x: |", "---"])))
    return "\n".join(lines)


@settings(max_examples=60, deadline=None)
@given(text=documents(), size=st.integers(16, 600), extra=st.integers(0, 600))
def test_generated_documents_keep_the_guarantees(text: str, size: int, extra: int) -> None:
    """Any YAML document: bounded, numbered, deterministic, covering."""
    chunks = chunk_text(text, "yaml", size=size, overlap=0, max_chars=size + extra)
    assert_guarantees(text, "yaml", size, 0, size + extra, chunks)
    assert_covered(text, chunks, "yaml", size)


def test_yaml_chunks_in_linear_time() -> None:
    """8x the document, about 8x the CPU; a deep indentation staircase too."""
    assert_linear(data_files, lambda text: chunk_text(text, "yaml"), 200_000)
    stairs = "".join(f"{' ' * n}k{n}:\n" for n in range(2000))
    chunks = chunk_text(stairs, "yaml")
    assert_guarantees(stairs, "yaml", 1200, 200, 2000, chunks)
