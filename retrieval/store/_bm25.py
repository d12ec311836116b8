"""The BM25 side: a tantivy index of chunks, searched with queries built from escaped terms.

Schema (one tantivy document per entry: a text, once however many documents hold it,
keyed by its indexed holder's chunk; the filter fields hold the values of every holder,
:mod:`retrieval.store._entries`):

=============  ===============================  =============================================
field          analysis                         used for
=============  ===============================  =============================================
key            u64, indexed, fast, stored       the chunk key; results, deletes, ``keys()``
doc_id         raw (whole value), indexed       delete-by-document, ``Filters.doc_ids``
source         raw, indexed                     ``Filters.sources``
kind           raw, indexed                     ``Filters.kinds``
category       raw, indexed                     ``Filters.categories``
tags           raw, multi-valued, indexed       ``Filters.tags`` (any of)
indexed_at     i64 unix seconds, indexed, fast  ``Filters.since`` / ``until`` (range)
body           ``en_stem``, positions           title + heading + text, stemmed words
exact          ``llamad_exact``, frequencies    the same text, technical tokens kept whole
=============  ===============================  =============================================

``en_stem`` (tantivy's simple tokenizer, long-token removal, lowercasing, English stemmer)
on one title+text field scored nDCG@10 0.686 against 0.622 for two default-tokenizer
fields on this project's evaluation set. ``llamad_exact`` is a regex tokenizer plus
lowercasing that keeps ``CVE-2024-3094``, ``10.0.0.12``, ``v2.4.1``,
``web01.example.net``, ``GigabitEthernet0/1`` and ``fe80::1`` as single terms. Custom
analyzers are not stored in the index: :class:`TextIndex` registers it at every open.

User text never reaches tantivy's query parser as typed (the parser reads ``AND``,
``field:``, ``/regex/``, quotes, parentheses, ``-`` and ``^`` as syntax). A query is built
from two kinds of clause, combined as SHOULD:

* body: each word (a run of letters and digits) becomes ``body:"word"``. The word holds
  no quote or backslash, so the quoted literal is safe, and the parser runs it through
  ``en_stem`` (``disks`` finds ``disk``).
* exact: each technical token (a token of ``llamad_exact`` holding ``.``, ``-``, ``:``,
  ``/``, ``@`` or ``_``) becomes a term query on ``exact`` boosted by ``exact_boost``. Plain
  words get no exact clause: it would weigh unstemmed forms up to three times their
  stemmed variants and undo what ``en_stem`` measured above.

Filters are MUST clauses with a constant score of zero, so they select without changing
scores; within one filter type the values are alternatives (any of).
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import tantivy

from ..errors import IndexCorrupt, RetrievalError, StorageFull, is_storage_full

EXACT_TOKENIZER = "llamad_exact"
"""Name the technical-token analyzer is registered under (it is part of the schema)."""

EXACT_PATTERN = r"[\p{L}\p{N}][\p{L}\p{N}._:/@-]*[\p{L}\p{N}]|[\p{L}\p{N}]"
"""A token starts and ends with a letter or digit and may hold ``. _ : / @ -`` inside, so
trailing punctuation ("see web01.example.net.") is not part of it. Rust regex syntax."""

MAX_EXACT_TOKEN_BYTES = 128
"""Longer exact tokens (UTF-8 bytes: base64 blobs, long URLs) are not indexed: nobody types
them, and tantivy has a hard limit on term length."""

MAX_QUERY_WORDS = 64
"""Distinct body words used from one query; the rest are ignored (a bound on query cost)."""

MAX_QUERY_TOKENS = 32
"""Distinct technical tokens used from one query."""

_DELETE_BATCH = 1024
LOW_SPACE_BYTES = 8 * 1024 * 1024
"""A tantivy write that fails with less free space than this is reported as a full disk."""
_MIN_HEAP_PER_THREAD = 15_000_000  # tantivy refuses a smaller arena per indexing thread

# Python's \w minus "_": letters and digits of any script. en_stem splits on anything that
# is not alphanumeric, so a word yields one term (none from 40 bytes up: en_stem drops it).
_WORD = re.compile(r"[^\W_]+")
_TECHNICAL = re.compile(r"[._:/@-]")


@dataclass(frozen=True)
class Filters:
    """What a search may return. Empty tuples and ``None`` bounds do not filter.

    Within one field the values are alternatives (any of); different fields must all hold.
    Values match exactly (case-sensitive, whole value).
    """

    sources: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()             # any of
    since: int | None = None               # unix seconds, indexed_at >= since
    until: int | None = None               # unix seconds, indexed_at <= until
    # The document's own date (unix seconds), in SQLite only: a search turns these bounds
    # into ``doc_ids`` for this index (a document without a date never passes them).
    dated_since: int | None = None
    dated_until: int | None = None
    doc_ids: frozenset[str] | None = None  # only these documents (None: any)


Holder = tuple[str, str, str, str, tuple[str, ...], int]
"""A document holding an entry's text, as the filter fields see it: ``(doc_id, source,
kind, category, tags, indexed_at)``."""


@dataclass(frozen=True)
class IndexedChunk:
    """One entry as the text index sees it (built from the SQLite rows): its indexed
    holder's chunk, and the filter fields of every holder of its text in ``also``
    (:mod:`retrieval.store._entries`; the index keeps the distinct values)."""

    key: int
    doc_id: str
    source: str
    kind: str
    category: str
    tags: tuple[str, ...]
    indexed_at: int
    title: str
    heading: str
    text: str
    also: tuple[Holder, ...] = ()


def _schema() -> tantivy.Schema:
    sb = tantivy.SchemaBuilder()
    sb.add_unsigned_field("key", stored=True, indexed=True, fast=True)
    for name in ("doc_id", "source", "kind", "category", "tags"):
        sb.add_text_field(name, tokenizer_name="raw", index_option="basic")
    sb.add_integer_field("indexed_at", indexed=True, fast=True)
    sb.add_text_field("body", tokenizer_name="en_stem", index_option="position")
    sb.add_text_field("exact", tokenizer_name=EXACT_TOKENIZER, index_option="freq")
    return sb.build()


def exact_analyzer() -> tantivy.TextAnalyzer:
    """The ``llamad_exact`` analyzer: the tokens of ``exact``, for indexing and queries."""
    return (
        tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.regex(EXACT_PATTERN))
        .filter(tantivy.Filter.remove_long(MAX_EXACT_TOKEN_BYTES + 1))  # keeps len < limit
        .filter(tantivy.Filter.lowercase())
        .build()
    )


def _words(text: str) -> list[str]:
    """The distinct words of ``text`` (case-folded), first occurrence first, bounded."""
    seen: dict[str, None] = {}
    for match in _WORD.finditer(text):
        seen.setdefault(match.group().lower(), None)
        if len(seen) >= MAX_QUERY_WORDS:
            break
    return list(seen)


class TextIndex:
    """A tantivy index of chunks in one directory, opened (or created) for reading and writing.

    One writer per directory: the instance holds tantivy's writer (and its lock file) for
    its whole life, so a second ``TextIndex`` on the same directory, in this process or
    another, fails with :class:`IndexCorrupt`. ``add`` and ``delete_keys`` are staged and
    invisible until ``commit``; searches see the last commit. All methods are thread-safe:
    writes are serialised by a lock, searches run concurrently with them.
    """

    def __init__(self, path: Path, *, heap_size: int = 64_000_000, num_threads: int = 1,
                 exact_boost: float = 2.0) -> None:
        """Open the index in ``path`` (a directory), creating it when absent.

        Args:
            path: the index directory.
            heap_size: the writer's memory budget in bytes, shared by its threads; a
                segment is flushed when it fills. At least 15 MB per thread.
            num_threads: indexing threads. Each thread writes its own segment per commit;
                chunks are small and arrive a document at a time, so one is plenty.
            exact_boost: weight of a technical-token match relative to a body word.

        Raises:
            ValueError: ``heap_size`` too small for ``num_threads``, or ``num_threads`` < 1.
            IndexCorrupt: the directory holds something tantivy cannot open (damaged
                files, another schema), or another writer holds it.
        """
        if num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {num_threads}")
        if heap_size < _MIN_HEAP_PER_THREAD * num_threads:
            raise ValueError(f"heap_size must be at least {_MIN_HEAP_PER_THREAD} bytes per "
                             f"thread, got {heap_size} for {num_threads}")
        self.path = path
        self.exact_boost = exact_boost
        self._lock = threading.Lock()
        self._schema = _schema()
        self._analyzer = exact_analyzer()
        try:
            path.mkdir(parents=True, exist_ok=True)
            # reuse=True opens an existing index (refusing another schema) or creates one.
            self._index = tantivy.Index(self._schema, path=str(path), reuse=True)
            self._index.register_tokenizer(EXACT_TOKENIZER, self._analyzer)
            # Manual reloads: commit() reloads itself, so a search right after a commit
            # sees it (the default policy reloads a little later, in the background).
            self._index.config_reader(reload_policy="manual")
            self._writer: tantivy.IndexWriter | None = self._index.writer(
                heap_size=heap_size, num_threads=num_threads)
        except (OSError, ValueError) as exc:
            raise IndexCorrupt(f"text index {path} cannot be opened: {exc}") from exc

    # -- writing -----------------------------------------------------------------------

    def add(self, chunks: Sequence[IndexedChunk]) -> None:
        """Stage chunks for indexing; visible after :meth:`commit`.

        A chunk whose key is already indexed replaces it (the old version is deleted in
        the same commit), so replaying an add after a crash never duplicates a key.

        Raises:
            ValueError: a key is negative or does not fit in 64 bits.
            RetrievalError: the index was closed, or tantivy failed (a full disk, say):
                every change staged since the last commit is then dropped.
        """
        docs = [self._document(c) for c in chunks]
        if not docs:
            return
        with self._lock:
            writer = self._require_writer()
            try:
                self._delete_locked(writer, [c.key for c in chunks])
                for doc in docs:
                    writer.add_document(doc)
            except (OSError, ValueError) as exc:
                self._fail(writer, "staging chunks", exc)

    def delete_keys(self, keys: Iterable[int]) -> None:
        """Stage the deletion of chunks by key (unknown keys are ignored); see :meth:`commit`.

        Raises:
            RetrievalError: the index was closed, or tantivy failed (as for :meth:`add`).
        """
        wanted = sorted({_check_key(k) for k in keys})
        if not wanted:
            return
        with self._lock:
            writer = self._require_writer()
            try:
                self._delete_locked(writer, wanted)
            except (OSError, ValueError) as exc:
                self._fail(writer, "staging deletes", exc)

    def _delete_locked(self, writer: tantivy.IndexWriter, keys: Sequence[int]) -> None:
        # Not delete_documents_by_term("key", k): tantivy-py turns a Python int into an i64
        # term whatever the field's type, which never matches this u64 field, and deletes
        # nothing, silently. A term query builds the term from the schema.
        for i in range(0, len(keys), _DELETE_BATCH):
            batch = list(keys[i:i + _DELETE_BATCH])
            writer.delete_documents_by_query(
                tantivy.Query.term_set_query(self._schema, "key", batch))

    def commit(self) -> None:
        """Make staged adds and deletes durable and visible to searches.

        tantivy fsyncs the new segments and then atomically replaces its ``meta.json``:
        after this returns the changes survive kill -9 and power loss; a crash before
        leaves the previous commit intact. Uncommitted changes are simply lost.

        Raises:
            RetrievalError: tantivy failed to commit (a disk error, say); the staged
                changes are lost and the previous commit stays in force.
        """
        with self._lock:
            writer = self._require_writer()
            try:
                writer.commit()
            except (OSError, ValueError) as exc:
                self._fail(writer, "commit", exc)
            self._index.reload()

    def close(self) -> None:
        """Drop uncommitted changes, wait for background merges and release the writer lock.

        Idempotent. The index can be reopened (by a new ``TextIndex``) afterwards.
        """
        with self._lock:
            writer, self._writer = self._writer, None
            if writer is not None:
                writer.rollback()
                writer.wait_merging_threads()

    def _fail(self, writer: tantivy.IndexWriter, what: str, exc: Exception) -> NoReturn:
        """Raise for a failed write, leaving a writer that works.

        A writer whose indexing thread hit an I/O error (a full disk, seen as ENOSPC) is
        dead inside: later adds fail ("An index writer was killed"), or commits return
        without indexing anything, until a restart. ``rollback()`` replaces it with a
        fresh writer on the same lock, dropping what was staged since the last commit.
        """
        try:
            writer.rollback()
        except (OSError, ValueError) as again:
            exc.add_note(f"and the rollback failed too: {again}")
        message = f"text index {self.path}: {what} failed: {exc}"
        # A killed writer no longer says why ("A worker thread encountered an error
        # (io::Error most likely)"): a nearly full disk is the likely reason.
        if is_storage_full(exc) or _low_on_space(self.path):
            raise StorageFull(message) from exc
        raise RetrievalError(message) from exc

    def _require_writer(self) -> tantivy.IndexWriter:
        if self._writer is None:
            raise RetrievalError(f"text index {self.path} is closed")
        return self._writer

    def _document(self, c: IndexedChunk) -> tantivy.Document:
        doc = tantivy.Document()
        doc.add_unsigned("key", _check_key(c.key))
        holders: list[Holder] = [
            (c.doc_id, c.source, c.kind, c.category, c.tags, c.indexed_at), *c.also]
        # Multi-valued: a filter term matches when any holder has it.
        for i, name in enumerate(("doc_id", "source", "kind", "category")):
            for value in dict.fromkeys(str(h[i]) for h in holders):
                doc.add_text(name, _utf8(value))
        for tag in dict.fromkeys(t for h in holders for t in h[4]):
            doc.add_text("tags", _utf8(tag))
        for at in dict.fromkeys(h[5] for h in holders):
            doc.add_integer("indexed_at", at)
        text = _utf8("\n".join(part for part in (c.title, c.heading, c.text) if part))
        doc.add_text("body", text)
        doc.add_text("exact", text)
        return doc

    # -- reading -----------------------------------------------------------------------

    def search(self, query: str, *, filters: Filters, limit: int) -> list[tuple[int, float]]:
        """BM25 search: ``(key, score)`` pairs, best first, at most ``limit``.

        Any text is a valid query: words and technical tokens are taken from it and the
        rest (operators, quotes, brackets, field names) is ignored. Text with no word in
        it returns no hits. At most :data:`MAX_QUERY_WORDS` words and
        :data:`MAX_QUERY_TOKENS` technical tokens are used.

        Raises:
            ValueError: ``limit`` < 1.
        """
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        matching = self._text_query(_utf8(query))
        if matching is None:
            return []
        clauses = [(tantivy.Occur.Must, matching)]
        clauses += [(tantivy.Occur.Must, tantivy.Query.const_score_query(q, 0.0))
                    for q in self._filter_queries(filters)]
        searcher = self._index.searcher()
        hits = searcher.search(tantivy.Query.boolean_query(clauses), limit=limit,
                               count=False).hits
        if not hits:
            return []
        keys = searcher.fast_field_values("key", [address for _, address in hits])
        return [(_as_key(key), float(score)) for (score, _), key in zip(hits, keys, strict=True)]

    def _text_query(self, query: str) -> tantivy.Query | None:
        clauses: list[tuple[tantivy.Occur, tantivy.Query]] = []
        words = _words(query)
        if words:
            # Each word is letters and digits only: no quote or backslash can end the
            # literal early, and inside quotes nothing else is syntax.
            literal = " ".join(f'body:"{w}"' for w in words)
            clauses.append((tantivy.Occur.Should, self._index.parse_query(literal)))
        tokens: dict[str, None] = {}
        for token in self._analyzer.analyze(query):
            if _TECHNICAL.search(token):
                tokens.setdefault(token, None)
                if len(tokens) >= MAX_QUERY_TOKENS:
                    break
        if tokens:
            exact = tantivy.Query.boolean_query(
                [(tantivy.Occur.Should, tantivy.Query.term_query(self._schema, "exact", t))
                 for t in tokens])
            clauses.append((tantivy.Occur.Should,
                            tantivy.Query.boost_query(exact, self.exact_boost)))
        return tantivy.Query.boolean_query(clauses) if clauses else None

    def _filter_queries(self, filters: Filters) -> list[tantivy.Query]:
        out = []
        for field, values in (("source", filters.sources), ("kind", filters.kinds),
                              ("category", filters.categories), ("tags", filters.tags)):
            if values:
                out.append(tantivy.Query.term_set_query(self._schema, field,
                                                        [_utf8(v) for v in values]))
        if filters.since is not None or filters.until is not None:
            out.append(tantivy.Query.range_query(
                self._schema, "indexed_at", tantivy.FieldType.Integer,
                lower_bound=filters.since, upper_bound=filters.until))
        if filters.doc_ids is not None:
            out.append(tantivy.Query.term_set_query(self._schema, "doc_id",
                                                    [_utf8(d) for d in filters.doc_ids])
                       if filters.doc_ids else tantivy.Query.empty_query())
        return out

    def keys(self) -> set[int]:
        """Every committed key (for reconciliation with SQLite).

        One all-documents search and one fast-field read of ``key`` (measured at 100k
        chunks: 30 ms in one segment, 120 ms in nine).
        """
        searcher = self._index.searcher()
        n = searcher.num_docs
        if n == 0:
            return set()  # tantivy panics on a search with limit 0
        hits = searcher.search(tantivy.Query.all_query(), limit=n, count=False).hits
        values = searcher.fast_field_values("key", [address for _, address in hits])
        return {_as_key(v) for v in values}

    def count(self) -> int:
        """Committed entries (a text once, however many documents hold it)."""
        return self._index.searcher().num_docs

    def holding(self, term: str) -> int:
        """Committed entries whose ``body`` holds ``term`` (as indexed: stemmed,
        lowercase): its document frequency without the deleted entries tantivy's own
        statistics keep until their segments merge."""
        query = tantivy.Query.term_query(self._schema, "body", _utf8(term))
        found = self._index.searcher().search(query, limit=1, count=True)
        return int(getattr(found, "count", 0) or 0)  # not in tantivy's type stubs


def _low_on_space(path: Path) -> bool:
    """Whether the filesystem of ``path`` has less than :data:`LOW_SPACE_BYTES` free."""
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < LOW_SPACE_BYTES


def _as_key(value: object) -> int:
    """A ``key`` fast-field value: always an int, since every document has a key."""
    if not isinstance(value, int):
        raise IndexCorrupt(f"text index holds a document without a valid key: {value!r}")
    return value


def _utf8(text: str) -> str:
    """``text`` as tantivy can take it: lone surrogates (which no UTF-8 string can hold,
    and which make the Rust side raise) become ``?``."""
    return text.encode("utf-8", "replace").decode("utf-8")


def _check_key(key: int) -> int:
    if not 0 <= key < 2**64:
        raise ValueError(f"chunk key must fit in an unsigned 64-bit integer, got {key}")
    return key

