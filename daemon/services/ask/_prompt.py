"""Context assembly for grounded answers: deterministic, under a token budget.

The prompt is one system template plus one per task type (answer, explain-output,
diagnose, summarize); templates are versioned data files (``templates/*.txt``) whose
header names the template and its version, or an operator's directory over them
(:mod:`daemon.config.answer_templates`). A document is one source: its retrieved chunks
are joined in document order under one label (:func:`documents`), the documents in the
rank of their best chunk. Over budget, assembly first trims the conversation, oldest turn
first, until the question and templates fit with the best source; then drops the
lowest-ranked chunks (a document whose chunks are all dropped drops out), then clips the
attachment head-and-tail; the question, the templates and the task are never truncated;
if even they do not fit without any history, :class:`PromptTooLarge` carries the
numbers. Token counts come from the generation model's own tokenizer (a callable), never
a word-count guess.

Nothing reaches a message but the templates and one :class:`~._pieces.PromptPieces`, built
at the top of :func:`assemble`: every source (title, heading, text), the question, each
history turn and the attachment are redacted there, once, together. Each source is fenced
(:mod:`._fence`): its text cannot fake a source label or close its fence, and the system
template says fenced text is data. The same inputs always give the same prompt, and so the
same SHA-256.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from retrieval import Hit

from ...config.answer_templates import Template, TemplateSet, load_templates
from ._fence import fence_source, neutralise
from ._pieces import PromptPieces, SourcePiece

_T = TypeVar("_T")
_PACKAGED = load_templates()

TASKS = ("answer", "explain_output", "diagnose", "summarize")
# Per chat message, the template adds role markers and separators; measured on ChatML and
# Gemma templates it is under 8 tokens. Budgeting with a margin keeps us honest.
_PER_MESSAGE_TOKENS = 8
_MARGIN_TOKENS = 16
_CLIP_MARK = "\n[… clipped …]\n"


class PromptTooLarge(Exception):
    """The question, templates and task alone exceed the budget."""

    def __init__(self, needed: int, budget: int) -> None:
        self.needed = needed
        self.budget = budget
        super().__init__(
            f"the question and templates need {needed} tokens; the budget is {budget} "
            "(the model's context minus the answer's max_tokens)"
        )


def load_template(name: str) -> Template:
    """The packaged template ``name`` (``templates/<name>.txt``), its header checked."""
    return _PACKAGED[name]


def group(items: Sequence[_T], key: Callable[[_T], Hashable],
          ordinal: Callable[[_T], int]) -> list[tuple[_T, ...]]:
    """``items`` (in rank order) grouped by ``key``: the groups in the rank of their first
    (best) item, each group's items in ``ordinal`` order (their document's)."""
    groups: dict[Hashable, list[_T]] = {}
    for item in items:
        groups.setdefault(key(item), []).append(item)
    return [tuple(sorted(g, key=ordinal)) for g in groups.values()]


def documents(hits: Sequence[Hit]) -> list[tuple[Hit, ...]]:
    """``hits`` as documents: one per document id, in the rank of its best chunk, each
    document's chunks in document order."""
    return group(hits, lambda h: h.doc_id, lambda h: h.ordinal)


@dataclass(frozen=True)
class Assembled:
    """The assembled prompt and what assembly did."""

    messages: list[tuple[str, str]]
    sha256: str
    hits: list[Hit]              # the chunks actually included, in rank order
    dropped: int                 # chunks left out for the budget
    attachment_clipped: bool
    prompt_tokens: int
    template_version: str
    turns_dropped: int = 0       # history turns left out, oldest first, for the budget
    budget: int = 0

    @property
    def documents(self) -> list[tuple[Hit, ...]]:
        """The sources as labelled: ``S1`` first, each a document's included chunks."""
        return documents(self.hits)


_MIN_OVERLAP = 40
"""Shorter shared text between adjacent chunks is not taken for the chunker's overlap."""
_MAX_OVERLAP = 4000


def _continuation(before: SourcePiece, chunk: SourcePiece) -> str:
    """``chunk``'s text after the chunk ``before`` it in its document: without the heading
    line it repeats (the fence's ``section`` says it) and without the chunker's overlap
    (the head of its text that ``before`` ends with), so the prompt holds the text once."""
    text = chunk.text
    prefix = f"{chunk.heading}\n\n"
    if chunk.heading and chunk.heading == before.heading and text.startswith(prefix):
        text = text[len(prefix):]
    head = text[:_MIN_OVERLAP]
    tail_from = max(0, len(before.text) - _MAX_OVERLAP)
    at = before.text.find(head, tail_from) if len(head) == _MIN_OVERLAP else -1
    while at != -1:  # the earliest match that runs to the end of `before` is the longest
        if text.startswith(before.text[at:]):
            return text[len(before.text) - at:].lstrip()
        at = before.text.find(head, at + 1)
    return text


