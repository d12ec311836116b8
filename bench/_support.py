"""What the benchmark scripts share: where the repository and the models are, the
machine's description, how busy it is while a part is timed (and waiting for it to be
quiet), and the markdown they write into ``bench/RESULTS.md``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import math
import os
import platform
import shlex
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from llamad_protocol.v1.wire import RETRY_AFTER_KEY
from supervisor import find_llama_server
from tests.support.procs import proc_stats

ROOT = Path(__file__).resolve().parent.parent
MODELS_DIR = Path(os.environ.get("LLAMAD_MODELS_DIR") or ROOT / "models" / "gguf")
DEFAULT_MODEL = "gemma-3-270m-q4_k_m.gguf"
SMALL_MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBED_MODEL = "all-MiniLM-L6-v2-f16.gguf"


def model_file(name: str) -> Path:
    """``name`` as a path, else in MODELS_DIR; exits saying where it looked if missing."""
    path = Path(name)
    if not path.is_file():
        path = MODELS_DIR / name
    if not path.is_file():
        raise SystemExit(f"bench: model {name} not found (looked in {MODELS_DIR})")
    return path.resolve()


def short(model: str) -> str:
    """A model's short name in tables."""
    return "gemma-3-270m" if model.startswith("gemma") else (
        "SmolLM2-135M" if model.startswith("SmolLM2") else model or "?")


# -- the machine ---------------------------------------------------------------------------


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def version_of(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def ancestors() -> set[int]:
    """This process and its ancestors (a shell that started us names the script too)."""
    out = set()
    pid = os.getpid()
    while pid > 1 and pid not in out:
        out.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return out


def foreign_benchmarks() -> list[str]:
    """Other benchmark processes (``pgrep -fa 'bench\\.'``), ours and our ancestors
    excluded."""
    try:
        out = subprocess.run(["pgrep", "-fa", r"bench\."], capture_output=True, text=True,
                             check=False).stdout
    except OSError:
        return []
    mine = ancestors()
    return [line for line in out.splitlines()
            if line.split(maxsplit=1) and int(line.split(maxsplit=1)[0]) not in mine]


def under(pid: int, root: int, parent: dict[int, int]) -> bool:
    """Whether ``pid`` is ``root`` or below it in the process tree ``parent``."""
    p, hops = pid, 0
    while p not in (root, 0, 1) and hops < 64:
        p, hops = parent.get(p, 0), hops + 1
    return p == root


def tree_ticks(root: int) -> int:
    """CPU ticks used so far by ``root`` and its descendants (reaped ones included)."""
    stats = proc_stats()
    parent = {pid: int(fields[1]) for pid, fields in stats.items()}
    return sum(sum(int(x) for x in fields[11:15]) for pid, fields in stats.items()
               if under(pid, root, parent))


# -- markdown --------------------------------------------------------------------------------


def f3(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.3f}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def command_line(module: str, argv: Sequence[str] | None) -> str:
    """How a bench was run, for its report: ``.venv/bin/python -m MODULE`` and its
    arguments (``argv``, or the process's own when None), quoted for a shell."""
    return shlex.join([".venv/bin/python", "-m", module,
                       *(sys.argv[1:] if argv is None else argv)])


def publish(path: Path, sections: Sequence[list[str]]) -> None:
    """Print ``sections`` and write them to ``path`` (:func:`write_sections`)."""
    for section in sections:
        print("\n".join(section), end="\n\n")
    write_sections(path, sections)
    print(f"written to {path}", flush=True)


def print_or_publish(section: list[str], out: Path, write: bool) -> None:
    """A bench's one section: published into ``out`` (:func:`publish`), or only printed
    (``--no-write``)."""
    if write:
        publish(out, [section])
    else:
        print("\n".join(section))


def write_sections(path: Path, sections: Sequence[list[str]]) -> None:
    """Create or replace each section (by its ``## `` heading); keep the others."""
    text = path.read_text() if path.exists() else (
        "# Benchmarks\n\nWritten by the scripts in `bench/`; each section says how to "
        "reproduce it.\n")
    blocks: list[list[str]] = [[]]
    for line in text.rstrip("\n").splitlines():
        if line.startswith("## "):
            blocks.append([])
        blocks[-1].append(line)
    for section in sections:
        for block in blocks:
            if block and block[0] == section[0]:
                block[:] = [*section, ""]
                break
        else:
            if blocks[-1] and blocks[-1][-1] != "":
                blocks[-1].append("")
            blocks.append([*section, ""])
    lines = [line for block in blocks for line in block]
    while lines and lines[-1] == "":
        lines.pop()
    path.write_text("\n".join(lines) + "\n")


# -- the machine while a part is timed ---------------------------------------------------


CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class CpuSnap:
    at: float  # time.monotonic()
    busy: int  # system-wide busy ticks, steal included (/proc/stat)
    own: int  # ticks of this process and its descendants, reaped ones included


def _busy_ticks() -> int:
    with open("/proc/stat") as fh:
        user, nice, system, _idle, _iowait, irq, softirq, steal = (
            int(x) for x in fh.readline().split()[1:9])
    return user + nice + system + irq + softirq + steal


def cpu_snap() -> CpuSnap:
    return CpuSnap(time.monotonic(), _busy_ticks(), tree_ticks(os.getpid()))


def foreign_cores(before: CpuSnap, after: CpuSnap) -> float:
    """Cores used on average, between two snapshots, by processes that are not ours."""
    seconds = max(after.at - before.at, 1e-3)
    return max(0, (after.busy - before.busy) - (after.own - before.own)) / CLK_TCK / seconds


CI_LOG = Path("/tmp/ci/run.log")  # noqa: S108 (only read: a CI run on this machine)


async def active_benchmarks(window: float = 3.0, idle: float = 0.05) -> list[str]:
    """The other benchmarks that are measuring: those whose process tree used more than
    ``idle`` cores over ``window`` seconds. One that only waits for a quiet machine (for
    this one, maybe) is idle, and is not counted: two benchmarks waiting for each other
    would otherwise both wait until they give up."""
    others = foreign_benchmarks()
    pids = [int(line.split(maxsplit=1)[0]) for line in others]
    before = {pid: tree_ticks(pid) for pid in pids}
    await asyncio.sleep(window)
    tck = os.sysconf("SC_CLK_TCK")
    return [line for line, pid in zip(others, pids, strict=True)
            if (tree_ticks(pid) - before[pid]) / tck / window > idle]


def ci_running(log: Path = CI_LOG) -> bool:
    """Whether a CI run is going: its log exists and does not end with ``exit=...``."""
    try:
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return False
    return bool(lines) and not lines[-1].startswith("exit=")


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=False,
                              timeout=5).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        load1, load5, load15 = os.getloadavg()
        return f"load average: {load1:.2f}, {load5:.2f}, {load15:.2f}"


