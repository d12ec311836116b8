"""A model's background instance with a real daemon and real embedding children (issue 28):
batch and background calls go to a second child of the model started at a lower CPU
priority, interactive calls never do; it is niced (its /proc stat says so), its memory is
counted by the pool's budget (a budget too small for both refuses the instance, not the
model), its absence never fails a call (the main child serves the lower lanes then), and
it stops once the lower lanes were idle. Nothing here depends on how fast a model embeds."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from daemon import Daemon
from daemon.config import load
from daemon.models import memory
from daemon.models.lane_instance import LaneInstance, instance_threads
from daemon.models.model import Model
from daemon.services.retrieval_bridge import make_provider
from llamad_protocol.v1 import control_pb2, control_pb2_grpc, inference_pb2_grpc
from llamad_protocol.v1 import inference_pb2 as ipb
from supervisor import State
from tests.support.daemon import Clients, config_env, make_daemon

pytestmark = pytest.mark.integration

BATCH = (("x-llamad-lane", "batch"),)
TEXTS = [f"note {i}: the disk on the web server filled up with logs" for i in range(8)]
MIB = 1024 * 1024


def env(tmp_path: Path, **more: str) -> dict[str, str]:
    return config_env("llama-server", LLAMAD_STATE_DIR=str(tmp_path / "state"),
                      LLAMAD_GENERATION_ENABLED="false", **more)


def nice_of(pid: int) -> int:
    """The nice value of ``pid`` (field 19 of /proc/PID/stat)."""
    stat = Path(f"/proc/{pid}/stat").read_bytes()
    return int(stat[stat.rfind(b")") + 2:].split()[16])


def threads_of(pid: int) -> int:
    """The ``--threads`` llama-server ``pid`` was started with."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    return int(argv[argv.index("--threads") + 1])


async def wait_for(check: Callable[[], object], what: str, seconds: float = 90) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


def exit_counts(daemon: Daemon, family: str, model: str) -> dict[str, float]:
    """``family``'s samples for ``model`` by their ``kind`` label, from the scrape."""
    counts = {}
    for line in daemon.metrics.render().decode().splitlines():
        if line.startswith(family + "{") and f'model="{model}"' in line:
            labels, value = line.rsplit(" ", 1)
            kind = labels.split('kind="', 1)[1].split('"', 1)[0]
            counts[kind] = float(value)
    return counts


class Served:
    """Calls each child completed since this was made (the admissions' own counts)."""

    def __init__(self, model: Model, instance: LaneInstance) -> None:
        self.model, self.instance = model, instance
        self.main0 = model.admission.served_by(model.serving_pid)
        self.lower0 = instance.admission.served_by(instance.serving_pid)

    def counts(self) -> tuple[int, int]:
        """(by the main child, by the instance) since."""
        return (self.model.admission.served_by(self.model.serving_pid) - self.main0,
                self.instance.admission.served_by(self.instance.serving_pid) - self.lower0)


async def start(tmp_path: Path, *, reload_from: dict[str, str] | None = None, **more: str
                ) -> tuple[Daemon, Clients, Model, LaneInstance]:
    """A started daemon of :func:`env` and ``more``; with ``reload_from``, a reload reads
    its environment from that dict (filled here: the test changes it, then reloads)."""
    if reload_from is None:
        daemon = make_daemon(env(tmp_path, **more))
    else:
        reload_from.update(env(tmp_path, **more))
        daemon = Daemon(load(None, env=reload_from), reload=lambda: load(None, env=reload_from))
    c = Clients(await daemon.start())
    await c.wait_serving("")
    model = daemon.children["embedding"]
    instance = model.lane_instance
    assert instance is not None  # on by default for an embedding model
    return daemon, c, model, instance


