"""A child process: own process group, dies with the daemon, output always drained.

Process hygiene, in one place:

* The child leads its own process group (``process_group=0``), so a stop signals the
  child *and anything it spawned*, and a Ctrl-C on the daemon's terminal does not reach
  it directly.
* The child gets a parent-death signal (``PR_SET_PDEATHSIG`` = SIGKILL) through
  ``setpriv --pdeathsig`` before it execs, so even a SIGKILL of the daemon takes the
  child down; a child whose daemon died in the instant before the signal was armed
  notices (its parent is no longer the daemon) and exits. ``setpriv`` (util-linux) is
  used instead of a ``preexec_fn`` because ``preexec_fn`` is unsafe in a process with
  threads (gRPC has many). Without ``setpriv`` on PATH, a small Python prelude arms the
  same signal with ``prctl`` (through ctypes) and execs the command: the signal survives
  ``execve``, so the protection never silently disappears (it costs one interpreter
  start, ~20 ms, per child start).
* stdout and stderr are read continuously by two tasks into a :class:`LogRing`, so a
  chatty child never blocks on a full pipe.
* :meth:`ChildProcess.terminate` sends SIGTERM to the group, waits a grace period, then
  SIGKILL; the child is always reaped.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import shutil
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence

from ._logring import LogRing

_READ_CHUNK = 65536

LineSink = Callable[[int, str, str], None]
"""Called with (pid, stream name, line) for every line the child prints."""


# Run by the child once setpriv has armed the parent-death signal, before the real
# command: if the daemon ($0) died before that instant, the signal will never come (the
# kernel sends it only for a death after the prctl), and the child would run on as an
# orphan; so it exits instead. Any later death of the daemon kills it.
_ORPHAN_CHECK = 'if [ "$PPID" != "$0" ]; then exit 125; fi; exec "$@"'


# The same as setpriv + _ORPHAN_CHECK, for a machine without setpriv: arm the signal
# (prctl(PR_SET_PDEATHSIG = 1, SIGKILL)), check the parent is still the daemon, exec.
_PRCTL_PRELUDE = (
    "import ctypes, os, signal, sys\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "if libc.prctl(1, int(signal.SIGKILL), 0, 0, 0) != 0:\n"
    "    sys.exit('prctl(PR_SET_PDEATHSIG) failed: ' + os.strerror(ctypes.get_errno()))\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit(125)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


def pdeathsig_method() -> str:
    """How children get their parent-death signal: ``setpriv`` or ``prctl`` (the Python
    prelude, when setpriv is not on PATH)."""
    return "setpriv" if shutil.which("setpriv") else "prctl"


def _pdeathsig_prefix() -> list[str]:
    setpriv = shutil.which("setpriv")
    if not setpriv:
        # -I: isolated (no user site, no PYTHON* variables); -S: no site import (fast).
        return [sys.executable, "-I", "-S", "-c", _PRCTL_PRELUDE, str(os.getpid())]
    prefix = [setpriv, "--pdeathsig", "KILL", "--"]
    sh = shutil.which("sh")
    return [*prefix, sh, "-c", _ORPHAN_CHECK, str(os.getpid())] if sh else prefix


def can_lower_niceness(to: int) -> bool:
    """Whether this process may set a nice value as low as ``to`` (root, CAP_SYS_NICE, or
    an RLIMIT_NICE allowing it: systemd's ``LimitNICE=``)."""
    if os.geteuid() == 0:
        return True
    soft, _ = resource.getrlimit(resource.RLIMIT_NICE)
    if soft == resource.RLIM_INFINITY or 20 - soft <= to:
        return True
    try:
        with open("/proc/self/status") as fh:
            caps = next((ln.split()[1] for ln in fh if ln.startswith("CapEff:")), "0")
    except OSError:
        return False
    return bool(int(caps, 16) & (1 << 23))  # CAP_SYS_NICE


_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float | None:
    """The CPU time (user and system, every thread) process ``pid`` has used, in seconds;
    None when it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    # After the command name (in parentheses, which may hold anything): state is the
    # first field, utime and stime the 12th and 13th.
    fields = stat[stat.rfind(b")") + 2:].split()
    try:
        return (int(fields[11]) + int(fields[12])) / _TICKS
    except (IndexError, ValueError):
        return None


def renice(pid: int, value: int) -> bool:
    """Set the nice value of every thread of ``pid`` (niceness is per thread on Linux).

    Returns False when the process is gone or a thread could not be changed.
    """
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    done = True
    for tid in tids:
        try:
            os.setpriority(os.PRIO_PROCESS, int(tid), value)
        except ProcessLookupError:
            continue  # that thread ended
        except PermissionError:
            done = False
    return done


class ChildProcess:
    """A running child. Create with :meth:`spawn`."""

    def __init__(self, proc: asyncio.subprocess.Process, ring: LogRing, sink: LineSink | None):
        self._proc = proc
        self._ring = ring
        self._sink = sink
        self.pid: int = proc.pid
        self.killed_by_us = False
        self.lines_seen = 0
        self._drains = [
            asyncio.create_task(self._drain(proc.stdout, "stdout"), name=f"drain-out-{proc.pid}"),
            asyncio.create_task(self._drain(proc.stderr, "stderr"), name=f"drain-err-{proc.pid}"),
        ]
        self._recent: list[str] = []

    @classmethod
    async def spawn(
        cls,
        argv: Sequence[str],
        *,
        ring: LogRing,
        env: Mapping[str, str] | None = None,
        sink: LineSink | None = None,
        cwd: str | None = None,
    ) -> ChildProcess:
        """Start ``argv`` in its own process group with parent-death protection.

        Raises:
            OSError: the executable cannot be started (missing, not executable).
        """
        full_env = dict(os.environ if env is None else env)
        proc = await asyncio.create_subprocess_exec(
            *_pdeathsig_prefix(),
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=full_env,
            cwd=cwd,
            process_group=0,
        )
        return cls(proc, ring, sink)

    @property
    def returncode(self) -> int | None:
        """None while the process is alive."""
        return self._proc.returncode

    def recent_lines(self) -> list[str]:
        """The last lines this process printed (up to 50), oldest first."""
        return list(self._recent)

    async def _drain(self, stream: asyncio.StreamReader | None, name: str) -> None:
        if stream is None:
            return
        pending = b""
        while True:
            chunk = await stream.read(_READ_CHUNK)
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                self._emit(name, raw)
            if len(pending) > _READ_CHUNK:  # an endless line: flush what we have
                self._emit(name, pending)
                pending = b""
        if pending:
            self._emit(name, pending)

    def _emit(self, stream: str, raw: bytes) -> None:
        text = raw.decode("utf-8", "replace").rstrip("\r")
        self.lines_seen += 1
        self._ring.append(time.time(), self.pid, stream, text)
        self._recent.append(text)
        if len(self._recent) > 50:
            del self._recent[:-50]
        if self._sink is not None:
            self._sink(self.pid, stream, text)

    async def wait(self) -> int:
        """Wait for the process to exit and its output to be drained; return its status."""
        code = await self._proc.wait()
        # The pipes close when the process (and any grandchild holding them) is gone.
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.gather(*self._drains), timeout=2.0)
        return code

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the child's whole process group; no error if it is gone."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    async def terminate(self, grace: float) -> int:
        """Stop the child: SIGTERM to the group, wait ``grace`` s, then SIGKILL. Reaps.

        Safe to call more than once and after the child exited. Cancelling the caller
        does not leave the child behind: the kill and the reap are shielded.
        """
        self.killed_by_us = True
        return await asyncio.shield(self._terminate(grace))

    async def _terminate(self, grace: float) -> int:
        if self._proc.returncode is None:
            self.signal_group(signal.SIGTERM)
            try:
                return await asyncio.wait_for(self.wait(), timeout=grace)
            except TimeoutError:
                pass
        self.signal_group(signal.SIGKILL)  # also reaches grandchildren left behind
        return await self.wait()

    def kill(self) -> None:
        """SIGKILL the group now (the caller must still :meth:`wait`)."""
        self.killed_by_us = True
        self.signal_group(signal.SIGKILL)
