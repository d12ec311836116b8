"""A real HAProxy for the load-balancing tests: Debian's package, fetched with ``apt-get
download`` and unpacked with ``dpkg -x`` under the cache (no root, no system service), with
the libraries it needs that the machine lacks; run in the foreground on a config of the
test's; asked for its servers' states on its stats socket.

``python -m tests.support.haproxy`` fetches it (``make test-tools`` does, before the
tests); :func:`haproxy` fetches it on first use too, and skips the test only when
``apt-get download`` itself fails.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

FETCH_FAILED = "HAProxy could not be fetched with apt-get download"


def cache_dir() -> Path:
    """``$LLAMAD_CACHE/haproxy`` (default ``~/.cache/llamad/haproxy``), as
    packaging/build-llama-server.sh caches llama-server."""
    base = os.environ.get("LLAMAD_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "llamad")
    return Path(base) / "haproxy"


@dataclass(frozen=True)
class Binary:
    """The haproxy executable and the environment it runs with (its unpacked libraries)."""

    path: Path
    env: dict[str, str]


def _installed(package: str) -> bool:
    done = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package],
                          capture_output=True, text=True, check=False)
    return done.returncode == 0 and "install ok installed" in done.stdout


def _depends(deb: Path) -> list[str]:
    """The package names a .deb depends on (first of each alternative, no versions)."""
    field = subprocess.run(["dpkg-deb", "-f", str(deb), "Depends", "Pre-Depends"],
                           capture_output=True, text=True, check=True).stdout
    names = []
    for clause in re.split(r"[,\n]", field):
        first = clause.split("|")[0].strip()
        name = re.sub(r"^[A-Za-z-]+:\s*", "", first).split(" ")[0].split(":")[0]
        if name:
            names.append(name)
    return names


def fetch(root: Path) -> Path:
    """Download haproxy and every dependency not installed here, unpack them into
    ``root``; return the executable.

    Raises:
        RuntimeError: apt-get download or dpkg failed (its message).
    """
    debs = root / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    wanted, seen = ["haproxy"], set()
    options: list[str] = []  # the system's package lists, until they fail us
    while wanted:
        package = wanted.pop()
        if package in seen:
            continue
        seen.add(package)
        done = _download(package, debs, options)
        if done.returncode != 0 and not options:
            # A fresh machine (or container) may have no package lists: read them into a
            # private directory, which needs neither root nor a change to the system's.
            options = _private_lists(root)
            done = _download(package, debs, options)
        if done.returncode != 0:
            raise RuntimeError(f"apt-get download {package}: {done.stderr.strip()[-500:]}")
        deb = max(debs.glob(f"{package}_*.deb"), key=lambda p: p.stat().st_mtime)
        subprocess.run(["dpkg", "-x", str(deb), str(root / "root")], check=True)
        wanted += [d for d in _depends(deb) if d not in seen and not _installed(d)]
    return root / "root" / "usr" / "sbin" / "haproxy"


def _download(package: str, debs: Path,
              options: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["apt-get", *options, "download", package], cwd=debs,
                          capture_output=True, text=True, check=False)


def _private_lists(root: Path) -> list[str]:
    """``apt-get update`` into lists under ``root``; the options that make apt-get use
    them (the system's sources, no lock, no sandbox user).

    Raises:
        RuntimeError: the update failed (its message).
    """
    lists, cache = root / "apt" / "lists", root / "apt" / "cache"
    (lists / "partial").mkdir(parents=True, exist_ok=True)
    (cache / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    options = ["-o", f"Dir::State::Lists={lists}", "-o", f"Dir::Cache={cache}",
               "-o", "Debug::NoLocking=1", "-o", "APT::Sandbox::User=root"]
    done = subprocess.run(["apt-get", "-qq", *options, "update"], capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"apt-get update: {done.stderr.strip()[-500:]}")
    return options


def _runs(binary: Binary) -> bool:
    try:
        done = subprocess.run([str(binary.path), "-v"], env=binary.env, capture_output=True,
                              text=True, timeout=30, check=False)
    except OSError:
        return False
    return done.returncode == 0 and "HAProxy version" in done.stdout


def _unpacked(root: Path) -> Binary:
    libs = [str(p) for p in (root / "root" / "usr" / "lib" / "x86_64-linux-gnu",
                             root / "root" / "usr" / "lib" / "aarch64-linux-gnu",
                             root / "root" / "usr" / "lib") if p.is_dir()]
    env = {**os.environ, "LD_LIBRARY_PATH": ":".join(
        [*libs, *filter(None, [os.environ.get("LD_LIBRARY_PATH")])])}
    return Binary(root / "root" / "usr" / "sbin" / "haproxy", env)


def ensure() -> Binary:
    """HAProxy on PATH, else the cached unpacked package, else fetched now.

    Raises:
        RuntimeError: it could not be fetched.
    """
    found = shutil.which("haproxy")
    if found and _runs(Binary(Path(found), dict(os.environ))):
        return Binary(Path(found), dict(os.environ))
    root = cache_dir()
    binary = _unpacked(root)
    if not _runs(binary):
        fetch(root)
        binary = _unpacked(root)
        if not _runs(binary):
            raise RuntimeError(f"the unpacked {binary.path} does not run")
    return binary


def haproxy() -> Binary:
    """:func:`ensure`, skipping the test (with :data:`FETCH_FAILED`) when it fails."""
    try:
        return ensure()
    except RuntimeError as exc:
        pytest.skip(f"{FETCH_FAILED}: {exc}")


@dataclass(frozen=True)
class Node:
    """One daemon as HAProxy sees it: its gRPC and agent-check ports."""

    name: str
    port: int
    agent_port: int


def config(front: int, nodes: Sequence[Node], stats: Path, interval_ms: int = 300) -> str:
    """A gRPC frontend on ``front`` over ``nodes`` (h2 to the daemons): a TCP check of the
    gRPC port and an agent check, each every ``interval_ms``; a refused connection is
    retried on another node (redispatch). Weight 100, so the agent's percentages are
    weights 1 to 100 (of weight 1 they would round to 0). The config docs/scale-out.md
    shows."""
    servers = "\n".join(
        f"    server {n.name} 127.0.0.1:{n.port} proto h2 weight 100 check inter {interval_ms}ms "
        f"fall 1 rise 1 agent-check agent-port {n.agent_port} agent-inter {interval_ms}ms"
        for n in nodes)
    return f"""global
    maxconn 256
    stats socket {stats} level admin

defaults
    mode http
    timeout connect 1s
    timeout client 1h
    timeout server 1h
    timeout check 1s
    retries 2
    option redispatch 1

frontend grpc
    bind 127.0.0.1:{front} proto h2
    default_backend llamad

backend llamad
    balance leastconn
{servers}
"""


class HAProxy:
    """A running HAProxy: its frontend port and its servers' states."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, stats: Path,
                 log: Path) -> None:
        self.proc = proc
        self.port = port
        self.address = f"127.0.0.1:{port}"
        self._stats = stats
        self.log = log

    def command(self, line: str) -> str:
        """Send one command to the stats socket; its answer."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(5)
            s.connect(str(self._stats))
            s.sendall(line.encode() + b"\n")
            chunks = []
            while chunk := s.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def states(self) -> dict[str, str]:
        """Each server's status as ``show stat`` says it: UP, DOWN, DRAIN, ..."""
        lines = self.command("show stat").splitlines()
        header = lines[0].lstrip("# ").split(",")
        rows = [dict(zip(header, ln.split(","), strict=False)) for ln in lines[1:] if ln]
        return {r["svname"]: r["status"] for r in rows
                if r.get("pxname") == "llamad" and r["svname"] not in ("BACKEND", "FRONTEND")}

    def wait_state(self, server: str, prefix: str, timeout: float = 15.0) -> None:
        """Wait until ``server``'s status starts with ``prefix`` (UP, DOWN, DRAIN)."""
        deadline = time.monotonic() + timeout
        while not (state := self.states().get(server, "")).startswith(prefix):
            assert time.monotonic() < deadline, f"{server} is {state!r}, not {prefix}: " \
                f"{self.states()}\n{self.log.read_text()[-2000:]}"
            time.sleep(0.05)


