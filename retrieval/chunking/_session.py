"""Shell session transcripts for the chunker (:mod:`retrieval.chunking._chunker`): each command kept
with its output.

Session (commands with their output, as history sources push them)
    A command line is a line that starts with a prompt and a command after it (one
    space or more, then a non-space character). The prompts recognised:

    * ``$``, ``#`` or ``>`` alone: ``$ df -h``, ``# systemctl restart nginx``;
    * the same after ``user@host``, optionally followed by ``:path`` or by a space and a
      path: ``ops@web01:~$ df -h``, ``root@web01:/etc/nginx# nginx -t``,
      ``ops@web01 ~ %`` (``%`` too, after such a prefix), and in brackets:
      ``[root@web01 nginx]# ls``;
    * any of those after a virtualenv or conda marker: ``(venv) $ pip list``;
    * PowerShell and cmd.exe: ``PS C:\\Users\\ops> Get-Service``, ``PS /home/ops> ls``,
      ``C:\\Users\\ops> dir``.

    A ``>`` line right after a command line, before any output, continues that command
    (the shell's secondary prompt). A record is a command line, its continuations and the
    lines after it up to the next command line; lines before the first command form a
    record without a command. The record's heading is the command without its prompt.
    Records are packed whole into chunks by :mod:`retrieval.chunking._blocks`: several
    small ones share a chunk (headed by the first command), a record over ``max_chars``
    is cut between paragraphs, then lines, of its output, and every piece after the
    first starts with the command line again. So output never loses its command.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from ._blocks import Block, block_chunks, tidy

__all__ = ["PROMPT", "session_chunks"]

PROMPT = re.compile(
    r"(?:\([\w.-]+\) ?)?"                              # (venv)
    r"(?:"
    r"PS(?: [^>\n]*)?>"                                # PS C:\Users\ops>
    r"|[A-Za-z]:\\[^>\n]*>"                            # C:\Users\ops>
    r"|\[[\w.-]+@[\w.-]+(?: [^\]\n]*)?\][$#%>]"        # [root@web01 nginx]#
    r"|[\w.-]+@[\w.-]+(?::[^\s$#%>]*| [^\s$#%>]+)? ?[$#%>]"  # ops@web01:~$
    r"|[$#>]"                                          # $
    r") +(?=\S)")
"""A command line: the prompt (matched from the line's start) and the spaces after it."""

_CONTINUATION = re.compile(r"> +(?=\S)")


def _records(text: str) -> Iterator[Block]:
    heading = ""
    lines: list[str] = []
    sep = ""
    command = False  # the record's lines so far are its command (and continuations)
    for blank, line in tidy(text.split("\n")):
        m = PROMPT.match(line)
        if m and command and not blank and _CONTINUATION.match(line):
            lines.append(line)
            continue
        if m:
            if lines:
                yield Block(heading, lines, sep, lines[0] if heading else "")
            heading, lines, command = line[m.end():].strip(), [line], True
            sep = "\n\n" if blank else "\n"
            continue
        if blank and lines:
            lines.append("")
        lines.append(line)
        command = False
    if lines:
        yield Block(heading, lines, sep, lines[0] if heading else "")


def session_chunks(text: str, size: int, max_chars: int) -> Iterator[tuple[str, str]]:
    """(heading, chunk text) for each chunk of a session transcript, in order."""
    return block_chunks(_records(text), size, max_chars)
