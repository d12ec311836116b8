"""TOML for the chunker (:mod:`retrieval.chunking._chunker`): tables and their keys.

TOML
    Read line by line, never parsed (invalid TOML chunks too). Multi-line strings
    (``\"\"\"``, ``'''``) and the brackets of multi-line arrays and inline tables are
    followed, so only a line outside them can be a table header or a key. A table
    header (``[server.tls]``, ``[[servers]]``) opens a top-level node whose key path is
    the header itself, up to the next header; the keys before the first header are the
    root table's (no path). Within a table each ``key = value`` line opens a node with
    the table's path, holding its value's continuation lines, so a table too big for a
    chunk is cut between keys. Comment lines go with the next header or key. The
    cutting and packing are :mod:`retrieval.chunking._tree`'s.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from ._blocks import string_end, tidy
from ._tree import Node, Path, Tree, tree_chunks

__all__ = ["toml_chunks"]

_HEADER = re.compile(r"(\[\[?)[ \t]*([^\[\]]*?)[ \t]*(\]\]?)[ \t]*(?:#.*)?")
_KEY = re.compile(r"""[ \t]*(?:[\w-]+|"(?:\\.|[^"\\])*"|'[^']*')""")
_TOKEN = re.compile(r'"""|\'\'\'|"(?:\\.|[^"\\])*"?|\'[^\']*\'?|#|[\[\]{}]')
_CLOSE = {'"""': re.compile(r'\\.|"""'), "'''": re.compile(r"'''")}


def _scan(line: str, depth: int, quote: str) -> tuple[int, str]:
    """The bracket depth and open multi-line string after ``line``."""
    pos = 0
    while True:
        if quote:
            end = string_end(line, pos, _CLOSE[quote], quote)
            if end is None:
                return depth, quote
            pos, quote = end, ""
        m = _TOKEN.search(line, pos)
        if m is None or m.group() == "#":
            return depth, quote
        tok, pos = m.group(), m.end()
        if tok in ('"""', "'''"):
            quote = tok
        elif tok in "[{":
            depth += 1
        elif tok in "]}":
            depth = max(0, depth - 1)


def _tree(text: str) -> Node:
    tree = Tree()
    depth, quote = 0, ""
    table = False  # a header has been seen: keys are level 2
    for _, line in tidy(text.split("\n")):
        bare = line.lstrip()
        if quote or depth:
            tree.add(tree.depth, line)
        elif bare.startswith("#"):
            tree.comment(line)
        elif (m := _HEADER.fullmatch(bare)) and len(m.group(1)) == len(m.group(3)):
            tree.start(1, m.group(1) + m.group(2) + m.group(3), line)
            table = True
        elif _KEY.match(bare):
            tree.start(2 if table else 1, None, line)
        else:
            tree.add(tree.depth, line)
        depth, quote = _scan(line, depth, quote)
    return tree.finish()


def _render(path: Path) -> str:
    return path[0] if path else ""


def toml_chunks(text: str, size: int, max_chars: int) -> Iterator[tuple[str, str]]:
    """(heading, chunk text) for each chunk of a TOML document, in order."""
    return tree_chunks(_tree(text), size, max_chars, _render)
