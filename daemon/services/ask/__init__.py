"""Ask, the grounded answer with citations, free of any wire: the service
(:class:`AskService`), what it takes and yields (plain dataclasses), the prompt assembly
under a token budget with its versioned templates, and the response cache."""

from ._cache import CachedAnswer, ResponseCache
from ._core import (
    NO_CONTEXT_ANSWER,
    ROLES,
    AnswerSettings,
    AskEvent,
    AskService,
    Citation,
    Done,
    Question,
    Sources,
    Turn,
    redacted_head,
    relevant,
)
from ._prompt import TASKS, Assembled, PromptTooLarge, assemble, load_template

__all__ = [
    "NO_CONTEXT_ANSWER",
    "ROLES",
    "TASKS",
    "AnswerSettings",
    "AskEvent",
    "AskService",
    "Assembled",
    "CachedAnswer",
    "Citation",
    "Done",
    "PromptTooLarge",
    "Question",
    "ResponseCache",
    "Sources",
    "Turn",
    "assemble",
    "load_template",
    "redacted_head",
    "relevant",
]
