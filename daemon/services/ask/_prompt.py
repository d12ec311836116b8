"""Context assembly for grounded answers: deterministic, under a token budget.

The prompt is one system template plus one per task type (answer, explain-output,
diagnose, summarize); templates are versioned data files (``templates/*.txt``) whose
header names the template and its version. Over budget, assembly drops the lowest-ranked
sources first, then clips the attachment head-and-tail; the question, the templates and
the task are never truncated; if even they do not fit, :class:`PromptTooLarge` carries the
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
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from importlib import resources

from retrieval import Hit

from ._fence import fence_source, neutralise
from ._pieces import PromptPieces

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


@dataclass(frozen=True)
class Template:
    name: str
    version: str
    text: str


def load_template(name: str) -> Template:
    """Read ``templates/<name>.txt`` and check its header."""
    raw = resources.files("daemon.services.ask").joinpath("templates", f"{name}.txt").read_text()
    header: dict[str, str] = {}
    body: list[str] = []
    for line in raw.splitlines():
        if line.startswith("# ") and ":" in line and not body:
            key, _, value = line[2:].partition(":")
            header[key.strip()] = value.strip()
        else:
            body.append(line)
    if header.get("llamad-template") != name or "version" not in header:
        raise ValueError(f"template {name}.txt lacks its 'llamad-template'/'version' header")
    return Template(name, header["version"], "\n".join(body).strip())


@dataclass(frozen=True)
class Assembled:
    """The assembled prompt and what assembly did."""

    messages: list[tuple[str, str]]
    sha256: str
    hits: list[Hit]              # the sources actually included, in rank order (S1..)
    dropped: int
    attachment_clipped: bool
    prompt_tokens: int
    template_version: str


def render_sources(pieces: PromptPieces, count: int) -> str:
    """The first ``count`` sources of ``pieces``, fenced and labelled ``S1``…"""
    if count <= 0:
        return "(none)"
    return "\n\n".join(fence_source(f"S{i}", source.title, source.heading, source.text)
                         for i, source in enumerate(pieces.sources[:count], start=1))


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
) -> Assembled:
    """Build the chat messages within ``budget`` prompt tokens.

    Every argument's text is redacted before it can reach a message (see the module doc);
    the caller passes them as received.

    Raises:
        PromptTooLarge: the question, templates and history alone do not fit.
    """
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}")
    # The one way in: below, messages are built from `pieces` and the templates only.
    pieces = PromptPieces.of(question=question, hits=hits, history=history,
                             attachment=attachment)
    ranked = list(hits)  # for Assembled.hits (the citations), never for a message
    del question, hits, history, attachment
    system = load_template("system")
    body = load_template(task)
    version = f"system/{system.version}+{task}/{body.version}"
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

    fixed = await size(build(0, ""))
    if fixed > budget:
        raise PromptTooLarge(fixed, budget)
    included = len(pieces.sources)
    attach = neutralise(pieces.attachment)
    clipped = False
    messages = build(included, attach)
    tokens = await size(messages)
    # Drop the lowest-ranked sources first (but keep the attachment whole while possible).
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
                     len(ranked) - included, clipped, tokens, version)
