"""The text the redaction rules read: look-alike characters folded, invisible ones dropped.

``pass\\u200bword=``, ``\\u0440\\u0430ssword=`` (Cyrillic er and a), ``password=`` in
full-width letters (U+FF50...) and a BEGIN line typed with em and en dashes (U+2014,
U+2013) are meant to read as ``password=`` and ``-----BEGIN``, by people and by the
services that take them. The rules match on a normalised copy:

* each character is NFKC-normalised on its own (full-width forms, ligatures, compatibility
  digits and spaces; no composition across characters, so every normalised character comes
  from exactly one original character);
* zero-width and invisible formatting characters (U+200B..U+200F, U+2060..U+2064, U+FEFF,
  the soft hyphen U+00AD, bidirectional controls, every other format character (category
  Cf), the tag characters U+E0000..U+E007F and the variation selectors) are dropped, so
  ``pass\U000e0041word=`` reads as ``password=``;
* Cyrillic and Greek letters that look like Latin ones become those letters; dashes
  (U+2010..U+2015, U+2212, ...) become ``-``; curly quotes straight ones.

:class:`Normalized` maps offsets of the copy back to the original, so that the caller's
text is changed only inside redacted spans (documents are quoted to users as they were).
ASCII text, the common case, is its own normalised copy: no work, no map.
"""

from __future__ import annotations

import bisect
import re
import unicodedata
from dataclasses import dataclass, field

_INVISIBLE = frozenset(
    "\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b\u180c\u180d\u180e\u200b\u200c\u200d"
    "\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2060\u2061\u2062\u2063\u2064\u2066\u2067"
    "\u2068\u2069\u3164\ufe00\ufe01\ufe02\ufe03\ufe04\ufe05\ufe06\ufe07\ufe08\ufe09\ufe0a"
    "\ufe0b\ufe0c\ufe0d\ufe0e\ufe0f\ufeff\uffa0"
)

# Look-alikes of ASCII letters and punctuation (after NFKC). Letters: Cyrillic and Greek
# capitals and small letters drawn like a Latin one; a few Latin-extended ones too.
_CONFUSABLE_PAIRS = (
    # Cyrillic
    "аa бb вb сc дd еe ёe һh іi ӏl јj кk мm нh оo рp ԛq ѕs тt уy хx ԝw ԁd ʏy ьb"
    " АA ВB СC ЕE ЁE НH ІI ЈJ КK МM ОO РP ЅS ТT УY ХX ԜW ԚQ ӀI"
    # Greek
    " αa βb εe ηn ιi κk νv οo ρp τt υu χx ϲc ϳj ΑA ΒB ΕE ΖZ ΗH ΙI ΚK ΜM ΝN ΟO ΡP ΤT ΥY ΧX"
    # Latin extended, IPA
    " ıi ȷj ɑa ɡg ɩi ɪi ʟl ᴀa ᴄc ᴅd ᴇe ᴋk ᴍm ᴏo ᴘp ᴛt ᴜu ᴠv ᴡw ᴢz"
    # dashes, quotes, colons, equals signs
    " ‐- ‑- ‒- –- —- ―- −- ⁃- ﹘- ‘' ’' ‚' ‛' ′' “\" ”\" „\" ‟\" ″\" ∶: ꞉: ꞊= ⹀="
)
_CONFUSABLE = {pair[0]: pair[1] for pair in _CONFUSABLE_PAIRS.split()}
_NON_ASCII = re.compile(r"[^\x00-\x7f]++")


def _invisible(c: str) -> bool:
    """``c`` is drawn as nothing: listed above, a format character (Cf: the tag characters
    U+E0001 and U+E0020..U+E007F among them), an unassigned tag (U+E0000..U+E007F) or a
    variation selector (U+E0100..U+E01EF)."""
    if c in _INVISIBLE:
        return True
    code = ord(c)
    return (0xE0000 <= code <= 0xE007F or 0xE0100 <= code <= 0xE01EF
            or unicodedata.category(c) == "Cf")


def fold(ch: str) -> str:
    """What one character reads as: NFKC, look-alikes folded, invisible ones dropped.

    A character that NFKC expands into several is folded only into letters and digits
    (``\ufb01`` -> ``fi``) or a run of one character (``\u2026`` -> ``...``): an expansion
    holding a space or punctuation (``\u00a8`` -> space and a combining diaeresis,
    ``\u2474`` -> ``(1)``) would cut a token where the original has none, and a secret's
    span could then start or end inside one character of the original.
    """
    out = ch
    for _ in range(3):  # to a fixed point: NFKC output may hold look-alikes, and back
        folded = "".join(
            "" if _invisible(c) else _CONFUSABLE.get(c, c)
            for c in unicodedata.normalize("NFKC", out)
        )
        if folded == out:
            break
        out = folded
    if len(out) > 1 and not out.isalnum() and len(set(out)) > 1:
        return ch
    return out


@dataclass(frozen=True)
class Normalized:
    """A normalised copy of a text and the way back to the original's offsets.

    Attributes:
        text: the normalised copy (the original itself when nothing changed).
        identity: True when ``text`` is the original.
    """

    text: str
    identity: bool
    # Characters whose normalised form is not one character long, in order: the original
    # offset, and the normalised offsets before and after its normalised form.
    _orig: list[int] = field(default_factory=list)
    _before: list[int] = field(default_factory=list)
    _after: list[int] = field(default_factory=list)

    def start_of(self, q: int) -> int:
        """The original offset where a span starting at normalised offset ``q`` starts
        (inside an expanded character: at that character; after dropped ones)."""
        j = bisect.bisect_right(self._before, q) - 1
        if j < 0:
            return q
        if q < self._after[j]:
            return self._orig[j]
        return self._orig[j] + 1 + (q - self._after[j])

    def end_of(self, q: int) -> int:
        """The original offset where a span ending at normalised offset ``q`` ends (inside
        an expanded character: after it; before dropped ones)."""
        j = bisect.bisect_left(self._after, q)  # first edit whose output ends at or after q
        o = q if j == 0 else self._orig[j - 1] + 1 + (q - self._after[j - 1])
        if j < len(self._orig) and o > self._orig[j]:
            return self._orig[j] + 1
        return o


def normalize(text: str) -> Normalized:
    """The normalised copy of ``text`` (module docstring). Linear in ``len(text)``."""
    if text.isascii():
        return Normalized(text, identity=True)
    runs = [(m.start(), m.group()) for m in _NON_ASCII.finditer(text)]
    table: dict[int, str] = {}
    for ch in set("".join(run for _, run in runs)):
        folded = fold(ch)
        if folded != ch:
            table[ord(ch)] = folded
    if not table:
        return Normalized(text, identity=True)
    pieces: list[str] = []
    orig: list[int] = []
    before: list[int] = []
    after: list[int] = []
    pos = 0
    shift = 0  # normalised offset minus original offset so far
    resized = {ch for ch, folded in table.items() if len(folded) != 1}
    for start, run in runs:
        pieces += [text[pos:start], run.translate(table)]
        pos = start + len(run)
        if resized and not resized.isdisjoint(map(ord, run)):
            for i, ch in enumerate(run):
                if ord(ch) in resized:
                    size = len(table[ord(ch)])
                    orig.append(start + i)
                    before.append(start + i + shift)
                    shift += size - 1
                    after.append(start + i + 1 + shift)
    pieces.append(text[pos:])
    return Normalized("".join(pieces), identity=False, _orig=orig, _before=before,
                      _after=after)