@contextmanager
def running(binary: Binary, tmp: Path, front: int, nodes: Sequence[Node],
            interval_ms: int = 300) -> Iterator[HAProxy]:
    """HAProxy in the foreground on :func:`config`; stopped and reaped on the way out."""
    stats, cfg, log = tmp / "haproxy.sock", tmp / "haproxy.cfg", tmp / "haproxy.log"
    stats.unlink(missing_ok=True)
    cfg.write_text(config(front, nodes, stats, interval_ms))
    check = subprocess.run([str(binary.path), "-c", "-q", "-f", str(cfg)], env=binary.env,
                           capture_output=True, text=True, check=False)
    assert check.returncode == 0, f"haproxy -c: {check.stderr}{check.stdout}"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(binary.path), "-db", "-f", str(cfg)], env=binary.env,
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 15
        while not stats.exists():
            assert proc.poll() is None, f"haproxy exited: {log.read_text()}"
            assert time.monotonic() < deadline, f"no stats socket: {log.read_text()}"
            time.sleep(0.05)
        yield HAProxy(proc, front, stats, log)
    finally:
        proc.kill()
        proc.wait()


if __name__ == "__main__":
    try:
        found = ensure()
    except RuntimeError as exc:
        sys.stderr.write(f"warning: {FETCH_FAILED}: {exc}; the HAProxy tests skip (on CI that "
                         "fails)\n")
        sys.exit(0)
    sys.stdout.write(f"haproxy: {found.path}\n")
