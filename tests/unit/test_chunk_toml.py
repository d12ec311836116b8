"""Chunking TOML: tables with the comments above them, headed by their header, keys
before the first table kept together, multi-line strings and arrays never mistaken for
headers or keys, a big table cut between keys with its header atop each piece.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from retrieval.chunking._chunker import chunk_text
from tests.support.chunk_samples import PYPROJECT, toml_files
from tests.support.chunks import assert_covered, assert_guarantees
from tests.support.scaling import assert_linear


def test_tables_are_headed_by_their_header() -> None:
    """Each table is a node headed ``[server.tls]``; the comment above a header goes with
    it; the root keys have no heading; a multi-line string's "[not.a.table]" is text."""
    chunks = chunk_text(PYPROJECT, "toml", size=150, overlap=0, max_chars=150)
    tls = next(c for c in chunks if c.heading == "[server.tls]")
    assert tls.text == ('[server.tls]\n\n# TLS settings\n[server.tls]\n'
                        'cert = "/etc/ssl/web.pem"\nmotd = """\n[not.a.table]\n'
                        'key = "not a key"\n"""')
    assert not any("not.a.table" in c.heading for c in chunks)
    assert chunks[0].heading == ""
    assert chunks[0].text.startswith('# Service settings\ntitle = "web"\nowners = [\n'
                                     '  "ops",  # on call\n  "dev",\n]')


def test_a_big_table_is_cut_between_keys_under_its_header() -> None:
    """[upstreams], over max_chars, is cut between whole ``key = value`` lines, every
    piece after the first opening with the header path; all keys once, in order."""
    chunks = chunk_text(PYPROJECT, "toml", size=1200, overlap=0, max_chars=2000)
    ups = [c for c in chunks if c.heading == "[upstreams]"]
    assert len(ups) >= 2
    keys: list[str] = []
    for c in chunks:
        body = c.text.removeprefix(c.heading + "\n\n") if c.heading else c.text
        keys += [line for line in body.split("\n") if line.startswith("web0")]
    assert keys == [f'web{n:03d} = {{ host = "10.0.0.{n}", port = 8080, weight = {n % 5} }}'
                    for n in range(60)]
    for c in ups:
        assert c.text.startswith("[upstreams]\n\nweb0")


def test_arrays_of_tables_share_their_header() -> None:
    """``[[servers]]`` tables are headed by ``[[servers]]``, each whole."""
    chunks = chunk_text(PYPROJECT, "toml", size=50, overlap=0, max_chars=50)
    servers = [c for c in chunks if c.heading == "[[servers]]"]
    assert [c.text for c in servers][-2:] == ['[[servers]]\n\n[[servers]]\nname = "web01"',
                                             '[[servers]]\n\n[[servers]]\nname = "web02"']


@st.composite
def documents(draw: st.DrawFn) -> str:
    """TOML-like documents: headers, keys, multi-line strings and arrays, comments,
    broken lines."""
    lines = st.sampled_from([
        "[a]", "[a.b]", "[[c]]", "[ d . e ]", "[broken", "x = 1", 'y = "s"', "z = [",
        "  1,", "]", 'm = """', "[inside]", '"""', "n = '''", "'''", "# note",
        "t = { a = 1, b = [2, 3] }", "", "  indented = true", "= nothing"])
    return "\n".join(draw(st.lists(lines, max_size=60)))


@settings(max_examples=150, deadline=None)
@given(text=documents(), size=st.integers(8, 300), extra=st.integers(0, 300))
def test_generated_documents_keep_the_guarantees(text: str, size: int, extra: int) -> None:
    """Any TOML-like document: bounded, numbered, deterministic, covering; headings are
    headers."""
    chunks = chunk_text(text, "toml", size=size, overlap=0, max_chars=size + extra)
    assert_guarantees(text, "toml", size, 0, size + extra, chunks)
    assert_covered(text, chunks, "toml", size)
    for c in chunks:
        assert c.heading == "" or c.heading.startswith("[")


def test_toml_chunks_in_linear_time() -> None:
    """8x the document, about 8x the CPU."""
    assert_linear(toml_files, lambda text: chunk_text(text, "toml"), 200_000)
