"""What Ask returns: the answer's text, the sources it cites and its summary, streamed or whole."""

from __future__ import annotations

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


AskEvent: TypeAlias = AskText | AskSources | AskDone
"""What an Ask stream yields: text events, then one AskSources, then one AskDone."""


@dataclass(frozen=True, slots=True)
class AskResult:
    """A whole answer: its text, the sources it cites, and the summary."""

    answer: str
    sources: AskSources | None
    done: AskDone | None

    @property
    def citations(self) -> tuple[Citation, ...]:
        """The cited sources (empty when nothing relevant was retrieved)."""
        return self.sources.citations if self.sources is not None else ()
