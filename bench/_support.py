"""What the benchmark scripts share: where the repository and the models are, the
machine's description, and the markdown they write into ``bench/RESULTS.md``."""

from __future__ import annotations

import contextlib
import math
import os
import platform
import subprocess
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

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
