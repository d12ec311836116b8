"""Why a child stopped, classified.

The classification decides what happens next: a permanent cause (a model that cannot
load, arguments the runtime rejects) opens the circuit breaker at once, because
restarting cannot fix it; a transient one (a crash, an OOM kill, a port clash, a hang)
backs off and retries.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ExitCause:
    """Why a child is gone (or never became ready).

    Attributes:
        kind: crash, signal, oom, port_in_use, usage_error, model_error, invalid_model,
            hung, never_ready, start_timeout, spawn_error, stranger, stopped; for an
            external endpoint, one of :data:`supervisor.endpoint._client.ENDPOINT_KINDS`.
        permanent: True when retrying the same launch cannot help.
        message: one line, in words.
        exit_code: the process's exit status when it exited by itself.
        signal: the signal name when a signal killed it.
        at: wall-clock time it was recorded.
    """

    kind: str
    permanent: bool
    message: str
    exit_code: int | None = None
    signal: str = ""
    at: float = 0.0


# What a child's last lines say of why it exited, in order of precedence: the first of
# these patterns (case-blind) that a line matches names the cause, the line its message.
_TOLD_IN_OUTPUT: tuple[tuple[str, bool, re.Pattern[str]], ...] = tuple(
    (kind, permanent, re.compile(pattern, re.IGNORECASE)) for kind, permanent, pattern in (
        # The model cannot be loaded. Examples:
        #   llama_model_load: error loading model: ...       (llama.cpp, both runtimes)
        #   main: exiting due to model loading error          (llama-server)
        #   ValueError: Failed to load model from file: ...   (llama-cpp-python)
        ("model_error", True,
         r"error loading model|exiting due to model loading error|failed to load model"
         r"|gguf_init_from_file|invalid magic|unknown model architecture"),
        ("port_in_use", False,
         r"couldn't bind|address already in use|error while attempting to bind"),
        # Argument errors: llama-server's "error: invalid argument: --x", argparse's
        # "usage: ... error: unrecognized arguments" (exit 2) and pydantic-settings
        # validation errors.
        ("usage_error", True,
         r"invalid argument|unrecognized argument|error: argument|validation error"),
        # argparse prints its (long) usage before the error line: the usage line is only
        # the fallback message, so the cause names the bad argument.
        ("usage_error", True, r"^usage:"),
    )
)


def _last_meaningful(lines: Sequence[str]) -> str:
    for line in reversed(lines):
        text = line.strip()
        if text:
            return text[:300]
    return ""


def _first_match(pattern: re.Pattern[str], lines: Sequence[str]) -> str | None:
    for line in lines:
        if pattern.search(line):
            return line.strip()[:300]
    return None


def cgroup_oom_kills() -> int | None:
    """The ``oom_kill`` count of this process's cgroup (v2), or None if unreadable.

    Children share the daemon's cgroup (under systemd, the unit's), so a rise of this
    counter while a child died of SIGKILL means the kernel's OOM killer chose it.
    """
    try:
        with open("/proc/self/cgroup") as fh:
            path = next((ln.strip()[3:] for ln in fh if ln.startswith("0::")), None)
        if path is None:
            return None
        with open(f"/sys/fs/cgroup{path}/memory.events") as fh:
            for line in fh:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def classify_exit(
    returncode: int,
    tail: Sequence[str],
    *,
    we_killed: bool = False,
    oom_kills: int | None = None,
    at: float = 0.0,
) -> ExitCause:
    """Classify a child's exit from its return code and its last output lines.

    Args:
        returncode: as from ``Popen.returncode`` (negative: killed by that signal).
        tail: the child's last output lines, oldest first.
        we_killed: the supervisor itself sent the fatal signal (a stop, or a hung child).
        oom_kills: how many OOM kills the cgroup saw during the child's life (None:
            unknown).
        at: wall-clock time to stamp on the cause.
    """
    if returncode < 0:
        sig = -returncode
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"SIG{sig}"
        if we_killed:
            return ExitCause("stopped", False, f"stopped with {name}", signal=name, at=at)
        if sig == signal.SIGKILL and oom_kills:
            return ExitCause("oom", False, "killed by the kernel's OOM killer",
                             signal=name, at=at)
        if sig == signal.SIGKILL:
            return ExitCause(
                "signal", False,
                "killed by SIGKILL, not sent by llamad (another process, or the OOM killer "
                "outside this cgroup's accounting)",
                signal=name, at=at,
            )
        return ExitCause("signal", False, f"killed by {name}", signal=name, at=at)

    for kind, permanent, pattern in _TOLD_IN_OUTPUT:
        if (line := _first_match(pattern, tail)) is not None:
            return ExitCause(kind, permanent, line, exit_code=returncode, at=at)
    if returncode == 0:
        return ExitCause(
            "crash", False, "exited with status 0 without being asked to stop",
            exit_code=0, at=at,
        )
    message = _last_meaningful(tail) or f"exited with status {returncode}"
    return ExitCause("crash", False, message, exit_code=returncode, at=at)
