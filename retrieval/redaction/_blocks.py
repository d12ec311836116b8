"""Private key blocks: PEM (``-----BEGIN ... PRIVATE KEY-----``) and PuTTY ``.ppk`` files.

Both are found by a literal and read forwards with patterns matched at one position
(possessive, so linear in what they eat); END markers are found with ``str.find``, once
per label. The text given is already normalised (retrieval.redaction._normalize), so a block
typed with en or em dashes (U+2013, U+2014) has ASCII dashes here.
"""

from __future__ import annotations

import re

from ._base import Ranges, Rule, Span

# Any number of dashes, an optional space, the label; word processors turn "-----" into
# an em dash and an en dash and the like, hence the free count. Found by "BEGIN " (a
# literal: fast), then the dashes before it are read back.
_PEM_BEGIN = re.compile(r"BEGIN (?P<label>[A-Z0-9 ]{0,40}?PRIVATE KEY(?: BLOCK)?) ?-++")
_PEM_END_TAIL = re.compile(r" ?-++")
# Body lines of an unterminated block: base64, armor headers ("Proc-Type: 4,ENCRYPTED"),
# blank lines.
_PEM_BODY = re.compile(
    r"(?:\r?\n(?:[ \t]*+[A-Za-z0-9+/=]{8,}+[ \t]*+"
    r"|(?:Proc-Type|DEK-Info|Comment|Version|Hash|Charset|MessageID):[^\n]*+|[ \t]*+)"
    r"(?=\r?\n|\Z))*+"
)
# The same inside a JSON string or a YAML scalar: "-----BEGIN PRIVATE KEY-----\nMIIE...\n"
_PEM_ESCAPED_BODY = re.compile(r"(?:\\r?\\n[A-Za-z0-9+/=]*+)++")


def find_private_keys(text: str, lowered: str = "", needles: tuple[str, ...] = (),
                      ranges: Ranges | None = None) -> list[Span]:
    """Every ``-----BEGIN ... PRIVATE KEY-----`` block, END line included.

    An unterminated block (a truncated paste; or one whose END comes only after another
    BEGIN) loses its BEGIN line and the key-shaped lines after it. Linear: each END marker
    is found once per label (its position is kept until a BEGIN passes it), each BEGIN
    once, and dashes are read back only as far as the previous block.
    """
    spans: list[Span] = []
    if ranges is not None:
        return spans  # blocks are whole: a placeholder next to a line starts none
    pos = 0
    next_end: dict[str, int] = {}  # label -> offset of its next END marker (-1: none left)
    m = _PEM_BEGIN.search(text)
    while m is not None:
        following = _PEM_BEGIN.search(text, m.end())
        start = m.start() - (text[m.start() - 1 : m.start()] == " ")
        dashes = start
        while dashes > pos and text[dashes - 1] == "-":
            dashes -= 1
        if dashes == start:  # "BEGIN RSA PRIVATE KEY" in prose, no armor
            m = following
            continue
        marker = f"END {m.group('label')}"
        end = next_end.get(marker)
        if end is None or 0 <= end < m.end():
            end = next_end[marker] = text.find(marker, m.end())
        if end != -1 and (following is None or end < following.start()):
            stop = end + len(marker)
            tail = _PEM_END_TAIL.match(text, stop)
            if tail is not None:
                stop = tail.end()
        else:
            body = _PEM_ESCAPED_BODY.match(text, m.end()) or _PEM_BODY.match(text, m.end())
            eaten = text[m.end() : body.end()] if body else ""
            stop = m.end() + len(eaten.rstrip())  # trailing blank lines stay
        spans.append((dashes, stop, "private_key"))
        pos = stop
        while following is not None and following.start() < stop:
            following = _PEM_BEGIN.search(text, stop)
        m = following
    return spans


# PuTTY-User-Key-File-3: ssh-ed25519 / Encryption: none / Comment: ... / Public-Lines: 2 /
# <base64> / [Key-Derivation: Argon2id ...] / Private-Lines: 1 / <base64> / Private-MAC: <hex>
_PUTTY = re.compile(
    r"PuTTY-User-Key-File-[0-9]++:[^\n]*+"
    r"(?:\r?\n(?:[A-Za-z0-9-]{1,40}+:[^\n]*+|[ \t]*+[A-Za-z0-9+/=]{4,}+[ \t]*+))*+"
)
_PUTTY_MAC = re.compile(r"\nPrivate-MAC:[^\n]*+")


def find_putty_keys(text: str, lowered: str = "", needles: tuple[str, ...] = (),
                    ranges: Ranges | None = None) -> list[Span]:
    """Every PuTTY private key file (``.ppk``), from its first line to ``Private-MAC``.

    A truncated one loses what is left of it (header and key-shaped lines).
    """
    spans: list[Span] = []
    if ranges is not None:
        return spans
    pos = 0
    while (m := _PUTTY.search(text, pos)) is not None:
        block = m.group()
        mac = _PUTTY_MAC.search(block)
        stop = m.start() + (mac.end() if mac is not None else len(block.rstrip()))
        spans.append((m.start(), stop, "private_key"))
        pos = max(stop, m.start() + 1)
    return spans


PRIVATE_KEYS = Rule(find_private_keys, ("private key",))
PUTTY_KEYS = Rule(find_putty_keys, ("putty-user-key-file",))