def proc_table() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, CPU ticks it used so far; its reaped children's not included,
    so that a reap does not count a child's whole life again)."""
    return {pid: (int(f[1]), int(f[11]) + int(f[12])) for pid, f in proc_stats().items()}


def command_of(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()[:90]
    except OSError:
        return "?"


class CpuMonitor:
    """Samples, every ``period`` seconds, the cores used by processes outside this one's
    tree (perf_counter time), and which foreign process used the most in busy samples."""

    def __init__(self, period: float = 1.0, busy: float = 0.25) -> None:
        self.period = period
        self.busy = busy
        self.samples: list[tuple[float, float, float]] = []  # (from, to, foreign cores)
        self.offenders: Counter[str] = Counter()  # command -> busy samples it led
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="cpu-monitor")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        tck = os.sysconf("SC_CLK_TCK")
        me = os.getpid()
        before, t0 = proc_table(), time.perf_counter()
        while True:
            await asyncio.sleep(self.period)
            after, t1 = proc_table(), time.perf_counter()
            foreign: dict[int, int] = {}
            for pid, (_, ticks) in after.items():
                p, hops = pid, 0
                while p not in (me, 0, 1) and hops < 64:
                    p, hops = after.get(p, (0, 0))[0], hops + 1
                if p != me:
                    foreign[pid] = ticks - before[pid][1] if pid in before else ticks
            cores = sum(foreign.values()) / tck / (t1 - t0)
            self.samples.append((t0, t1, cores))
            if cores > self.busy and foreign:
                top = max(foreign, key=lambda k: foreign[k])
                self.offenders[command_of(top)] += 1
            before, t0 = after, t1

    def foreign(self, start: float, end: float) -> float:
        """Average foreign cores over [start, end] (perf_counter), from the samples."""
        weight = total = 0.0
        for a, b, cores in self.samples:
            overlap = min(b, end) - max(a, start)
            if overlap > 0:
                weight += overlap
                total += overlap * cores
        return total / weight if weight else math.nan

    def disturbed(self, start: float, end: float) -> bool:
        value = self.foreign(start, end)
        return not math.isnan(value) and value > self.busy


