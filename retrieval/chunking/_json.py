"""JSON for the chunker (:mod:`retrieval.chunking._chunker`): members and elements, by bracket
depth.

JSON
    Read line by line, never parsed (invalid JSON, JSON Lines and JSON with comments
    chunk too). The bracket depth at each line's start is counted outside strings (a
    string never spans lines). A line at depth ``d >= 1`` that does not start with a
    closing bracket opens a node at level ``d``: a member (``"key": ...``, named by its
    key) or an element (named by its index, ``[3]``); the lines after it belong to it
    until the next line that opens a node at its level or above. A line starting with
    ``}`` or ``]`` belongs to the node it closes. Comment lines (``//``, ``/*``, ``*``,
    ``#``) go with the next member. Key paths: ``services.web.ports[1]``. A minified document
    is one long line: it is cut after commas. The cutting and packing are
    :mod:`retrieval.chunking._tree`'s.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from ._blocks import tidy
from ._tree import Node, Tree, tree_chunks

__all__ = ["json_chunks"]

_TOKEN = re.compile(r'"(?:\\.|[^"\\])*"?|[\[\]{}]')
_KEY = re.compile(r'"((?:\\.|[^"\\])*)"[ \t]*:')
_MAX_NAME = 80


def _depth(line: str, depth: int) -> int:
    """The bracket depth after ``line``, given the depth before it."""
    for m in _TOKEN.finditer(line):
        tok = m.group()
        if tok in "[{":
            depth += 1
        elif tok in "]}":
            depth = max(0, depth - 1)
    return depth


def _tree(text: str) -> Node:
    tree = Tree()
    depth = 0
    for _, line in tidy(text.split("\n")):
        bare = line.lstrip()
        if bare.startswith(("//", "/*", "*", "#")):
            tree.comment(line)
        elif depth == 0:
            tree.add(0, line)
        elif bare[0] in "]}":
            tree.add(depth - 1, line)
        elif key := _KEY.match(bare):
            tree.start(depth, key.group(1)[:_MAX_NAME], line)
        else:
            tree.start(depth, "[]", line)
        depth = _depth(line, depth)
    return tree.finish()


def json_chunks(text: str, size: int, max_chars: int) -> Iterator[tuple[str, str]]:
    """(heading, chunk text) for each chunk of a JSON document, in order."""
    return tree_chunks(_tree(text), size, max_chars)
