"""YAML for the chunker (:mod:`retrieval.chunking._chunker`): keys and their nested blocks, by
indentation.

YAML
    Read line by line, never parsed (invalid YAML chunks too). A line ``key: ...``
    (plain, ``"double"`` or ``'single'`` quoted key) or a sequence item ``- ...`` opens a
    node under the nearest key or item above it that is less indented (an item as
    indented as the key above it, as in ``ports:`` then ``- 80``, is under that key);
    more indented lines that open nothing belong to the node above them, and so do the
    lines of a block scalar (``key: |``, ``- >-``) however they look. Comment lines go
    with the next key or item. A document marker (``---``, ``...``) or directive
    (``%YAML``) at column 0 closes every node. Key paths: ``services.web.ports[1]``. The
    cutting and packing are :mod:`retrieval.chunking._tree`'s.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from ._blocks import tidy
from ._tree import Node, Tree, tree_chunks

__all__ = ["yaml_chunks"]

_ITEM = re.compile(r"-(?:[ \t]+|$)")
_QUOTED = re.compile(r"""(?:"((?:\\.|[^"\\])*)"|'((?:[^']|'')*)')[ \t]*:(?:[ \t]+|$)""")
_COLON = re.compile(r":(?:[ \t]+|$)")  # a search, not one pattern: no quadratic backtracking
_SCALAR = re.compile(r"[|>][-+0-9]*[ \t]*(?:#.*)?")
_MAX_NAME = 80


def _key(bare: str) -> tuple[str, int] | None:
    """The key a line (without its indentation) opens and where its value starts."""
    if bare[0] in "\"'":
        if m := _QUOTED.match(bare):
            return (m.group(1) if m.group(1) is not None else m.group(2)), m.end()
        return None
    if bare[0] in "#{[" or not (m := _COLON.search(bare)) or "#" in bare[:m.start()]:
        return None
    return bare[:m.start()].rstrip(), m.end()


def _tree(text: str) -> Node:
    tree = Tree()
    opened: list[tuple[int, bool]] = []  # (indent, is an item) of each open node
    scalar = -1     # indent of the key or item whose block scalar is open (-1: none)
    for _, line in tidy(text.split("\n")):
        bare = line.lstrip(" \t")
        indent = len(line) - len(bare)
        if scalar >= 0:
            if indent > scalar:
                tree.add(len(opened), line)
                continue
            scalar = -1
        if indent == 0 and (bare.startswith(("---", "...", "%"))):
            opened.clear()
            tree.add(0, line)
            continue
        if bare.startswith("#"):
            tree.comment(line)
            continue
        item = _ITEM.match(bare)
        key = None if item else _key(bare)
        while opened and (opened[-1][0] > indent or (
                opened[-1][0] == indent and (opened[-1][1] or not item))):
            opened.pop()
        if key:
            name, value = key[0][:_MAX_NAME], bare[key[1]:]
        elif item:
            name, value = "[]", bare[item.end():]
        else:
            tree.add(len(opened), line)
            continue
        tree.start(len(opened) + 1, name, line)
        del opened[tree.depth - 1:]
        opened.append((indent, bool(item)))
        if _SCALAR.fullmatch(value):
            scalar = indent
    return tree.finish()


def yaml_chunks(text: str, size: int, max_chars: int) -> Iterator[tuple[str, str]]:
    """(heading, chunk text) for each chunk of a YAML document, in order."""
    return tree_chunks(_tree(text), size, max_chars)
