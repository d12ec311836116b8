"""retrieval's public surface: the daemon and the clients use ``retrieval`` (and its public
``retrieval.errors``), never its private modules, and retrieval never imports gRPC."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import retrieval

ROOT = Path(__file__).resolve().parents[2]

# Any private import is a gap in retrieval's public surface: none is allowed.
_ALLOWED: set[tuple[str, str]] = set()


def imports(path: Path) -> Iterator[str]:
    """Every module ``path`` imports (absolute imports only)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def test_daemon_and_clients_import_only_public_retrieval() -> None:
    """No module of daemon/ or clients/ imports a private ``retrieval._*`` module."""
    private = []
    for package in ("daemon", "clients"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for name in imports(path):
                if not name.startswith("retrieval._"):
                    continue
                module = ".".join(name.split(".")[:2])
                if any(rel.startswith(where) and module == allowed
                       for where, allowed in _ALLOWED):
                    continue
                private.append(f"{rel}: {name}")
    assert private == []


def test_retrieval_never_imports_grpc() -> None:
    """The core package maps nothing to gRPC itself: no module of it imports grpc."""
    offenders = [f"{path.name}: {name}" for path in sorted((ROOT / "retrieval").glob("*.py"))
                 for name in imports(path) if name.split(".")[0] == "grpc"]
    assert offenders == []


def test_every_public_name_resolves() -> None:
    """Each name of ``retrieval.__all__`` exists, and the daemon's needs are among them."""
    missing = [name for name in retrieval.__all__ if not hasattr(retrieval, name)]
    assert missing == []
    assert {"Retriever", "RetrievalStatus", "ExtractLimits", "extract_bytes", "redact",
            "Redacted", "KINDS", "validate_document_id"} <= set(retrieval.__all__)
