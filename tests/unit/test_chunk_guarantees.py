"""Chunking's guarantees (bounded, non-empty, numbered, deterministic, covering, balanced)
for every kind: invalid arguments and edge cases, every sample text at every size, any text
and any markdown document (hypothesis), and linear time on megabytes of runbooks and on
pathological shapes.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retrieval.chunking._chunker import chunk_text
from retrieval.extraction._kinds import KINDS
from tests.support.chunk_samples import (
    CISCO,
    COMPOSE,
    INVENTORY,
    JUNIPER,
    PLAIN,
    PYPROJECT,
    PYTHON,
    RUNBOOK,
    SENTENCES,
    SESSION,
    SHELL,
    runbooks,
)
from tests.support.chunks import assert_covered, assert_guarantees, body, open_fence_at_end
from tests.support.scaling import assert_linear

# --- arguments and edge cases -----------------------------------------------------------


@pytest.mark.parametrize(("size", "overlap", "max_chars"), [
    (0, 0, 10), (-5, 0, 10), (100, -1, 200), (100, 100, 200), (100, 150, 200), (100, 10, 99)])
def test_invalid_arguments_raise_value_error(size: int, overlap: int, max_chars: int) -> None:
    """size > 0, 0 <= overlap < size and max_chars >= size are enforced."""
    with pytest.raises(ValueError, match=r"^(size|overlap|max_chars) must be"):
        chunk_text("text", "text", size=size, overlap=overlap, max_chars=max_chars)


def test_unknown_kind_raises_value_error() -> None:
    """Kinds outside KINDS are refused."""
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
    (SENTENCES, "pdf"), (SESSION, "session"), (PYTHON, "python"), (SHELL, "shell"),
    (COMPOSE, "yaml"), (INVENTORY, "json"), (PYPROJECT, "toml")])
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
    "blank-run-in-a-key": (lambda n: "a" + " " * n + "b: c\n", "yaml"),
    "deep-brackets": (lambda n: "[\n" * (n // 16) + "]\n" * (n // 16), "json"),
    "one-toml-table": (lambda n: "[t]\n" + "k = 1\n" * (n // 6), "toml"),
    "one-giant-function": (lambda n: "f() {\n" + "  echo x\n" * (n // 9) + "}\n", "shell"),
    "one-giant-class": (lambda n: "class A:\n" + "    def m(self):\n        pass\n" * (n // 30),
                        "python"),
    "one-long-output": (lambda n: "$ cat log\n" + "line\n" * (n // 5), "session"),
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
         '    description "a { b";', "## Last commit", "/* note */", "end",
         "$ df -h", "ops@web01:~$ uptime", "> done", "PS C:\\> dir", "# reboot",
         "def f(x):", "    return x", "class A(B):", "    @property", "@cache", '"""',
         "    '''doc", "f() {", "function g {", "  echo '}'", "cat <<EOF", "EOF", "(", ")",
         "key: value", "  nested:", "    - item", "  - x", "run: |", "---", '"k": {',
         '  "a": [1, 2],', "},", "]", "[table.sub]", "[[arr]]", 'k = """', "x = [", "# c"]
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
