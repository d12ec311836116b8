"""An upper bound on the work llama.cpp's grammar engine does for one token.

Why a grammar can stall a child: to mask the vocabulary at each step, llama.cpp
(``llama_grammar_reject_candidates_for_stack`` in ``src/llama-grammar.cpp``) walks every
candidate token's characters through the grammar's parse stacks. After each character it
advances the stack into every stack the grammar allows next (``llama_grammar_advance_stack``)
and recurses into each of them separately: nothing merges two walks that reach the same
place by different routes. A token of L characters therefore costs as many walks as the
grammar has ways to parse its characters, and an ambiguous grammar has exponentially many:
``root ::= ([a-z]* [a-z]*)+`` can split a run of letters between its parts in k^L ways, so
an 8-letter token that is finally rejected costs millions of walks, for every such token of
the vocabulary, at every step (issue 25: 45-118 s per request, every slot of the child
waiting, since llama-server samples all slots in one loop).

This module counts those walks for the worst string of :data:`TOKEN_CHARS` characters, on
the rules llama.cpp builds (:mod:`daemon.checks._gbnf`), without a vocabulary:

* a walk is a stack of positions, as llama.cpp's; the next character is chosen once for all
  the walks that branched from one place (so alternatives that need different characters,
  as JSON's ``,`` ``:`` ``}`` after a value, do not add up), and each walk then picks its
  own worst continuation (an over-estimate, never an under-estimate);
* every position is tried as a starting point with an unknown context below it: when a walk
  returns from the rule it started in, it continues after every place that rule is used;
  stacks deeper than :data:`STACK_DEPTH` forget their bottom the same way. Both only add
  walks, so the count stays an upper bound for whatever prefix the model has generated.

The count itself is bounded: past ``budget`` distinct (stack, length) states the grammar is
refused as too complex to check.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass

from ._gbnf import MAX_CODE_POINT, Chars, Grammar, Ref, Token

TOKEN_CHARS = 12
"""Characters of the token the count is made for: llama.cpp vocabularies hold many tokens
of this length (runs of letters, spaces, punctuation)."""

STACK_DEPTH = 3
"""Positions a stack keeps before its bottom is forgotten (and taken as any context)."""

Stack = tuple[int, ...]
_FORGOTTEN = -1  # at a stack's bottom: the positions below it were forgotten
_RETURN = -2  # (_RETURN, rule): returned from rule into a forgotten context


class CostExceeded(Exception):
    """The count passed the limit (``walks``), or the states to count passed the budget."""

    def __init__(self, walks: int | None, states: int | None = None) -> None:
        super().__init__(walks, states)
        self.walks = walks
        self.states = states


@dataclass
class _Flat:
    """The rules laid out as llama.cpp lays them out: alternatives one after the other,
    each ended by None (llama.cpp's END/ALT), addressed by index."""

    elements: list[Chars | Token | Ref | None]
    rule_of: list[int]
    starts: list[list[int]]
    callers: list[list[int]]
    masks: list[int]


def _flatten(g: Grammar) -> _Flat:
    elements: list[Chars | Token | Ref | None] = []
    rule_of: list[int] = []
    starts: list[list[int]] = [[] for _ in g.rules]
    callers: list[list[int]] = [[] for _ in g.rules]
    for r, alts in enumerate(g.rules):
        for seq in alts:
            starts[r].append(len(elements))
            for e in seq:
                if isinstance(e, Ref):
                    callers[e.rule].append(len(elements))
                elements.append(e)
                rule_of.append(r)
            elements.append(None)
            rule_of.append(r)
    bounds = sorted({0, MAX_CODE_POINT + 1} | {b for e in elements if isinstance(e, Chars)
                                                for lo, hi in e.ranges for b in (lo, hi + 1)})
    full = (1 << (len(bounds) - 1)) - 1
    masks = []
    for item in elements:
        mask = 0
        if isinstance(item, Chars):
            for lo, hi in item.ranges:
                if lo <= hi:
                    k0, k1 = bisect_left(bounds, lo), bisect_left(bounds, hi + 1)
                    mask |= ((1 << k1) - 1) ^ ((1 << k0) - 1)
            if item.negated:
                mask = full & ~mask
        masks.append(mask)
    return _Flat(elements, rule_of, starts, callers, masks)


Regions = dict[int, int]
"""Walks per set of next characters: keys are disjoint character masks (the characters
outside every key add nothing)."""


def _add(a: Regions, b: Regions) -> Regions:
    """Walks of two groups of stacks together, per next character."""
    return _combine(a, b, lambda x, y: x + y)


def _most(a: Regions, b: Regions) -> Regions:
    """The larger of two alternatives' walks, per next character."""
    return _combine(a, b, max)


def _combine(a: Regions, b: Regions, op: Callable[[int, int], int]) -> Regions:
    if not a:
        return b
    if not b:
        return a
    out: Regions = {}
    rest_b = dict(b)
    for ma, wa in a.items():
        left = ma
        for mb in list(rest_b):
            both = left & mb
            if not both:
                continue
            wb = rest_b.pop(mb)
            out[both] = op(wa, wb)
            if mb & ~both:
                rest_b[mb & ~both] = wb
            left &= ~both
            if not left:
                break
        if left:
            out[left] = op(wa, 0)
    for mb, wb in rest_b.items():
        out[mb] = op(0, wb)
    return out


class _Counter:
    def __init__(self, g: Grammar, limit: int, budget: int) -> None:
        self.f = _flatten(g)
        self.root = g.root
        self.limit = limit
        self.budget = budget
        self.next_memo: dict[Stack, list[Stack]] = {}
        self.walk_memo: dict[tuple[Stack, int], int] = {}
        self.worst_memo: dict[tuple[Stack, int], int] = {}
        self.return_memo: dict[tuple[int, int], Regions] = {}
        self.work = 0  # region operations so far, bounded by 10 x budget
        self.returning: set[tuple[int, int]] = set()

    @staticmethod
    def _ret(rule: int) -> Stack:
        """The state "returned from ``rule`` into a context the stack no longer knows"."""
        return (_RETURN, rule)

    def _popped(self, rest: Stack, finished: int) -> Stack | None:
        """``rest`` once the position ``finished`` ended its alternative: None when the
        stack is empty (the grammar may end here: no character continues it), a return
        into a forgotten context when only that is left."""
        if not rest:
            return None
        if rest == (_FORGOTTEN,):
            return self._ret(self.f.rule_of[finished])
        return rest

    def expand(self, start: Stack) -> list[Stack]:
        """Every stack ``start`` advances to whose top is a terminal (llama.cpp's
        ``llama_grammar_advance_stack``), and the returns into a forgotten context it
        reaches (left for :meth:`regions` to continue in each possible caller)."""
        f = self.f
        todo = [start]
        seen: set[Stack] = set()
        out: list[Stack] = []
        steps = 0
        while todo:
            s = todo.pop()
            steps += 1
            if steps > self.budget:
                raise CostExceeded(None, steps)
            # llama.cpp merges identical stacks. Two stacks that look identical here only
            # because their bottoms were forgotten may differ below: they are kept apart
            # (counted twice), so forgetting never lowers the count. (Without left
            # recursion and nullable repetitions, refused before, nothing here cycles.)
            if s[0] not in (_FORGOTTEN, _RETURN):
                if s in seen:
                    continue
                seen.add(s)
            top = s[-1]
            ref = f.elements[top]
            if s[0] == _RETURN or not isinstance(ref, Ref):
                if s[0] in (_FORGOTTEN, _RETURN) or s not in out:
                    out.append(s)
                continue
            base = s[:-1]
            after = top + 1
            if f.elements[after] is not None:
                base = (*base, after)
            for alt in f.starts[ref.rule]:
                nxt: Stack | None
                if f.elements[alt] is None:
                    nxt = self._popped(base, top)
                elif len(base) < STACK_DEPTH:
                    nxt = (*base, alt)
                else:  # forget the bottom: it becomes any context
                    nxt = (_FORGOTTEN, *base[-STACK_DEPTH + 2:], alt)
                if nxt is not None:
                    todo.append(nxt)
        return out

    def callers_of(self, ret: Stack) -> list[Stack]:
        """Where a return from rule ``ret[1]`` may continue: after each of its uses."""
        f = self.f
        return [(_FORGOTTEN, q + 1) if f.elements[q + 1] is not None
                else self._ret(f.rule_of[q]) for q in f.callers[ret[1]]]

    def after_char(self, s: Stack) -> Stack | None:
        """Where a walk continues once the terminal on top of ``s`` matched: the stack to
        advance (None: it is empty, the grammar may end there)."""
        top = s[-1]
        rest = s[:-1]
        if self.f.elements[top + 1] is not None:
            rest = (*rest, top + 1)
        return self._popped(rest, top)

    def advanced(self, start: Stack) -> list[Stack]:
        """:meth:`expand` of ``start``, remembered."""
        found = self.next_memo.get(start)
        if found is None:
            found = self.next_memo[start] = self.expand(start)
        return found

    def walks(self, s: Stack, chars: int) -> int:
        """Walks for a token of ``chars`` characters reaching ``s`` (its own one included)."""
        key = (s, chars)
        found = self.walk_memo.get(key)
        if found is not None:
            return found
        total = 1
        if chars > 1 and (nxt := self.after_char(s)) is not None:
            total += self.worst_from(nxt, chars - 1)
        if total > self.limit:
            raise CostExceeded(total)
        self.walk_memo[key] = total
        return total

    def worst_from(self, start: Stack, chars: int) -> int:
        """The most walks one next character makes among the stacks ``start`` advances
        to (remembered per start: many stacks continue from the same one)."""
        key = (start, chars)
        found = self.worst_memo.get(key)
        if found is None:
            if len(self.worst_memo) > self.budget:
                raise CostExceeded(None, len(self.worst_memo))
            found = self.worst_memo[key] = self.worst(self.advanced(start), chars)
        return found

    def regions(self, stacks: list[Stack], chars: int) -> Regions:
        """The walks ``stacks`` make together, per next character. A return into a
        forgotten context continues in one of the rule's callers (the real context is
        one of them): the most walks among them counts, not their sum."""
        out: Regions = {}
        for s in stacks:
            self.work += len(out) + 1
            if self.work > 10 * self.budget:
                raise CostExceeded(None, self.work // 10)
            if s[0] == _RETURN:
                out = _add(out, self.returned(s, chars))
                continue
            mask = self.f.masks[s[-1]]
            if mask:  # (a token terminal has none: no character continues it)
                out = _add(out, {mask: self.walks(s, chars)})
        return out

    def returned(self, ret: Stack, chars: int) -> Regions:
        key = (ret[1], chars)
        found = self.return_memo.get(key)
        if found is not None:
            return found
        if key in self.returning:  # a cycle of returns adds no other continuation
            return {}
        self.returning.add(key)
        try:
            best: Regions = {}
            for caller in self.callers_of(ret):
                stacks = [caller] if caller[0] == _RETURN else self.advanced(caller)
                best = _most(best, self.regions(stacks, chars))
        finally:
            self.returning.discard(key)
        self.return_memo[key] = best
        return best

    def worst(self, stacks: list[Stack], chars: int) -> int:
        """The most walks one next character makes among ``stacks`` together."""
        return max(self.regions(stacks, chars).values(), default=0)

    def count(self) -> int:
        f = self.f
        # llama.cpp's initial stacks: what a reference to root advances to.
        f.elements.extend((Ref(self.root), None))
        f.rule_of.extend((self.root, self.root))
        f.masks.extend((0, 0))
        start = self.expand((len(f.elements) - 2,))
        best = self.worst(start, TOKEN_CHARS)
        # Then every stack the grammar can reach (as kept: at most STACK_DEPTH deep).
        seen = set(start)
        todo = list(start)
        while todo:
            s = todo.pop()
            if s[0] == _RETURN:
                nexts = [t for c in self.callers_of(s)
                         for t in ([c] if c[0] == _RETURN else self.advanced(c))]
            else:
                best = max(best, self.walks(s, TOKEN_CHARS))
                nxt = self.after_char(s)
                nexts = [] if nxt is None else self.advanced(nxt)
            for t in nexts:
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
            if len(seen) > self.budget:
                raise CostExceeded(None, len(seen))
        return best


def walks_per_token(g: Grammar, *, limit: int, budget: int) -> int:
    """The most walks llama.cpp may make for one token of :data:`TOKEN_CHARS` characters.

    Raises:
        CostExceeded: past ``limit`` walks (``walks`` set), or past ``budget`` states to
            count (``states`` set).
    """
    return _Counter(g, limit, budget).count()
