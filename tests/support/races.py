"""An attacker's race for the confinement tests: a file and a directory swapped for
symlinks to the outside, as fast as it can."""

from __future__ import annotations

import os
import threading
from pathlib import Path

# A word only the outside directory holds: a search that finds it leaked.
OUTSIDE_DIR_WORD = "xylophonewombat"


def swap_forever(src: Path, outside_file: Path, outside_dir: Path,
                 stop: threading.Event) -> None:
    """Swap src/doc.txt between a regular file and a symlink to a file outside, and
    src/sub between a directory and a symlink to a directory outside, as fast as it can
    (atomically, with os.replace / rename, as an attacker would)."""
    tmp_file, tmp_link = src / ".doc.tmp", src / ".link.tmp"
    real_sub, sub = src / ".sub.real", src / "sub"
    while not stop.is_set():
        tmp_file.write_text("inside words only\n")
        os.replace(tmp_file, src / "doc.txt")
        tmp_link.symlink_to(outside_file)
        os.replace(tmp_link, src / "doc.txt")
        os.rename(sub, real_sub)
        tmp_link.symlink_to(outside_dir)
        os.replace(tmp_link, sub)
        os.unlink(sub)
        os.rename(real_sub, sub)
