"""The hnswlib vector index: recall against brute force on clustered data, filtered search
inside the graph, deletes and slot reuse, growth, atomic save and every crash window of it,
dimension checks, and adds racing searches from threads."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest

from retrieval.errors import IndexCorrupt
from retrieval.store._vectors import EXACT_MAX, INITIAL_CAPACITY, VectorIndex

DIM = 384


def clustered(n: int, dim: int = DIM, *, clusters: int = 50, spread: float = 0.5,
              seed: int = 0) -> np.ndarray:
    """Unit vectors drawn around fixed random centres: structure like real embeddings,
    unlike uniform noise, where every neighbour is about as far as any other. ``seed``
    draws the points; the centres are the same for every seed (queries drawn with another
    seed come from the indexed clusters)."""
    centres = np.random.default_rng(12345).standard_normal((clusters, dim))
    rng = np.random.default_rng(seed)
    points = centres[rng.integers(0, clusters, n)] + spread * rng.standard_normal((n, dim))
    points /= np.linalg.norm(points, axis=1, keepdims=True)
    return points.astype(np.float32)


def brute_force(data: np.ndarray, keys: np.ndarray, query: np.ndarray, k: int) -> list[int]:
    sims = data @ (query / np.linalg.norm(query))
    return [int(keys[i]) for i in np.argsort(-sims, kind="stable")[:k]]


def small(path: Path, n: int, *, start: int = 0, seed: int = 1) -> tuple[VectorIndex, np.ndarray]:
    index = VectorIndex(path, 16)
    data = clustered(n, 16, clusters=5, seed=seed)
    index.add(list(range(start, start + n)), data)
    return index, data


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> tuple[VectorIndex, np.ndarray, np.ndarray]:
    """20k clustered unit vectors of dim 384 under large keys (built once: ~4 s)."""
    data = clustered(20_000)
    keys = np.arange(2**40, 2**40 + len(data), dtype=np.uint64)
    index = VectorIndex(tmp_path_factory.mktemp("vectors") / "v.hnsw", DIM)
    index.add([int(k) for k in keys], data)
    return index, data, keys


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "vectors.hnsw"


# -- search quality -----------------------------------------------------------------------


def test_recall_at_10_against_brute_force(
        big: tuple[VectorIndex, np.ndarray, np.ndarray]) -> None:
    """HNSW (M 16, ef_construction 200, ef 100) finds >= 97 % of the exact top 10."""
    index, data, keys = big
    queries = clustered(200, seed=99)              # same kind of data, not in the index
    found = 0
    for q in queries:
        hnsw = [key for key, _ in index.search(q, 10)]
        found += len(set(hnsw) & set(brute_force(data, keys, q, 10)))
    assert found / (10 * len(queries)) >= 0.97


def test_distances_are_cosine_distances(
        big: tuple[VectorIndex, np.ndarray, np.ndarray]) -> None:
    """Results are best first with distance 1 - cosine similarity; an indexed vector is its
    own nearest neighbour at distance 0."""
    index, data, keys = big
    hits = index.search(data[123] * 7.0, 5)        # scale does not matter for cosine
    assert hits[0][0] == int(keys[123])
    assert hits[0][1] == pytest.approx(0.0, abs=1e-5)
    for key, dist in hits:
        expected = 1.0 - float(data[int(key - int(keys[0]))] @ data[123])
        assert dist == pytest.approx(expected, abs=1e-5)
    assert [d for _, d in hits] == sorted(d for _, d in hits)


def test_filtered_search_returns_only_allowed_keys_and_still_k(
        big: tuple[VectorIndex, np.ndarray, np.ndarray]) -> None:
    """With a filter keeping 1 key in 10, every hit is allowed and k come back; they are
    the exact allowed top k almost always."""
    index, data, keys = big
    allowed = {int(k) for k in keys[3::10]}
    subset = data[3::10]
    overlap = 0
    for q in clustered(50, seed=7):
        hits = [key for key, _ in index.search(q, 10, allowed.__contains__)]
        assert len(hits) == 10
        assert set(hits) <= allowed
        overlap += len(set(hits) & set(brute_force(subset, keys[3::10], q, 10)))
    assert overlap / 500 >= 0.95


def test_selective_filter_returns_every_allowed_key(
        big: tuple[VectorIndex, np.ndarray, np.ndarray]) -> None:
    """A filter allowing fewer keys than k returns exactly those; allowing exactly k, all k;
    allowing none, nothing (these take the exact path: at most EXACT_MAX keys)."""
    index, data, keys = big
    five = {int(k) for k in keys[[5, 500, 5000, 9000, 19999]]}
    assert {k for k, _ in index.search(data[0], 10, five.__contains__)} == five
    ten = {int(k) for k in keys[1000:20000:1900]}
    assert len(ten) == 10
    hits = index.search(data[0], 10, ten.__contains__)
    assert {k for k, _ in hits} == ten
    assert [d for _, d in hits] == sorted(d for _, d in hits)
    assert index.search(data[0], 10, lambda key: False) == []


def test_exact_and_graph_paths_agree(
        big: tuple[VectorIndex, np.ndarray, np.ndarray]) -> None:
    """EXACT_MAX allowed keys (exact path) and one more (hnswlib's filtered search) give the
    same neighbours at the same cosine distances."""
    index, data, keys = big
    query = clustered(1, seed=31)[0]
    allowed = [int(k) for k in keys[:20000:39]][:EXACT_MAX]
    extra = int(keys[19999])
    exact = index.search(query, 10, set(allowed).__contains__)
    graph = index.search(query, 10, {*allowed, extra}.__contains__)
    expected = brute_force(data[:20000:39][:EXACT_MAX], keys[:20000:39][:EXACT_MAX], query, 10)
    assert [k for k, _ in exact] == expected
    for key, dist in exact:
        assert dist == pytest.approx(1.0 - float(data[key - int(keys[0])] @ query), abs=1e-5)
    graph_hits = dict(graph)
    shared = [k for k, _ in exact if k in graph_hits]
    assert len(shared) >= 9
    for key in shared:
        assert graph_hits[key] == pytest.approx(dict(exact)[key], abs=1e-5)


def test_a_short_graph_search_falls_back_to_exact(
        big: tuple[VectorIndex, np.ndarray, np.ndarray]) -> None:
    """When hnswlib's filtered search comes back short, exact search answers instead (forced
    here by a filter that stops allowing anything after the pre-count)."""
    index, data, _ = big
    calls = 0

    def fickle(key: int) -> bool:
        nonlocal calls
        calls += 1
        return calls <= EXACT_MAX + 1

    assert index.search(data[0], 10, fickle) == []


def test_k_larger_than_the_index(path: Path) -> None:
    """k above the number of vectors returns them all; an empty index returns nothing."""
    empty = VectorIndex(path, 16)
    assert empty.search(np.ones(16), 5) == []
    index, data = small(path.with_name("five.hnsw"), 5)
    hits = index.search(data[0], 50)
    assert sorted(k for k, _ in hits) == [0, 1, 2, 3, 4]


def test_ef_search_is_settable(path: Path) -> None:
    """ef_search is a property; the constructor's value is applied."""
    index = VectorIndex(path, 16, ef_search=33)
    assert index.ef_search == 33
    index.ef_search = 250
    assert index.ef_search == 250
    with pytest.raises(ValueError, match="ef_search"):
        index.ef_search = 0


