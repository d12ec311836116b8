"""Health from outcomes (issue 28), on the injected clock: calls that fail in a row take a
child out of service at once; a silent call gets the child a 1-token probe, whose failure
or silence takes it out of service unless the child is busy (heard from, or its serving
loop answers); an idle child is never probed; calls waiting on a condemned child end at
once with an error naming the cause. The calls go through the real
:class:`~supervisor.outcomes.WatchedClient` wrappers, the child's answers are scripted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from supervisor import ChildRequestError, Chunk, ManualClock, Sampling, Timeouts
from supervisor._runtime import LLAMA_SERVER_API
from supervisor.errors import ChildBadRequestError, ChildUnresponsiveError
from supervisor.outcomes import OutcomePolicy, Outcomes, WatchedClient, watch_outcomes
from tests.support.load import patience

POLICY = OutcomePolicy(failures=3, interval=1.0, probe_timeout=4.0, busy_silence=120.0)
SAMPLING = Sampling(max_tokens=4)


class Child:
    """The scripted child behind a :class:`WatchedClient`: streams and unary answers come
    from futures the test resolves; its probes and serving loop answer as told."""

    def __init__(self, clock: ManualClock) -> None:
        self.client = WatchedClient("http://127.0.0.1:9", model_id="m", api=LLAMA_SERVER_API,
                                    loopback=True, now=clock.monotonic)
        self.chunks: asyncio.Queue[Chunk | Exception] = asyncio.Queue()
        self.unary: asyncio.Future[Any] | None = None
        self.probe_answer: str | None = None
        self.probe_hangs = False
        self.probes = 0
        self.loop_answers = False
        self.client._stream = self._stream  # type: ignore[method-assign]
        self.client._json = self._json  # type: ignore[method-assign]

    async def _stream(self, path: str, body: dict[str, Any], *, chat: bool,
                      sampling: Sampling) -> AsyncIterator[Chunk]:
        while True:
            item = await self.chunks.get()
            if isinstance(item, Exception):
                raise item
            yield item
            if item.finish_reason is not None:
                return

    async def _json(self, method: str, path: str, body: dict[str, Any] | None, *,
                    timeout: float | None = None) -> dict[str, Any]:
        self.unary = asyncio.get_running_loop().create_future()
        result: dict[str, Any] = await self.unary
        return result

    async def probe(self) -> str | None:
        self.probes += 1
        if self.probe_hangs:
            await asyncio.Event().wait()
        return self.probe_answer

    async def loop(self, timeout: float) -> bool:
        return self.loop_answers


async def watching(child: Child, clock: ManualClock,
                   policy: OutcomePolicy = POLICY) -> asyncio.Task[Any]:
    """The watch, running, and waiting for a call on the child: no timer while none
    runs (an idle daemon's wake-ups are its idle CPU, issue 27)."""
    watch = asyncio.ensure_future(watch_outcomes(
        child.client.outcomes, child.probe, clock=clock, policy=policy,
        loop_answers=child.loop))
    for _ in range(5):
        await asyncio.sleep(0)
    assert clock.sleepers == 0 and not watch.done()
    return watch


async def running(coro: Any) -> asyncio.Task[Any]:
    """``coro`` as a task that has run up to its first wait."""
    task: asyncio.Task[Any] = asyncio.ensure_future(coro)
    for _ in range(5):
        await asyncio.sleep(0)
    return task


async def stream_text(child: Child) -> str:
    return "".join([c.text async for c in child.client.stream_completion("p", SAMPLING)])


async def silent_stream(clock: ManualClock
                        ) -> tuple[Child, asyncio.Task[Any], asyncio.Task[Any]]:
    """A watched child whose probes hang, with a stream on it that got nothing yet: the
    child, its watch and the stream's reader."""
    child = Child(clock)
    child.probe_hangs = True
    return child, await watching(child, clock), await running(stream_text(child))


async def test_three_failed_calls_in_a_row_take_the_child_out_at_once() -> None:
    """A 5xx, a dropped connection and a timeout in a row: condemned without waiting for
    the next look, the cause naming the count and the last error; a refusal of the
    request itself (4xx) is not the child's failure and does not count."""
    clock = ManualClock()
    child = Child(clock)
    child.probe_answer = "HTTP 500: boom"  # the confirming probe fails too
    watch = await watching(child, clock)
    errors = [ChildRequestError("HTTP 500: boom", status=500),
              ChildBadRequestError("HTTP 400: bad", status=400),
              ChildRequestError("connection dropped by the child"),
              ChildRequestError("timed out (ReadTimeout)")]
    for error in errors:
        child.chunks.put_nowait(error)
        with pytest.raises(ChildRequestError):
            await stream_text(child)
    await asyncio.sleep(0)
    cause = await asyncio.wait_for(watch, patience(1))
    assert cause.kind == "calls_failing" and not cause.permanent
    assert cause.message.startswith("3 calls in a row failed on it while its /health")
    assert "timed out (ReadTimeout)" in cause.message
    assert cause.message.endswith("its 1-token probe failed while its /health answered "
                                  "(HTTP 500: boom)")
    assert child.client.outcomes.failures == 3 and child.probes == 1


async def test_failed_calls_do_not_condemn_a_child_that_answers_its_probe() -> None:
    """Calls a hostile client makes fail on purpose (three in a row, faster than a probe)
    never get a child that computes replaced: its probe answers, the count is cleared."""
    clock = ManualClock()
    child = Child(clock)
    child.probe_answer = None
    watch = await watching(child, clock)
    for _ in range(2):
        for _ in range(3):
            child.chunks.put_nowait(ChildRequestError("HTTP 500: hostile", status=500))
            with pytest.raises(ChildRequestError):
                await stream_text(child)
        await clock.advance(1.0)
        assert child.client.outcomes.failures == 0
    assert child.probes == 2 and not watch.done()
    watch.cancel()


async def test_a_success_resets_the_count_and_an_idle_child_is_never_probed() -> None:
    """Two failures, a success, two failures: still in service; with no call running and
    no failure since the last look, no probe is sent, however long it stays idle."""
    clock = ManualClock()
    child = Child(clock)
    child.probe_answer = None
    watch = await watching(child, clock)
    script: list[Chunk | Exception] = [ChildRequestError("x"), ChildRequestError("x"),
                                       Chunk("w", 1), ChildRequestError("x"),
                                       ChildRequestError("x")]
    for item in script:
        child.chunks.put_nowait(item)
        if isinstance(item, Chunk):
            child.chunks.put_nowait(Chunk("", 0, "stop", 3, 1))
            assert await stream_text(child) == "w"
        else:
            with pytest.raises(ChildRequestError):
                await stream_text(child)
    await clock.advance(1.0)
    probes = child.probes  # failures get the child probed (it answers: it stays)
    assert probes >= 1
    await clock.advance(600.0)
    assert child.probes == probes
    assert not watch.done()
    watch.cancel()


async def test_a_silent_stream_gets_a_probe_and_a_stalled_one_condemns_the_child() -> None:
    """A stream with no byte for the interval: a 1-token probe; no answer to it, none from
    the serving loop, nothing from the child within probe_timeout: taken out of service
    (probe_stalled) at interval + probe_timeout, and the stream waiting on it ends at
    once with ChildUnresponsiveError naming the cause (it does not hang)."""
    clock = ManualClock()
    child, watch, reader = await silent_stream(clock)
    await clock.advance(0.5)
    assert child.probes == 0
    await clock.advance(0.5)
    assert child.probes == 1
    await clock.advance(3.5)
    assert not watch.done()
    await clock.advance(0.5)
    cause = await asyncio.wait_for(watch, patience(1))
    assert cause.kind == "probe_stalled"
    assert "no answer within 4.0 s" in cause.message and "waited in silence" in cause.message
    child.client.outcomes.condemn(cause)  # what ProcessChild.watch does with the cause
    await asyncio.sleep(0)
    assert not reader.done()  # waiting calls end when the child is stopped:
    child.client.outcomes.interrupt()
    with pytest.raises(ChildUnresponsiveError, match="taken out of service") as ended:
        await asyncio.wait_for(reader, 1)
    assert ended.value.kind == "probe_stalled"
    assert "probe got no answer within 4.0 s" in str(ended.value)
    # A later call is refused at once, naming the same cause.
    with pytest.raises(ChildUnresponsiveError, match="probe got no answer"):
        await child.client.embed(["a"])


async def test_a_busy_child_is_not_condemned_for_a_slow_probe() -> None:
    """The probe waits behind other calls: a child heard from meanwhile (another stream's
    chunk), or whose serving loop answers, is busy, not stuck."""
    clock = ManualClock()
    child, watch, silent = await silent_stream(clock)
    await clock.advance(1.0)
    assert child.probes == 1
    await clock.advance(2.0)
    child.chunks.put_nowait(Chunk("w", 1))  # the child speaks during the probe
    await clock.advance(2.0)
    assert not watch.done()
    child.loop_answers = True  # silent again; the loop answers the next probe's question
    await clock.advance(20.0)
    assert child.probes >= 2 and not watch.done()
    child.loop_answers = False  # and then nothing answers
    await clock.advance(10.0)
    assert (await asyncio.wait_for(watch, patience(1))).kind == "probe_stalled"
    silent.cancel()


class Cpu:
    """The child process's CPU time, as the test sets it (seconds)."""

    def __init__(self) -> None:
        self.used: float | None = 0.0

    def __call__(self) -> float | None:
        return self.used


async def test_a_computing_child_gets_time_and_a_stuck_one_does_not() -> None:
    """A probe unanswered while the child's process gets CPU time (a long prompt step on
    a loaded machine) waits on, window by window, and an answer then clears the child;
    one whose CPU time stops growing is judged at the end of that window; one that
    computes without ever answering is judged at busy_max all the same."""
    policy = OutcomePolicy(failures=3, interval=1.0, probe_timeout=4.0, busy_silence=120.0,
                           busy_max=20.0)

    async def watched(cpu: Cpu) -> tuple[Child, ManualClock, asyncio.Task[Any], Any]:
        clock = ManualClock()
        child = Child(clock)
        child.probe_hangs = True
        watch = asyncio.ensure_future(watch_outcomes(
            child.client.outcomes, child.probe, clock=clock, policy=policy,
            loop_answers=child.loop, cpu_seconds=cpu))
        for _ in range(5):
            await asyncio.sleep(0)
        reader = await running(stream_text(child))
        await clock.advance(1.0)
        assert child.probes == 1
        return child, clock, watch, reader

    async def computing(cpu: Cpu, clock: ManualClock, watch: asyncio.Task[Any], windows: int,
                        seconds: float) -> None:
        """``windows`` probe windows in each of which the child computes ``seconds``: not
        judged meanwhile."""
        for _ in range(windows):
            cpu.used = (cpu.used or 0) + seconds
            await clock.advance(4.0)
            assert not watch.done()

    # Computing through three windows, then it answers: never condemned.
    cpu = Cpu()
    child, clock, watch, reader = await watched(cpu)
    await computing(cpu, clock, watch, 3, 2.0)
    child.probe_hangs = False
    child.chunks.put_nowait(Chunk("w", 1, finish_reason="length"))
    await clock.advance(4.0)
    assert not watch.done()
    assert await asyncio.wait_for(reader, patience(1)) == "w"
    watch.cancel()

    # Computing for one window, then frozen (SIGSTOP): judged at the end of the next one.
    cpu = Cpu()
    child, clock, watch, reader = await watched(cpu)
    await computing(cpu, clock, watch, 1, 1.0)
    await clock.advance(3.9)
    assert not watch.done()
    await clock.advance(0.1)
    assert (await asyncio.wait_for(watch, patience(1))).kind == "probe_stalled"
    reader.cancel()

    # No CPU time at all over the probe's allowance: judged at once, as without the check.
    cpu = Cpu()
    child, clock, watch, reader = await watched(cpu)
    cpu.used = 0.001
    await clock.advance(4.0)
    assert (await asyncio.wait_for(watch, patience(1))).kind == "probe_stalled"
    reader.cancel()

    # Spinning (CPU time grows) but never answering: judged at busy_max.
    cpu = Cpu()
    child, clock, watch, reader = await watched(cpu)
    await computing(cpu, clock, watch, 4, 4.0)
    cpu.used = (cpu.used or 0) + 4.0
    await clock.advance(4.0)
    assert (await asyncio.wait_for(watch, patience(1))).kind == "probe_stalled"
    reader.cancel()


async def test_a_failing_probe_condemns_at_once() -> None:
    """A failed call gets the child probed at the next look; the probe fails too:
    probe_failed, naming the probe's error."""
    clock = ManualClock()
    child = Child(clock)
    child.probe_answer = "/v1/completions: HTTP 500: fake: wedged"
    watch = await watching(child, clock)
    child.chunks.put_nowait(ChildRequestError("HTTP 500: fake: wedged", status=500))
    with pytest.raises(ChildRequestError):
        await stream_text(child)
    await clock.advance(1.0)
    cause = await asyncio.wait_for(watch, patience(1))
    assert cause.kind == "probe_failed"
    assert cause.message == ("its 1-token probe failed while its /health answered "
                             "(/v1/completions: HTTP 500: fake: wedged)")


async def test_a_stream_with_no_token_and_no_usage_is_a_failure() -> None:
    """llama-server always reports usage: an answer with neither is broken; an empty
    generation that reports its usage (end of sequence at once) is a success."""
    clock = ManualClock()
    child = Child(clock)
    outcomes = child.client.outcomes
    child.chunks.put_nowait(Chunk("", 0, "stop", None, None))
    assert await stream_text(child) == ""
    assert outcomes.failures == 1 and "no token and no usage" in outcomes.last_failure
    child.chunks.put_nowait(Chunk("", 0, "stop", 5, 0))
    assert await stream_text(child) == ""
    assert outcomes.failures == 0


async def test_a_long_unary_call_is_given_busy_silence() -> None:
    """An embedding batch answers only at its end: no probe before busy_silence of
    silence; then one."""
    clock = ManualClock()
    child = Child(clock)
    child.probe_answer = None
    watch = await watching(child, clock)
    call = await running(child.client.embed(["a"]))
    await clock.advance(119.0)
    assert child.probes == 0
    await clock.advance(1.0)
    assert child.probes == 1
    assert child.unary is not None
    child.unary.set_result({"data": [{"index": 0, "embedding": [1.0, 0.0]}]})
    assert (await asyncio.wait_for(call, patience(1))).matrix.shape == (1, 2)
    assert child.client.outcomes.failures == 0
    watch.cancel()


async def test_a_caller_cancelled_by_someone_else_stays_cancelled() -> None:
    """Condemning interrupts only calls waiting on the child; a caller cancelled by its
    own client at the same time gets CancelledError, not the child's error."""
    clock = ManualClock()
    child = Child(clock)
    reader = await running(stream_text(child))
    await asyncio.sleep(0)
    reader.cancel()  # the client left
    from supervisor import ExitCause
    child.client.outcomes.condemn(ExitCause("probe_stalled", False, "stuck"))
    child.client.outcomes.interrupt()
    with pytest.raises(asyncio.CancelledError):
        await reader


def test_the_probe_allowance_grows_with_the_model() -> None:
    """token_probe_timeout plus token_probe_per_gib per GiB of model file; 0 stays off."""
    t = Timeouts(token_probe_timeout=4.0, token_probe_per_gib=5.0)
    assert t.outcomes(0).probe_timeout == 4.0
    assert t.outcomes(2 * 2**30).probe_timeout == 14.0
    assert Timeouts(token_probe_timeout=0).outcomes(2**30).probe_timeout == 0
    assert t.outcomes().interval == 1.0 and t.outcomes().failures == 3
    assert t.outcomes().busy_max == 60.0  # token_probe_busy_max
    assert t.outcomes(20 * 2**30).busy_max == 104.0  # never below the probe's allowance


async def test_without_a_loop_question_a_busy_child_is_not_probed() -> None:
    """The bundled runtime serves one call at a time and has no serving-loop question: a
    probe behind its running call would only wait, so none is sent while a call waits."""
    clock = ManualClock()
    child = Child(clock)
    child.probe_hangs = True
    watch = asyncio.ensure_future(watch_outcomes(
        child.client.outcomes, child.probe, clock=clock, policy=POLICY, loop_answers=None))
    await running(asyncio.sleep(0))
    reader = await running(stream_text(child))
    await clock.advance(60.0)
    assert child.probes == 0 and not watch.done()
    reader.cancel()
    watch.cancel()


async def test_no_failure_count_means_never() -> None:
    """failed_calls = 0: failures never take the child out (probes still judge it)."""
    clock = ManualClock()
    child = Child(clock)
    child.probe_answer = None
    watch = await watching(child, clock, OutcomePolicy(failures=0, interval=1.0,
                                                 probe_timeout=4.0, busy_silence=120.0))
    for _ in range(5):
        child.chunks.put_nowait(ChildRequestError("x"))
        with pytest.raises(ChildRequestError):
            await stream_text(child)
    await clock.advance(10.0)
    assert not watch.done()
    assert isinstance(child.client.outcomes, Outcomes)
    watch.cancel()


async def test_with_probes_off_the_count_alone_decides() -> None:
    """token_probe_timeout = 0: three failed calls in a row take the child out, unprobed."""
    clock = ManualClock()
    child = Child(clock)
    watch = await watching(child, clock, OutcomePolicy(failures=3, interval=1.0,
                                                       probe_timeout=0, busy_silence=120.0))
    for _ in range(3):
        child.chunks.put_nowait(ChildRequestError("HTTP 500: boom", status=500))
        with pytest.raises(ChildRequestError):
            await stream_text(child)
    cause = await asyncio.wait_for(watch, patience(1))
    assert cause.kind == "calls_failing" and child.probes == 0
    assert cause.message == ("3 calls in a row failed on it while its /health answered "
                             "(last: HTTP 500: boom)")
