"""What every redaction rule shares: spans, rules, value checks (see retrieval.redaction._redactor).

A rule finds *spans*: ``(start, end, kind)`` triples, sorted and disjoint, naming what to
replace with ``[REDACTED:<kind>]``. The pipeline in :mod:`retrieval.redaction._redactor` splices
them into the text and maps them back to the caller's original text.
"""

from __future__ import annotations

import math
import re
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

PLACEHOLDER_PREFIX = "[REDACTED:"

Span = tuple[int, int, str]
"""(start, end, placeholder type) of one secret in the text a rule was given."""

Ranges = list[tuple[int, int]]
"""Disjoint ``(start, end)`` ranges of whole lines of a text, in order."""

Finder = Callable[[str, str, tuple[str, ...], "Ranges | None"], list[Span]]
"""Finds the secrets of one rule in a text, given the text, its lower-case copy (same
offsets), which of the rule's needles it holds, and the ranges to look in (None: where
the rule's needles are): spans sorted by start, disjoint."""

Handler = Callable[[re.Match[str]], "Span | None"]
"""Gets a match; returns the span to replace (absolute offsets) or None to reject it."""


def placeholder(kind: str) -> str:
    """The text that replaces a secret of type ``kind``."""
    return f"{PLACEHOLDER_PREFIX}{kind}]"


# A placeholder as :func:`placeholder` writes it: only these pass as one. An unclosed
# "[REDACTED:" or one with spaces in it is text like any other, or writing it before a
# secret would hide the secret.
_PLACEHOLDER = re.compile(r"\[REDACTED:[A-Za-z0-9_.-]{1,40}\]")


# --- value checks ------------------------------------------------------------------------

VARIABLE = re.compile(
    r"\$(?:\{\{[^}\n]{1,200}\}\}|\{[^}\n]{1,100}\}|\([^)\n]{1,200}\)|[A-Za-z_][A-Za-z0-9_]{0,100})"
)


_REFERENCE_STARTS = frozenset("[<{.$%*\u2022")


# Template fillers: "xxxxxxxx", "changeme", "YOUR_API_TOKEN_HERE", "<your-key>"'s
# unbracketed cousins ("your-api-key", "enter_password_here", "REPLACE_ME").
_FILLER_WORDS = frozenset({
    "changeme", "change_me", "change-me", "changeit", "replaceme", "replace_me", "replace-me",
    "placeholder", "redacted", "todo", "tbd", "fixme", "notset", "not_set", "unset",
    "secret_here", "password_here", "token_here", "example", "dummy",
})
_FILLER_CHARS = re.compile(r"[A-Za-z_-]++")
_FILLER_STARTS = tuple(f"{w}{sep}" for w in ("enter", "insert", "put", "paste", "add",
                                              "replace", "set") for sep in "_-")
_FILLER_ENDS = ("_here", "-here", "_placeholder", "-placeholder")


def is_filler(value: str) -> bool:
    """True for template fillers that stand where a secret goes: ``xxxxxxxx``,
    ``xxxx-xxxx``, ``changeme``, ``REPLACE_ME``, ``YOUR_API_TOKEN_HERE``,
    ``your-api-key``, ``enter_password_here`` (letters, ``_`` and ``-`` only:
    ``changeme2`` or ``your-Pa55`` are taken for secrets)."""
    low = value.lower()
    if low in _FILLER_WORDS or (low.count("x") >= 4 and set(low) <= {"x", "-", "_"}):
        return True
    if _FILLER_CHARS.fullmatch(value) is None:
        return False
    return low.startswith(("your", *_FILLER_STARTS)) or low.endswith(_FILLER_ENDS)