# -- deletes, updates, slot reuse ---------------------------------------------------------


def test_deleted_keys_are_never_returned(path: Path) -> None:
    """Deleted keys vanish from search and keys(); unknown and repeated deletes are ignored."""
    index, data = small(path, 100)
    index.delete([3, 4, 5, 999])
    index.delete([3])
    assert index.keys() == set(range(100)) - {3, 4, 5}
    assert index.count() == 97
    for q in data[3:6]:
        assert {3, 4, 5}.isdisjoint(k for k, _ in index.search(q, 100))


def test_deleted_slots_are_reused_so_the_index_stays_bounded(path: Path) -> None:
    """Rolling deletes and adds of 500 keys keep 1000 slots in use and the capacity unchanged."""
    index, _ = small(path, 1000)
    next_key = 1000
    for round_ in range(10):
        index.delete(range(next_key - 1000, next_key - 500))
        fresh = clustered(500, 16, clusters=5, seed=100 + round_)
        new_keys = list(range(next_key, next_key + 500))
        index.add(new_keys, fresh)
        next_key += 500
        assert index.slots_used == 1000
        assert index.capacity == INITIAL_CAPACITY
        assert index.keys() == set(range(next_key - 1000, next_key))
        for key, q in zip(new_keys[::50], fresh[::50], strict=True):
            ((found, dist),) = index.search(q, 1)
            assert found == key
            assert dist == pytest.approx(0.0, abs=1e-5)


def test_capacity_doubles_when_full(path: Path) -> None:
    """Adding past the capacity grows it (doubling) and keeps every vector searchable."""
    index, data = small(path, 3000)
    assert index.capacity == 4 * INITIAL_CAPACITY
    assert index.count() == 3000
    for key in (0, 1500, 2999):
        assert index.search(data[key], 1)[0][0] == key


