"""Loads that say how far they are (issue 28): the phase parser on llama-server's and the
bundled runtime's real start-up lines, the watch and its retry hint, the supervisor's
progress while starting (in Status and in the UNAVAILABLE a waiting caller gets), and the
start deadline that grows with the model's size."""

from __future__ import annotations

import asyncio

import pytest

from supervisor import ChildNotReadyError, ManualClock, State, Supervisor, Timeouts
from supervisor import _loading as loading
from supervisor._child import StageSink
from supervisor._loading import LoadProgress, LoadWatch, phase_of
from tests.support.load import patience

# llama-server (llama.cpp 0.5.0-dev, commit 0c1e570) at its default verbosity, as it
# printed loading gemma-3-270m (our capture, timestamps kept).
LLAMA_SERVER_DEFAULT = [
    ("0.00.007.162 I srv  llama_server: initializing ...", None),
    ("0.00.012.091 I srv    load_model: loading model 'models/gguf/gemma-3-270m.gguf'",
     "loading"),
    ("0.00.942.477 W load: control-looking token:    212 '</s>' was not control-type", None),
    ("0.01.168.341 I cmn          init: llama threadpool init, n_threads = 1", None),
    ("0.01.302.401 I srv    load_model: initializing, n_slots = 4, n_ctx_slot = 512",
     "warming_up"),
    ("0.01.304.965 I srv  llama_server: model loaded", "probing"),
    ("0.01.309.192 I srv  llama_server: listening on http://127.0.0.1:18777", "probing"),
]
# The same at -lv 4, and the bundled runtime (llama-cpp-python, verbose): the lines that
# move the phase.
VERBOSE = [
    ("0.00.748.186 I llama_model_loader: loaded meta data with 33 key-value pairs and 236 "
     "tensors from m.gguf (version GGUF V3 (latest))", "loading"),
    ("0.01.327.901 I load_tensors: loading model tensors, this can take a while... "
     "(load_mode = mmap)", "loading"),
    ("0.01.364.986 I llama_context: constructing llama_context", "warming_up"),
    ("0.01.372.236 I cmn  common_init_: warming up the model with an empty run - please "
     "wait ... (--no-warmup to disable)", "warming_up"),
    ("load_tensors: layer   0 assigned to device CPU, is_swa = 1", "loading"),
    (".......................repack: repack tensor blk.0.attn_output.weight with q4_K_8x8",
     None),
    # An older llama-server binds (and says so) before it loads, then says it again.
    ("main: HTTP server is listening, hostname: 127.0.0.1, port: 8080, http threads: 5",
     None),
    ("main: server is listening on http://127.0.0.1:8080 - starting the main loop",
     "probing"),
    ("INFO:     Uvicorn running on unix socket /run/llamad/x.sock (Press CTRL+C to quit)",
     "probing"),
]


@pytest.mark.parametrize(("line", "phase"), LLAMA_SERVER_DEFAULT + VERBOSE)
def test_phase_of_reads_the_runtimes_own_lines(line: str, phase: str | None) -> None:
    """Each known start-up line maps to its phase; other lines to none."""
    assert phase_of(line) == phase


def test_the_watch_only_moves_forward_and_takes_health_stages() -> None:
    """Fed llama-server's default output: launching, loading, warming up, probing; a
    later 'loading' line (or stage) never takes it back; unknown stages are ignored."""
    now = [10.0]
    watch = LoadWatch(lambda: now[0])
    assert watch.phase == "launching"
    seen = []
    for line, _ in LLAMA_SERVER_DEFAULT:
        watch.line(line)
        seen.append(watch.phase)
    assert seen == ["launching", "loading", "loading", "loading", "warming_up", "probing",
                    "probing"]
    watch.line("load_tensors: loading model tensors")
    watch.stage("loading")
    watch.stage("swapping")
    assert watch.phase == "probing"
    now[0] = 13.5
    assert watch.progress(5.0) == LoadProgress("probing", 3.5, 5.0)


