"""Credential redaction: secrets never reach an index or a model (ARCHITECTURE.md, 8).

:func:`redact` replaces credential-shaped text with ``[REDACTED:<type>]``. It runs at
ingest (before chunking), again before prompt assembly, and on questions written to the
answer audit log, so it has to be:

* **Precise about shape, not about words.** Only assignments, key-value pairs, headers,
  config statements, command lines and well-known token formats are secrets; "Reset your
  password in the portal" is prose and survives. Look-alikes survive too: hex digests, git
  hashes, UUIDs, CVE ids, versions, dates, MAC addresses.
* **Blind to disguises, faithful to the text.** The rules read a normalised copy
  (:mod:`retrieval.redaction._normalize`: NFKC per character, zero-width characters dropped,
  Cyrillic/Greek look-alikes and Unicode dashes folded), so ``password=`` spelt with a
  Cyrillic ``\\u0440``, with a zero-width space inside or in full-width letters, and a
  ``BEGIN RSA PRIVATE KEY`` line with em and en dashes are caught; the output is the
  caller's original text with only the secrets' spans replaced.
* **Idempotent.** ``redact(redact(t).text).text == redact(t).text``: no rule matches a
  placeholder, and no rule's output is shaped like another rule's input.
* **Linear-time.** Every pattern is anchored by a literal or a lookbehind that allows one
  match attempt per run of candidate characters, and every unbounded quantifier is
  possessive (Python 3.11), so a hostile 1 MB input cannot trigger catastrophic
  backtracking. Checks that a regex would express with unbounded lookaheads ("contains a
  digit") are done in Python on the match instead. Private key blocks are found with
  ``str.find`` for the same reason.

Values that are references or placeholders (``$PASSWORD``, ``${VAR}``, ``%VAR%``,
``<token>``, ``{{ secret }}``, ``****``) are left alone: they carry no secret, and runbooks
are full of them. When in doubt about a value in a key-value shape, it is redacted.

The rules live by concept in sibling modules: ``_redact_tokens`` (provider token formats),
``_redact_blocks`` (PEM and PuTTY keys), ``_redact_devices`` (Cisco, Juniper, SNMP),
``_redact_config`` (system files, command lines, SQL, crypt hashes), ``_redact_assign``
(key/value shapes), ``_redact_clients`` (URLs with credentials, connection strings,
database and directory clients), ``_redact_shells`` (fish, csh and PowerShell
setters), ``_redact_network`` (optional host names and addresses).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from dataclasses import dataclass

from ._assign import ASSIGNMENTS, FLAG, HEADER_RULES, KEYED_RULES
from ._base import PLACEHOLDER_PREFIX, Ranges, Rule, Span, placeholder
from ._blocks import PRIVATE_KEYS, PUTTY_KEYS
from ._clients import CLIENT_RULES, URL_USERINFO
from ._config import COMMAND_RULES, CRYPT_HASH, FILE_RULES, SCHEME_HASH
from ._devices import CISCO_RULES, SNMP_RULES
from ._network import HOSTNAME, IPV4, IPV6
from ._normalize import Normalized, normalize
from ._shells import SHELL_RULES
from ._tokens import AWS_SECRET_BARE, TOKEN_RULES

__all__ = ["PLACEHOLDER_PREFIX", "Redacted", "redact"]


@dataclass(frozen=True)
class Redacted:
    """The result of :func:`redact`.

    Attributes:
        text: the input with every secret replaced by ``[REDACTED:<type>]``.
        counts: placeholder type -> placeholders of that type in ``text`` that this call
            inserted (types with none are absent).
    """

    text: str
    counts: dict[str, int]

    @property
    def total(self) -> int:
        """How many secrets were replaced in all."""
        return sum(self.counts.values())


# Order matters: blocks and specific formats first (their placeholders then stop the
# generic rules), device and file shapes, then generic assignments, then the shapes with
# no key at all (crypt hashes, bare AWS secrets); optional hostnames and addresses last.
_RULES: tuple[Rule, ...] = (
    PRIVATE_KEYS,
    PUTTY_KEYS,
    *TOKEN_RULES,
    *HEADER_RULES,
    URL_USERINFO,
    *CISCO_RULES,
    *SNMP_RULES,
    *FILE_RULES,
    *COMMAND_RULES,
    *CLIENT_RULES,
    *SHELL_RULES,
    *KEYED_RULES,
    FLAG,
    ASSIGNMENTS,
    CRYPT_HASH,
    SCHEME_HASH,
    AWS_SECRET_BARE,
)


def redact(text: str, *, hostnames: bool = False, ips: bool = False) -> Redacted:
    """Replace credential-shaped text with ``[REDACTED:<type>]`` placeholders.

    Secrets (private keys, tokens, passwords in assignments, device configs, command lines
    and connection strings, password hashes) are always redacted; host names and IP
    addresses only when asked. Pure and thread-safe; linear in ``len(text)``.

    Args:
        text: any text (an extracted document, a chunk, a prompt).
        hostnames: also redact FQDN-like host names (``web01.example.net``).
        ips: also redact IPv4 and IPv6 addresses (MAC addresses are kept).

    Returns:
        The redacted text and how many placeholders of each type were inserted.
        Idempotent: ``redact(redact(t).text).text == redact(t).text``. Outside the
        placeholders the text is the input's, character for character.
    """
    rules = list(_RULES)
    if ips:
        rules += [IPV6, IPV4]
    if hostnames:
        rules.append(HOSTNAME)
    if len(text) <= 2 * _CHUNK:
        return _redact(text, rules)
    pieces: list[str] = []
    counts: Counter[str] = Counter()
    for start, end in _chunks(text):
        part = _redact(text[start:end], rules)
        pieces.append(part.text)
        counts.update(part.counts)
    return Redacted(text="".join(pieces), counts=dict(counts))


# Long texts are redacted in pieces of about this many characters, cut where no rule
# reaches across: at a line start, outside private key blocks, not after a line that
# continues (a trailing backslash) or a long base64 line (the bare AWS secret rule reads
# the line before). Each rule rewrites only the piece it is in, not the whole text.
_CHUNK = 1 << 16
_BASE64_LINE = re.compile(r"[A-Za-z0-9+/=]{60,}+\r?")


def _chunks(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` pieces of ``text``, in order, covering it (see :data:`_CHUNK`)."""
    norm = normalize(text)
    lowered = _lower(norm.text)
    blocks: list[tuple[int, int]] = []
    for rule in (PRIVATE_KEYS, PUTTY_KEYS):
        if any(needle in lowered for needle in rule.needles):
            blocks += [(norm.start_of(a), norm.end_of(b))
                       for a, b, _ in rule.find(norm.text, lowered, rule.needles, None)]
    blocks.sort()
    out: list[tuple[int, int]] = []
    pos = 0
    block = 0
    n = len(text)
    while n - pos > 2 * _CHUNK:
        cut = text.find("\n", pos + _CHUNK) + 1
        while cut:
            while block < len(blocks) and blocks[block][1] <= cut:
                block += 1
            if block < len(blocks) and blocks[block][0] < cut:  # inside a block
                cut = text.find("\n", blocks[block][1]) + 1
                continue
            line = text[text.rfind("\n", pos, cut - 1) + 1 : cut - 1]
            if not line.rstrip("\r").endswith(("\\", "^", "`")) and _BASE64_LINE.fullmatch(
                    line) is None:
                break
            cut = text.find("\n", cut) + 1
        if not cut:
            break
        out.append((pos, cut))
        pos = cut
    out.append((pos, n))
    return out