def test_adding_a_live_key_updates_it_in_place(path: Path) -> None:
    """Re-adding a live key replaces its vector without a second copy."""
    index, data = small(path, 50)
    index.delete([10])                  # a vacant slot the update must not move into
    index.add([7], data[30:31])
    assert index.slots_used == 50
    hits = index.search(data[30], 3)
    assert {k for k, _ in hits} >= {7, 30}
    assert len({k for k, _ in index.search(data[30], 49)}) == 49


def test_re_adding_a_deleted_key_revives_it_once(path: Path) -> None:
    """A deleted key added again is live once, with the new vector, and a later add of a new
    key into another vacant slot does not disturb it."""
    index, data = small(path, 50)
    index.delete([7, 8])
    index.add([7], data[40:41])
    index.add([1000], data[41:42])      # takes 8's slot
    assert index.keys() == (set(range(50)) - {8}) | {1000}
    assert index.slots_used == 50
    keys_found = [k for k, _ in index.search(data[40], 50)]
    assert keys_found.count(7) == 1
    assert index.search(data[41], 1)[0][0] in {41, 1000}
    index.delete([1000])
    index.add([2000], data[0:1])        # reuses 1000's slot; 7 must stay intact
    assert index.keys() == (set(range(50)) - {8}) | {2000}
    assert index.search(data[40], 2)[0][0] in {7, 40}


def test_invalid_input_is_refused(path: Path) -> None:
    """Wrong shapes, NaN, repeated or negative keys, k < 1: ValueError, index unchanged."""
    index, _ = small(path, 10)
    with pytest.raises(ValueError, match="shape"):
        index.add([100], np.ones((1, 15), dtype=np.float32))
    with pytest.raises(ValueError, match="shape"):
        index.add([100, 101], np.ones((1, 16), dtype=np.float32))
    with pytest.raises(ValueError, match="NaN"):
        index.add([100], np.full((1, 16), np.nan, dtype=np.float32))
    with pytest.raises(ValueError, match="repeat"):
        index.add([100, 100], np.ones((2, 16), dtype=np.float32))
    with pytest.raises(ValueError, match="64-bit"):
        index.add([-1], np.ones((1, 16), dtype=np.float32))
    with pytest.raises(ValueError, match="k must"):
        index.search(np.ones(16), 0)
    with pytest.raises(ValueError, match="16 finite"):
        index.search(np.ones(8), 1)
    assert index.keys() == set(range(10))


# -- persistence --------------------------------------------------------------------------


def test_save_and_load_round_trip(path: Path) -> None:
    """A saved index reopens with the same keys, deletions, results and capacity."""
    index, data = small(path, 2000, start=2**62)
    index.delete([2**62 + i for i in range(0, 2000, 3)])
    index.save()
    assert sorted(p.name for p in path.parent.iterdir()) == ["vectors.hnsw",
                                                            "vectors.hnsw.json"]
    loaded = VectorIndex(path, 16, ef_search=100)
    assert loaded.keys() == index.keys()
    assert loaded.capacity == index.capacity
    assert loaded.slots_used == index.slots_used
    for q in data[::100]:
        assert loaded.search(q, 10) == index.search(q, 10)
    sidecar = json.loads(path.with_name("vectors.hnsw.json").read_text())
    assert sidecar["dim"] == 16
    assert sidecar["live"] == len(index.keys())


def test_loaded_index_keeps_reusing_deleted_slots(path: Path) -> None:
    """Deleted slots saved to disk are still reused after a reload."""
    index, _ = small(path, 100)
    index.delete(range(50))
    index.save()
    loaded = VectorIndex(path, 16)
    loaded.add(list(range(100, 150)), clustered(50, 16, seed=5))
    assert loaded.slots_used == 100
    assert loaded.keys() == set(range(50, 150))


def test_save_is_a_no_op_when_nothing_changed(path: Path) -> None:
    """A second save without changes does not rewrite the file."""
    index, _ = small(path, 10)
    index.save()
    before = path.stat()
    index.save()
    after = path.stat()
    assert (before.st_ino, before.st_mtime_ns) == (after.st_ino, after.st_mtime_ns)


