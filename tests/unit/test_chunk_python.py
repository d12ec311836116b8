"""Chunking Python: each function whole with its decorators and the comments above it,
strings and brackets never mistaken for statements, a big class cut between methods
with its class line atop each piece, and the rest packed between.
"""

from __future__ import annotations

from retrieval.chunking._chunker import chunk_text
from tests.support.chunk_samples import PYTHON, python_files
from tests.support.chunks import assert_covered, assert_guarantees
from tests.support.scaling import assert_linear


def _source(first: str, last: str) -> str:
    """The lines of PYTHON from the one starting with ``first`` to ``last``, inclusive."""
    lines = PYTHON.split("\n")
    a = next(n for n, line in enumerate(lines) if line.startswith(first))
    b = next(n for n, line in enumerate(lines) if n > a and line.startswith(last))
    return "\n".join(lines[a:b + 1])


RESTART = "def restart(host: str, timeout: int = TIMEOUT) -> None:"  # two lines, joined
FUNCTIONS = {
    RESTART: _source("# Restart nginx", "    subprocess.run"),
    "async def drain(pool, host: str) -> None:": _source("# Drain", "    await pool.wait"),
    "def status(host: str) -> str:": _source("def status", "                          cap"),
}


def test_each_function_is_whole_with_its_decorators_and_comment() -> None:
    """Three functions give three chunks, each holding one whole function from the
    comment above it through its decorators to its last line, headed by its signature."""
    chunks = chunk_text(PYTHON, "python", size=200, overlap=0, max_chars=800)
    for heading, source in FUNCTIONS.items():
        holders = [c for c in chunks if source in c.text]
        assert len(holders) == 1, heading
        assert holders[0].heading == heading
        assert holders[0].text.startswith(source.split("\n")[0])
    restart = next(c for c in chunks if c.heading == RESTART)
    assert restart.text == FUNCTIONS[RESTART]


def test_strings_and_brackets_are_not_statements() -> None:
    """A docstring line at column 0 starting with "def", a multi-line signature (its
    lines joined in the heading) and a triple-quoted string holding "def fake():" start
    nothing."""
    chunks = chunk_text(PYTHON, "python", size=200, overlap=0, max_chars=800)
    headings = [c.heading for c in chunks]
    assert not any("fake" in h or "not_a_function" in h for h in headings)
    assert chunks[0].heading == ""
    assert chunks[0].text.startswith("#!/usr/bin/env python3\n\"\"\"Restart helpers")
    assert chunks[0].text.endswith("TIMEOUT = 30")


def test_a_big_class_is_cut_between_methods_with_its_class_line() -> None:
    """A class over max_chars is cut between methods: each piece after the head opens with
    the class line, is headed Class.method, and holds whole methods with their decorator
    and comment."""
    chunks = chunk_text(PYTHON, "python", size=400, overlap=0, max_chars=600)
    pool = [c for c in chunks if c.heading.startswith("Pool.")]
    assert len(pool) >= 4
    methods: list[int] = []
    for c in pool:
        assert c.text.startswith("class Pool(Base):\n    # check ")
        assert len(c.text) <= 400
        for n in range(12):
            if f"def check_{n}(" in c.text:
                assert (f"    # check {n}\n    @property\n    def check_{n}(self) -> bool:\n"
                        f'        """Whether check {n} passes on every host of the pool."""\n'
                        f"        return all(host.check({n}) for host in self.hosts)"
                        ) in c.text
                methods.append(n)
        assert c.heading == f"Pool.check_{min(n for n in range(12) if f'check_{n}(' in c.text)}"
    head = next(c for c in chunks if "class Pool(Base):\n    \"\"\"The hosts" in c.text)
    assert head.heading in ("def status(host: str) -> str:", "class Pool(Base):")
    assert sorted(set(methods)) == [n for n in range(12) if n not in
                                    {m for m in range(12) if f"def check_{m}(" in head.text}]
    assert chunks[-1].text.endswith('if __name__ == "__main__":\n    restart(sys.argv[1])')


def test_a_class_that_fits_is_one_chunk() -> None:
    """Under max_chars a class is never cut, even when longer than size."""
    cls = _source("class Pool", '        return all(host.check(11)')
    chunks = chunk_text(PYTHON, "python", size=1200, overlap=0, max_chars=4000)
    assert sum(cls in c.text for c in chunks) == 1
    assert len(cls) > 2000


def test_a_huge_function_is_cut_with_its_def_line_repeated() -> None:
    """A function over max_chars is cut between paragraphs, then lines; every piece after
    the first opens with the def line; inside a class, with the class line too."""
    body = "\n".join(f"        step_{n} = run({n})" for n in range(100))
    text = f"class Job:\n    def run_all(self):\n{body}\n"
    chunks = chunk_text(text, "python", size=300, overlap=0, max_chars=300)
    assert len(chunks) > 5
    assert chunks[0].text.startswith("class Job:\n    def run_all(self):\n        step_0")
    for c in chunks[1:]:
        assert c.heading == "Job.run_all"
        assert c.text.startswith("class Job:\n    def run_all(self):\n        step_")
    assert_covered(text, chunks, "python", 300)


def test_unparsable_python_still_chunks() -> None:
    """Broken code (an unclosed bracket and string) chunks, covering everything."""
    text = "def a(:\n    x = [1, 2\n\ndef b():\n    '''never closed\n\nclass C:\n    pass\n"
    for size in (20, 64, 1200):
        chunks = chunk_text(text, "python", size=size, overlap=0, max_chars=size)
        assert_guarantees(text, "python", size, 0, size, chunks)
        assert_covered(text, chunks, "python", size)
    assert chunk_text(text, "python", size=20, overlap=0, max_chars=20)[0].heading.startswith(
        "def a(: x = [1, 2 def b():")


def test_python_chunks_in_linear_time() -> None:
    """8x the source, about 8x the CPU."""
    assert_linear(python_files, lambda text: chunk_text(text, "python"), 200_000)