# Texts up to this long have every needle looked for at once (cheaper than the lazy
# look-up, which pays off on long texts: there a needle is not searched for when a
# shorter one inside it is absent).
_SHORT = 4096
_ALL_NEEDLES = {needle for rule in (*_RULES, IPV6, IPV4, HOSTNAME) for needle in rule.needles}


def _needles_in(lowered: str) -> frozenset[str]:
    """The needles of all rules that ``lowered`` holds."""
    return frozenset(needle for needle in _ALL_NEEDLES if needle in lowered)
_INNER_NEEDLES = {
    needle: sorted((part for part in _ALL_NEEDLES if part != needle and part in needle), key=len)
    for needle in _ALL_NEEDLES
}


# A placeholder can make text next to it match a rule that ran before it was there
# ("host.example.net$1$salt$hash": once the host name is "[REDACTED:hostname]", the crypt
# hash after it stands alone). So after the first pass the rules run again over the
# lines holding a placeholder glued to other text, until a pass finds nothing (at most
# this many passes): redacting the result again then finds nothing either.
_PASSES = 4


def _runs_on(work: str, newline: int) -> bool:
    """The line ending at ``newline`` (its line break) continues on the next one."""
    return work[max(0, newline - 2) : newline].rstrip("\r").endswith(("\\", "^", "`"))


