"""A command run in a real terminal: a detached tmux session of a fixed size, so progress
bars are tested as a user sees them (issue 31).

The command runs under ``script`` inside the tmux pane: script gives it a pseudo-terminal
of the pane's size and records everything it draws, frame by frame (the bars that are
redrawn with carriage returns and erased at the end); tmux's ``capture-pane`` gives the
screen as it is left once the command has ended. The tmux server is this run's alone (its
own socket in a temporary directory) and is ended afterwards. Nothing waits on timing:
the pane stays (``remain-on-exit``) until its screen is captured, and the exit status is
the one script records.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

COLUMNS, ROWS = 160, 40


@dataclass(frozen=True)
class Terminal:
    """What a command did in the terminal.

    Attributes:
        drawn: every byte it wrote, as text (all the frames of its bars).
        screen: the screen and its scrollback once it ended, as tmux shows them.
        status: its exit status as ``script`` saw it (-1: script said none).
    """

    drawn: str
    screen: str
    status: int


def in_tmux(command: Sequence[str], *, cwd: Path, env: Mapping[str, str],
            timeout: float = 300.0) -> Terminal:
    """Run ``command`` in a new tmux session COLUMNS x ROWS wide, to its end."""
    tmux = shutil.which("tmux")
    assert tmux is not None, "tmux is needed (make test-tools installs it)"
    with tempfile.TemporaryDirectory(prefix="llamad-tmux-") as tmp:
        socket, log, conf = Path(tmp, "tmux.sock"), Path(tmp, "drawn.log"), Path(tmp, "conf")
        conf.write_text("set -g remain-on-exit on\nset -g history-limit 20000\n")

        def tmux_run(*args: str) -> str:
            return subprocess.run([tmux, "-S", str(socket), "-f", str(conf), *args],
                                  env=dict(env), capture_output=True, text=True, check=True,
                                  timeout=30).stdout

        inner = " ".join(shlex.quote(a) for a in command)
        shell = (f"cd {shlex.quote(str(cwd))} && "
                 f"script -qefc {shlex.quote(inner)} {shlex.quote(str(log))}")
        tmux_run("new-session", "-d", "-s", "t", "-x", str(COLUMNS), "-y", str(ROWS), shell)
        try:
            deadline = time.monotonic() + timeout
            while tmux_run("display-message", "-p", "-t", "t", "#{pane_dead}").strip() != "1":
                if time.monotonic() > deadline:
                    screen = tmux_run("capture-pane", "-p", "-J", "-t", "t", "-S", "-")
                    raise AssertionError(f"{inner} still running after {timeout} s:\n{screen}")
                time.sleep(0.2)
            screen = tmux_run("capture-pane", "-p", "-J", "-t", "t", "-S", "-")
        finally:
            subprocess.run([tmux, "-S", str(socket), "kill-server"], capture_output=True,
                           timeout=30, check=False)
        drawn = log.read_text(errors="replace")
        # script's last line: Script done on ... [COMMAND_EXIT_CODE="N"]
        ended = re.search(r'COMMAND_EXIT_CODE="(\d+)"\]\s*$', drawn)
        return Terminal(drawn, screen, int(ended.group(1)) if ended else -1)