def _joined(chunks: tuple[SourcePiece, ...]) -> SourcePiece:
    """One document's chunks (in document order) as one source: adjacent chunks joined
    without what they repeat of each other (:func:`_continuation`), a gap mark between
    chunks that are not adjacent, their distinct headings joined."""
    text = chunks[0].text
    for before, chunk in itertools.pairwise(chunks):
        if chunk.ordinal == before.ordinal + 1:
            rest = _continuation(before, chunk)
            text += ("\n" + rest) if rest else ""
        else:
            text += "\n[…]\n" + chunk.text
    headings = list(dict.fromkeys(c.heading for c in chunks if c.heading.strip()))
    return SourcePiece(chunks[0].title, " / ".join(headings), text)


def render_sources(pieces: PromptPieces, count: int) -> str:
    """The first ``count`` chunks of ``pieces``, one fenced source per document, labelled
    ``S1``… in the rank of each document's best chunk."""
    if count <= 0:
        return "(none)"
    grouped = group(pieces.sources[:count], lambda p: p.document, lambda p: p.ordinal)
    return "\n\n".join(fence_source(f"S{i}", source.title, source.heading, source.text)
                         for i, source in enumerate(map(_joined, grouped), start=1))


def prompt_sha256(messages: Sequence[tuple[str, str]]) -> str:
    digest = hashlib.sha256()
    for role, content in messages:
        digest.update(role.encode())
        digest.update(b"\x00")
        digest.update(content.encode())
        digest.update(b"\x01")
    return digest.hexdigest()


def clip_head_tail(text: str, keep: int) -> str:
    """``keep`` characters of ``text``: its head and tail around a clip mark."""
    if len(text) <= keep:
        return text
    head = keep * 2 // 3
    tail = max(0, keep - head)
    return text[:head] + _CLIP_MARK + (text[-tail:] if tail else "")


async def assemble(
    *,
    question: str,
    task: str,
    hits: Sequence[Hit],
    history: Sequence[tuple[str, str]],
    attachment: str,
    budget: int,
    count_tokens: Callable[[str], Awaitable[int]],
    templates: TemplateSet | None = None,
) -> Assembled:
    """Build the chat messages within ``budget`` prompt tokens.

    Every argument's text is redacted before it can reach a message (see the module doc);
    the caller passes them as received. ``templates``: the set in force (None: the
    packaged one).

    Raises:
        PromptTooLarge: the question and templates alone (no history) do not fit.
    """
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}")
    # The one way in: below, messages are built from `pieces` and the templates only.
    pieces = PromptPieces.of(question=question, hits=hits, history=history,
                             attachment=attachment)
    ranked = list(hits)  # for Assembled.hits (the citations), never for a message
    del question, hits, history, attachment
    templates = templates or _PACKAGED
    system = templates["system"]
    body = templates[task]
    version = f"system/{system.version}+{task}/{body.version}@{templates.sha256[:12]}"
    turns = [(turn.role, turn.content) for turn in pieces.history]

    def build(count: int, attach: str) -> list[tuple[str, str]]:
        user = body.text.format(sources=render_sources(pieces, count),
                                question=pieces.question, attachment=attach)
        if attach and "{attachment}" not in body.text:
            user += f"\n\nAttached:\n{attach}"
        return [("system", system.text), *turns, ("user", user)]

    async def size(messages: Sequence[tuple[str, str]]) -> int:
        total = 0
        for _, content in messages:
            total += await count_tokens(content) + _PER_MESSAGE_TOKENS
        return total + _MARGIN_TOKENS

    # An over-long conversation loses its oldest turns first: until the question and
    # templates fit, and then, while any turn is left, until the best source fits too (an
    # answer from the sources matters more than what was said long ago).
    turns_dropped = 0
    needed = min(1, len(pieces.sources))
    fixed = await size(build(0, ""))
    while turns and (fixed > budget or await size(build(needed, "")) > budget):
        turns.pop(0)
        turns_dropped += 1
        fixed = await size(build(0, ""))
    if fixed > budget:
        raise PromptTooLarge(fixed, budget)
    included = len(pieces.sources)
    attach = neutralise(pieces.attachment)
    clipped = False
    messages = build(included, attach)
    tokens = await size(messages)
    # Drop the lowest-ranked chunks first (but keep the attachment whole while possible).
    while tokens > budget and included:
        included -= 1
        messages = build(included, attach)
        tokens = await size(messages)
    if tokens > budget and attach:
        # Clip the attachment head-and-tail: binary search on its kept length.
        lo, hi = 0, len(attach)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if await size(build(included, clip_head_tail(attach, mid))) <= budget:
                lo = mid
            else:
                hi = mid - 1
        attach = clip_head_tail(attach, lo)
        clipped = True
        messages = build(included, attach)
        tokens = await size(messages)
    return Assembled(messages, prompt_sha256(messages), list(ranked[:included]),
                     len(ranked) - included, clipped, tokens, version, turns_dropped, budget)
