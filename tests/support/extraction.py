"""What the extraction tests share (tests/unit/test_extract_*.py): writing a file to
extract, and expecting an ExtractionError of a given kind.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from retrieval.errors import ExtractionError

# --- helpers -------------------------------------------------------------------------------


def fails(kind: str, call: Callable[[], object]) -> ExtractionError:
    """Run ``call``, expect an ExtractionError of ``kind``, return it."""
    with pytest.raises(ExtractionError) as info:
        call()
    assert info.value.kind == kind, str(info.value)
    return info.value


def write(tmp_path: Path, name: str, data: bytes | str) -> Path:
    path = tmp_path / name
    path.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return path
