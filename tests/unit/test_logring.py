"""The child-output ring: bounded, lines cut, tail/since by sequence number, and followers
that get the backlog then new lines, end on close, and do not disturb each other."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import cast

import pytest

from supervisor import LogLine, LogRing
from tests.support.load import patience

CUT = " …[cut]"


def fill(ring: LogRing, *texts: str) -> list[LogLine]:
    return [ring.append(float(i), 7, "stdout", text) for i, text in enumerate(texts)]


async def pending_next(agen: AsyncIterator[LogLine]) -> asyncio.Future[LogLine]:
    """Start waiting for the follower's next line and let it block (no real sleeping)."""
    fut = asyncio.ensure_future(anext(agen))
    for _ in range(3):
        await asyncio.sleep(0)
    return fut


async def assert_waiting(agen: AsyncIterator[LogLine]) -> None:
    """The follower has nothing more to give: its next read blocks (and is then cancelled)."""
    fut = await pending_next(agen)
    assert not fut.done()
    fut.cancel()
    with pytest.raises(asyncio.CancelledError):
        await fut


def follow(ring: LogRing, n: int = 0) -> AsyncGenerator[LogLine, None]:
    """``ring.follow(n)``, typed as the async generator it is (so tests can close it)."""
    return cast(AsyncGenerator[LogLine, None], ring.follow(n))


def texts(lines: list[LogLine]) -> list[str]:
    return [line.text for line in lines]


def test_capacity_bounds_the_buffer() -> None:
    """Only the newest ``capacity`` lines are kept; older ones fall off."""
    ring = LogRing(capacity=3)
    fill(ring, "a", "b", "c", "d", "e")
    assert texts(ring.tail()) == ["c", "d", "e"]
    assert [line.seq for line in ring.tail()] == [3, 4, 5]
    assert ring.last_seq == 5


@pytest.mark.parametrize("capacity", [0, -1])
def test_capacity_must_be_positive(capacity: int) -> None:
    """A ring that could hold nothing is refused."""
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        LogRing(capacity=capacity)


def test_long_line_is_cut_and_marked() -> None:
    """A line over ``max_line`` is cut to it and marked; one at the limit is untouched."""
    ring = LogRing(max_line=10)
    cut = ring.append(0.0, 1, "stderr", "x" * 25)
    exact = ring.append(0.0, 1, "stderr", "y" * 10)
    assert cut.text == "x" * 10 + CUT
    assert exact.text == "y" * 10


def test_line_fields_are_kept() -> None:
    """Time, pid and stream are stored as given."""
    line = LogRing().append(1234.5, 4242, "stderr", "hello")
    assert line == LogLine(seq=1, time=1234.5, pid=4242, stream="stderr", text="hello")


def test_tail_n() -> None:
    """tail(n) is the latest n lines oldest first; 0 or more than buffered gives all."""
    ring = LogRing(capacity=10)
    fill(ring, "a", "b", "c", "d")
    assert texts(ring.tail(2)) == ["c", "d"]
    assert texts(ring.tail(1)) == ["d"]
    assert texts(ring.tail(0)) == ["a", "b", "c", "d"]
    assert texts(ring.tail(99)) == ["a", "b", "c", "d"]
    assert LogRing().tail(5) == []


def test_since() -> None:
    """since(seq) gives the buffered lines newer than seq, nothing once caught up."""
    ring = LogRing(capacity=3)
    fill(ring, "a", "b", "c", "d", "e")
    assert texts(ring.since(3)) == ["d", "e"]
    assert ring.since(ring.last_seq) == []
    assert texts(ring.since(0)) == ["c", "d", "e"]  # the fallen-off lines are gone


def test_seq_is_monotonic_across_overflow() -> None:
    """Sequence numbers rise by one per line, also after old lines fall off."""
    ring = LogRing(capacity=2)
    seqs = [line.seq for line in fill(ring, *"abcdefg")]
    assert seqs == list(range(1, 8))
    assert ring.last_seq == 7
    assert LogRing().last_seq == 0


