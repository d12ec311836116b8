"""The tantivy text index: stemming, technical tokens kept whole, every filter, deletes and
replacement, durability across reopen, one writer per directory, and query text that can
never break the query (fixed nasty inputs and hypothesis-generated ones)."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retrieval.errors import IndexCorrupt, RetrievalError
from retrieval.store._bm25 import (
    MAX_QUERY_WORDS,
    Filters,
    IndexedChunk,
    TextIndex,
    exact_analyzer,
)

NONE = Filters()
DAY = 86_400
T0 = 1_700_000_000


def chunk(key: int, text: str, *, title: str = "ops notes", heading: str = "",
          source: str = "docs", kind: str = "markdown", category: str = "runbook",
          tags: tuple[str, ...] = (), indexed_at: int = T0) -> IndexedChunk:
    return IndexedChunk(key, f"{source}/doc{key}.md", source, kind, category, tags,
                        indexed_at, title, heading, text)


CORPUS = [
    chunk(1, "The disks filled up on web01.example.net; rotating the logs freed them.",
          title="Storage runbook", heading="Runbooks > web01", tags=("linux", "storage")),
    chunk(2, "CVE-2024-3094: backdoor in xz / liblzma 5.6.0 and 5.6.1.", source="cve",
          kind="text", category="cve", tags=("security",), indexed_at=T0 + 10 * DAY),
    chunk(3, "Advisory CVE-2024-3095 for build 3094, published in 2024.", source="cve",
          kind="text", category="cve", tags=("security", "advisory"),
          indexed_at=T0 + 20 * DAY),
    chunk(4, "interface GigabitEthernet0/1\n ip address 10.0.0.12 255.255.255.0",
          source="configs", kind="config", category="network", tags=("cisco",),
          indexed_at=T0 + 30 * DAY),
    chunk(5, "Upgrade the agent to v2.4.1 and check the link-local address fe80::1.",
          title="Agent upgrade", tags=("linux",), indexed_at=T0 + 40 * DAY),
    chunk(6, "interface GigabitEthernet0/10\n ip address 10.0.0.120 255.255.255.0",
          source="configs", kind="config", category="network", tags=("juniper",),
          indexed_at=T0 + 50 * DAY),
]
KEYS = {c.key for c in CORPUS}
EVERYTHING = "ops notes storage agent"   # a query every chunk of CORPUS matches


def build(path: Path) -> TextIndex:
    index = TextIndex(path)
    index.add(CORPUS)
    index.commit()
    return index


@pytest.fixture
def index(tmp_path: Path) -> Iterator[TextIndex]:
    idx = build(tmp_path / "bm25")
    yield idx
    idx.close()


@pytest.fixture
def empty(tmp_path: Path) -> Iterator[TextIndex]:
    idx = TextIndex(tmp_path / "empty")
    yield idx
    idx.close()


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TextIndex]:
    """A read-only index for the fuzzing tests (hypothesis wants no function fixtures)."""
    idx = build(tmp_path_factory.mktemp("bm25") / "bm25")
    yield idx
    idx.close()


def keys(index: TextIndex, query: str, filters: Filters = NONE, limit: int = 10) -> list[int]:
    return [key for key, _ in index.search(query, filters=filters, limit=limit)]


def assert_sane(hits: list[tuple[int, float]], limit: int) -> None:
    assert len(hits) <= limit
    assert all(isinstance(k, int) and k in KEYS for k, _ in hits)
    assert len({k for k, _ in hits}) == len(hits)
    scores = [s for _, s in hits]
    assert all(math.isfinite(s) for s in scores)
    assert scores == sorted(scores, reverse=True)


# -- analysis ---------------------------------------------------------------------------


def test_exact_analyzer_keeps_technical_tokens_whole() -> None:
    """The exact field's tokens: CVE ids, IPs, versions, hostnames, interfaces, IPv6, lowercased,
    without trailing punctuation."""
    text = ("See CVE-2024-3094, 10.0.0.12 and v2.4.1 on web01.example.net. "
            "GigabitEthernet0/1 fe80::1 ops@example.org")
    assert exact_analyzer().analyze(text) == [
        "see", "cve-2024-3094", "10.0.0.12", "and", "v2.4.1", "on", "web01.example.net",
        "gigabitethernet0/1", "fe80::1", "ops@example.org"]


@pytest.mark.parametrize("query", ["disk", "fill", "rotate", "Log", "DISKS"])
def test_stemming_matches_inflected_forms(index: TextIndex, query: str) -> None:
    """``disk`` finds ``disks``, ``fill`` finds ``filled``, ``rotate`` finds ``rotating``."""
    assert keys(index, query) == [1]


def test_title_and_heading_are_searchable(index: TextIndex) -> None:
    """The body holds title and heading as well as the text."""
    assert keys(index, "storage") == [1]      # title "Storage runbook"
    assert keys(index, "runbooks") == [1]     # heading "Runbooks > web01"


@pytest.mark.parametrize(("query", "expected"), [
    ("CVE-2024-3094", 2),
    ("cve-2024-3094", 2),
    ("10.0.0.12", 4),
    ("GigabitEthernet0/1", 4),
    ("GigabitEthernet0/10", 6),
    ("10.0.0.120", 6),
    ("v2.4.1", 5),
    ("fe80::1", 5),
    ("web01.example.net", 1),
])
def test_technical_tokens_rank_the_exact_match_first(index: TextIndex, query: str,
                                                     expected: int) -> None:
    """An exact technical token beats chunks that only share its pieces."""
    assert keys(index, query)[0] == expected


def test_exact_boost_adds_only_to_the_whole_token(index: TextIndex, tmp_path: Path) -> None:
    """The exact clause raises the chunk holding CVE-2024-3094 and leaves the advisory that
    has CVE, 2024 and 3094 apart at its body score."""
    boosted = dict(index.search("CVE-2024-3094", filters=NONE, limit=10))
    plain_index = TextIndex(tmp_path / "plain", exact_boost=0.0)
    try:
        plain_index.add(CORPUS)
        plain_index.commit()
        plain = dict(plain_index.search("CVE-2024-3094", filters=NONE, limit=10))
    finally:
        plain_index.close()
    assert boosted[3] == pytest.approx(plain[3])
    assert boosted[2] > plain[2] + 1.0
    assert boosted[2] > boosted[3]


def test_words_of_a_technical_token_still_match_in_the_body(index: TextIndex) -> None:
    """``liblzma`` alone, and the pieces ``example`` and ``net`` of a hostname, are words."""
    assert keys(index, "liblzma") == [2]
    assert keys(index, "example") == [1]


# -- filters ----------------------------------------------------------------------------


@pytest.mark.parametrize(("filters", "expected"), [
    (Filters(sources=("cve",)), {2, 3}),
    (Filters(sources=("cve", "configs")), {2, 3, 4, 6}),
    (Filters(kinds=("config",)), {4, 6}),
    (Filters(categories=("runbook",)), {1, 5}),
    (Filters(tags=("linux",)), {1, 5}),
    (Filters(tags=("cisco", "juniper")), {4, 6}),
    (Filters(since=T0 + 20 * DAY), {3, 4, 5, 6}),
    (Filters(until=T0 + 20 * DAY), {1, 2, 3}),
    (Filters(since=T0 + 10 * DAY, until=T0 + 30 * DAY), {2, 3, 4}),
    (Filters(since=T0 + 11 * DAY, until=T0 + 19 * DAY), set()),
    (Filters(sources=("docs",), tags=("linux",), since=T0 + DAY), {5}),
    (Filters(sources=("cve",), kinds=("text",), categories=("cve",), tags=("advisory",)), {3}),
    (Filters(sources=("Docs",)), set()),       # values match exactly
    (Filters(sources=("nope",)), set()),
])
def test_filters_select_exactly(index: TextIndex, filters: Filters, expected: set[int]) -> None:
    """Each filter type, alone and combined: any of within a type, all across types,
    indexed_at bounds inclusive."""
    assert set(keys(index, EVERYTHING)) == KEYS
    assert set(keys(index, EVERYTHING, filters)) == expected


def test_filters_do_not_change_scores(index: TextIndex) -> None:
    """A filter selects; the scores of the chunks it keeps are those of the unfiltered search."""
    unfiltered = dict(index.search("interface address", filters=NONE, limit=10))
    filtered = index.search("interface address", filters=Filters(tags=("cisco",)), limit=10)
    assert filtered == [(4, unfiltered[4])]


def test_filters_without_matching_text_return_nothing(index: TextIndex) -> None:
    """Filters narrow a text match; they never match on their own."""
    assert keys(index, "zebra", Filters(sources=("docs",))) == []


# -- writing ----------------------------------------------------------------------------


def test_delete_is_visible_after_commit(index: TextIndex) -> None:
    """Deleted keys stay searchable until commit, then disappear from search and keys()."""
    index.delete_keys([2, 999])
    assert 2 in keys(index, "backdoor")
    index.commit()
    assert keys(index, "backdoor") == []
    assert index.keys() == KEYS - {2}
    assert index.count() == len(KEYS) - 1


def test_delete_handles_large_keys_and_batches(empty: TextIndex) -> None:
    """Keys up to 2**64-1 are stored and deleted; thousands of deletes at once work."""
    big = [2**64 - 1, 2**63 + 7]
    empty.add([chunk(k, "payload") for k in [*big, *range(1, 3001)]])
    empty.commit()
    assert empty.keys() == {*big, *range(1, 3001)}
    assert dict(empty.search("payload", filters=NONE, limit=3002)).keys() >= set(big)
    empty.delete_keys([*big, *range(1, 3000)])
    empty.commit()
    assert empty.keys() == {3000}


def test_adds_are_invisible_until_commit(index: TextIndex) -> None:
    """Staged adds are not searchable before commit."""
    index.add([chunk(7, "kernel panic on boot")])
    assert keys(index, "panic") == []
    index.commit()
    assert keys(index, "panic") == [7]


def test_adding_an_existing_key_replaces_it(index: TextIndex) -> None:
    """Re-adding a key (a replayed write) replaces the chunk instead of duplicating it."""
    index.add([replace(CORPUS[0], text="memory pressure on web01")])
    index.commit()
    assert index.count() == len(KEYS)
    assert keys(index, "disk") == []
    assert keys(index, "memory") == [1]


def test_commits_survive_reopen_and_uncommitted_changes_do_not(tmp_path: Path) -> None:
    """After close and reopen, committed chunks are there; staged ones are gone."""
    path = tmp_path / "bm25"
    first = build(path)
    first.delete_keys([1])
    first.commit()
    first.add([chunk(8, "never committed")])
    first.close()
    first.close()                                   # idempotent
    with pytest.raises(RetrievalError, match="closed"):
        first.add([chunk(9, "after close")])
    again = TextIndex(path)
    try:
        assert again.keys() == KEYS - {1}
        assert keys(again, "CVE-2024-3094")[0] == 2
        assert keys(again, "committed") == []
    finally:
        again.close()


def test_one_writer_per_directory(index: TextIndex) -> None:
    """A second TextIndex on an open directory is refused: tantivy's writer lock is held."""
    with pytest.raises(IndexCorrupt, match="cannot be opened"):
        TextIndex(index.path)


