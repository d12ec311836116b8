"""Bounding what a grammar costs before it reaches a child (issue 25).

A GBNF grammar is applied by the child at every step for every candidate token, in the one
loop that serves all its slots: a grammar that is expensive to apply stalls everyone on
that child, and the call cannot be stopped between tokens while one token takes minutes.
So a grammar is checked here, on the rules llama.cpp would build (:mod:`daemon.checks._gbnf`),
and refused with the reason when:

* it does not parse (with the line and column), has no root or uses an undefined rule;
* it expands to more than ``max_grammar_rules`` rules, nests groups deeper than
  ``max_grammar_depth`` or repeats anything more than ``max_grammar_repetition`` times;
* it repeats (``*``, ``+``, ``{m,}``, ``{m,n}`` with n > 1) something that can match the
  empty string: the parse stacks multiply with every character (``([a-z]* [a-z]*)+``);
* it is left-recursive (llama.cpp refuses those too, at the child's cost);
* one token may cost more than ``max_grammar_walks`` walks through its parse stacks
  (:mod:`daemon.checks._grammar_cost`): ambiguity that survives the rules above.

JSON schemas become grammars inside the child; :mod:`daemon.checks.schema` bounds those.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._gbnf import Chars, Grammar, GrammarSyntaxError, ParseLimits, Ref, Token, parse
from ._grammar_cost import TOKEN_CHARS, CostExceeded, walks_per_token

if TYPE_CHECKING:
    from ..config import Limits


class GrammarRefused(ValueError):
    """Why a grammar is refused, in words that end a sentence starting with its name."""


@dataclass(frozen=True)
class GrammarLimits:
    """The limits a grammar is checked against: the ``[limits]`` options
    ``max_grammar_rules``, ``max_grammar_depth``, ``max_grammar_repetition`` and
    ``max_grammar_walks`` (:meth:`of`); the defaults are theirs."""

    max_rules: int = 1024
    max_depth: int = 32
    max_repetition: int = 1000
    max_walks: int = 20_000

    @classmethod
    def of(cls, limits: Limits) -> GrammarLimits:
        """The grammar limits among ``limits`` (``limits.max_grammar_*``)."""
        return cls(limits.max_grammar_rules, limits.max_grammar_depth,
                   limits.max_grammar_repetition, limits.max_grammar_walks)

    @property
    def budget(self) -> int:
        """States the cost count may visit (bounds the check's own time)."""
        return 100_000


def nullable_rules(g: Grammar) -> list[bool]:
    """Which rules can match the empty string (a fixpoint over the alternatives)."""
    empty = [False] * len(g.rules)
    changed = True
    while changed:
        changed = False
        for r, alts in enumerate(g.rules):
            if not empty[r] and any(all(_empty(e, empty) for e in seq) for seq in alts):
                empty[r] = changed = True
    return empty


def _empty(e: Chars | Token | Ref, empty: list[bool]) -> bool:
    return isinstance(e, Ref) and empty[e.rule]


def _left_recursive(g: Grammar, empty: list[bool]) -> str | None:
    """The name of a rule that can reach itself before consuming anything, if any."""
    # Rule r "starts with" rule s when s appears in an alternative of r after only nullable
    # elements; a cycle in that relation is left recursion.
    starts: list[set[int]] = []
    for alts in g.rules:
        first: set[int] = set()
        for seq in alts:
            for e in seq:
                if isinstance(e, Ref):
                    first.add(e.rule)
                if not _empty(e, empty):
                    break
        starts.append(first)
    state = [0] * len(g.rules)  # 0 new, 1 on the path, 2 done
    for top in range(len(g.rules)):
        if state[top]:
            continue
        path: list[tuple[int, list[int]]] = [(top, sorted(starts[top]))]
        state[top] = 1
        while path:
            r, todo = path[-1]
            if not todo:
                state[r] = 2
                path.pop()
                continue
            s = todo.pop()
            if state[s] == 1:
                return g.names[s]
            if state[s] == 0:
                state[s] = 1
                path.append((s, sorted(starts[s])))
    return None


def check_rules(g: Grammar, limits: GrammarLimits) -> None:
    """Refuse rules that are costly to apply (see the module's list).

    Raises:
        GrammarRefused: naming the construct and the limit.
    """
    empty = nullable_rules(g)
    for rep in g.repetitions:
        if (rep.high is None or rep.high > 1) and all(_empty(e, empty) for e in rep.body):
            raise GrammarRefused(
                f"repeats something that can match the empty string (at {rep.where}): "
                "llama.cpp's parse stacks multiply with every character of such a "
                "repetition; make its body consume at least one character")
    name = _left_recursive(g, empty)
    if name is not None:
        raise GrammarRefused(f"is left-recursive (rule '{name}' can reach itself without "
                             "consuming a character), which llama.cpp refuses")
    try:
        walks_per_token(g, limit=limits.max_walks, budget=limits.budget)
    except CostExceeded as exc:
        if exc.walks is not None:
            raise GrammarRefused(
                f"is too ambiguous: a token of {TOKEN_CHARS} characters may take more than "
                f"{limits.max_walks} walks through its parse stacks "
                "(limits.max_grammar_walks); alternatives or repetitions that can match "
                "the same text multiply the child's work for every token") from None
        raise GrammarRefused(
            f"is too complex to check: more than {limits.budget} parse states "
            "within one token") from None


def check_grammar(text: str, limits: GrammarLimits) -> Grammar:
    """Parse ``text`` as llama.cpp would and refuse it if it is costly to apply.

    Raises:
        GrammarRefused: naming the reason (and the option that sets the limit).
    """
    try:
        g = parse(text, ParseLimits(limits.max_rules, limits.max_depth,
                                    limits.max_repetition))
    except GrammarSyntaxError as exc:
        message = str(exc)
        for what, option in (("rules", "max_grammar_rules"), ("nest deeper", "max_grammar_depth"),
                             ("repetition count", "max_grammar_repetition"),
                             ("expanding past", "max_grammar_rules")):
            if what in message:
                message += f" (limits.{option})"
                break
        raise GrammarRefused(f"is not a grammar llama.cpp can take: {message}") from None
    check_rules(g, limits)
    return g