MONITOR = CpuMonitor()


@dataclass
class PartNote:
    """The machine around one timed part."""

    part: str
    uptime: str = ""
    waited: float = 0.0  # seconds spent waiting for other benchmarks
    others: list[str] = field(default_factory=list)  # other benchmarks seen during the part
    foreign: float = 0.0  # cores used on average by processes that are not ours
    busy_share: float = 0.0  # share of seconds in which they used more than MONITOR.busy
    offenders: list[tuple[str, int]] = field(default_factory=list)  # (command, busy seconds)
    seconds: float = 0.0
    start: float = 0.0  # perf_counter
    offended_before: dict[str, int] = field(default_factory=dict, repr=False)

    def line(self) -> str:
        others = ("; other benchmarks seen: " + "; ".join(self.others)) if self.others else (
            "; no other benchmark ran")
        waited = f" (after waiting {self.waited:.0f} s for a quiet machine)" if (
            self.waited >= 5) else ""
        busy = ""
        if self.offenders:
            busy = ("; busiest foreign processes then: " + "; ".join(
                f"`{c}` ({n} s)" for c, n in self.offenders[:3]))
        return (f"- Machine during this part: `{self.uptime}` at its start{waited}; other "
                f"processes used {self.foreign:.2f} cores on average over its "
                f"{self.seconds:.0f} s, more than {MONITOR.busy} cores in "
                f"{self.busy_share:.0%} of its seconds{busy}{others}.")


async def begin_part(name: str, wait_limit: float, anyway: bool,
                     max_foreign: float, *, wait_others: bool = True) -> PartNote:
    """Wait until no other benchmark measures (see :func:`active_benchmarks`; only when
    ``wait_others``), no CI run is going and other processes use at most ``max_foreign``
    cores over 3 s. After ``wait_limit`` seconds: refuse if another benchmark still
    measures (unless ``anyway``), else measure regardless (the section says how busy the
    machine was). Note ``uptime``; start the CPU accounting."""
    note = PartNote(name)
    began = time.monotonic()
    told = 0.0
    while True:
        before = cpu_snap()
        active = await active_benchmarks() if wait_others else []
        if not wait_others:
            await asyncio.sleep(3)
        share = foreign_cores(before, cpu_snap())
        ci = ci_running()
        if not active and share <= max_foreign and not ci:
            break
        if time.monotonic() - began >= wait_limit:
            if active and not anyway:
                raise SystemExit(f"other benchmarks still run after {wait_limit:.0f}s; not "
                                 f"measuring (--anyway to measure regardless): {active}")
            break  # measure regardless; the section says how busy the machine was
        if time.monotonic() - told > 60:
            told = time.monotonic()
            why = (f"other benchmarks run: {active}" if active else
                   "a CI run is going" if ci else f"other processes use {share:.2f} cores")
            print(f"  waiting for a quiet machine: {why}", flush=True)
    note.waited = time.monotonic() - began
    active = await active_benchmarks()
    note.others = [line if line in active else f"{line} (idle: waiting)"
                   for line in foreign_benchmarks()]
    note.uptime = uptime()
    print(f"\n== {name}: {note.uptime}", flush=True)
    note.start = time.perf_counter()
    note.offended_before = dict(MONITOR.offenders)
    return note


