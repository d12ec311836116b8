"""Ask's dry run: what an Ask would put in its prompt, without generating.

:class:`Plan` lists every hit retrieval returned with what became of it (kept as a
source under its label, below the relevance floor, or left out for the token budget), the
assembled prompt's sections as the model would get them (redacted: they are built from
:class:`~._pieces.PromptPieces` like any prompt) with their token counts, and the budget.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from retrieval import Hit

from ._prompt import Assembled

KEPT, BELOW_FLOOR, OVER_BUDGET = "kept", "below_floor", "over_budget"


@dataclass(frozen=True, kw_only=True)
class PlannedHit(Hit):
    """A retrieved hit and what became of it (``verdict``: kept, below_floor or
    over_budget); ``label`` is its document's source label when kept."""

    verdict: str
    label: str = ""


@dataclass(frozen=True)
class Section:
    """One message of the prompt: its role (system, user, assistant), its content as
    sent (redacted) and its tokens."""

    role: str
    content: str
    tokens: int


@dataclass(frozen=True)
class Plan:
    """The dry run of an Ask (module docstring)."""

    hits: tuple[PlannedHit, ...]
    sections: tuple[Section, ...] = ()
    prompt_tokens: int = 0
    budget: int = 0


def planned(hits: Sequence[Hit], relevant: Callable[[Hit], bool],
            assembled: Assembled | None) -> tuple[PlannedHit, ...]:
    """Each of ``hits`` (as retrieved, in rank order) with its verdict."""
    labels: dict[str, str] = {}
    if assembled is not None:
        labels = {h.chunk_id: f"S{i}" for i, doc in enumerate(assembled.documents, start=1)
                  for h in doc}
    out = []
    for h in hits:
        verdict = (KEPT if h.chunk_id in labels else
                   BELOW_FLOOR if not relevant(h) else OVER_BUDGET)
        out.append(PlannedHit(**vars(h), verdict=verdict, label=labels.get(h.chunk_id, "")))
    return tuple(out)


async def sections(assembled: Assembled, count: Callable[[str], Awaitable[int]]
                   ) -> tuple[Section, ...]:
    """The assembled prompt's messages with their token counts."""
    return tuple([Section(role, content, await count(content))
                  for role, content in assembled.messages])
