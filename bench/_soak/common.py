"""What ``bench.soak`` shares: limits, the daemon process, and the records of what happened."""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from bench._support import under
from llamad_protocol.v1 import common_pb2
from tests.support.procs import proc_stats

T = TypeVar("T")

HEADING = "## Soak"
MIB = 1024 * 1024
HANG_GRACE = 2.0  # a call running this long past its deadline hangs
THREADS = 2
GEN = common_pb2.CHILD_ROLE_GENERATION
PUSH_SOURCE = "soak-push"
DIR_SOURCE = "soak-dir"
CLIENT_CANCEL = "CANCELLED by the client"

DEADLINES: dict[str, float] = {
    "Generate": 30.0,
    "Search": 10.0,
    "UpsertDocument": 30.0,
    "DeleteDocument": 10.0,
    "Reindex": 120.0,
    "Swap": 150.0,
    "Status": 5.0,
    "RetrievalService/Status": 10.0,
    "ListDocuments": 30.0,
    "AddSource": 10.0,
}

# The growth rule: (absolute limit, relative limit or None), in the metric's unit.
RSS_LIMIT_MIB = 30.0
RSS_LIMIT_SHARE = 0.10
FD_LIMIT = 8
THREAD_LIMIT = 4

WORDS = (
    "disk", "nginx", "replication", "certificate", "latency", "backup", "rotation", "vpn",
    "tunnel", "kernel", "memory", "swap", "queue", "consumer", "partition", "leader",
    "failover", "dns", "resolver", "firewall", "rule", "route", "gateway", "switch",
    "uplink", "vlan", "database", "vacuum", "index", "snapshot", "restore", "cron",
    "timer", "service", "restart", "journal", "alert", "threshold", "pager", "runbook",
)
QUERIES = (
    "disk full on the web server", "how to restore a database snapshot",
    "vpn tunnel flapping", "certificate renewal", "replication lag on the replica",
    "firewall rule for the gateway", "restart the consumer service", "dns resolver timeout",
)


# -- the daemon process ------------------------------------------------------------------


@dataclass(frozen=True)
class ProcStat:
    rss: int  # bytes
    fds: int
    threads: int
    rss_anon: int = 0  # bytes: heap and other private memory (RssAnon)
    rss_file: int = 0  # bytes: mapped files (RssFile)


def proc_stat(pid: int) -> ProcStat | None:
    """Resident memory, open file descriptors and threads of ``pid``; None if it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    fields: dict[str, int] = {}
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "Threads"):
            number = int(value.split()[0])
            fields[key] = number if key == "Threads" else number * 1024
    return ProcStat(fields.get("VmRSS", 0), fds, fields.get("Threads", 0),
                    fields.get("RssAnon", 0), fields.get("RssFile", 0))


def descendants(root: int) -> list[int]:
    """Every live process under ``root`` (children, grandchildren, ...)."""
    parent = {pid: int(fields[1]) for pid, fields in proc_stats().items()}
    return sorted(pid for pid, ppid in parent.items() if under(ppid, root, parent))


def daemon_env(state_dir: Path, corpus: Path, model: Path, embed: Path) -> dict[str, str]:
    return {
        "LLAMAD_RETRIEVAL_ALLOWED_ROOTS": str(corpus),
        "LLAMAD_LISTEN": "127.0.0.1:0",
        "LLAMAD_STATE_DIR": str(state_dir),
        "LLAMAD_GENERATION_MODEL": str(model),
        "LLAMAD_GENERATION_RUNTIME": "llama-server",
        "LLAMAD_GENERATION_THREADS": str(THREADS),
        "LLAMAD_GENERATION_PARALLEL": "2",
        "LLAMAD_GENERATION_CTX_SIZE": "2048",
        "LLAMAD_EMBEDDING_MODEL": str(embed),
        "LLAMAD_EMBEDDING_RUNTIME": "llama-server",
        "LLAMAD_EMBEDDING_THREADS": str(THREADS),
        "LLAMAD_LOG_FORMAT": "json",
    }


# -- what the clients did ------------------------------------------------------------------


@dataclass
class Sample:
    t: float  # seconds since the load started
    rss: int
    fds: int
    threads: int
    children: int
    children_rss: int
    children_fds: int
    children_threads: int
    calls: int  # calls finished so far
    acked: int  # documents acknowledged so far (push source)
    phase: str = "load"  # "idle" before the load, "load", "after" once it stopped
    rss_anon: int = 0  # the daemon's RssAnon (heap, private memory)
    rss_file: int = 0  # the daemon's RssFile (mapped files)


@dataclass
class DocRecord:
    """One pushed document, as the clients know it."""

    id: str
    token: str | None = None  # the last acknowledged write's token
    superseded: list[str] = field(default_factory=list)  # earlier acknowledged tokens
    pending: list[str] = field(default_factory=list)  # unacknowledged writes since then
    deleted: bool = False  # an acknowledged delete (deleted=true)
    delete_pending: bool = False  # a delete that got no answer
    busy: bool = False  # a write to it is running

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Busy (so not clean, and left alone by other clients) while a write runs."""
        self.busy = True
        try:
            yield
        finally:
            self.busy = False

    @property
    def clean(self) -> bool:
        return (self.token is not None and not self.pending and not self.deleted
                and not self.delete_pending and not self.busy)


@dataclass
class SwapRecord:
    at: float  # seconds since the load started
    from_model: str
    to_model: str
    seconds: float
    code: str
    message: str


@dataclass
class Hung:
    rpc: str
    at: float
    deadline: float


@dataclass
class Check:
    """The end-of-run check of the writes."""

    push_checked: int = 0  # acknowledged, no unanswered write after, not deleted
    push_not_indexed: list[str] = field(default_factory=list)
    push_not_found: list[str] = field(default_factory=list)
    ambiguous_checked: int = 0  # acknowledged, then a write or delete with no answer
    ambiguous_lost: list[str] = field(default_factory=list)
    deleted_checked: int = 0
    resurrected: list[str] = field(default_factory=list)
    superseded_checked: int = 0
    stale: list[str] = field(default_factory=list)  # a superseded token still finds its doc
    never_acked: int = 0
    dir_reindex: str = ""
    dir_checked: int = 0
    dir_lost: list[str] = field(default_factory=list)
    dir_removed_checked: int = 0
    dir_stale: list[str] = field(default_factory=list)
    in_flight: int = -1  # generation calls running once the load stopped (after settling)
    queued: int = -1
    settle_seconds: float = 0.0

    @property
    def lost(self) -> int:
        return (len(self.push_not_indexed) + len(self.push_not_found) + len(self.ambiguous_lost)
                + len(self.dir_lost))


def token(rng: random.Random) -> str:
    return "sk" + "".join(rng.choice("abcdefghjkmnpqrstuvwxyz23456789") for _ in range(10))


def body(rng: random.Random, tok: str, paragraphs: int) -> str:
    out = []
    for _ in range(paragraphs):
        words = [rng.choice(WORDS) for _ in range(rng.randint(25, 70))]
        out.append(" ".join(words).capitalize() + ".")
    out.insert(rng.randrange(len(out) + 1), f"Reference {tok} for this note.")
    return "\n\n".join(out)