async def test_lower_lanes_go_to_a_niced_instance_and_interactive_calls_never_do(
        tmp_path: Path, llama_server: str) -> None:
    daemon, c, model, instance = await start(tmp_path)
    try:
        stub = inference_pb2_grpc.InferenceServiceStub(c.channel)
        assert instance.supervisor is None and instance.status == "off"  # lazily started
        await stub.Embed(ipb.EmbedRequest(texts=TEXTS[:2]))  # interactive: starts nothing
        assert instance.supervisor is None
        # The first batch call starts it, and is served by the main child meanwhile.
        first = Served(model, instance)
        await stub.Embed(ipb.EmbedRequest(texts=TEXTS), metadata=BATCH)
        assert first.counts()[0] == 1
        await wait_for(lambda: instance.running, "the background instance running")
        pid, main = instance.serving_pid, model.serving_pid
        assert pid and pid != main
        assert nice_of(pid) == min(19, nice_of(main) + 10)  # limits.background_instance_nice
        # limits.background_instance_threads 0: half the cores, at most the model's.
        assert threads_of(main) == model.setup.spec.threads
        assert threads_of(pid) == instance_threads(model.setup.spec.threads, 0)

        served = Served(model, instance)
        for _ in range(3):
            resp = await stub.Embed(ipb.EmbedRequest(texts=TEXTS), metadata=BATCH)
            assert len(resp.embeddings) == len(TEXTS)
        assert served.counts() == (0, 3)
        for _ in range(3):
            await stub.Embed(ipb.EmbedRequest(texts=TEXTS[:1]))
        assert served.counts() == (3, 3)
        # The retriever's own embeddings (ingest, backfill) are background: the instance.
        embedder = make_provider(daemon.router, daemon.children)()
        assert embedder is not None
        vectors = await embedder.embed(TEXTS)
        assert len(vectors) == len(TEXTS)
        assert served.counts() == (3, 4)

        # Its memory is counted beside the main child's; Status says it runs, niced.
        name = daemon.pool.catalog.defaults["embedding"]
        held = {r.name: r.memory for r in daemon.pool._residents("")}
        assert held[name] == 2 * memory.memory_needed(model.setup)
        view = daemon.pool.view(name)
        assert view.lane_instance == f"running pid {pid} nice +10"
        series = f'llamad_lane_instance_state{{model="{name}",role="embedding",state="running"}}'
        assert f"{series} 1.0" in daemon.metrics.render().decode()
    finally:
        await c.close()
        await daemon.shutdown()
    assert not Path(f"/proc/{pid}").exists()  # stopped and reaped with the daemon


async def test_while_the_instance_is_down_lower_lanes_complete_on_the_main_child(
        tmp_path: Path, llama_server: str) -> None:
    daemon, c, model, instance = await start(tmp_path)
    try:
        stub = inference_pb2_grpc.InferenceServiceStub(c.channel)
        await stub.Embed(ipb.EmbedRequest(texts=TEXTS), metadata=BATCH)
        await wait_for(lambda: instance.running, "the background instance running")
        sup = instance.supervisor
        assert sup is not None
        name = daemon.pool.catalog.defaults["embedding"]
        exits_before = exit_counts(daemon, "llamad_child_exits_total", name)
        os.kill(instance.serving_pid, signal.SIGKILL)
        await wait_for(lambda: sup.state is not State.RUNNING, "the instance seen down", 30)
        # Counted as the instance's exit, classified; not as the model's own child's.
        assert sum(exit_counts(daemon, "llamad_lane_instance_exits_total", name).values()) == 1
        assert exit_counts(daemon, "llamad_child_exits_total", name) == exits_before
        served = Served(model, instance)
        resp = await stub.Embed(ipb.EmbedRequest(texts=TEXTS), metadata=BATCH)
        assert len(resp.embeddings) == len(TEXTS)
        assert served.counts()[0] == 1  # the main child served it
        # Supervised like any child: it comes back, and takes the lower lanes again.
        await wait_for(lambda: instance.running, "the instance restarted")
        assert sup.restarts >= 1
        served = Served(model, instance)
        await stub.Embed(ipb.EmbedRequest(texts=TEXTS), metadata=BATCH)
        assert served.counts() == (0, 1)
    finally:
        await c.close()
        await daemon.shutdown()


