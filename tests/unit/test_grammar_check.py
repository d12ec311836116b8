"""The grammar and schema checks of issue 25: the shapes that stall llama.cpp's grammar
engine are refused (naming why and the limit), while the grammars and schemas people use
(yes/no, JSON, lists, arithmetic, typical structured outputs) pass, quickly."""

from __future__ import annotations

import time

import pytest

from daemon.checks._gbnf import ParseLimits, parse
from daemon.checks._grammar_cost import walks_per_token
from daemon.checks.grammar import GrammarLimits, GrammarRefused, check_grammar, nullable_rules
from daemon.checks.schema import check_schema, json_depth, regex_to_gbnf

LIMITS = GrammarLimits()

# The issue's 67-character grammar: a repetition over a sequence of nullable repetitions.
ISSUE = "root ::= ([a-z]* [a-z]* [a-z]* [a-z]* [a-z]* [a-z]* [a-z]* [a-z]*)+"

# Grammars written for these tests in the shapes people use.
JSON = r"""
root    ::= element
element ::= ws value ws
value   ::= object | array | string | number | "true" | "false" | "null"
object  ::= "{" ws ( member ( "," ws member )* )? "}"
member  ::= string ws ":" element
array   ::= "[" ws ( element ( "," element )* )? "]"
string  ::= "\"" ( [^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} ) )* "\""
number  ::= "-"? ( "0" | [1-9] [0-9]{0,15} ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
ws      ::= [ \t\n]{0,20}
"""
LIST = 'root ::= item+\nitem ::= "- " [^\\n]+ "\\n"'
ARITHMETIC = """
root  ::= expr
expr  ::= term (("+" | "-") term)*
term  ::= factor (("*" | "/") factor)*
factor ::= number | "(" expr ")"
number ::= [0-9]+ ("." [0-9]+)?
"""
SENTENCES = 'root ::= sentence (" " sentence)*\nsentence ::= [A-Z] [a-z]* ("," " " [a-z]+)* "."'
ENUM = "root ::= " + " | ".join(f'"{w}{i}"' for i, w in enumerate(["ok", "warn", "crit"] * 100))
CSV = 'root ::= row ("\\n" row){0,99}\nrow ::= field ("," field){0,15}\nfield ::= [^,\\n]*'


@pytest.mark.parametrize("grammar", [
    'root ::= "yes" | "no"', JSON, LIST, ARITHMETIC, SENTENCES, CSV, ENUM,
    'root ::= [0-9]{3} "-" [0-9]{4}',
    'root ::= "a" # a comment\n',
    'root ::= ("x" | "y")? "z"',
])
def test_usual_grammars_pass_quickly(grammar: str) -> None:
    """What people write passes, each checked in well under a second of CPU."""
    # The check's own CPU time (it runs in this thread alone): a busy machine's wait for
    # a core is not the check's cost, and it failed the wall-clock bound of a loaded run.
    started = time.process_time()
    check_grammar(grammar, LIMITS)
    assert time.process_time() - started < 1.0


@pytest.mark.parametrize(("grammar", "why"), [
    (ISSUE, "repeats something that can match the empty string"),
    ('root ::= ("a"?)*', "repeats something that can match the empty string"),
    ('root ::= x+\nx ::= "b"* "c"?', "repeats something that can match the empty string"),
    ('root ::= ([a-z]* [a-z]*){2,50}', "repeats something that can match the empty string"),
    ('root ::= root "a" | "b"', "left-recursive"),
    ('root ::= x\nx ::= "a"? x "b" | "c"', "left-recursive"),
    ('root ::= ("a" | "a" | "a" | "a")+', "too ambiguous"),
    ('root ::= ' + ' '.join(['[a-z]*'] * 8), "too ambiguous"),
    ('root ::= x+\nx ::= y+\ny ::= [a-z]+', "too ambiguous"),
    ('root ::= ([a-z]+ | [a-z]+ "s")+', "too ambiguous"),
])
def test_costly_shapes_are_refused(grammar: str, why: str) -> None:
    """The issue's grammar and its variants (nullable bodies, ambiguity, left recursion)."""
    with pytest.raises(GrammarRefused, match=why):
        check_grammar(grammar, LIMITS)


def test_ambiguity_is_counted_per_token() -> None:
    """The walk count is the number of ways a 12-character token splits: 2^12 - 1 for
    ([a-z]+ [a-z]+)+, so a limit below it refuses the grammar and one above lets it by."""
    g = parse("root ::= ([a-z]+ [a-z]+)+", ParseLimits(100, 10, 100))
    assert walks_per_token(g, limit=10**9, budget=10**6) == 4095
    with pytest.raises(GrammarRefused, match=r"limits.max_grammar_walks"):
        check_grammar("root ::= ([a-z]+ [a-z]+)+", GrammarLimits(max_walks=4000))
    check_grammar("root ::= ([a-z]+ [a-z]+)+", GrammarLimits(max_walks=5000))