def end_part(note: PartNote) -> None:
    end = time.perf_counter()
    note.seconds = end - note.start
    note.foreign = MONITOR.foreign(note.start, end)
    inside = [c for a, b, c in MONITOR.samples if a >= note.start and b <= end]
    note.busy_share = sum(c > MONITOR.busy for c in inside) / len(inside) if inside else 0.0
    note.offenders = (MONITOR.offenders - Counter(note.offended_before)).most_common(3)
    for line in foreign_benchmarks():
        if line not in note.others:
            note.others.append(line)


# -- what was measured, and how ------------------------------------------------------------


PROMPTS: tuple[str, ...] = (
    "The history of the printing press began",
    "Here is a short story about a lighthouse keeper who",
    "Photosynthesis is the process by which",
    "A beginner's guide to cooking rice: first,",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Ten tips for writing clear documentation:\n1.",
    "Once upon a time, in a small village near the mountains,",
    "My favourite differences between TCP and UDP are",
)


def llama_server_version() -> str:
    binary = find_llama_server()
    if binary is None:
        return "not found"
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10,
                             check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    for line in (out.stdout + out.stderr).splitlines():
        if line.startswith("version:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def bench_parser(module: str, doc: str | None) -> argparse.ArgumentParser:
    """The parser of ``python -m {module}``, described by the first paragraph of ``doc``
    (the script's docstring)."""
    return argparse.ArgumentParser(prog=f"python -m {module}",
                                   description=doc.split("\n\n")[0] if doc else None)


def add_quiet_options(p: argparse.ArgumentParser, when: str) -> None:
    """``--wait-others``, ``--max-foreign`` and ``--anyway``: how long to wait ``when``
    (say, "before each part") for other benchmarks to end and the other processes to use
    few cores, and whether to go on when they do not."""
    p.add_argument("--wait-others", type=float, default=900.0, metavar="SECONDS",
                   help=f"wait this long for other benchmarks to finish {when}")
    p.add_argument("--max-foreign", type=float, default=0.25, metavar="CORES",
                   help=f"{when}, also wait (within --wait-others) until other processes "
                   "use at most this many cores (default 0.25)")
    p.add_argument("--anyway", action="store_true",
                   help="measure even if other benchmarks still run after --wait-others")


def git_head(form: str = "%h") -> str:
    """HEAD as ``git log --format=form`` shows it, or "unknown" outside a git checkout."""
    try:
        return subprocess.run(["git", "log", "-1", f"--format={form}"], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def source() -> str:
    """The llamad commit measured, and which top-level directories differ from it."""
    def git(*args: str) -> str:
        out = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                             timeout=10, check=False)
        return out.stdout.strip() if out.returncode == 0 else ""

    try:
        rev = git("log", "-1", "--format=%h %s")
        changed = sorted({name.split("/")[0] for name in git("diff", "--name-only", "HEAD")
                          .splitlines() if name})
    except (OSError, subprocess.TimeoutExpired):
        rev, changed = "", []
    if not rev:
        return "not a git checkout"
    subject = rev.split(" ", 1)
    head = f"commit {subject[0]} ({subject[1][:60]}{'...' if len(subject[1]) > 60 else ''})"
    return head + (f", with uncommitted changes in {', '.join(changed)}" if changed else "")


def environment(command: str, llama_bin: str | None = None) -> list[str]:
    """The section's opening lines: date, commit, machine, versions, command (and the
    llama-server binary, when one was given)."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    binary = [f"- llama-server binary: `{llama_bin}`"] if llama_bin else []
    return [*binary,
        f"- Date: {now}; llamad {source()}",
        f"- Machine: {os.cpu_count()} CPUs ({cpu_model()}), Linux {platform.release()}, "
        f"Python {platform.python_version()}",
        f"- llama-cpp-python {version_of('llama_cpp_python')} (bundled runtime; its sources "
        f"built llama-server {llama_server_version()}), grpcio {version_of('grpcio')}, "
        f"httpx {version_of('httpx')}",
        f"- Command: `{command}`",
    ]


RETRY_KEY = RETRY_AFTER_KEY


RETRYABLE = ("UNAVAILABLE", "RESOURCE_EXHAUSTED")


def pct(values: Sequence[float], q: float) -> float:
    """The q-th percentile (linear interpolation between closest ranks)."""
    xs = sorted(v for v in values if not math.isnan(v))
    if not xs:
        return math.nan
    k = (len(xs) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)
