"""Structured data for the chunker (:mod:`retrieval.chunking._chunker`): the tree of keys that yaml,
json and toml share, and how it is cut and packed.

Trees and key paths
    A kind's module reads the text line by line (blank lines dropped, trailing whitespace
    dropped; nothing is parsed, so invalid files chunk too) into a tree: each node is a
    key, an array element or a table, with its lines in document order, its sub-nodes
    among them. Comment lines before a key belong to it. A node's key path names it:
    ``services.web``, ``servers[2].name``, ``[server.tls]``; an element's index counts
    the elements before it that start a line. Nodes nest at most 24 deep; deeper keys
    are nodes at depth 24.

Cutting and packing
    Each top-level node whose text, with its key path line (below), fits ``max_chars``
    is one unit, never cut; a larger one is replaced by its own lines and its sub-nodes,
    each treated the same way, so the cuts fall between sub-keys and elements, as high in
    the tree as they can. A line longer than the room is cut after commas, then at
    whitespace, then hard. Units are packed greedily into chunks within ``size`` (a unit
    over ``size`` is a chunk of its own); a chunk that starts inside a cut node takes
    nothing from outside it but lines of only brackets (so the tail of a cut block is a
    chunk under its own path); the lines of a cut node before its first sub-node
    (``services:``, ``"hosts": [``, a table header) move to the next chunk with what
    follows them rather than end a chunk. A chunk's ``heading`` is the key path its
    units share (``""`` when they share none, e.g. several top-level keys; a line of
    only brackets, commas and semicolons counts for none), and, like
    markdown's heading path, the chunk begins with ``heading + "\\n\\n"`` (cut to
    ``size // 2`` characters ending in ``…``; nothing for an empty heading or
    ``size < 8``), so a piece of a deep block stays findable by its path. No overlap.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import NamedTuple

from ._pack import WORDS, heading_prefix, split

__all__ = ["MAX_DEPTH", "Node", "Path", "Tree", "dotted", "tree_chunks"]

MAX_DEPTH = 24
_COMMA = re.compile(r",(\s*)")
_BRACKETS = " \t[]{}(),;"  # a line of only these holds no content of its own

Path = tuple[str, ...]


class Node:
    """A key, element or table: its path and its lines and sub-nodes in order."""

    __slots__ = ("items", "length", "nodes", "path")

    def __init__(self, path: Path, items: list[str | Node]) -> None:
        self.path = path
        self.items = items
        self.length = 0
        self.nodes = 0  # sub-nodes among the items

    def measure(self) -> int:
        """Set and return the length of the node's text (sub-nodes measured first)."""
        total = -1
        for item in self.items:
            total += 1 + (len(item) if isinstance(item, str) else item.measure())
        self.length = max(total, 0)
        return self.length

    def lines(self) -> Iterator[str]:
        for item in self.items:
            if isinstance(item, str):
                yield item
            else:
                yield from item.lines()


class Tree:
    """Builds the tree line by line: the open nodes are a stack from the root down."""

    def __init__(self) -> None:
        self.root = Node((), [])
        self.stack = [self.root]
        self.pending: list[str] = []  # comment lines waiting for the next key

    @property
    def depth(self) -> int:
        """How many nodes are open below the root."""
        return len(self.stack) - 1

    def comment(self, line: str) -> None:
        """A comment line: it goes with the next key (or where the next line goes)."""
        self.pending.append(line)

    def start(self, level: int, name: str | None, line: str) -> None:
        """``line`` opens a node at ``level`` (1: top level; clamped to what is open and
        to MAX_DEPTH) named ``name`` (None: its parent's path; ``"[]"``: the next
        element's index), closing deeper ones."""
        level = max(1, min(level, len(self.stack), MAX_DEPTH))
        del self.stack[level:]
        parent = self.stack[-1]
        if name == "[]":
            name = f"[{parent.nodes}]"
        path = parent.path if name is None else (*parent.path, name)
        node = Node(path, [*self.pending, line])
        self.pending.clear()
        parent.items.append(node)
        parent.nodes += 1
        self.stack.append(node)

    def add(self, level: int, line: str) -> None:
        """``line`` belongs to the open node at ``level`` (clamped), closing deeper ones."""
        level = max(0, min(level, len(self.stack) - 1))
        del self.stack[level + 1:]
        items = self.stack[-1].items
        items += self.pending
        items.append(line)
        self.pending.clear()

    def finish(self) -> Node:
        self.stack[-1].items += self.pending
        self.pending.clear()
        self.root.measure()
        return self.root


def dotted(path: Path) -> str:
    """``services.web``, ``servers[2].name``: keys joined by dots, elements appended."""
    if not path:
        return ""
    text = "".join(part if part[:1] == "[" else "." + part for part in path)
    return text if path[0][:1] == "[" else text[1:]


def _cut(line: str, room: int) -> Iterator[tuple[str, str]]:
    """(separator, piece) of a line: whole if it fits, else cut after commas, then at
    whitespace, then hard."""
    if len(line) <= room:
        yield "\n", line
        return
    sep, start = "\n", 0
    for m in _COMMA.finditer(line):
        for s, t, _ in split(line[start:m.start(1)], sep, room, WORDS):
            yield s, t
        sep, start = m.group(1), m.end()
    if start < len(line):
        for s, t, _ in split(line[start:], sep, room, WORDS):
            yield s, t