def test_progress_says_where_and_hints_from_the_last_start_or_the_phase() -> None:
    """describe() names the phase, its number and the seconds; the retry hint is what is
    left of the last start (1 s before any; at least 0.1 s), at most 0.5 s once warming
    up and 0.25 s once the server is up."""
    known = LoadProgress("loading", 3.14, 5.0)
    assert known.describe() == ("loading the model (phase 2 of 4), 3.1 s so far of about "
                                "5.0 s (its last start)")
    assert known.retry_after() == pytest.approx(1.86)
    assert LoadProgress("loading", 9.0, 5.0).retry_after() == 0.1
    assert LoadProgress("launching", 0.2).retry_after() == pytest.approx(0.8)
    assert LoadProgress("warming_up", 2.0, 60.0).retry_after() == 0.5
    assert LoadProgress("probing", 2.0, 60.0).retry_after() == 0.25
    assert LoadProgress("probing", 2.0).retry_after() == 0.1
    assert LoadProgress("launching", 0.0).describe() == (
        "launching (phase 1 of 4), 0.0 s so far")


@pytest.mark.parametrize(("gib", "cap"), [(0.0, 300.0), (0.25, 302.5), (4.0, 340.0),
                                          (40.0, 700.0), (500.0, 1800.0)])
def test_the_start_cap_grows_with_the_model_and_is_capped(gib: float, cap: float) -> None:
    """300 s + 10 s per GiB, at most 1800 s (the defaults): the small default models keep
    about today's 300 s; a 40 GiB model gets 700 s."""
    t = Timeouts(start_cap=300.0, start_cap_per_gib=10.0, start_cap_max=1800.0)
    assert t.start_cap_for(int(gib * 2**30)) == pytest.approx(cap)


def test_the_start_cap_never_falls_below_its_base() -> None:
    """A swap's cap (swap.ready_timeout, 90 s) keeps its base with a max below it, and
    with no allowance the cap is the base, as before."""
    assert Timeouts(start_cap=90.0, start_cap_per_gib=10.0,
                    start_cap_max=60.0).start_cap_for(2**30) == 90.0
    assert Timeouts(start_cap=300.0, start_cap_per_gib=0.0).start_cap_for(
        40 * 2**30) == 300.0
    assert Timeouts().start_cap_for(40 * 2**30) == 700.0  # the defaults


class FeedingLauncher:
    """A launcher that reports the lines the test gives it to the start's watch, and
    never finishes (the test stops the supervisor)."""

    def __init__(self) -> None:
        self.lines: asyncio.Queue[str] = asyncio.Queue()
        self.fed = asyncio.Event()

    async def launch(self, on_stage: StageSink | None = None) -> object:
        watch = loading.current()
        assert watch is not None
        while True:
            watch.line(await self.lines.get())
            self.fed.set()


async def test_a_starting_supervisor_reports_its_progress_to_waiting_callers() -> None:
    """While starting: load_progress() gives the phase and the seconds on the injected
    clock; a caller asking for the client gets ChildNotReadyError naming the phase, with
    the phase's retry hint; once stopped, no progress."""
    clock = ManualClock()
    launcher = FeedingLauncher()
    sup = Supervisor("generation", launcher, clock=clock)  # type: ignore[arg-type]
    sup.start()
    await sup.wait_for(State.STARTING, timeout=patience(5))
    await asyncio.sleep(0)
    progress = sup.load_progress()
    assert progress is not None and progress.phase == "launching"
    launcher.lines.put_nowait("0.00.012 I srv    load_model: loading model 'm.gguf'")
    await asyncio.wait_for(launcher.fed.wait(), patience(5))
    await clock.advance(2.5)
    with pytest.raises(ChildNotReadyError) as info:
        _ = sup.client
    error = info.value
    assert error.progress == "loading the model (phase 2 of 4), 2.5 s so far"
    assert str(error) == ("generation child is not running (state: starting; loading the "
                          "model (phase 2 of 4), 2.5 s so far)")
    assert error.retry_after == pytest.approx(0.1)  # 1 s expected before any start
    launcher.fed.clear()
    launcher.lines.put_nowait("0.01.304 I srv  llama_server: model loaded")
    await asyncio.wait_for(launcher.fed.wait(), patience(5))
    assert sup.retry_after() == pytest.approx(0.1)
    await sup.stop()
    assert sup.load_progress() is None
