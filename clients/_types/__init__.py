"""What the client returns: frozen dataclasses, not protobuf messages, one module per
service (inference, control, documents and search, answers).

Enumerations become short lower-case strings (``"running"``, ``"hybrid"``,
``"generation"``); an enum value this client does not know becomes ``"unknown(N)"``
rather than an error, so an older client keeps working against a newer daemon.
Timestamps become timezone-aware :class:`datetime.datetime` objects, or None when unset.
"""

from ._answer import AskDone, AskEvent, AskResult, AskSources, AskText, Citation, Task
from ._control import (
    ChildStatus,
    DaemonStatus,
    ExitCause,
    LogLine,
    Mode,
    Role,
    SwapInfo,
    SwapProgress,
)
from ._documents import (
    Document,
    DocumentState,
    FileIssue,
    ReindexProgress,
    Reprocessed,
    RetrievalStatus,
    SearchHit,
    SearchMode,
    SearchResult,
    Source,
    VectorBackfill,
    VectorRebuild,
)
from ._inference import (
    Embeddings,
    GenerateChunk,
    GenerateResult,
    Message,
    TokenLogprob,
    TokenLogprobs,
    Tokens,
    Tool,
    ToolCall,
    ToolCallDelta,
    ToolChoice,
    Usage,
)

__all__ = [
    "AskDone",
    "AskEvent",
    "AskResult",
    "AskSources",
    "AskText",
    "ChildStatus",
    "Citation",
    "DaemonStatus",
    "Document",
    "DocumentState",
    "Embeddings",
    "ExitCause",
    "FileIssue",
    "GenerateChunk",
    "GenerateResult",
    "LogLine",
    "Message",
    "Mode",
    "ReindexProgress",
    "Reprocessed",
    "RetrievalStatus",
    "Role",
    "SearchHit",
    "SearchMode",
    "SearchResult",
    "Source",
    "SwapInfo",
    "SwapProgress",
    "Task",
    "TokenLogprob",
    "TokenLogprobs",
    "Tokens",
    "Tool",
    "ToolCall",
    "ToolCallDelta",
    "ToolChoice",
    "Usage",
    "VectorBackfill",
    "VectorRebuild",
]
