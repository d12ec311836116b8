"""Admission lanes: interactive first, ageing that keeps batch and background moving, a
bounded queue per lane, the slot kept for interactive calls (on an injected clock)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from daemon.config import Limits
from daemon.errors import InvalidArgument, Overloaded
from daemon.models import lanes
from daemon.models.admission import Admission
from daemon.models.lanes import Lane, LanePolicy, parse_lane, policy_from
from daemon.models.router import InferenceRouter
from daemon.telemetry.metrics import Metrics
from supervisor import State
from tests.support.httpapi import client, serving
from tests.support.scripted import settle
from tests.support.scripted_pool import Rig, until

INT, B, G = Lane.INTERACTIVE, Lane.BATCH, Lane.BACKGROUND


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def spin() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


class Calls:
    """Calls that each hold their slot until released one by one; ``log`` names the calls
    in the order they got a slot."""

    def __init__(self, adm: Admission) -> None:
        self.adm = adm
        self.log: list[str] = []
        self.release: dict[str, asyncio.Event] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}

    async def start(self, name: str, lane: Lane) -> None:
        self.release[name] = asyncio.Event()
        self.tasks[name] = asyncio.create_task(self._hold(name, lane))
        await spin()

    async def _hold(self, name: str, lane: Lane) -> None:
        async with self.adm.slot(None, lane):
            self.log.append(name)
            await self.release[name].wait()

    async def finish(self, name: str) -> None:
        self.release[name].set()
        await self.tasks[name]
        await spin()

    def running(self) -> list[str]:
        return [n for n in self.log if not self.release[n].is_set()]


def admission(limit: int = 1, *, ahead: int = 0, queue: int = 8, clock: Clock | None = None,
              **policy: object) -> Admission:
    return Admission("embedding", limit, queue, ahead=ahead, clock=clock or Clock(),
                     lanes=LanePolicy(**policy))  # type: ignore[arg-type]


async def test_an_interactive_call_goes_before_batch_and_background_waiting_longer() -> None:
    calls = Calls(admission(promote_after=100, promote_seconds=100))
    await calls.start("first", G)
    await calls.start("bg", G)
    await calls.start("batch", B)
    await calls.start("query", INT)
    assert calls.log == ["first"]
    assert calls.adm.queued == 3
    assert [calls.adm.queued_in(lane) for lane in Lane] == [1, 1, 1]
    for name in ("first", "query", "batch"):
        await calls.finish(name)
    assert calls.log == ["first", "query", "batch", "bg"]


async def test_ageing_gives_background_a_slot_every_promote_after_plus_one_admissions() -> None:
    """A steady interactive stream (one always waiting) on a one-slot child: background
    still gets at least one admission in every promote_after + 1."""
    calls = Calls(admission(promote_after=3, promote_seconds=1000, background_queue=64))
    await calls.start("i0", INT)
    for n in range(10):
        await calls.start(f"b{n}", G)
    await calls.start("i1", INT)
    next_i = 2
    for _ in range(40):  # each turn: the running call ends, a new interactive call waits
        await calls.finish(calls.running()[0])
        await calls.start(f"i{next_i}", INT)
        next_i += 1
    order = ["b" if n.startswith("b") else "i" for n in calls.log]
    assert len(order) == 41
    # The minimum rate: no window of promote_after + 1 admissions without a background one.
    for start in range(1, len(order) - 3):
        assert "b" in order[start:start + 4], (start, "".join(order))
    # ... and interactive calls still go first the rest of the time.
    assert order.count("i") >= 3 * order.count("b")
    for task in calls.tasks.values():
        task.cancel()


async def test_a_lower_lane_call_waiting_promote_seconds_goes_first() -> None:
    clock = Clock()
    calls = Calls(admission(clock=clock, promote_after=1000, promote_seconds=2.0))
    await calls.start("run", INT)
    await calls.start("batch", B)
    clock.now = 1.0
    await calls.start("q1", INT)
    await calls.finish("run")
    assert calls.log == ["run", "q1"]  # not aged yet: interactive first
    await calls.start("q2", INT)
    clock.now = 2.5  # the batch call has now waited 2.5 s
    await calls.finish("q1")
    assert calls.log == ["run", "q1", "batch"]
    await calls.finish("batch")
    assert calls.log == ["run", "q1", "batch", "q2"]
    await calls.finish("q2")


async def test_a_full_lane_refuses_with_a_retry_hint_and_leaves_the_others_open() -> None:
    clock = Clock()
    adm = admission(queue=2, clock=clock, background_queue=1, batch_queue=0)
    async with adm.slot(None, INT):  # a finished call gives the wait estimate
        clock.now = 3.0
    calls = Calls(adm)
    await calls.start("run", INT)
    await calls.start("bg", G)
    with pytest.raises(Overloaded) as full:
        async with adm.slot(None, G):
            pass
    assert full.value.retry_after >= 3.0  # the call waiting ahead of it, at least
    assert "background lane full" in str(full.value)
    assert "limits.background_queue_size = 1" in str(full.value)
    with pytest.raises(Overloaded, match=r"limits\.batch_queue_size = 0"):
        async with adm.slot(None, B):
            pass
    assert adm.rejected["queue_full"] == 2
    await calls.start("query", INT)  # the interactive lane still takes calls
    assert adm.queued_in(INT) == 1
    await calls.finish("run")
    await calls.finish("query")
    await calls.finish("bg")
    assert calls.log == ["run", "query", "bg"]


async def test_one_slot_of_a_multi_slot_child_is_kept_for_interactive_calls() -> None:
    """Two slots and two calls ahead: batch and background hold at most one slot and are
    never sent ahead; an interactive call finds the other slot free."""
    clock = Clock()
    calls = Calls(admission(limit=2, ahead=2, clock=clock, promote_after=1,
                            promote_seconds=1000))
    await calls.start("bg1", G)
    await calls.start("bg2", G)
    clock.now = 1.0
    await calls.start("batch", B)
    assert calls.log == ["bg1"]
    await calls.start("q1", INT)
    await calls.start("q2", INT)
    await calls.start("q3", INT)
    assert calls.log == ["bg1", "q1", "q2", "q3"]  # capacity 4: interactive may go ahead
    await calls.finish("bg1")
    # Both lower calls are promoted (3 interactive admissions passed them): the one waiting
    # longer takes the one lower slot, free again.
    assert calls.log[-1] == "bg2"
    assert calls.adm.queued == 1
    for name in ("q1", "q2", "q3", "bg2"):
        await calls.finish(name)
    assert calls.log[-1] == "batch"
    await calls.finish("batch")


async def test_without_the_reserved_slot_lower_lanes_use_every_slot() -> None:
    calls = Calls(admission(limit=2, ahead=1, reserve_interactive=False))
    for n in range(4):
        await calls.start(f"bg{n}", G)
    assert calls.log == ["bg0", "bg1", "bg2"]
    for n in range(4):
        await calls.finish(f"bg{n}")


async def test_a_one_slot_child_keeps_no_slot_back() -> None:
    calls = Calls(admission(limit=1))
    await calls.start("bg", G)
    assert calls.log == ["bg"]
    await calls.finish("bg")


async def test_lanes_off_is_one_fifo() -> None:
    calls = Calls(admission(enabled=False, background_queue=0))
    await calls.start("run", G)
    await calls.start("bg", G)  # counted in the interactive queue: not refused
    await calls.start("query", INT)
    for name in ("run", "bg", "query"):
        await calls.finish(name)
    assert calls.log == ["run", "bg", "query"]


async def test_a_cancelled_waiter_leaves_its_lane() -> None:
    calls = Calls(admission())
    await calls.start("run", INT)
    await calls.start("bg", G)
    calls.tasks["bg"].cancel()
    await spin()
    assert calls.adm.queued == 0
    await calls.finish("run")
    assert calls.adm.in_flight == 0


def test_a_client_names_interactive_or_batch_only() -> None:
    assert parse_lane("") is INT
    assert parse_lane(" Batch ") is B
    assert parse_lane("interactive") is INT
    for bad in ("background", "urgent"):
        with pytest.raises(InvalidArgument) as exc:
            parse_lane(bad)
        assert exc.value.field == "x-llamad-lane"
        assert bad in str(exc.value)


def test_the_retriever_embedder_lane_is_background_but_inside_a_search() -> None:
    assert lanes.asked() is INT
    assert lanes.current(G) is G
    with lanes.asking(B):
        assert lanes.asked() is B
        assert lanes.current(G) is G  # a client's lane never moves llamad's own work
        with lanes.using(lanes.asked()):
            assert lanes.current(G) is B
    assert lanes.asked() is INT


def test_policy_from_limits_defaults() -> None:
    # The section's defaults, as a daemon with no [limits] reads them (loading a whole
    # configuration would want a prepared model: a fresh checkout's `make check` has none).
    policy = policy_from(Limits())
    assert policy == LanePolicy()
    assert (policy.batch_queue, policy.background_queue) == (64, 256)
    assert policy.lower_limit(slots=4, capacity=4) == 3
    assert policy.lower_limit(slots=1, capacity=2) == 2
    with pytest.raises(ValueError, match="promote_after"):
        LanePolicy(promote_after=0)


async def test_http_a_full_batch_lane_is_429_while_interactive_calls_still_queue() -> None:
    """Over the HTTP API (real router and admission, a scripted backend): with the slot
    busy, a call sent with x-llamad-lane: batch to a batch lane of size 0 is 429 with
    Retry-After naming its option; an interactive one waits and is served; a lane that
    is not a client's is 400 naming the header."""
    async with serving(queue=4) as h:
        h.gen_admission.configure(LanePolicy(batch_queue=0))
        h.gen.gate = asyncio.Event()
        busy, waiting = asyncio.Event(), asyncio.Event()

        def changed(adm: Admission) -> None:
            if adm.in_flight:
                busy.set()
            if adm.queued_in(INT):
                waiting.set()

        h.gen_admission.set_hooks(changed, None)
        async with client() as http:
            body = {"model": "gen", "prompt": "x"}
            first = asyncio.create_task(http.post(h.url + "/v1/completions", json=body))
            await busy.wait()
            batch = await http.post(h.url + "/v1/completions", json=body,
                                    headers={"X-Llamad-Lane": "batch"})
            queued = asyncio.create_task(http.post(h.url + "/v1/completions", json=body))
            await waiting.wait()
            bad = await http.post(h.url + "/v1/completions", json=body,
                                  headers={"X-Llamad-Lane": "urgent"})
            h.gen.gate.set()
            assert (await first).status_code == 200
            assert (await queued).status_code == 200
    assert batch.status_code == 429
    assert int(batch.headers["retry-after"]) >= 1
    assert "limits.batch_queue_size = 0" in batch.json()["error"]["message"]
    assert bad.status_code == 400
    assert "x-llamad-lane" in bad.json()["error"]["message"]


