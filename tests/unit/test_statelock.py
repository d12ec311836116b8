"""The state directory's lock (daemon.ops.statelock): one holder at a time, named by pid."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from daemon.ops.statelock import LOCK_NAME, StateDirInUse, StateLock


def test_second_lock_is_refused_naming_the_holder_until_released(tmp_path: Path) -> None:
    """A second lock on a held state directory fails with the holder's pid and the path;
    once released, it succeeds."""
    state = tmp_path / "state" / "nested"
    first, second = StateLock(state), StateLock(state)
    first.acquire()
    assert first.held
    assert (state / LOCK_NAME).read_text() == f"{os.getpid()}\n"
    with pytest.raises(StateDirInUse) as err:
        second.acquire()
    assert err.value.pid == os.getpid()
    assert f"state directory {state} in use by pid {os.getpid()}" in str(err.value)
    assert not second.held
    first.release()
    first.release()  # idempotent
    second.acquire()
    assert second.held
    second.release()


@pytest.mark.process
def test_a_dead_holder_leaves_no_lock(tmp_path: Path) -> None:
    """A process that took the lock and was killed (its pid still in the file) blocks
    no one."""
    code = ("import sys, signal, os; from pathlib import Path; "
            "from daemon.ops.statelock import StateLock; StateLock(Path(sys.argv[1])).acquire(); "
            "os.kill(os.getpid(), signal.SIGKILL)")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=False,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == -9
    assert (tmp_path / LOCK_NAME).read_text().strip().isdigit()
    lock = StateLock(tmp_path)
    lock.acquire()
    assert (tmp_path / LOCK_NAME).read_text() == f"{os.getpid()}\n"
    lock.release()


def test_unwritable_state_directory_is_one_line_naming_it(tmp_path: Path) -> None:
    """A state directory that cannot be created fails with an OSError naming the path,
    not a StateDirInUse."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OSError, match="cannot lock the state directory") as err:
        StateLock(blocker / "state").acquire()
    assert not isinstance(err.value, StateDirInUse)
    assert str(blocker) in str(err.value)
