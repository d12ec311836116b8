"""Connections to the PostgreSQL store: options, the password, and a small pool.

The password never travels in the DSN: it is read from a file (``password_file``) or an
environment variable (``password_env``) and handed to libpq as its own parameter, so no
string llamad formats (a log line, an error, :func:`describe`) can hold it. A DSN that
carries one is refused, without echoing it. Every error from psycopg is re-raised as
:class:`~retrieval.errors.StoreUnavailable` with the server described by
:func:`describe` and the password, should libpq ever quote it, scrubbed from the text.

Connections are sync psycopg 3 ones: the embedded store is called the same way, from
worker threads (``asyncio.to_thread``) by :mod:`retrieval.store._indexes`, so the store keeps
that shape and the wiring stays a swap of one object for another. :class:`Pool` hands
each thread a connection of its own (searches run in parallel on the server), opening at
most ``max_connections`` and dropping any that broke.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import conninfo
from psycopg.rows import TupleRow

from ..errors import InvalidDocument, StorageFull, StoreUnavailable

Connection = psycopg.Connection[TupleRow]


@dataclass(frozen=True)
class PgOptions:
    """How to reach the PostgreSQL store (``retrieval.store = postgres``).

    Attributes:
        dsn: a libpq connection string or URI, without a password
            (``postgresql://llamad@db.example.net/kb``, ``host=/run/postgresql dbname=kb``).
        password_file: a file holding the password (its first line; read at each
            connection, so a rotated password is picked up).
        password_env: the name of an environment variable holding the password (used
            when ``password_file`` is empty).
        connect_timeout: seconds libpq waits for a connection before giving up.
        max_connections: connections this node opens at most (a thread waits for one
            beyond that).
        statement_timeout_ms: the server cancels a statement running longer (0: never).
        ef_search: HNSW candidates examined per vector search (``hnsw.ef_search``;
            raised to the list's length when that is larger).
        max_scan_tuples: how far an iterative HNSW scan goes to satisfy a selective
            filter (``hnsw.max_scan_tuples``) before it returns fewer hits.
        lexical_ranker: ``auto`` (a BM25 extension the server offers, else BM25 in plain
            SQL), ``pg_textsearch``, ``pg_search`` or ``bm25-sql``
            (:mod:`retrieval.postgres._rankers`).
        bm25_candidates_per_term: ``bm25-sql`` reads at most this many postings of each
            query term (highest impact first) when no filter is given: the bound on a
            query's cost; a rarer term is read whole, so its scores are exact.
        commits_in_flight: group commits written at once, each one transaction on its own
            connection (:class:`retrieval.store._group.GroupCommitter`).
    """

    dsn: str
    password_file: str = ""
    password_env: str = ""
    connect_timeout: float = 10.0
    max_connections: int = 8
    statement_timeout_ms: int = 30_000
    ef_search: int = 100
    max_scan_tuples: int = 20_000
    lexical_ranker: str = "auto"
    bm25_candidates_per_term: int = 1000
    commits_in_flight: int = 2


def describe(dsn: str) -> str:
    """The server and database a DSN names, for messages and logs: ``user@host:port/db``,
    never a password. A DSN that cannot be parsed is described as such, not quoted."""
    try:
        parts = conninfo.conninfo_to_dict(dsn)
    except psycopg.Error:
        return "(unparsable DSN)"
    host = str(parts.get("host") or "local socket")
    port = f":{parts['port']}" if parts.get("port") else ""
    user = f"{parts['user']}@" if parts.get("user") else ""
    return f"{user}{host}{port}/{parts.get('dbname') or '(default database)'}"


def read_password(options: PgOptions) -> str | None:
    """The password from ``password_file`` or ``password_env``; None when neither is set.

    Raises:
        StoreUnavailable: the file cannot be read, or the variable is not set.
    """
    if options.password_file:
        try:
            text = Path(options.password_file).read_text(encoding="utf-8")
        except OSError as exc:
            raise StoreUnavailable(f"cannot read the PostgreSQL password file "
                                   f"{options.password_file}: {exc.strerror}") from None
        return text.splitlines()[0] if text else ""
    if options.password_env:
        value = os.environ.get(options.password_env)
        if value is None:
            raise StoreUnavailable(f"the PostgreSQL password variable {options.password_env} "
                                   "is not set")
        return value
    return None


def check_dsn(dsn: str) -> None:
    """Refuse a DSN that cannot be parsed or that carries a password.

    Raises:
        StoreUnavailable: says which, without quoting the DSN (it may hold a secret).
    """
    try:
        parts = conninfo.conninfo_to_dict(dsn)
    except psycopg.Error:
        raise StoreUnavailable("the PostgreSQL DSN cannot be parsed (expected "
                               "'postgresql://user@host:port/dbname' or 'key=value' "
                               "pairs)") from None
    if parts.get("password"):
        raise StoreUnavailable(f"the PostgreSQL DSN for {describe(dsn)} holds a password: "
                               "put it in a file (password_file) or an environment "
                               "variable (password_env) instead")


def first_line(exc: BaseException) -> str:
    """The first line of an error's message (libpq adds hints and context below it)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def scrub(text: str, secret: str | None) -> str:
    """``text`` with every occurrence of ``secret`` replaced by ``***``."""
    return text.replace(secret, "***") if secret else text


def connect(options: PgOptions) -> Connection:
    """A new connection with llamad's session settings.

    Raises:
        StoreUnavailable: bad DSN, unreachable server, refused login (names the server).
    """
    check_dsn(options.dsn)
    password = read_password(options)
    extra: dict[str, str | int] = {
        "connect_timeout": max(1, round(options.connect_timeout)),
        "application_name": "llamad",
        # A node that vanishes without closing its socket (power cut, partition) loses
        # its session, and its scan locks, within about a minute rather than hours.
        "keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10,
        "keepalives_count": 3,
    }
    if password is not None:
        extra["password"] = password
    try:
        # The password joins the conninfo here only, in memory, never in a message.
        conn = psycopg.connect(conninfo.make_conninfo(options.dsn, **extra), autocommit=True)
    except psycopg.Error as exc:
        reason = scrub(first_line(exc), password)
        raise StoreUnavailable(f"cannot connect to PostgreSQL at {describe(options.dsn)}: "
                               f"{reason}") from None
    try:
        # JIT off for this session: llamad's statements are short index lookups, where
        # compiling a plan (tens of ms, once its estimated cost passes jit_above_cost,
        # 100 000 by default, which a large corpus's estimates can) costs more than it
        # saves; PostgreSQL 11 and later have it on by default.
        conn.execute("SELECT set_config('statement_timeout', %s, false), "
                     "set_config('jit', 'off', false)",
                     (str(options.statement_timeout_ms),))
    except psycopg.Error:
        conn.close()
        raise
    return conn


@contextlib.contextmanager
def translated(target: str) -> Iterator[None]:
    """psycopg's errors raised in the block as retrieval errors naming ``target``: a full
    disk as StorageFull, a lost server (or a deadlock, retryable) as StoreUnavailable, a
    refused value or constraint as InvalidDocument."""
    try:
        yield
    except psycopg.errors.DiskFull as exc:
        raise StorageFull(f"the PostgreSQL server of {target} is out of disk space: "
                          f"{first_line(exc)}; nothing of this write was kept") from None
    except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
        raise StoreUnavailable(f"PostgreSQL store {target} unavailable: "
                               f"{first_line(exc)}") from None
    except (psycopg.DataError, psycopg.IntegrityError) as exc:
        raise InvalidDocument(f"PostgreSQL store {target} refused the write: "
                              f"{first_line(exc)}") from None


class PgConnected:
    """The base of the store's query mixins (``_pg_store_vectors``, ``_pg_store_review``,
    ``_pg_store_history``): their one way to the database, which
    :class:`~retrieval.postgres._store.PostgresStore` gives."""

    def _conn(self) -> contextlib.AbstractContextManager[Connection]:
        """A pooled connection for one call (the store's)."""
        raise NotImplementedError


class Pool:
    """At most ``max_connections`` connections, one per thread at a time.

    A connection comes back to the pool after use unless it broke (or is inside a
    transaction, which only a bug leaves): then it is closed and a fresh one opened
    next time. Thread-safe.
    """

    def __init__(self, options: PgOptions) -> None:
        self.options = options
        self._idle: queue.LifoQueue[Connection] = queue.LifoQueue()
        self._slots = threading.BoundedSemaphore(max(1, options.max_connections))
        self._closed = False

    @contextlib.contextmanager
    def connection(self) -> Iterator[Connection]:
        """A connection for the block (autocommit; open a transaction with
        ``conn.transaction()``).

        Raises:
            StoreUnavailable: no connection could be opened, or the pool is closed.
        """
        if not self._slots.acquire(timeout=self.options.connect_timeout + 30):
            raise StoreUnavailable(f"no PostgreSQL connection free "
                                   f"(max_connections = {self.options.max_connections})")
        conn: Connection | None = None
        try:
            if self._closed:
                raise StoreUnavailable("the PostgreSQL store is closed")
            while conn is None:
                try:
                    conn = self._idle.get_nowait()
                except queue.Empty:
                    conn = connect(self.options)
                    break
                if conn.closed or conn.broken:
                    _close(conn)
                    conn = None
            yield conn
        finally:
            if conn is not None:
                healthy = not (conn.closed or conn.broken) and \
                    conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
                if healthy and not self._closed:
                    self._idle.put(conn)
                else:
                    _close(conn)
            self._slots.release()

    def close(self) -> None:
        """Close the idle connections; those in use close when their block ends."""
        self._closed = True
        while True:
            try:
                _close(self._idle.get_nowait())
            except queue.Empty:
                return


def _close(conn: Connection) -> None:
    with contextlib.suppress(psycopg.Error):
        conn.close()
