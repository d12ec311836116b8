"""Config exports for the chunker (:mod:`retrieval.chunking._chunker`): blocks packed whole.

Config (Cisco IOS, Arista, Juniper exports)
    Blank lines are dropped. A block is a non-indented line with the indented lines after
    it and any non-indented comment or terminator lines (``!``, ``#``, ``/*``, ``}``) after
    those; comment lines before the first block form a headerless block. A non-indented
    line ending in ``{`` opens a Juniper brace block that runs until its braces balance
    (braces in double quotes and on comment lines ignored). Blocks are packed whole into
    chunks within ``size``; a block longer than ``size`` but within ``max_chars`` is a
    chunk of its own; a longer one is cut into pieces within ``size``, each after the first
    starting with the block's header line (cut to ``size // 2`` characters ending in
    ``…``). The cuts fall between sub-blocks (a line as shallow as the first line after
    the header, with the deeper and ``}``/``!`` lines after it) where those fit, else
    between lines (a longer line at whitespace, then hard). A chunk's ``heading`` is
    the header line of its first block that has one, a Juniper header without its ``{``.
    There is no overlap.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ._pack import CODE, WORDS, Unit, pack, split

__all__ = ["config_chunks"]

_CONTINUATION = ("!", "#", "}", "/*")


def _braces(line: str) -> int:
    """Net ``{`` minus ``}`` outside double quotes; 0 for comment lines."""
    if line.lstrip().startswith(("#", "/*")):
        return 0
    if '"' not in line:
        return line.count("{") - line.count("}")
    depth, quoted = 0, False
    for ch in line:
        if ch == '"':
            quoted = not quoted
        elif not quoted and ch in "{}":
            depth += 1 if ch == "{" else -1
    return depth


@dataclass
class _ConfigBlock:
    heading: str
    lines: list[str]
    header: bool  # lines[0] is a header line (not a leading comment)


def _config_blocks(text: str) -> list[_ConfigBlock]:
    blocks: list[_ConfigBlock] = []
    depth = 0
    for raw in text.split("\n"):
        line = raw.rstrip()
        if not line.strip():
            continue
        if depth > 0:
            blocks[-1].lines.append(line)
            depth = max(0, depth + _braces(line))
        elif line[0] in " \t" or line.startswith(_CONTINUATION):
            if blocks:
                blocks[-1].lines.append(line)
            else:
                blocks.append(_ConfigBlock("", [line], header=False))
        else:
            heading = line.strip()
            if heading.endswith("{"):
                heading = heading[:-1].rstrip()
                depth = max(0, _braces(line))
            blocks.append(_ConfigBlock(heading, [line], header=True))
    return blocks


def _children(lines: list[str]) -> Iterator[list[str]]:
    """Lines grouped into sub-blocks: a line as shallow as the first one, with the deeper
    lines and the ``}``/``!`` lines after it (``ge-0/0/1 { ... }``, ``vrf PROD ...``)."""
    base = len(lines[0]) - len(lines[0].lstrip())
    child: list[str] = []
    for line in lines:
        bare = line.lstrip()
        if child and (len(line) - len(bare) > base or bare.startswith(("}", "!"))):
            child.append(line)
        else:
            if child:
                yield child
            child = [line]
    if child:
        yield child


def _config_units(block: _ConfigBlock, room: int) -> Iterator[Unit]:
    """The block's lines as units within ``room``: whole sub-blocks where they fit, else
    lines, a longer line at whitespace then hard."""
    lines = block.lines
    if block.header:
        yield from split(lines[0], "", room, WORDS)
        lines = lines[1:]
    for child in _children(lines) if lines else ():
        text = "\n".join(child)
        if len(text) <= room:
            yield "\n", text, CODE
        else:
            for line in child:
                yield from split(line, "\n", room, WORDS)


def _config_pieces(block: _ConfigBlock, size: int) -> list[str]:
    """A block longer than max_chars, cut into pieces of at most ``size``."""
    repeat = block.lines[0] if block.header and len(block.lines) > 1 else ""
    cap = size // 2
    if repeat and len(repeat) + 1 > cap:
        repeat = repeat[:cap - 2] + "…" if cap >= 3 else ""
    room = size - (len(repeat) + 1 if repeat else 0)
    pieces = pack(_config_units(block, room), room, 0, room)
    if repeat:
        pieces[1:] = [repeat + "\n" + p for p in pieces[1:]]
    return pieces


def config_chunks(text: str, size: int, max_chars: int) -> Iterator[tuple[str, str]]:
    """(heading, chunk text) for each chunk of a config export, in order."""
    group: list[str] = []
    heading = ""
    length = 0
    for block in _config_blocks(text):
        body = "\n".join(block.lines)
        if group and length + 1 + len(body) <= size:
            group.append(body)
            length += 1 + len(body)
            heading = heading or block.heading
            continue
        if group:
            yield heading, "\n".join(group)
        if len(body) > max_chars:
            for piece in _config_pieces(block, size):
                yield block.heading, piece
            group, heading, length = [], "", 0
        else:
            group, heading, length = [body], block.heading, len(body)
    if group:
        yield heading, "\n".join(group)