async def test_each_models_queue_depth_is_exported_by_lane(tmp_path: Path) -> None:
    """llamad_lane_queue_depth{model, lane}: a pooled model's calls waiting in each lane
    (its slots all taken by interactive calls), at 0 again once they leave."""
    metrics = Metrics(version="test", models={"gen-a": "generation", "gen-b": "generation",
                                              "gen-c": "generation", "emb": "embedding"})
    rig = Rig(tmp_path, metrics=metrics)
    rig.default.start()
    await settle(rig.default.supervisor, State.RUNNING)
    router = InferenceRouter({"generation": rig.default})
    router.attach(rig.pool)

    def depth(lane: str, model: str = "gen-a") -> float | None:
        return metrics.registry.get_sample_value(
            "llamad_lane_queue_depth", {"role": "generation", "model": model, "lane": lane})

    async with contextlib.AsyncExitStack() as stack:
        for _ in range(rig.default.admission.capacity):
            await stack.enter_async_context(router.admit("generation", None))
        waiting = [asyncio.create_task(stack.enter_async_context(
            router.admit("generation", None, lane=lane))) for lane in (B, G, G)]
        await until(lambda: rig.default.admission.queued == 3)
        assert (depth("interactive"), depth("batch"), depth("background")) == (0, 1, 2)
        assert depth("batch", "gen-b") in (None, 0)
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        assert (depth("batch"), depth("background")) == (0, 0)
