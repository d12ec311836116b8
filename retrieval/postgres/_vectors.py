"""The PostgreSQL store's vector spaces over time: the backfill's queries and the switch
of the shared corpus to another embedding model.

The corpus is embedded with one model (``corpus_model``: one vector space). A switch to
another model is asked for once (``corpus_switch``: the target space, at most one) and
then carried out by whichever node embeds with the target model
(:mod:`retrieval.postgres._backfill`): every chunk gets a vector of the target space, page by
page, while searches keep using the corpus's space; then one transaction
(:meth:`PgVectors.finish_switch`) makes the target the corpus's space, only if no chunk
lacks a vector of it. Writers hold ``corpus_model`` (and ``corpus_switch``) ``FOR SHARE``
for their transaction and the switch takes them ``FOR UPDATE``: a document committed
while the switch is checked is either in the check or waits for it, never missed. The
previous space's vectors stay (as the embedded store keeps its cache): switching back
reuses them by content hash.

Lock order everywhere: ``corpus_model``, then ``corpus_switch``, then document advisory
locks, then chunk rows. A mixin of :class:`~retrieval.postgres._store.PostgresStore` (which
provides the connections), kept apart for the module's size.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidDocument
from ._connect import Connection, PgConnected
from ._schema import ensure_vector_space


@dataclass(frozen=True)
class Space:
    """A vector space: one embedding model at one dimension."""

    id: int
    model: str
    dim: int


def locked_spaces(conn: Connection, mode: str = "") -> tuple[Space | None, Space | None]:
    """The corpus's space and the one it is being switched to (None: none), read with
    their rows locked ``FOR SHARE`` or ``FOR UPDATE`` (``mode``) for the transaction."""
    lock = {"": "", "share": " FOR SHARE OF c", "update": " FOR UPDATE OF c"}[mode]
    spaces: list[Space | None] = []
    for table in ("corpus_model", "corpus_switch"):
        row = conn.execute(
            f"SELECT s.id, s.model, s.dim FROM {table} c JOIN vector_spaces s "  # noqa: S608 - fixed table names and clauses
            f"ON s.id = c.space_id{lock}").fetchone()
        spaces.append(None if row is None else Space(int(row[0]), str(row[1]), int(row[2])))
    return spaces[0], spaces[1]


_MISSING = ("c.entry = c.key AND NOT EXISTS (SELECT 1 FROM chunk_vectors v "
            "WHERE v.chunk_key = c.key AND v.space_id = %s) "
            "AND c.content_hash <> ALL(%s::text[])")
"""A text's entry ``c`` (its copies hold no vector: :mod:`retrieval.postgres._entries`)
without a vector of a space, its text not among the skipped hashes."""


class PgVectors(PgConnected):
    """The vector-space queries of :class:`~retrieval.postgres._store.PostgresStore`."""

    def spaces(self) -> tuple[Space | None, Space | None]:
        """The corpus's vector space and the one it is being switched to."""
        with self._conn() as conn:
            return locked_spaces(conn)

    def request_switch(self, model: str, dim: int) -> Space:
        """Ask for the corpus to be switched to ``model`` (``dim`` dimensions); return its
        space. Before the corpus has a model, this sets it at once; when it is the
        corpus's already, a switch asked before is withdrawn. A switch to another target
        asked before is replaced (the newest request wins).

        Raises:
            ValueError: ``dim`` cannot be indexed by HNSW.
        """
        with self._conn() as conn:
            space = Space(ensure_vector_space(conn, model, dim), model, dim)
            with conn.transaction():
                corpus, _ = locked_spaces(conn, "update")
                if corpus is None:
                    conn.execute("INSERT INTO corpus_model(space_id) VALUES (%s) "
                                 "ON CONFLICT (one) DO NOTHING", (space.id,))
                    conn.execute("DELETE FROM corpus_switch")
                elif corpus.id == space.id:
                    conn.execute("DELETE FROM corpus_switch")
                else:
                    conn.execute("INSERT INTO corpus_switch(space_id) VALUES (%s) "
                                 "ON CONFLICT (one) DO UPDATE SET space_id = excluded.space_id, "
                                 "requested_at = now() WHERE corpus_switch.space_id <> "
                                 "excluded.space_id", (space.id,))
        return space

    def missing_chunks(self, space: int, *, after: int, limit: int, skip: Sequence[str] = (),
                       scope: Sequence[int] | None = None) -> list[tuple[int, str, str]]:
        """Up to ``limit`` chunks with a key above ``after`` and no vector of ``space``
        (their text's hash not in ``skip``; among ``scope`` when given), in key order:
        ``(key, content hash, text)``."""
        where, args = _MISSING + " AND c.key > %s", [space, list(skip), after]
        if scope is not None:
            where += " AND c.key = ANY(%s)"
            args.append(list(scope))
        with self._conn() as conn:
            rows = conn.execute(
                f"SELECT c.key, c.content_hash, c.text FROM chunks c WHERE {where} "  # noqa: S608 - fixed clauses, placeholders
                "ORDER BY c.key LIMIT %s", [*args, limit]).fetchall()
        return [(int(k), str(h), str(t)) for k, h, t in rows]

    def any_missing(self, space: int, skip: Sequence[str] = ()) -> bool:
        """Whether some chunk lacks a vector of ``space`` (its hash not in ``skip``)."""
        with self._conn() as conn:
            row = conn.execute(f"SELECT EXISTS (SELECT 1 FROM chunks c WHERE {_MISSING})",  # noqa: S608 - a fixed clause
                               (space, list(skip))).fetchone()
        return bool(row and row[0])

    def missing_count(self, space: int, skip: Sequence[str] = (),
                      scope: Sequence[int] | None = None) -> int:
        """How many chunks (among ``scope`` when given) lack a vector of ``space``, but
        those of the hashes in ``skip``."""
        where, args = _MISSING, [space, list(skip)]
        if scope is not None:
            where += " AND c.key = ANY(%s)"
            args.append(list(scope))
        with self._conn() as conn:
            row = conn.execute(f"SELECT count(*) FROM chunks c WHERE {where}",  # noqa: S608 - fixed clauses, placeholders
                               args).fetchone()
        return int(row[0]) if row else 0

    def missing_keys(self, space: int, keys: Iterable[int]) -> set[int]:
        """The entries of the texts of ``keys`` (existing chunks) without a vector of
        ``space``."""
        with self._conn() as conn:
            return {int(r[0]) for r in conn.execute(
                "SELECT c.key FROM chunks c WHERE c.key IN (SELECT entry FROM chunks "  # noqa: S608 - a fixed clause
                f"WHERE key = ANY(%s)) AND {_MISSING}", (list(keys), space, []))}

    def add_vectors(self, space: Space, vectors: dict[int, np.ndarray]) -> int | None:
        """Store vectors of ``space`` for the chunks of these keys, in one transaction; a
        chunk deleted or replaced meanwhile is skipped, one that has a vector of the space
        already keeps it. Returns how many were added, or None (nothing written) when the
        space is no longer the corpus's nor the one it is being switched to.

        Raises:
            InvalidDocument: a vector of another dimension than the space's, or not finite.
        """
        for key, vector in vectors.items():
            if vector.shape != (space.dim,) or not np.isfinite(vector).all():
                raise InvalidDocument(f"the vector of chunk key {key} has shape "
                                      f"{vector.shape} or is not finite; the space of "
                                      f"{space.model} has {space.dim} dimensions")
        with self._conn() as conn, conn.transaction():
            corpus, switch = locked_spaces(conn, "share")
            if space.id not in {s.id for s in (corpus, switch) if s is not None}:
                return None
            # FOR KEY SHARE waits for a replacement deleting one of these chunks, then
            # leaves it out: no vector is written for a chunk that is gone.
            alive = {int(r[0]) for r in conn.execute(
                "SELECT key FROM chunks WHERE key = ANY(%s) AND entry = key FOR KEY SHARE",
                (sorted(vectors),))}  # a copy's text has its vector on its entry
            rows = [(k, space.id, space.dim, vectors[k].astype(np.float32).tolist())
                    for k in sorted(alive)]
            added = 0
            with conn.cursor() as cur:
                for row in rows:
                    cur.execute("INSERT INTO chunk_vectors(chunk_key, space_id, dim, "
                                "embedding) VALUES (%s, %s, %s, %s::float4[]::vector) "
                                "ON CONFLICT (chunk_key, space_id) DO NOTHING", row)
                    added += cur.rowcount
        return added

    def finish_switch(self, space: int, skip: Sequence[str] = ()) -> str:
        """Make ``space`` (the switch's target) the corpus's, in one transaction, if every
        chunk has a vector of it (but those of the hashes in ``skip``: texts the model
        refused). Returns ``done``, ``incomplete`` (chunks arrived without one: nothing
        changed) or ``gone`` (``space`` is not the switch's target any more)."""
        with self._conn() as conn, conn.transaction():
            _, switch = locked_spaces(conn, "update")
            if switch is None or switch.id != space:
                return "gone"
            row = conn.execute(f"SELECT EXISTS (SELECT 1 FROM chunks c WHERE {_MISSING})",  # noqa: S608 - a fixed clause
                               (space, list(skip))).fetchone()
            if row and row[0]:
                return "incomplete"
            conn.execute("UPDATE corpus_model SET space_id = %s, set_at = now()", (space,))
            conn.execute("DELETE FROM corpus_switch")
        return "done"

    # -- chunk keys (a Reprocess's scope) ------------------------------------------------

    def chunk_keys(self) -> set[int]:
        """Every chunk key."""
        with self._conn() as conn:
            return {int(r[0]) for r in conn.execute("SELECT key FROM chunks")}

    def keys_matching(self, *, sources: Sequence[str] = ()) -> set[int]:
        """The chunk keys of these sources' documents (every chunk's when none given)."""
        if not sources:
            return self.chunk_keys()
        with self._conn() as conn:
            return {int(r[0]) for r in conn.execute(
                "SELECT c.key FROM chunks c JOIN documents d ON d.id = c.doc_id "
                "WHERE d.source_id = ANY(%s)", (list(sources),))}

