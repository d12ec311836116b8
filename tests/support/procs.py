"""Processes seen from /proc: is one alive, wait for some to go, every process's stat
fields (shared with the benches), what runs below one; and a free TCP port."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Sequence


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def gone(pids: Sequence[int], timeout: float = 10.0) -> list[int]:
    """Wait until none of ``pids`` is alive; return the ones still alive."""
    deadline = time.monotonic() + timeout
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def proc_stats() -> dict[int, list[str]]:
    """pid -> the fields of /proc/pid/stat after the command name (state, ppid, ...; utime
    is [11], stime [12], the reaped children's cutime and cstime [13] and [14])."""
    stats: dict[int, list[str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stats[int(entry)] = fh.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
    return stats


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` in the process tree."""
    children: dict[int, list[int]] = {}
    for child, fields in proc_stats().items():
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(child)
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
