"""A GBNF parser that builds the rules llama.cpp's grammar engine would build.

llama.cpp (``src/llama-grammar.cpp``, ``llama_grammar_parser``) turns a grammar's text into
flat rules: each rule is a list of alternatives, each alternative a sequence of terminals
(a character class, a literal's characters, a token) and references to other rules. Groups
become rules of their own; repetitions are rewritten into rules too (``S*`` becomes
``S' ::= S S' |``, ``S{m,n}`` copies ``S`` m times and chains n-m optional rules). We
rebuild exactly those rules, because the cost of applying a grammar (what
:mod:`daemon.checks._grammar_cost` estimates) depends on their shape, not on the text's.

The parser also records every repetition's body, so that a repetition over something that
can match the empty string (the shape that stalls the engine) can be refused by name.
Errors carry the line and column they were found at.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_CODE_POINT = 0x10FFFF


class GrammarSyntaxError(ValueError):
    """The text is not a grammar llama.cpp would accept, or exceeds a limit while parsing."""


@dataclass(frozen=True)
class Chars:
    """A character class (a literal's character is a class of one): matches a code point
    inside one of ``ranges`` (inclusive), or outside all of them when ``negated``."""

    ranges: tuple[tuple[int, int], ...]
    negated: bool = False


@dataclass(frozen=True)
class Token:
    """A token terminal (``<[id]>``, ``!<...>``): matches whole tokens, never characters."""


@dataclass(frozen=True)
class Ref:
    """A reference to rule ``rule``."""

    rule: int


Element = Chars | Token | Ref
Sequence = list[Element]


@dataclass(frozen=True)
class Repetition:
    """A repetition as written: its body, its bounds (``high`` None: unbounded) and where."""

    body: tuple[Element, ...]
    low: int
    high: int | None
    where: str


@dataclass
class Grammar:
    """The rules (index: rule id; each a list of alternatives), their names, the root."""

    rules: list[list[Sequence]] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    defined: list[bool] = field(default_factory=list)
    repetitions: list[Repetition] = field(default_factory=list)
    root: int = -1

    def elements(self) -> int:
        """How many elements all the rules hold together."""
        return sum(len(seq) + 1 for alts in self.rules for seq in alts)


@dataclass(frozen=True)
class ParseLimits:
    """What parsing refuses past: rules after expansion, group nesting, repetition bounds."""

    max_rules: int
    max_depth: int
    max_repetition: int


_ESCAPES = {"n": 10, "r": 13, "t": 9, "\\": 92, '"': 34, "[": 91, "]": 93}
_HEX = {"x": 2, "u": 4, "U": 8}


def _is_word(c: str) -> bool:
    return c.isascii() and (c.isalnum() or c == "-")


class _Parser:
    def __init__(self, text: str, limits: ParseLimits) -> None:
        self.text = text
        self.pos = 0
        self.limits = limits
        self.g = Grammar()
        self.ids: dict[str, int] = {}
        self.depth = 0

    # -- plumbing -------------------------------------------------------------------------

    def where(self, at: int) -> str:
        line = self.text.count("\n", 0, at) + 1
        return f"line {line}, column {at - (self.text.rfind(chr(10), 0, at) + 1) + 1}"

    def fail(self, what: str, at: int | None = None) -> GrammarSyntaxError:
        return GrammarSyntaxError(f"{what} at {self.where(self.pos if at is None else at)}")

    def peek(self, k: int = 0) -> str:
        i = self.pos + k
        return self.text[i] if i < len(self.text) else ""

    def space(self, newline_ok: bool) -> None:
        text = self.text
        while self.pos < len(text):
            c = text[self.pos]
            if c == "#":
                while self.pos < len(text) and text[self.pos] not in "\r\n":
                    self.pos += 1
            elif c in " \t" or (newline_ok and c in "\r\n"):
                self.pos += 1
            else:
                break

    def new_rule(self, name: str) -> int:
        if len(self.g.rules) >= self.limits.max_rules:
            raise GrammarSyntaxError(
                f"expands to more than {self.limits.max_rules} rules (groups and repetitions "
                "count as rules, as llama.cpp builds them)")
        self.g.rules.append([])
        self.g.names.append(name)
        self.g.defined.append(False)
        return len(self.g.rules) - 1

    def symbol(self, name: str) -> int:
        if name not in self.ids:
            self.ids[name] = self.new_rule(name)
        return self.ids[name]

    def name(self) -> str:
        start = self.pos
        while self.pos < len(self.text) and _is_word(self.text[self.pos]):
            self.pos += 1
        if self.pos == start:
            raise self.fail("expecting a rule name")
        return self.text[start:self.pos]

    def char(self) -> int:
        c = self.peek()
        if not c:
            raise self.fail("unexpected end of input")
        if c != "\\":
            self.pos += 1
            return ord(c)
        e = self.peek(1)
        if e in _HEX:
            digits = self.text[self.pos + 2:self.pos + 2 + _HEX[e]]
            value, n = 0, 0
            for d in digits:
                if d not in "0123456789abcdefABCDEF":
                    break
                value, n = value * 16 + int(d, 16), n + 1
            if n != _HEX[e]:
                raise self.fail(f"expecting {_HEX[e]} hex digits")
            self.pos += 2 + n
            return value
        if e in _ESCAPES:
            self.pos += 2
            return _ESCAPES[e]
        raise self.fail("unknown escape")

    # -- grammar --------------------------------------------------------------------------

    def grammar(self) -> Grammar:
        self.space(True)
        while self.pos < len(self.text):
            self.rule()
        for i, ok in enumerate(self.g.defined):
            if not ok:
                raise GrammarSyntaxError(f"rule '{self.g.names[i]}' is used but not defined")
        if "root" not in self.ids:
            raise GrammarSyntaxError("it has no 'root' rule")
        self.g.root = self.ids["root"]
        return self.g

    def rule(self) -> None:
        name = self.name()
        self.space(False)
        if self.text[self.pos:self.pos + 3] != "::=":
            raise self.fail("expecting '::='")
        self.pos += 3
        self.space(True)
        rule_id = self.symbol(name)
        self.alternates(name, rule_id, nested=False)
        if self.peek() == "\r":
            self.pos += 2 if self.peek(1) == "\n" else 1
        elif self.peek() == "\n":
            self.pos += 1
        elif self.pos < len(self.text):
            raise self.fail("expecting a newline or the end")
        self.space(True)

    def alternates(self, name: str, rule_id: int, *, nested: bool) -> None:
        alts = [self.sequence(name, nested)]
        while self.peek() == "|":
            self.pos += 1
            self.space(True)
            alts.append(self.sequence(name, nested))
        # A rule defined twice gets the later alternatives added, as llama.cpp does.
        self.g.rules[rule_id] = self.g.rules[rule_id] + alts
        self.g.defined[rule_id] = True

    def sequence(self, name: str, nested: bool) -> Sequence:
        seq: Sequence = []
        last = len(seq)  # where the last symbol (what a repetition applies to) starts
        while self.pos < len(self.text):
            c = self.peek()
            start = self.pos
            if c == '"':
                self.pos += 1
                last = len(seq)
                while self.peek() != '"':
                    cp = self.char()
                    seq.append(Chars(((cp, cp),)))
                self.pos += 1
            elif c == "[":
                self.pos += 1
                negated = self.peek() == "^"
                self.pos += negated
                ranges: list[tuple[int, int]] = []
                while self.peek() != "]":
                    lo = hi = self.char()
                    if self.peek() == "-" and self.peek(1) not in ("]", ""):
                        self.pos += 1
                        hi = self.char()
                    ranges.append((lo, hi))
                self.pos += 1
                last = len(seq)
                seq.append(Chars(tuple(ranges), negated))
            elif c in "<!":
                self.pos += 1 + (c == "!")
                end = self.text.find(">", self.pos)
                if end < 0:
                    raise self.fail("expecting '>'", start)
                self.pos = end + 1
                last = len(seq)
                seq.append(Token())
            elif _is_word(c):
                ref = self.symbol(self.name())
                last = len(seq)
                seq.append(Ref(ref))
            elif c == "(":
                self.pos += 1
                self.space(True)
                self.depth += 1
                if self.depth > self.limits.max_depth:
                    raise self.fail(f"groups nest deeper than {self.limits.max_depth}")
                sub = self.new_rule(name)
                self.alternates(name, sub, nested=True)
                self.depth -= 1
                if self.peek() != ")":
                    raise self.fail("expecting ')'")
                self.pos += 1
                last = len(seq)
                seq.append(Ref(sub))
            elif c == ".":
                self.pos += 1
                last = len(seq)
                seq.append(Chars(((0, MAX_CODE_POINT),)))
            elif c in "*+?{":
                low, high = self.bounds()
                if last == len(seq):
                    raise self.fail("a repetition with nothing before it", start)
                self.repeat(name, seq, last, (low, high), start)
                self.space(nested)
                continue
            else:
                break
            self.space(nested)
        return seq

    def bounds(self) -> tuple[int, int | None]:
        c = self.peek()
        self.pos += 1
        if c != "{":
            return {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
        self.space(True)
        low = self.integer()
        self.space(True)
        high: int | None = low
        if self.peek() == ",":
            self.pos += 1
            self.space(True)
            high = self.integer() if self.peek().isdigit() else None
            self.space(True)
        if self.peek() != "}":
            raise self.fail("expecting '}'")
        self.pos += 1
        if high is not None and high < low:
            raise self.fail(f"a repetition {{{low},{high}}} with its maximum below its minimum")
        return low, high

    def integer(self) -> int:
        start = self.pos
        while self.peek().isascii() and self.peek().isdigit():
            self.pos += 1
        if start == self.pos:
            raise self.fail("expecting a number")
        digits = self.text[start:self.pos]
        # Compared as text first: a 10000-digit count must not become a huge int.
        if len(digits) > 9 or int(digits) > self.limits.max_repetition:
            raise self.fail(f"a repetition count {digits[:12]} above "
                            f"{self.limits.max_repetition}", start)
        return int(digits)

    def repeat(self, name: str, seq: Sequence, last: int, bounds: tuple[int, int | None],
               at: int) -> None:
        """Rewrite ``seq[last:]`` repeated ``low..high`` times the way llama.cpp does."""
        low, high = bounds
        body = seq[last:]
        self.g.repetitions.append(Repetition(tuple(body), low, high, self.where(at)))
        if len(body) * max(low, 1) > 64 * self.limits.max_rules:
            raise self.fail(f"a repetition expanding past {64 * self.limits.max_rules} "
                            "elements", at)
        del seq[last:]
        for _ in range(low):
            seq.extend(body)
        optional = 1 if high is None else high - low
        previous = -1
        for i in range(optional):
            rec = self.new_rule(name)
            alt: Sequence = list(body)
            if high is None:
                alt.append(Ref(rec))
            elif i > 0:
                alt.append(Ref(previous))
            self.g.rules[rec] = [alt, []]
            self.g.defined[rec] = True
            previous = rec
        if optional:
            seq.append(Ref(previous))


def parse(text: str, limits: ParseLimits) -> Grammar:
    """The rules llama.cpp would build from ``text``.

    Raises:
        GrammarSyntaxError: a syntax error (with line and column), an undefined rule, no
            root, or a limit passed while parsing.
    """
    return _Parser(text, limits).grammar()
