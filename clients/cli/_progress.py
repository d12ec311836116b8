"""Progress of long CLI work on a terminal, drawn by tqdm: a scan's files (ingest,
reindex) with total, rate and ETA, and a model load's elapsed time. Nothing is drawn when
stderr is not a terminal or the verb prints ``--json``: results stay on stdout alone.

The daemon streams a scan's counts but not how many files it will find (it indexes while
it walks), so the total is counted here, beside it, when the source's directory is on
this machine: regular files, hidden ones left out as the scan leaves them out. Without
it the bar shows the count and the rate alone.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, TextIO

from tqdm import tqdm  # type: ignore[import-untyped]  # (no stubs; a small surface)

from .._types import ReindexProgress

# Counting stops here: a bigger tree gets no total (the count would take too long).
MAX_COUNTED = 200_000


def count_files(path: str | os.PathLike[str], limit: int = MAX_COUNTED) -> int | None:
    """The regular files under ``path`` outside hidden names, as the scan walks them;
    None when it is not a readable directory here or holds more than ``limit``."""
    root = Path(path)
    if not root.is_dir():
        return None
    found = 0
    for _, dirs, files in os.walk(root, onerror=None, followlinks=False):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found += sum(1 for f in files if not f.startswith("."))
        if found > limit:
            return None
    return found


class ScanBars:
    """One tqdm bar per source a scan reports on, on ``out`` when it is a terminal."""

    def __init__(self, out: TextIO, totals: dict[str, int | None], *, shown: bool) -> None:
        self._out = out
        self._totals = totals
        self._shown = shown
        self._bar: Any = None  # a tqdm
        self._source = ""

    def start(self, source_id: str) -> None:
        """Draw ``source_id``'s bar at 0 before its first report (the daemon reports at
        most every second, none before a short scan ends)."""
        if not self._shown or (self._bar is not None and source_id == self._source):
            return
        self.close()
        self._source = source_id
        self._bar = tqdm(total=self._totals.get(source_id), file=self._out,
                         desc=source_id, unit=" files", dynamic_ncols=True, leave=False,
                         mininterval=0.2)

    def update(self, p: ReindexProgress) -> None:
        """Show ``p``'s counts (the files it has gone through: taken in or skipped)."""
        if not self._shown:
            return
        self.start(p.source_id)
        done = p.seen + p.skipped_total
        total = self._bar.total
        self._bar.n = min(done, total) if total else done
        self._bar.set_postfix_str(f"{p.added} added, {p.changed} changed, "
                                  f"{p.failed_total} failed", refresh=False)
        self._bar.refresh()

    def close(self) -> None:
        """Erase the bar (the verb prints the final counts itself)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class Elapsed:
    """``what (mm:ss)``, the time spent on it, redrawn on ``out`` while a call without
    progress of its own runs (a model load; an Ask until its answer starts); erased by
    :meth:`done` or when the ``with`` block ends."""

    def __init__(self, out: TextIO, what: str, *, shown: bool, interval: float = 0.5) -> None:
        self._out = out
        self._what = what
        self._shown = shown
        self._interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Elapsed:
        if self._shown:
            self._thread = threading.Thread(target=self._run, name="llamad-elapsed",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done()

    def done(self) -> None:
        """Stop and erase the line; idempotent."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        with tqdm(total=None, file=self._out, desc=self._what, leave=False,
                  bar_format="{desc} ({elapsed})", mininterval=0) as bar:
            while not self._stop.wait(self._interval):
                bar.refresh()