@pytest.mark.parametrize(("grammar", "limits", "why"), [
    ('root ::= "a"{1001}', LIMITS, r"repetition count 1001 above 1000 at line 1.*"
                                   r"max_grammar_repetition"),
    ('root ::= ' + "(" * 40 + '"a"' + ")" * 40, LIMITS, r"nest deeper than 32.*max_grammar_depth"),
    ('root ::= "a"{0,300}', GrammarLimits(max_rules=100),
     r"more than 100 rules.*max_grammar_rules"),
    ('root ::= ("yes"', LIMITS, r"expecting '\)' at line 1, column 16"),
    ('root ::= x', LIMITS, "rule 'x' is used but not defined"),
    ('start ::= "a"', LIMITS, "no 'root' rule"),
    ('root ::= "a" ::=', LIMITS, "expecting a newline or the end at line 1, column 14"),
    ('root ::= "\\q"', LIMITS, "unknown escape"),
    ('root ::= "a"{5,2}', LIMITS, "maximum below its minimum"),
    ('root ::= "a"{99999999999999999999}', LIMITS, "repetition count 999999999999 above"),
])
def test_limits_and_syntax_are_named(grammar: str, limits: GrammarLimits, why: str) -> None:
    """Sizes past the options and syntax errors say what, where and which option."""
    with pytest.raises(GrammarRefused, match=why):
        check_grammar(grammar, limits)


def test_rules_are_built_as_llama_cpp_builds_them() -> None:
    """Groups and repetitions become rules: S{1,3} is S then a chain of two optional
    rules; S* a self-referencing one; nullability follows."""
    g = parse('root ::= "a"{1,3} b*\nb ::= "b"', ParseLimits(100, 10, 100))
    # root, {1,3}'s two optional copies, b, and b*'s rule (named after root, as llama.cpp)
    assert g.names == ["root", "root", "root", "b", "root"]
    assert nullable_rules(g) == [False, True, True, False, True]
    assert len(g.rules[1]) == 2 and g.rules[1][1] == []  # S'(1) ::= S |


@pytest.mark.parametrize(("grammar", "why"), [
    # Many overlapping alternatives: the check itself is bounded (its states, its work).
    ("root ::= (" + " | ".join(f'"{chr(97 + i % 26)}{i}" [a-z0-9]{{0,5}}'
                               for i in range(150)) + ")+", "too complex to check"),
    ("root ::= (" + " | ".join(f'"x{i:05d}"' for i in range(6000)) + ")+", "too ambiguous"),
    ("root ::= " + " | ".join(f"r{i}" for i in range(100)) + "\n" +
     "\n".join(f'r{i} ::= "{i}" (root | [a-z]{{1,4}})' for i in range(100)), "too ambiguous"),
])
def test_hostile_sizes_stay_cheap_to_check(grammar: str, why: str) -> None:
    """Grammars built to make the check itself slow are refused within seconds of CPU (its
    own, as above)."""
    started = time.process_time()
    with pytest.raises(GrammarRefused, match=why):
        check_grammar(grammar, LIMITS)
    assert time.process_time() - started < 5.0


SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 5000},
    "email": {"type": "string", "pattern": r"^[a-z0-9._-]+@[a-z0-9.-]+\.[a-z]{2,6}$"},
    "phone": {"type": "string", "pattern": r"^\d{3}-\d{4}$"},
    "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]},
             "maxItems": 10},
    "address": {"type": "object", "properties": {"city": {"type": "string"}}},
}, "required": ["name"]}


def test_typical_schemas_pass() -> None:
    """A structured output with patterns, bounds and nesting passes; so does one 64 deep."""
    check_schema(SCHEMA, LIMITS, 64)
    deep: dict[str, object] = {"type": "string"}
    for _ in range(31):  # 2 JSON levels each: {"items": {...}}
        deep = {"type": "array", "items": deep}
    assert json_depth(deep, 100) == 32
    check_schema(deep, LIMITS, 64)


def test_deep_schema_is_refused_without_recursion() -> None:
    """300 levels (past the JSON encoder's 254) is refused by the depth limit, counted
    without recursing (a value nested past Python's recursion limit too)."""
    deep: object = {"type": "string"}
    for _ in range(300):
        deep = {"type": "array", "items": deep}
    with pytest.raises(GrammarRefused, match=r"nests deeper than 64 levels "
                                             r"\(limits.max_schema_depth\)"):
        check_schema(deep, LIMITS, 64)
    very: object = []
    for _ in range(5000):
        very = [very]
    assert json_depth(very, 64) == 65


@pytest.mark.parametrize(("schema", "why"), [
    ({"type": "string", "pattern": "^(a*)*$"},
     r"pattern at /pattern that repeats something that can match the empty string"),
    ({"properties": {"x": {"type": "string", "pattern": "^([a-z]|[a-z]|\\w)+$"}}},
     r"pattern at /properties/x/pattern that is too ambiguous"),
    ({"type": "array", "minItems": 5000}, r"minItems 5000 at /: the limit is 1000"),
    ({"items": [{"minLength": 1e9}]}, r"minLength 1e\+09 at /items/0"),
    ({"type": "string", "pattern": "^(?=a)b$"}, r"llamad cannot check: .*group syntax"),
])
def test_costly_schemas_are_refused(schema: dict[str, object], why: str) -> None:
    """Patterns are checked as grammars; required repetitions are bounded."""
    with pytest.raises(GrammarRefused, match=why):
        check_schema(schema, LIMITS, 64)


def test_unanchored_pattern_is_not_a_grammar() -> None:
    """llama.cpp's converter turns only ^...$ patterns into grammar (others: any string),
    so an unanchored one costs nothing and passes."""
    check_schema({"type": "string", "pattern": "(a*)*"}, LIMITS, 64)


def test_regex_translation() -> None:
    """Classes, escapes and quantifiers keep their meaning in GBNF."""
    assert parse("root ::= " + regex_to_gbnf(r"[a-c\d-]+\.(?:x|y){2}"),
                 ParseLimits(100, 10, 100)).root == 0
    with pytest.raises(ValueError, match="backreference"):
        regex_to_gbnf(r"(a)\1")