def is_reference(value: str) -> bool:
    """True for values that are not secrets themselves: placeholders, variables, masks.

    ``$VAR``, ``${VAR}``, ``${{ secrets.X }}``, ``$(cmd)``, ``%VAR%``, ``<token>``,
    ``{{ secret }}``, ``****``, ``...``, earlier placeholders and template fillers
    (:func:`is_filler`) are references; crypt hashes (``$1$...``, ``$6$...``, ``$9$...``)
    start with ``$`` too but are secrets.
    """
    v = value.strip().strip("\"'`")
    if not v:
        return True
    if v[0] not in _REFERENCE_STARTS:
        return is_filler(v)
    if v.startswith(PLACEHOLDER_PREFIX):
        return _PLACEHOLDER.match(v) is not None
    if v.startswith(("<", "{{", "{%", "...")):
        return True
    if v.startswith("$"):
        return VARIABLE.fullmatch(v) is not None
    if v.startswith("%") and v.endswith("%") and len(v) > 2:
        return True
    return set(v) <= {"*", "\u2022"}  # a mask ("****", "••••")


def in_placeholder(text: str, pos: int) -> bool:
    """True when ``pos`` is inside a well-formed ``[REDACTED:kind]`` placeholder (after
    its prefix)."""
    at = text.rfind(PLACEHOLDER_PREFIX, max(0, pos - 50), pos)
    if at < 0:
        return False
    found = _PLACEHOLDER.match(text, at)
    return found is not None and pos < found.end()


def has_digit(s: str) -> bool:
    """True when ``s`` holds a decimal digit."""
    return any(c.isdigit() for c in s)


def has_letter(s: str) -> bool:
    """True when ``s`` holds a letter."""
    return any(c.isalpha() for c in s)


def mixed_case(s: str) -> bool:
    """True when ``s`` holds an upper case letter, a lower case letter and a digit."""
    return has_digit(s) and any(c.isupper() for c in s) and any(c.islower() for c in s)


def tokenish(value: str, min_len: int = 16) -> bool:
    """Long enough, with digits and letters: shaped like a generated token."""
    return len(value) >= min_len and has_digit(value) and has_letter(value)


def is_path(value: str) -> bool:
    """``/etc/x``, ``~/.aws/credentials``, ``./key.pem``: where a secret lives, not one."""
    return value.startswith(("/", "~/", "./", "../")) and "/" in value[1:].lstrip("./")


def unquote(value: str) -> str:
    """``value`` without one pair of matching surrounding quotes."""
    if len(value) >= 2 and value[0] in "\"'" and value[-1] == value[0]:
        return value[1:-1]
    return value


def entropy(s: str) -> float:
    """Shannon entropy of the characters of ``s``, in bits per character."""
    if not s:
        return 0.0
    n = len(s)
    return -sum(c / n * math.log2(c / n) for c in Counter(s).values())


MAX_LINE_LOOKBACK = 512


def _logical_line(text: str, pos: int) -> tuple[int, int]:
    """The line holding ``pos``, with the lines it continues (a trailing backslash, caret
    or backtick: ``curl \\`` then ``  -u user:pw``), reaching at most 512 characters back:
    ``(start, end)``, end before the line break."""
    floor = max(0, pos - MAX_LINE_LOOKBACK)
    start = text.rfind("\n", floor, pos) + 1
    while start > floor:  # text[start - 1] is a line break: is it a continuation?
        j = start - 1
        if j > 0 and text[j - 1] == "\r":
            j -= 1
        if j == 0 or text[j - 1] not in "\\^`":
            break
        start = text.rfind("\n", floor, j) + 1
    end = text.find("\n", pos)
    return max(start, floor), len(text) if end == -1 else end


def line_has(words: Sequence[str]) -> Callable[[re.Match[str]], bool]:
    """An ``accept`` check: the match's line (with the lines it continues) names one of
    ``words`` (a command). Each line is read once, however many matches it holds."""
    last: list[tuple[str, int, int, bool]] = [("", 0, 0, False)]

    def accept(m: re.Match[str]) -> bool:
        text, pos = m.string, m.start()
        seen_text, start, end, found = last[0]  # one read: safe across threads
        if seen_text is text and start <= pos < end:
            return found
        start, end = _logical_line(text, pos)
        line = text[start:end].lower()
        found = any(word in line for word in words)
        last[0] = (text, start, end, found)
        return found

    return accept