async def test_follow_yields_backlog_then_new_lines() -> None:
    """follow(n) gives the latest n buffered lines, then each new line as it arrives."""
    ring = LogRing()
    fill(ring, "a", "b", "c")
    agen = follow(ring, 2)
    try:
        assert (await anext(agen)).text == "b"
        assert (await anext(agen)).text == "c"
        fut = await pending_next(agen)
        assert not fut.done()
        ring.append(0.0, 7, "stdout", "d")
        assert (await fut).text == "d"
        fut = await pending_next(agen)
        assert not fut.done()
        ring.append(0.0, 7, "stderr", "e")
        line = await fut
        assert (line.text, line.stream, line.seq) == ("e", "stderr", 5)
    finally:
        await agen.aclose()


async def test_follow_zero_sends_all_buffered_lines() -> None:
    """follow(0) first sends every buffered line (TailLogs' "0 means all buffered")."""
    ring = LogRing()
    fill(ring, "a", "b", "c")
    agen = follow(ring, 0)
    try:
        got = [await anext(agen) for _ in range(3)]
        assert texts(got) == ["a", "b", "c"]
        await assert_waiting(agen)
    finally:
        await agen.aclose()


async def test_follow_on_empty_ring_waits_for_the_first_line() -> None:
    """A follower of an empty ring blocks until the first line, then gets it."""
    ring = LogRing()
    agen = follow(ring, 5)
    try:
        fut = await pending_next(agen)
        assert not fut.done()
        ring.append(0.0, 7, "stdout", "first")
        assert (await fut).seq == 1
    finally:
        await agen.aclose()


async def test_follow_gets_every_line_appended_between_reads() -> None:
    """Lines appended while the follower is not reading all arrive, in order."""
    ring = LogRing()
    agen = follow(ring)
    try:
        fut = await pending_next(agen)
        fill(ring, "a", "b", "c")
        got = [await fut, await anext(agen), await anext(agen)]
        assert texts(got) == ["a", "b", "c"]
        await assert_waiting(agen)
    finally:
        await agen.aclose()


async def test_slow_follower_sees_a_gap_not_a_repeat() -> None:
    """A follower outrun by the ring skips the fallen-off lines, visible as a seq gap."""
    ring = LogRing(capacity=2)
    agen = follow(ring)
    try:
        fut = await pending_next(agen)
        ring.append(0.0, 7, "stdout", "1")
        assert (await fut).seq == 1
        fill(ring, "2", "3", "4", "5")
        got = [await anext(agen), await anext(agen)]
        assert [line.seq for line in got] == [4, 5]
    finally:
        await agen.aclose()


async def test_close_ends_every_follower() -> None:
    """close() ends blocked followers, and later followers end after their backlog."""
    ring = LogRing()
    fill(ring, "a")
    first, second = follow(ring), follow(ring)
    try:
        assert (await anext(first)).text == "a"
        assert (await anext(second)).text == "a"
        waits = [await pending_next(first), await pending_next(second)]
        assert not any(w.done() for w in waits)
        ring.close()
        async with asyncio.timeout(patience(5)):
            for w in waits:
                with pytest.raises(StopAsyncIteration):
                    await w
        late = [line async for line in follow(ring, 0)]
        assert texts(late) == ["a"]
    finally:
        await first.aclose()
        await second.aclose()


async def test_cancelled_follower_does_not_affect_others() -> None:
    """Cancelling one follower leaves the others and new followers working."""
    ring = LogRing()
    doomed, survivor = follow(ring), follow(ring)
    try:
        doomed_next = await pending_next(doomed)
        survivor_next = await pending_next(survivor)
        doomed_next.cancel()
        with pytest.raises(asyncio.CancelledError):
            await doomed_next
        ring.append(0.0, 7, "stdout", "after")
        assert (await survivor_next).text == "after"
        fresh = follow(ring, 1)
        try:
            assert (await anext(fresh)).text == "after"
            fut = await pending_next(fresh)
            ring.append(0.0, 7, "stdout", "more")
            assert (await fut).text == "more"
            assert (await anext(survivor)).text == "more"
        finally:
            await fresh.aclose()
    finally:
        await doomed.aclose()
        await survivor.aclose()