def test_an_unreadable_directory_is_reported_as_corrupt(tmp_path: Path) -> None:
    """Garbage where tantivy expects its meta.json is IndexCorrupt, not a foreign error."""
    path = tmp_path / "bm25"
    path.mkdir()
    (path / "meta.json").write_text("{not json")
    with pytest.raises(IndexCorrupt):
        TextIndex(path)


def test_empty_index(empty: TextIndex) -> None:
    """A new index has no keys and finds nothing."""
    assert empty.keys() == set()
    assert empty.count() == 0
    assert empty.search("anything", filters=NONE, limit=5) == []


def test_invalid_arguments(index: TextIndex, tmp_path: Path) -> None:
    """limit < 1, negative keys and a too small writer heap are ValueErrors."""
    with pytest.raises(ValueError, match="limit"):
        index.search("disk", filters=NONE, limit=0)
    with pytest.raises(ValueError, match="unsigned 64-bit"):
        index.add([chunk(-1, "negative")])
    with pytest.raises(ValueError, match="heap_size"):
        TextIndex(tmp_path / "small", heap_size=10_000_000)


def test_limit_bounds_results(index: TextIndex) -> None:
    """At most ``limit`` hits come back, best first."""
    hits = index.search(EVERYTHING, filters=NONE, limit=3)
    assert len(hits) == 3
    assert_sane(hits, 3)


