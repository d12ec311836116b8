"""Audit logs: JSON lines, rotated by size, one record per call.

Ask's records have the prompt's SHA-256 and the retrieval hit list (citation labels,
chunk ids, scores), the task, the model, token counts and whether it was cached — enough
to reproduce and review an answer. Search's (optional) have the query, the filters, the
mode and the whole fused candidate list with both ranks, and the latency. Never raw
secrets: questions and queries are stored redacted, and neither sources' text nor an
answer is stored (their chunk ids are).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from retrieval import redact


class AuditLog:
    def __init__(self, path: Path, max_bytes: int, backups: int) -> None:
        self.path = path
        self._max = max_bytes
        self._backups = backups
        self._lock = threading.Lock()

    def record(self, **fields: Any) -> None:
        """Append one record (thread-safe; rotates first when the file is full)."""
        for key in ("question", "query"):
            if key in fields:
                fields[key] = redact(str(fields[key])).text[:2000]
        line = json.dumps({"ts": round(time.time(), 3), **fields}, sort_keys=True,
                          ensure_ascii=False) + "\n"
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                if self.path.stat().st_size + len(line) > self._max:
                    self._rotate()
            except FileNotFoundError:
                pass
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)

    def _rotate(self) -> None:
        if self._backups <= 0:
            self.path.unlink(missing_ok=True)
            return
        for i in range(self._backups - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{i}")
            if older.exists():
                older.replace(self.path.with_name(f"{self.path.name}.{i + 1}"))
        self.path.replace(self.path.with_name(f"{self.path.name}.1"))