def _around(work: str, marks: list[_Mark]) -> Ranges:
    """The lines holding a placeholder glued to other text, each with the line after it
    (the bare AWS secret rule reads the line before) and the lines it continues or runs on
    into: merged ranges, in order. Linear: each line break is looked at a bounded number
    of times."""
    out: Ranges = []
    n = len(work)
    for ws, we, _, _, _ in marks:
        if (ws == 0 or work[ws - 1].isspace()) and (we == n or work[we].isspace()):
            continue  # a placeholder between spaces changes no neighbour's shape
        floor = out[-1][1] if out else 0
        if out and ws <= floor:
            start = out.pop()[0]
        else:
            start = work.rfind("\n", floor, ws) + 1 or floor
            while start > floor and _runs_on(work, start - 1):
                start = work.rfind("\n", floor, start - 1) + 1 or floor
        end = work.find("\n", max(we, floor))
        for step in ("this line", "the next"):  # each with the lines it runs on into
            while end != -1 and _runs_on(work, end):
                end = work.find("\n", end + 1)
            if end == -1 or step == "the next":
                break
            end = work.find("\n", end + 1)
        end = n if end == -1 else end
        if out and start <= out[-1][1] + 1:
            start = out.pop()[0]
        out.append((start, end))
    return out


def _redact(text: str, rules: list[Rule]) -> Redacted:
    """:func:`redact` of one piece of text, with these rules."""
    norm = normalize(text)
    work = norm.text
    lowered = _lower(work)
    marks: list[_Mark] = []
    counts: Counter[str] = Counter()
    present: dict[str, bool] = {}  # needle -> in the text (each looked for once)

    def has(needle: str) -> bool:
        hit = present.get(needle)
        if hit is None:  # absent if a shorter needle inside it is (shortest looked for first)
            hit = present[needle] = (all(has(part) for part in _INNER_NEEDLES[needle])
                                     and needle in lowered)
        return hit

    # A short text (a name, a title, a question, a chunk) has every needle looked for at
    # once, and the rules none of whose needles it holds are skipped in one set operation.
    short = len(lowered) <= _SHORT
    held = _needles_in(lowered) if short else frozenset()
    ranges: Ranges | None = None  # the first pass reads everything
    for _ in range(_PASSES):
        found = False
        for rule in rules:
            if short:
                if rule.needles and held.isdisjoint(rule.needles):
                    continue
                needles = [needle for needle in rule.needles if needle in held]
            else:
                needles = [needle for needle in rule.needles if has(needle)]
                if rule.needles and not needles:
                    continue
            spans = rule.find(work, lowered, tuple(needles), ranges)
            if spans:
                work, lowered, marks = _splice(work, lowered, marks, spans, counts)
                found = True
                if short:
                    held = _needles_in(lowered)
                if ranges is not None:
                    ranges = _around(work, marks)
        if not found:
            break
        ranges = _around(work, marks)
        if not ranges:
            break
    if not marks:
        return Redacted(text=text, counts={})
    out = work if norm.identity else _rebuild(text, norm, marks)
    return Redacted(text=out, counts={k: n for k, n in counts.items() if n > 0})


