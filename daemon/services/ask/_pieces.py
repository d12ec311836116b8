"""The prompt's redaction boundary: every piece a prompt is built from, redacted once.

A grounded answer's prompt holds text from two untrusted places besides the versioned
templates: the caller (the question, each history turn, the attachment) and the knowledge
base (each source's title, heading and text). Any of them may carry a credential, and the
prompt leaves the process — to a child, or in endpoint mode to another machine — so every
one is redacted before it can reach a message (ARCHITECTURE.md, invariant 8).

:class:`PromptPieces` is that boundary, and the prompt renderer accepts nothing else.
Constructing one — however it is constructed — redacts every string it holds: its
``__post_init__`` walks its fields (strings, tuples, nested dataclasses), so a field added
later is redacted without anyone remembering to, and a field of a type the walk does not
know (a list, a dict, a hit) is refused at construction instead of slipping through.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from retrieval import Hit, redact

__all__ = ["PromptPieces", "SourcePiece", "TurnPiece"]


@dataclass(frozen=True)
class SourcePiece:
    """One retrieved source as the prompt shows it.

    Attributes:
        title: the document's title (its id when it has none).
        heading: the chunk's section heading ("" when none).
        text: the chunk's text.
    """

    title: str
    heading: str
    text: str
    document: str = ""  # the document's id: a document's chunks are one source
    ordinal: int = 0    # the chunk's place in its document (document order)


@dataclass(frozen=True)
class TurnPiece:
    """One earlier turn of the conversation.

    Attributes:
        role: ``user`` or ``assistant``.
        content: what was said.
    """

    role: str
    content: str


@dataclass(frozen=True)
class PromptPieces:
    """Everything caller- or document-supplied that a prompt holds, redacted.

    Attributes:
        question: the caller's question.
        attachment: the caller's attachment ("" when none).
        history: earlier turns, oldest first.
        sources: the retrieved sources in rank order (``S1`` first).
    """

    question: str
    attachment: str
    history: tuple[TurnPiece, ...]
    sources: tuple[SourcePiece, ...]

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            object.__setattr__(self, field.name,
                               _redacted(getattr(self, field.name), field.name))

    @classmethod
    def of(cls, *, question: str, hits: Sequence[Hit],
           history: Sequence[tuple[str, str]], attachment: str) -> PromptPieces:
        """The pieces of a prompt from the raw request and retrieval hits, redacted."""
        return cls(
            question=question,
            attachment=attachment,
            history=tuple(TurnPiece(role, content) for role, content in history),
            sources=tuple(SourcePiece(hit.title or hit.doc_id, hit.heading or "", hit.text,
                                      hit.doc_id, hit.ordinal)
                          for hit in hits),
        )


def _redacted(value: object, where: str) -> object:
    """``value`` with every string in it redacted (a copy; ``value`` is not changed).

    Raises:
        TypeError: ``value`` holds something other than strings, tuples and dataclasses,
            which this walk could not vouch for.
    """
    if isinstance(value, str):
        return redact(value).text if value else value
    if isinstance(value, int):  # a position: no text to redact
        return value
    if isinstance(value, tuple):
        return tuple(_redacted(item, f"{where}[{i}]") for i, item in enumerate(value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{
            f.name: _redacted(getattr(value, f.name), f"{where}.{f.name}")
            for f in dataclasses.fields(value)})
    raise TypeError(f"prompt piece {where} is a {type(value).__name__}: only strings, "
                    "integers, tuples and dataclasses of them can be redacted")