async def test_a_budget_too_small_for_both_refuses_the_instance_not_the_model(
        tmp_path: Path, llama_server: str) -> None:
    probe = make_daemon(env(tmp_path))
    need = memory.memory_needed(probe.children["embedding"].setup)
    budget = need * 3 // 2 // MIB  # the model fits, the model and its instance do not
    daemon, c, model, instance = await start(
        tmp_path, LLAMAD_MODELS_MEMORY_BUDGET_MB=str(budget))
    try:
        stub = inference_pb2_grpc.InferenceServiceStub(c.channel)
        served = Served(model, instance)
        for _ in range(2):
            resp = await stub.Embed(ipb.EmbedRequest(texts=TEXTS), metadata=BATCH)
            assert len(resp.embeddings) == len(TEXTS)
        assert served.counts()[0] == 2
        assert instance.supervisor is None
        assert instance.status.startswith("refused: ")
        assert f"budget ({budget} MiB)" in instance.status
        name = daemon.pool.catalog.defaults["embedding"]
        assert daemon.pool.view(name).state == "ready"
        listed = await control_pb2_grpc.ControlServiceStub(c.channel).ListModels(
            control_pb2.ListModelsRequest())
        assert [m.lane_instance for m in listed.models if m.name == name] == [instance.status]
    finally:
        await c.close()
        await daemon.shutdown()


async def test_the_instance_stops_after_the_lower_lanes_were_idle(
        tmp_path: Path, llama_server: str) -> None:
    """Stopped once idle for its ttl; started again by the next lower-lane call, with the
    nice value and threads a reload gave meanwhile."""
    settings: dict[str, str] = {}
    daemon, c, model, instance = await start(
        tmp_path, reload_from=settings, LLAMAD_LIMITS_BACKGROUND_INSTANCE_TTL="1",
        LLAMAD_MODELS_TTL_CHECK_INTERVAL="0.2")
    try:
        stub = inference_pb2_grpc.InferenceServiceStub(c.channel)
        await stub.Embed(ipb.EmbedRequest(texts=TEXTS), metadata=BATCH)
        await wait_for(lambda: instance.running, "the background instance running")
        pid = instance.serving_pid
        await wait_for(lambda: instance.supervisor is None, "the idle instance stopped", 30)
        assert not Path(f"/proc/{pid}").exists()
        assert instance.status == "off"
        assert model.serving_pid  # the model itself serves on
        settings.update({"LLAMAD_LIMITS_BACKGROUND_INSTANCE_NICE": "5",
                         "LLAMAD_LIMITS_BACKGROUND_INSTANCE_THREADS": "3",
                         "LLAMAD_LIMITS_BACKGROUND_INSTANCE_TTL": "60",
                         "LLAMAD_LIMITS_SWITCH_INTERVAL_MS": "2"})
        report = await daemon.reload()
        assert report.error == "" and report.changes[
            "limits.background_instance_threads"] == "applied"
        assert sys.getswitchinterval() == pytest.approx(0.002)  # limits.switch_interval_ms
        # The next lower-lane call starts it again (served by the main child meanwhile),
        # with the reload's nice value and threads.
        resp = await stub.Embed(ipb.EmbedRequest(texts=TEXTS), metadata=BATCH)
        assert len(resp.embeddings) == len(TEXTS)
        await wait_for(lambda: instance.running, "the background instance started again")
        pid, main = instance.serving_pid, model.serving_pid
        assert nice_of(pid) == min(19, nice_of(main) + 5) and threads_of(pid) == 3
        assert instance.idle == 60
    finally:
        await c.close()
        await daemon.shutdown()
