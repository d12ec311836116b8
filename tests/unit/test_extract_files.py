"""Extraction (retrieval.extraction._extract) of files that are not what they claim: binary files
(named .md, or control characters without NULs; ANSI colours are still text), files too
large (refused by stat before reading), and special files: FIFOs (and symlinks to them)
refused without blocking, devices and directories refused, symlinks to regular files
followed, missing, dangling and unreadable paths refused as unreadable.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from retrieval.errors import ExtractionError
from retrieval.extraction._extract import ExtractLimits, extract_bytes, extract_file
from tests.support.extraction import fails, write
from tests.support.load import patience

# --- binary and size ---------------------------------------------------------------------


def test_binary_file_named_md_is_refused(tmp_path: Path) -> None:
    """A PNG renamed to .md is refused clearly: binary, naming the file and the kind."""
    png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)) * 4
    error = fails("binary", lambda: extract_file(write(tmp_path, "diagram.md", png)))
    assert "diagram.md" in str(error)
    assert "binary" in str(error)
    assert "markdown" in str(error)


def test_control_characters_without_nuls_are_binary(tmp_path: Path) -> None:
    """More than 30% control characters means binary even without NUL bytes."""
    data = bytes([1, 2, 3, 4, 5, 6, 0x41]) * 500
    fails("binary", lambda: extract_file(write(tmp_path, "ctl.log", data)))


def test_ansi_colours_in_logs_are_text(tmp_path: Path) -> None:
    """Escape sequences in a coloured log do not make it binary."""
    data = b"\x1b[31mERROR\x1b[0m disk full on /var\n" * 50
    assert "ERROR" in extract_file(write(tmp_path, "app.log", data)).text


def test_too_large_is_refused_by_stat_before_reading(tmp_path: Path) -> None:
    """A file over max_bytes is refused from its size alone (a sparse 1 TiB file is
    refused instantly)."""
    path = tmp_path / "huge.txt"
    with path.open("wb") as f:
        f.truncate(1 << 40)
    # CPU time (reading the hole would be system time): the refusal's cost, not a busy
    # machine's wait for a core.
    started = time.process_time()
    error = fails("too_large", lambda: extract_file(path))
    assert time.process_time() - started < 1.0
    assert "huge.txt" in str(error)
    small = ExtractLimits(max_bytes=10)
    fails("too_large", lambda: extract_file(write(tmp_path, "a.txt", b"x" * 11), small))
    assert extract_file(write(tmp_path, "b.txt", b"x" * 10), small).text == "x" * 10


def test_too_large_bytes(tmp_path: Path) -> None:
    """extract_bytes checks the size before anything else, PDFs included."""
    small = ExtractLimits(max_bytes=10)
    fails("too_large", lambda: extract_bytes(b"x" * 11, "a.md", "markdown", small))
    fails("too_large", lambda: extract_bytes(b"%PDF-" + b"x" * 11, "a.pdf", "pdf", small))


# --- special files -----------------------------------------------------------------------


def no_block(call: Callable[[], object], seconds: float = 5.0) -> BaseException | None:
    """Run ``call`` in a thread; fail if it does not return within ``seconds``."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "extraction blocked"
    return outcome[0]


@pytest.mark.timeout(patience(20))
def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    """A FIFO named like a document returns not_regular at once: never opened, so it
    cannot block waiting for a writer."""
    fifo = tmp_path / "pipe.md"
    os.mkfifo(fifo)
    error = no_block(lambda: extract_file(fifo))
    assert isinstance(error, ExtractionError)
    assert error.kind == "not_regular"
    assert "FIFO" in str(error)


@pytest.mark.timeout(patience(20))
def test_symlink_to_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    """Following a symlink does not get around the check."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    link = tmp_path / "notes.txt"
    link.symlink_to(fifo)
    error = no_block(lambda: extract_file(link))
    assert isinstance(error, ExtractionError)
    assert error.kind == "not_regular"


def test_devices_and_directories_are_refused(tmp_path: Path) -> None:
    """Character devices and directories are not regular files."""
    link = tmp_path / "null.txt"
    link.symlink_to("/dev/null")
    assert "character device" in str(fails("not_regular", lambda: extract_file(link)))
    folder = tmp_path / "folder.md"
    folder.mkdir()
    assert "directory" in str(fails("not_regular", lambda: extract_file(folder)))


def test_symlink_to_regular_file_is_followed(tmp_path: Path) -> None:
    """Which symlinks to hand over is the caller's decision; a symlink given is followed."""
    target = write(tmp_path, "real.md", "# Real\n")
    link = tmp_path / "link.md"
    link.symlink_to(target)
    assert extract_file(link).title == "Real"


def test_missing_and_dangling_paths_are_unreadable(tmp_path: Path) -> None:
    """A missing file or a dangling symlink is an unreadable-file error, not a crash."""
    fails("unreadable", lambda: extract_file(tmp_path / "missing.md"))
    link = tmp_path / "dangling.md"
    link.symlink_to(tmp_path / "nowhere")
    fails("unreadable", lambda: extract_file(link))


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files regardless of mode")
def test_unreadable_file(tmp_path: Path) -> None:
    """A file without read permission is unreadable, with the OS reason."""
    path = write(tmp_path, "secret.md", "x")
    path.chmod(0)
    assert "ermission" in str(fails("unreadable", lambda: extract_file(path)))
