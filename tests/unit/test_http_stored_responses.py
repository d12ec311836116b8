"""The bounded store of ``/v1/responses`` (``daemon.httpapi._stored``): how many it keeps,
for how long, and for whom."""

from __future__ import annotations

from daemon.httpapi._stored import ResponseStore

HI = [{"role": "user", "content": "hi"}]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_oldest_goes_first_past_the_bound() -> None:
    store = ResponseStore(2, 60.0, Clock())
    for n in range(3):
        store.put(f"resp_{n}", "", [{"role": "user", "content": str(n)}])
    assert len(store) == 2
    assert store.get("resp_0", "") is None
    assert store.get("resp_2", "") == [{"role": "user", "content": "2"}]


def test_an_entry_expires_after_its_ttl() -> None:
    clock = Clock()
    store = ResponseStore(10, 60.0, clock)
    store.put("resp_a", "", HI)
    clock.now += 59.9
    assert store.get("resp_a", "") == HI
    store.put("resp_b", "", HI)
    clock.now += 0.2
    assert store.get("resp_a", "") is None and store.get("resp_b", "") == HI
    assert len(store) == 1


def test_only_its_owner_continues_it_and_gets_a_copy() -> None:
    store = ResponseStore(10, 60.0, Clock())
    store.put("resp_a", "fingerprint-1", HI)
    assert store.get("resp_a", "fingerprint-2") is None
    assert store.get("resp_a", "") is None
    got = store.get("resp_a", "fingerprint-1")
    assert got == HI
    assert got is not None
    got.append({"role": "assistant", "content": "changed"})
    assert store.get("resp_a", "fingerprint-1") == HI


def test_zero_entries_keeps_nothing() -> None:
    store = ResponseStore(0, 60.0, Clock())
    assert not store.enabled
    store.put("resp_a", "", HI)
    assert store.get("resp_a", "") is None and len(store) == 0
