"""The embedded store's disk size (Status's ``disk_bytes``) while an ingest changes the
directory: a file removed between its listing and its size is skipped, not an error."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from retrieval.store._indexes import directory_bytes


def test_counts_regular_files_below_root_and_not_links(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"x" * 10)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b").write_bytes(b"y" * 5)
    (tmp_path / "link").symlink_to(tmp_path / "a")
    assert directory_bytes(tmp_path) == 15


def test_a_file_removed_after_it_was_listed_is_skipped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As tantivy deleting a merged segment while Status reads the directory: the
    listing still names it, its lstat finds nothing."""
    (tmp_path / "kept").write_bytes(b"x" * 7)
    (tmp_path / "merged").write_bytes(b"y" * 100)
    real = os.lstat

    def lstat(path: str | os.PathLike[str]) -> os.stat_result:
        if os.path.basename(path) == "merged":
            os.unlink(path)
        return real(path)

    monkeypatch.setattr(os, "lstat", lstat)  # what directory_bytes calls
    assert directory_bytes(tmp_path) == 7


def test_a_directory_removed_while_walked_is_skipped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "kept").write_bytes(b"x" * 3)
    gone = tmp_path / "segment"
    gone.mkdir()
    (gone / "f").write_bytes(b"z" * 50)
    real = os.lstat

    def lstat(path: str | os.PathLike[str]) -> os.stat_result:
        if os.path.basename(path) == "kept" and gone.exists():
            (gone / "f").unlink()
            gone.rmdir()  # before the walk descends into it
        return real(path)

    monkeypatch.setattr(os, "lstat", lstat)  # what directory_bytes calls
    assert directory_bytes(tmp_path) == 3