def test_searches_run_while_another_thread_writes(index: TextIndex) -> None:
    """Concurrent searches during adds and commits neither fail nor see partial state."""
    errors: list[BaseException] = []
    stop = threading.Event()

    def search() -> None:
        try:
            while not stop.is_set():
                hits = index.search("disk ops", filters=NONE, limit=50)
                assert len({k for k, _ in hits}) == len(hits)
        except BaseException as exc:  # reported to the main thread
            errors.append(exc)

    threads = [threading.Thread(target=search) for _ in range(3)]
    for t in threads:
        t.start()
    for batch in range(20):
        index.add([chunk(100 + batch * 10 + i, f"disk batch {batch}") for i in range(10)])
        index.commit()
    stop.set()
    for t in threads:
        t.join()
    assert errors == []
    assert index.count() == len(KEYS) + 200


# -- query text is never syntax ---------------------------------------------------------

NASTY = [
    "", " ", "AND OR NOT", "/.*/", "title:foo", "body:disk", "exact:cve-2024-3094",
    '"unbalanced', "(((", ")))", "a-b", "*", "\\", "\\\"", "disk^10", "+disk -web01",
    "disk~2", "[a TO z]", "{* TO *}", "IN [a b]", "'single", "\x00", "\ud83d\udca5 💥",
    "NOT disk", "disk AND", "-", "--", ":", "::", "a:b:c", "key:1", "indexed_at:>0",
    "x" * 10_000, "disk " * 2_000, "CVE-2024-3094 " * 500, "é" * 45, "日本語のテキスト",
]