def test_a_crash_while_writing_the_temp_file_leaves_the_previous_index(path: Path) -> None:
    """A half-written ``.tmp`` (the crash happened inside save_index) is ignored and
    removed; the previous save loads intact."""
    index, data = small(path, 200)
    index.save()
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(path.read_bytes()[: path.stat().st_size // 3])
    path.with_name(path.name + ".json.tmp").write_text('{"format": 1, "dim"')
    loaded = VectorIndex(path, 16)
    assert loaded.keys() == set(range(200))
    assert loaded.search(data[17], 1)[0][0] == 17
    assert not tmp.exists()
    assert not path.with_name(path.name + ".json.tmp").exists()


def test_a_crash_between_the_two_renames_is_repaired(path: Path) -> None:
    """A new index beside the previous sidecar (the crash came after the first rename) is
    detected; the deleted labels are recovered from the index itself."""
    index, _ = small(path, 300)
    index.delete(range(10))
    index.save()
    sidecar = path.with_name(path.name + ".json")
    old_sidecar = sidecar.read_bytes()
    index.delete(range(10, 40))                   # deletions the old sidecar does not know
    index.add([500], clustered(1, 16, seed=3))    # reuses a vacant slot
    index.save()
    sidecar.write_bytes(old_sidecar)
    loaded = VectorIndex(path, 16)
    assert loaded.keys() == index.keys() == (set(range(40, 300)) | {500})
    assert loaded.slots_used == 300
    # Reuse keeps working with the recovered set: 29 vacant slots left.
    loaded.add(list(range(600, 629)), clustered(29, 16, seed=4))
    assert loaded.slots_used == 300
    assert loaded.capacity == INITIAL_CAPACITY


def test_a_missing_sidecar_is_rebuilt_from_the_index(path: Path) -> None:
    """Without the sidecar, deleted labels are recovered and the next save writes one."""
    index, _ = small(path, 100)
    index.delete([1, 2, 3])
    index.save()
    sidecar = path.with_name(path.name + ".json")
    sidecar.unlink()
    loaded = VectorIndex(path, 16)
    assert loaded.keys() == set(range(100)) - {1, 2, 3}
    loaded.save()
    assert json.loads(sidecar.read_text())["deleted"] == [1, 2, 3]


def test_a_different_dimension_is_refused(path: Path) -> None:
    """Opening an index with another dimension raises IndexCorrupt, with or without the
    sidecar (the check reads hnswlib's own header)."""
    index, _ = small(path, 10)
    index.save()
    with pytest.raises(IndexCorrupt, match="dimension 16, not 32"):
        VectorIndex(path, 32)
    path.with_name(path.name + ".json").unlink()
    with pytest.raises(IndexCorrupt, match="dimension 16, not 8"):
        VectorIndex(path, 8)


def test_a_damaged_index_file_is_reported_as_corrupt(path: Path) -> None:
    """A truncated or garbage index file raises IndexCorrupt, not a foreign error."""
    index, _ = small(path, 100)
    index.save()
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(IndexCorrupt, match="cannot be loaded"):
        VectorIndex(path, 16)
    path.write_bytes(b"\x00" * 10)
    with pytest.raises(IndexCorrupt, match="truncated"):
        VectorIndex(path, 16)


def test_a_sidecar_for_another_dimension_is_refused(path: Path) -> None:
    """A sidecar that contradicts the requested dimension is IndexCorrupt too."""
    index, _ = small(path, 10)
    index.save()
    sidecar = path.with_name(path.name + ".json")
    sidecar.write_text(json.dumps({**json.loads(sidecar.read_text()), "dim": 32}))
    with pytest.raises(IndexCorrupt, match="built for dim 32"):
        VectorIndex(path, 16)


# -- threads ------------------------------------------------------------------------------


def test_concurrent_adds_deletes_saves_and_searches(path: Path) -> None:
    """Adds that resize the index, deletes and saves race searches (plain and filtered)
    from other threads without a crash, and the final state is exact."""
    index = VectorIndex(path, 32)
    data = clustered(6000, 32, clusters=20, seed=11)
    errors: list[BaseException] = []
    stop = threading.Event()

    def search(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            while not stop.is_set():
                q = data[rng.integers(0, len(data))]
                hits = index.search(q, 10, (lambda key: key % 2 == 0) if seed % 2 else None)
                assert len({k for k, _ in hits}) == len(hits)
                if seed % 2:
                    assert all(k % 2 == 0 for k, _ in hits)
        except BaseException as exc:  # reported to the main thread
            errors.append(exc)

    threads = [threading.Thread(target=search, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for start in range(0, 6000, 250):
        index.add(list(range(start, start + 250)), data[start:start + 250])
        index.delete(range(start, start + 250, 5))
        if start % 1000 == 0:
            index.save()
    stop.set()
    for t in threads:
        t.join()
    assert errors == []
    assert index.keys() == {k for k in range(6000) if k % 5}


def test_missing_names_the_keys_without_a_live_vector(tmp_path: Path) -> None:
    """missing(): the asked keys that have no vector, a deleted one included."""
    index = VectorIndex(tmp_path / "v.hnsw", 4)
    index.add([1, 2, 3], np.eye(3, 4, dtype=np.float32))
    index.delete([2])
    assert index.missing([1, 2, 3, 4]) == {2, 4}
    assert index.missing([]) == set()