_Mark = tuple[int, int, int, int, str]
"""A placeholder in the working text: where it is there (start, end), which span of the
normalised text it stands for (start, end), and its type."""


def _widen(spans: list[Span], marks: list[_Mark]) -> list[Span]:
    """``spans`` widened to whole placeholders where they cut into one (``-u
    [REDACTED:x]:tail`` read as user ``[REDACTED`` and password ``x]:tail``), then merged
    where they overlap (the first one's type wins)."""
    out: list[Span] = []
    i = 0
    for span in spans:
        start, end, kind = span
        while i < len(marks) and marks[i][1] <= start:
            i += 1
        j = i
        while j < len(marks) and marks[j][0] < end:  # overlaps [start, end)
            start, end = min(start, marks[j][0]), max(end, marks[j][1])
            j += 1
        if out and start < out[-1][1]:
            last = out.pop()
            start, end, kind = last[0], max(end, last[1]), last[2]
        out.append((start, end, kind))
    return out


def _splice(work: str, lowered: str, marks: list[_Mark], spans: list[Span],
            counts: Counter[str]) -> tuple[str, str, list[_Mark]]:
    """Replace ``spans`` of ``work`` (and of its lower-case copy) with placeholders;
    return the new text, its lower-case copy and the new marks.

    A span that covers earlier placeholders absorbs them (:func:`_widen`): it stands for
    the union of what they stood for, and they are no longer counted.
    """
    if marks:
        spans = _widen(spans, marks)
    pieces: list[str] = []
    low: list[str] = []
    new: list[_Mark] = []
    pos = 0    # work[:pos] is in pieces
    i = 0      # marks[:i] are in new
    n_marks = len(marks)
    delta = 0  # working minus normalised offset, after marks[:i]
    shift = 0  # new working minus old working offset, after the spans so far
    added: Counter[str] = Counter()
    for a, b, kind in spans:
        if a >= b or a < pos:
            continue
        while i < n_marks and marks[i][1] <= a:
            ws, we, ns, ne, k = marks[i]
            new.append((ws + shift, we + shift, ns, ne, k))
            delta += (we - ws) - (ne - ns)
            i += 1
        n_start = a - delta
        while i < n_marks and marks[i][0] < b:  # inside [a, b): absorbed
            ws, we, ns, ne, k = marks[i]
            added[k] -= 1
            delta += (we - ws) - (ne - ns)
            i += 1
        n_end = b - delta
        text = placeholder(kind)  # lower case already
        pieces += (work[pos:a], text)
        low += (lowered[pos:a], text)
        new.append((a + shift, a + shift + len(text), n_start, n_end, kind))
        added[kind] += 1
        shift += len(text) - (b - a)
        pos = b
    new += [(ws + shift, we + shift, ns, ne, k) for ws, we, ns, ne, k in marks[i:]]
    pieces.append(work[pos:])
    low.append(lowered[pos:])
    counts.update(added)
    return "".join(pieces), "".join(low), new


def _rebuild(original: str, norm: Normalized, marks: list[_Mark]) -> str:
    """The original text with each mark's span (mapped back) replaced by its placeholder."""
    pieces: list[str] = []
    pos = 0
    for _, _, n_start, n_end, kind in marks:
        start = max(norm.start_of(n_start), pos)
        end = max(norm.end_of(n_end), start)
        pieces += (original[pos:start], placeholder(kind))
        pos = end
    pieces.append(original[pos:])
    return "".join(pieces)


_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


def _lower(text: str) -> str:
    """``text`` in lower case, with the same offsets (``str.lower`` lengthens a few
    characters, such as U+0130; then only ASCII letters are lowered)."""
    lowered = text.lower()
    return lowered if len(lowered) == len(text) else text.translate(_ASCII_LOWER)
