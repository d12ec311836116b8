"""AnswerService/Ask over gRPC: the adapter over :mod:`daemon.services.ask` (where the
grounded answer itself is made: retrieval, prompt assembly, response cache, audit)."""

from ..services.ask import (
    NO_CONTEXT_ANSWER,
    TASKS,
    AnswerSettings,
    AskService,
    Assembled,
    CachedAnswer,
    PromptTooLarge,
    ResponseCache,
    assemble,
    load_template,
)
from ..telemetry.audit import AuditLog
from ._service import AnswerServicer

__all__ = [
    "NO_CONTEXT_ANSWER",
    "TASKS",
    "AnswerServicer",
    "AnswerSettings",
    "AskService",
    "Assembled",
    "AuditLog",
    "CachedAnswer",
    "PromptTooLarge",
    "ResponseCache",
    "assemble",
    "load_template",
]
