"""Text and JSON output of the CLI verbs: aligned tables, durations, sizes, JSON lines."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from .._types import Document


def _default(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if isinstance(obj, datetime):
        return obj.isoformat()
    if isinstance(obj, Mapping):
        return dict(obj)
    if isinstance(obj, bytes):  # a token's bytes: integers, as OpenAI writes them
        return list(obj)
    raise TypeError(f"cannot encode {type(obj).__name__} as JSON")


def to_json(obj: Any, *, indent: int | None = None) -> str:
    """JSON of dataclasses (as objects), datetimes (ISO 8601), mappings and sequences."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        obj = dataclasses.asdict(obj)
    return json.dumps(obj, default=_default, ensure_ascii=False, indent=indent)


def json_line(out: TextIO, obj: Any) -> None:
    """Write one JSON line and flush (for streams read by scripts as they come)."""
    out.write(to_json(obj) + "\n")
    out.flush()


def table(rows: Sequence[Sequence[str]], header: Sequence[str]) -> str:
    """Columns aligned with two spaces; trailing spaces stripped."""
    every = [list(header), *[list(r) for r in rows]]
    widths = [max(len(r[i]) for r in every) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
             for r in every]
    return "\n".join(lines)


def duration(seconds: float) -> str:
    """``3725.0`` -> ``1h 2m``; ``75`` -> ``1m 15s``; ``0.4`` -> ``0.4s``."""
    if seconds < 10:
        return f"{seconds:.1f}s"
    total = int(seconds)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    if minutes:
        return f"{minutes}m {secs}s"
    return f"{secs}s"


def size(n: float) -> str:
    """Bytes, human readable: ``1536`` -> ``1.5 KiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def clip(text: str, width: int) -> str:
    """``text`` on one line, at most ``width`` characters (an ellipsis marks the cut)."""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def basename(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def when(value: datetime | None) -> str:
    """Local time, to the second; ``-`` when unset."""
    return value.astimezone().strftime("%Y-%m-%d %H:%M:%S") if value else "-"


def document_outcome(doc: Document, as_json: bool, detail: str = "") -> int:
    """Print the document a verb wrote or decided: as JSON, or ``ID: STATE`` and ``detail``;
    return the verb's exit status (1: the document failed)."""
    print(to_json(doc) if as_json else f"{doc.id}: {doc.state}{detail}")
    return 0 if doc.state != "failed" else 1
