"""Grounded answers (AnswerService/Ask): prompt assembly, response cache, audit log."""

from ..telemetry.audit import AuditLog
from ._cache import CachedAnswer, ResponseCache
from ._prompt import TASKS, Assembled, PromptTooLarge, assemble, load_template
from ._service import NO_CONTEXT_ANSWER, AnswerServicer, AnswerSettings

__all__ = [
    "NO_CONTEXT_ANSWER",
    "TASKS",
    "AnswerServicer",
    "AnswerSettings",
    "Assembled",
    "AuditLog",
    "CachedAnswer",
    "PromptTooLarge",
    "ResponseCache",
    "assemble",
    "load_template",
]