class _Unit(NamedTuple):
    path: Path
    sep: str      # before it
    text: str
    lead: bool    # a line of a cut node before its first sub-node: kept with what follows
    scope: Path | None  # the path of the cut node it is inside (None: top level)


class _Frame:
    """A node being walked: its remaining items, the room for its lines, and whether
    they are still its leading lines."""

    __slots__ = ("items", "lead", "node", "room")

    def __init__(self, node: Node, size: int, render: Callable[[Path], str]) -> None:
        self.node = node
        self.items = iter(node.items)
        self.room = size - len(heading_prefix(render(node.path), size))
        self.lead = node.nodes > 0


def _units(root: Node, size: int, max_chars: int,
           render: Callable[[Path], str]) -> Iterator[_Unit]:
    """The tree's units in document order (a loop, not recursion: one step per item)."""
    stack = [_Frame(root, size, render)]
    while stack:
        frame = stack[-1]
        scope = frame.node.path if len(stack) > 1 else None
        item = next(frame.items, None)
        if item is None:
            stack.pop()
        elif isinstance(item, str):
            for sep, piece in _cut(item, frame.room):
                yield _Unit(frame.node.path, sep, piece, frame.lead, scope)
        else:
            frame.lead = False
            if item.length + len(heading_prefix(render(item.path), size)) <= max_chars:
                yield _Unit(item.path, "\n", "\n".join(item.lines()), False, scope)
            else:
                stack.append(_Frame(item, size, render))


def _shared(a: Path, b: Path) -> Path:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return a[:n]


class _Chunk:
    """The units of the chunk being filled, the key path they share and their length."""

    def __init__(self, size: int, render: Callable[[Path], str]) -> None:
        self.size, self.render = size, render
        self.units: list[_Unit] = []
        self.shared: Path | None = None  # None while it holds only bracket lines
        self.scope: Path | None = None   # its first content unit's: see fits()
        self.length = 0
        self._path: Path = ()  # the last path fits() measured, and its prefix's length
        self._top = 0

    def _fold(self, unit: _Unit) -> Path | None:
        if not unit.text.strip(_BRACKETS):
            return self.shared
        return unit.path if self.shared is None else _shared(self.shared, unit.path)

    def fits(self, unit: _Unit) -> bool:
        """Whether ``unit`` joins the chunk: within size with the path they would share,
        and, when the chunk starts inside a cut node, inside it too (or only brackets)."""
        if (self.scope is not None and unit.path[:len(self.scope)] != self.scope
                and unit.text.strip(_BRACKETS)):
            return False
        shared = self._fold(unit)
        if shared is None:
            top = 0
        elif shared == self._path:  # the same path as last time: most of the time
            top = self._top
        else:
            top = len(heading_prefix(self.render(shared), self.size))
            self._path, self._top = shared, top
        return top + self.length + len(unit.sep) + len(unit.text) <= self.size

    def add(self, unit: _Unit) -> None:
        if self.shared is None and unit.text.strip(_BRACKETS):
            self.scope = unit.scope
        self.shared = self._fold(unit)
        self.length += (len(unit.sep) if self.units else 0) + len(unit.text)
        self.units.append(unit)

    def take(self, keep: int = 0) -> tuple[tuple[str, str], list[_Unit]]:
        """(heading, text) of the chunk without its last ``keep`` units, and those units;
        the chunk is emptied."""
        units = self.units[:len(self.units) - keep]
        carried = self.units[len(units):]
        shared: Path | None = None
        parts = [units[0].text]
        for u in units:
            if u.text.strip(_BRACKETS):
                shared = u.path if shared is None else _shared(shared, u.path)
            if u is not units[0]:
                parts += (u.sep, u.text)
        heading = self.render(shared) if shared is not None else ""
        self.units, self.shared, self.scope, self.length = [], None, None, 0
        return (heading, heading_prefix(heading, self.size) + "".join(parts)), carried


def tree_chunks(root: Node, size: int, max_chars: int,
                render: Callable[[Path], str] = dotted) -> Iterator[tuple[str, str]]:
    """(heading, chunk text) for each chunk of a tree, in order; its headings are its key
    paths as ``render`` writes them."""
    chunk = _Chunk(size, render)
    for unit in _units(root, size, max_chars, render):
        if chunk.units and not chunk.fits(unit):
            leads = 0
            while leads < len(chunk.units) - 1 and chunk.units[-1 - leads].lead:
                leads += 1
            done, carried = chunk.take(leads)
            yield done
            for u in carried:  # alone they may take a longer heading: check again
                if chunk.units and not chunk.fits(u):
                    yield chunk.take()[0]
                chunk.add(u)
            if chunk.units and not chunk.fits(unit):
                yield chunk.take()[0]
        chunk.add(unit)
    if chunk.units:
        yield chunk.take()[0]
