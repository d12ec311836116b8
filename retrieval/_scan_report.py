"""What a directory scan did: its counts, and the files it failed or skipped, bounded.

A Reindex streams the report as it grows, and a source may hold a hundred thousand files
that all fail or are skipped (empty, unreadable, past the source's limits). Listing them
all made one progress message 5.6 MB for 100k files, past gRPC's default 4 MiB receive
limit, so a client with default settings could not read its own Reindex. The report
therefore lists at most :data:`LISTED_ISSUES` failed and as many skipped files (the first
found), within :data:`LISTED_BYTES` of text in all, each reason clipped to
:data:`REASON_CHARS`; what is left out is counted (``failed_total``, ``skipped_total``
stay exact), so a message stays under ~40 KiB whatever the source holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["LISTED_BYTES", "LISTED_ISSUES", "REASON_CHARS", "ScanReport"]

LISTED_ISSUES = 100
"""Failed files, and skipped files, a report lists (each): enough to see what is wrong."""
LISTED_BYTES = 32 * 1024
"""UTF-8 bytes of paths and reasons a report lists in all: 100 paths of PATH_MAX (4 KiB)
would be 400 KiB, so the count alone does not bound a message."""
REASON_CHARS = 500
"""A listed reason is clipped to this, as a document's stored error is (an extraction error
may quote a long name)."""


@dataclass
class ScanReport:
    """Counts of a scan, and the failed and skipped files (bounded, see the module doc).

    Attributes:
        seen: files the scan took in (indexed ones and new ones it admitted).
        failed, skipped: ``(path, reason)`` of the first failed and skipped files; add to
            them with :meth:`fail` and :meth:`skip` so the bounds and totals hold.
        failed_omitted, skipped_omitted: how many more were not listed.
        limit_reached: non-empty when new files were not added because the source holds
            ``max_files_per_source`` documents (or ``retrieval.max_source_mb``): says
            which and how many; every document it held is kept.
        elsewhere: another node holds the source's scan lock (a shared PostgreSQL
            store): this one skipped it this round, and nothing else was counted.
        excluded: files and directories the source's exclude patterns (and the built-in
            defaults) left out, unopened; a directory counts once, its contents not at all.
    """

    source_id: str
    seen: int = 0
    added: int = 0
    changed: int = 0
    unchanged: int = 0
    deleted: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    failed_omitted: int = 0
    skipped_omitted: int = 0
    limit_reached: str = ""
    elsewhere: bool = False
    excluded: int = 0
    _listed_bytes: int = field(default=0, repr=False, compare=False)

    @property
    def failed_total(self) -> int:
        """Every file that failed, listed or not."""
        return len(self.failed) + self.failed_omitted

    @property
    def skipped_total(self) -> int:
        """Every file skipped, listed or not."""
        return len(self.skipped) + self.skipped_omitted

    def listing(self, kind: str) -> bool:
        """Whether one more ``"failed"`` (or ``"skipped"``) file may still be listed."""
        into = self.failed if kind == "failed" else self.skipped
        return len(into) < LISTED_ISSUES and self._listed_bytes < LISTED_BYTES

    def fail(self, path: str, reason: str) -> None:
        """Count a failed file; list it while the bounds allow."""
        if not self._list(self.failed, path, reason):
            self.failed_omitted += 1

    def skip(self, path: str, reason: str) -> None:
        """Count a skipped file; list it while the bounds allow."""
        if not self._list(self.skipped, path, reason):
            self.skipped_omitted += 1

    def _list(self, into: list[tuple[str, str]], path: str, reason: str) -> bool:
        if len(reason) > REASON_CHARS:
            reason = reason[:REASON_CHARS - 1] + "…"
        size = len(path.encode("utf-8", "surrogateescape")) + len(reason.encode("utf-8"))
        if len(into) >= LISTED_ISSUES or self._listed_bytes + size > LISTED_BYTES:
            return False
        self._listed_bytes += size
        into.append((path, reason))
        return True
