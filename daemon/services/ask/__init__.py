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
from ._plan import BELOW_FLOOR, KEPT, OVER_BUDGET, Plan, PlannedHit, Section
from ._prompt import TASKS, Assembled, PromptTooLarge, assemble, documents, load_template

__all__ = [
    "BELOW_FLOOR",
    "KEPT",
    "NO_CONTEXT_ANSWER",
    "OVER_BUDGET",
    "ROLES",
    "TASKS",
    "AnswerSettings",
    "AskEvent",
    "AskService",
    "Assembled",
    "CachedAnswer",
    "Citation",
    "Done",
    "Plan",
    "PlannedHit",
    "PromptTooLarge",
    "Question",
    "ResponseCache",
    "Section",
    "Sources",
    "Turn",
    "assemble",
    "documents",
    "load_template",
    "redacted_head",
    "relevant",
]