@pytest.mark.parametrize("query", NASTY, ids=range(len(NASTY)))
def test_nasty_queries_never_raise(shared: TextIndex, query: str) -> None:
    """Operators, field prefixes, regexes, brackets, quotes, escapes and huge inputs are text."""
    hits = shared.search(query, filters=NONE, limit=10)
    assert_sane(hits, 10)


def test_operators_are_words_not_syntax(shared: TextIndex) -> None:
    """``NOT disk`` still finds the disk chunk, ``body:disk`` searches the words body and
    disk, and ``/.*/`` or ``*`` match nothing rather than everything."""
    assert keys(shared, "NOT disk") == [1]
    assert keys(shared, "body:disk") == [1]
    assert keys(shared, "/.*/") == []
    assert keys(shared, "*") == []
    assert keys(shared, "") == []


def test_huge_queries_are_bounded_and_still_match(shared: TextIndex) -> None:
    """A 10k-character query is cut to its first words and still finds what they match."""
    assert keys(shared, "disk " * 2_000) == [1]
    padding = " ".join(f"w{i}" for i in range(MAX_QUERY_WORDS))
    assert keys(shared, padding + " disk") == []    # past the word limit: ignored
    assert keys(shared, "disk " + padding) == [1]


_FRAGMENTS = st.sampled_from([
    "AND", "OR", "NOT", "+", "-", ":", "\"", "'", "(", ")", "[", "]", "{", "}", "^", "~",
    "*", "?", "\\", "/", " ", "TO", "IN", "body:", "exact:", "key:", "disk", "CVE-2024-3094",
    "10.0.0.12", "fe80::1", "\x00", "\n", "é", "💥",
])


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.lists(st.one_of(_FRAGMENTS, st.text(max_size=5))).map("".join)))
def test_arbitrary_text_never_raises(shared: TextIndex, query: str) -> None:
    """Whatever the text, search returns sane hits (known keys, finite scores, best first)."""
    assert_sane(shared.search(query, filters=NONE, limit=5), 5)
