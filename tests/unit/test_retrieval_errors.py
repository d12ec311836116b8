"""retrieval.errors: the exception tree every retrieval failure belongs to, and the rules a
document id must follow (relative, no empty or dot segments, no backslashes or control
characters, bounded length), each refusal saying why.
"""

from __future__ import annotations

import pytest

from retrieval.errors import (
    ExtractionError,
    IndexCorrupt,
    InvalidDocument,
    NotFound,
    RetrievalError,
    validate_document_id,
)

# --- retrieval.errors --------------------------------------------------------------------


def test_error_tree() -> None:
    """Every retrieval error is a RetrievalError; ExtractionError carries reason and kind."""
    for cls in (InvalidDocument, ExtractionError, NotFound, IndexCorrupt):
        assert issubclass(cls, RetrievalError)
    error = ExtractionError("a.md: binary", "binary")
    assert (error.reason, error.kind, str(error)) == ("a.md: binary", "binary", "a.md: binary")
    assert NotFound("no source 'x'").reason == "no source 'x'"


@pytest.mark.parametrize("doc_id", [
    "docs/runbooks/web01.md", "a", "docs/a b/ü.md", "docs/" + "x" * 507, "src/.hidden",
    "docs/a..b", "docs/...",
])
def test_valid_document_ids(doc_id: str) -> None:
    """Ids within the rules are returned unchanged."""
    assert validate_document_id(doc_id) == doc_id


@pytest.mark.parametrize(("doc_id", "reason"), [
    ("", "empty"),
    ("x" * 513, "513 characters"),
    ("docs\\a.md", "backslash"),
    ("docs/../etc/passwd", "'..' segment"),
    ("..", "'..' segment"),
    ("docs/a/..", "'..' segment"),
    ("/etc/passwd", "starts with '/'"),
    ("docs//a.md", "empty segment"),
    ("docs/", "empty segment"),
    ("docs/a\x00.md", "control character (U+0000)"),
    ("docs/a\n.md", "control character (U+000A)"),
    ("docs/a\x7f", "control character (U+007F)"),
    ("docs/a\x85", "control character (U+0085)"),
    ("docs/\ud800", "unpaired surrogate"),
])
def test_invalid_document_ids(doc_id: str, reason: str) -> None:
    """Each rule is enforced with a reason naming it; the id is shown escaped."""
    with pytest.raises(InvalidDocument) as info:
        validate_document_id(doc_id)
    assert reason in str(info.value)
    assert "\x00" not in str(info.value)
    assert "\n" not in str(info.value)