# --- rules -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """A finder and the needles that gate it.

    Attributes:
        find: returns the spans of this rule's secrets (see :data:`Finder`).
        needles: the rule runs only if one of these is in the lower-cased text (empty:
            it always runs).
    """

    find: Finder
    needles: tuple[str, ...]


def _group_handler(
    kind: str | Callable[[re.Match[str]], str],
    group: str,
    accept: Callable[[re.Match[str]], bool] | None,
) -> Handler:
    def handle(m: re.Match[str]) -> Span | None:
        if group in m.re.groupindex:
            value = m.group(group)
            start, end = m.span(group)
        else:
            value, (start, end) = m.group(0), m.span()
        if value is None or start >= end or is_reference(value):
            return None
        if in_placeholder(m.string, start):
            return None  # "-u [REDACTED:x]:" read as user "[REDACTED", password "x]:"
        if accept is not None and not accept(m):
            return None
        return start, end, kind if isinstance(kind, str) else kind(m)

    return handle


_RESCAN = 64


def find_all(pattern: re.Pattern[str], handle: Handler, text: str, start: int = 0,
             end: int | None = None) -> list[Span]:
    """The spans ``handle`` accepts among the matches of ``pattern`` in ``text[start:end]``
    (lookbehinds see before ``start``), left to right.

    After a rejected match the search resumes inside its value (group ``v``) when that is
    short, so that a rejected match does not hide a real one glued to it; after a long one
    (over 64 characters) it resumes after the match, so that ``sig=sig=sig=...`` is read
    once, not once per ``sig=``. Each character is read a bounded number of times.
    """
    end = len(text) if end is None else end
    has_value = "v" in pattern.groupindex
    spans: list[Span] = []
    search = start
    while (m := pattern.search(text, search, end)) is not None:
        span = handle(m)
        if span is None:
            resume = m.end()
            if has_value and m.start("v") > m.start() and m.end("v") - m.start("v") <= _RESCAN:
                resume = m.start("v")
            search = max(resume, m.start() + 1)
            continue
        spans.append(span)
        search = max(m.end(), span[1], m.start() + 1)
    return spans


_CONTINUED = ("\\", "^", "`")  # shell, cmd.exe and PowerShell line continuations
_MERGE_GAP = 1024


def needle_lines(lowered: str, needles: tuple[str, ...], begin: int = 0,
                 stop: int | None = None) -> Ranges:
    """The lines of ``lowered`` holding one of ``needles``, each with the lines it runs on
    into (a trailing backslash): disjoint ``(start, end)`` ranges, in order, ends before
    the line break; ranges less than 1 KB apart are merged (one search is cheaper than
    many), and when needles are on more than one line in 1 KB on average the rest of the
    text is one range. Linear: each needle's next occurrence is searched for once per range
    it is behind, and the ranges are at most one per KB."""
    n = len(lowered) if stop is None else stop
    next_at = {needle: lowered.find(needle, begin, n) for needle in needles}
    ranges: Ranges = []
    pos = begin  # a line start; text before it is done
    budget = (n - begin) // _MERGE_GAP + 16  # more lines than this: needles are everywhere
    while (budget := budget - 1) > 0:
        best = -1
        for needle, seen in next_at.items():
            at = seen
            if 0 <= at < pos:
                at = next_at[needle] = lowered.find(needle, pos, n)
            if at >= 0 and (best < 0 or at < best):
                best = at
        if best < 0:
            return ranges
        start = lowered.rfind("\n", pos, best) + 1 or pos
        end = lowered.find("\n", best, n)
        while end != -1 and lowered[max(0, end - 2) : end].rstrip("\r").endswith(_CONTINUED):
            end = lowered.find("\n", end + 1, n)
        end = n if end == -1 else end
        start = max(start, pos)
        if ranges and start - ranges[-1][1] <= _MERGE_GAP:
            start = ranges.pop()[0]  # one search over both (and the few lines between)
        ranges.append((start, end))
        pos = end + 1
        if pos >= n:
            return ranges
    return [(ranges[0][0] if ranges else begin, n)]  # one search over the rest is cheaper


class _Windows(threading.local):
    """The last text's needle lines, per (needles, begin, stop): rules with the same
    needles ("-p", "set", "pass", ...) share one computation. Per thread (redaction runs
    in several); reset when another text (or the same after a splice) comes."""

    text: str | None = None
    found: dict[tuple[tuple[str, ...], int, int], Ranges]

    def __init__(self) -> None:
        self.found = {}


_WINDOWS = _Windows()


def _lines_of(lowered: str, needles: tuple[str, ...], begin: int, stop: int) -> Ranges:
    """:func:`needle_lines`, remembered for the text at hand (see :class:`_Windows`)."""
    cache = _WINDOWS
    if cache.text is not lowered:
        cache.text = lowered
        cache.found = {}
    key = (needles, begin, stop)
    ranges = cache.found.get(key)
    if ranges is None:
        ranges = cache.found[key] = needle_lines(lowered, needles, begin, stop)
    return ranges


def windowed(pattern: re.Pattern[str], handle: Handler, needles: tuple[str, ...],
             exact: re.Pattern[str] | None = None) -> Finder:
    """A finder running ``pattern`` only over the lines holding a needle (the pattern must
    match within one line, a needle inside the match or before it on its line).

    With ``exact``, ``pattern`` is searched for in the lower-case copy (it is written in
    lower case, without IGNORECASE: much faster) and each match is matched again by
    ``exact`` (the same pattern with IGNORECASE) in the text, for ``handle`` to see the
    original characters.
    """

    def run(text: str, lowered: str, start: int, end: int) -> list[Span]:
        if exact is None:
            return find_all(pattern, handle, text, start, end)

        def confirm(m: re.Match[str]) -> Span | None:
            original = exact.match(text, m.start())
            return None if original is None else handle(original)

        return find_all(pattern, confirm, lowered, start, end)

    def find(text: str, lowered: str, present: tuple[str, ...], ranges: Ranges | None
             ) -> list[Span]:
        spans: list[Span] = []
        for begin, stop in [(0, len(text))] if ranges is None else ranges:
            windows = _lines_of(lowered, present, begin, stop) if needles else [(begin, stop)]
            for start, end in windows:
                spans += run(text, lowered, start, end)
        return spans

    return find


def lead(*words: str, before: str = r"[\w-]") -> str:
    """A regex for any of the literal ``words`` not preceded by a ``before`` character.

    The check is a lookbehind placed after the word, so that the pattern starts with a
    literal and the regex engine skips ahead to candidates (a leading lookbehind makes it
    try every position: 10 to 30 times slower).
    """
    return "(?:" + "|".join(f"{re.escape(w)}(?<!{before}{re.escape(w)})" for w in words) + ")"


def rule(
    pattern: str,
    kind: str | Callable[[re.Match[str]], str],
    needles: tuple[str, ...],
    *,
    flags: int = 0,
    group: str = "v",
    accept: Callable[[re.Match[str]], bool] | None = None,
) -> Rule:
    """A rule replacing group ``group`` of each accepted match (the whole match if the
    pattern has no such group), searched for on the lines holding a needle.

    Args:
        pattern: a one-line regex; every unbounded quantifier possessive; starting with a
            literal where it can (see :func:`lead`). With IGNORECASE its literals must be
            in lower case (it is searched for in the lower-case copy of the text).
        kind: the placeholder type, or a function of the match giving it.
        needles: lower-case literals, one of which is on the line of every match (empty:
            the whole text is searched).
        flags: regex flags.
        group: the group holding the secret.
        accept: a further check on the match (None: every match whose value is not a
            reference is a secret).
    """
    handle = _group_handler(kind, group, accept)
    if flags & re.IGNORECASE:
        fast = re.compile(pattern, flags & ~re.IGNORECASE)
        finder = windowed(fast, handle, needles, exact=re.compile(pattern, flags))
    else:
        finder = windowed(re.compile(pattern, flags), handle, needles)
    return Rule(finder, needles)


CI = re.IGNORECASE
CIM = re.IGNORECASE | re.MULTILINE
M = re.MULTILINE

# Token alphabets.
B64URL = r"A-Za-z0-9_\-"
TOKEN68 = r"A-Za-z0-9\-._~+/"
