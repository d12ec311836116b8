"""What Ask returns: the answer's text, the sources it cites and its summary, streamed or whole."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, TypeAlias

from ._inference import Usage

Task: TypeAlias = Literal["answer", "explain_output", "diagnose", "summarize"]
"""What :meth:`Client.ask` should do with the question (and attachment)."""


@dataclass(frozen=True, slots=True)
class Citation:
    """A source an answer was given, labelled ``S1``, ``S2``, ... in rank order."""

    label: str
    chunk_id: str
    document_id: str
    title: str
    path: str
    score: float
    """On search's scale: the fused score normalised to [0, 1] (the cosine similarity in
    vector mode), as :attr:`SearchHit.score`."""
    snippet: str
    search_source: str = ""
    """Which index found it: ``text``, ``vector`` or ``hybrid``."""
    indexed_at: datetime | None = None
    document_date: datetime | None = None
    """The document's own date (None when it has none)."""
    kind: str = ""
    source_id: str = ""
    heading: str = ""
    """The section of the document the best chunk came from (its heading; "" for none)."""
    chunk_ids: tuple[str, ...] = ()
    """Every chunk of the document the prompt holds, in document order (a document is one
    source; ``chunk_id``, ``score`` and ``snippet`` are its best chunk's)."""


@dataclass(frozen=True, slots=True)
class AskText:
    """A piece of the answer, as generated."""

    text: str


@dataclass(frozen=True, slots=True)
class AskSources:
    """The sources the answer was grounded on (sent after the text)."""

    citations: tuple[Citation, ...]
    retrieval_mode: str
    warnings: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class AskDone:
    """The end of an answer: usage, the prompt's SHA-256, cache and budget facts."""

    usage: Usage
    prompt_sha256: str
    cached: bool
    no_context: bool
    finish_reason: str
    chunks_dropped: int
    attachment_clipped: bool
    template_version: str
    model_name: str = ""  # the catalog name of the model that answered ("": none ran)
    history_turns_dropped: int = 0
    """Conversation turns left out, oldest first, to fit the model's context."""
    dry_run: bool = False
    """A dry run: nothing was generated (the usage holds the prompt's tokens only)."""


@dataclass(frozen=True, slots=True)
class PlannedHit:
    """A chunk a dry run retrieved and what became of it: ``verdict`` is ``kept`` (in the
    prompt under ``label``), ``below_floor`` (under the relevance floor) or
    ``over_budget`` (left out to fit the token budget)."""

    chunk_id: str
    document_id: str
    title: str
    path: str
    ordinal: int
    score: float
    text_score: float | None
    vector_score: float | None
    verdict: str
    label: str = ""


@dataclass(frozen=True, slots=True)
class PromptSection:
    """One message of the prompt a dry run assembled (redacted, as the model would get
    it): ``role`` system, user or assistant."""

    role: str
    content: str
    tokens: int


@dataclass(frozen=True, slots=True)
class AskPlan:
    """A dry run's account (``ask(..., dry_run=True)``): every hit in rank order with its
    verdict, the prompt's sections, its tokens and the budget it fit (the model's context
    less max_tokens). Sent instead of the text."""

    hits: tuple[PlannedHit, ...]
    sections: tuple[PromptSection, ...]
    prompt_tokens: int
    budget: int


AskEvent: TypeAlias = AskText | AskPlan | AskSources | AskDone
"""What an Ask stream yields: text events (or, in a dry run, one AskPlan), then one
AskSources, then one AskDone."""


@dataclass(frozen=True, slots=True)
class AskResult:
    """A whole answer: its text, the sources it cites, and the summary."""

    answer: str
    sources: AskSources | None
    done: AskDone | None
    plan: AskPlan | None = None
    """A dry run's plan (None for an answer)."""

    @classmethod
    def of(cls, events: Iterable[AskEvent]) -> AskResult:
        """The whole answer the ``events`` of an Ask stream make (its ``collect()``)."""
        events = list(events)
        return cls(answer="".join(e.text for e in events if isinstance(e, AskText)),
                   sources=next((e for e in events if isinstance(e, AskSources)), None),
                   done=next((e for e in events if isinstance(e, AskDone)), None),
                   plan=next((e for e in events if isinstance(e, AskPlan)), None))

    @property
    def citations(self) -> tuple[Citation, ...]:
        """The cited sources (empty when nothing relevant was retrieved)."""
        return self.sources.citations if self.sources is not None else ()
