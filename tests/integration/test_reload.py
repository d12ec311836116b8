"""SIGHUP reload with real children: changed child settings go through the swap path."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from daemon import Daemon, load
from llamad_protocol.v1 import control_pb2
from tests.conftest import DEFAULT_MODEL, SMALL_MODEL, model_path
from tests.support.daemon import GEN, Clients, config_env, served

pytestmark = pytest.mark.integration


def write_config(path: Path, model: Path, *, max_tokens: int = 8192, threads: str = "2",
                 ahead: int = 0, spin: int = 300) -> None:
    path.write_text(
        f'[generation]\nmodel = "{model}"\nthreads = {threads}\nqueue_ahead = {ahead}\n'
        f"spin_count = {spin}\n[limits]\nmax_tokens = {max_tokens}\n"
    )


def env_without_models() -> dict[str, str]:
    env = config_env("llama-server", LLAMAD_EMBEDDING_ENABLED="false")
    del env["LLAMAD_GENERATION_MODEL"], env["LLAMAD_GENERATION_THREADS"]
    return env


@contextlib.asynccontextmanager
async def reloadable(file: Path) -> AsyncIterator[tuple[Daemon, Clients]]:
    """A daemon on SmolLM2 whose configuration is ``file`` (re-read on reload and SIGHUP),
    serving."""
    write_config(file, model_path(SMALL_MODEL))
    env = env_without_models()
    daemon = Daemon(load(None, env=env, file=file), reload=lambda: load(None, env=env, file=file))
    async with served(daemon) as c:
        daemon.install_signal_handlers()
        yield daemon, c


async def test_sighup_swaps_to_the_new_model_and_applies_limits(
    tmp_path: Path, llama_server: str
) -> None:
    """Changing the model and a limit in the file, then SIGHUP: swapped, limit applied."""
    file = tmp_path / "llamad.toml"
    async with reloadable(file) as (daemon, c):
        before = await c.child(GEN)
        write_config(file, model_path(DEFAULT_MODEL), max_tokens=1000)
        os.kill(os.getpid(), signal.SIGHUP)
        deadline = time.monotonic() + 60
        # The reload is done once its configuration is in force (after the old child's
        # drain; Status names the new model from the cut-over on, before that).
        while daemon.config.generation.model != str(model_path(DEFAULT_MODEL)):
            assert time.monotonic() < deadline, "no swap after SIGHUP"
            await asyncio.sleep(0.1)
        now = await c.child(GEN)
        assert now.model_path.endswith(DEFAULT_MODEL)
        assert now.last_swap.reason == "reload"
        assert now.pid != before.pid
        assert daemon.config.settings.limits.max_tokens == 1000
        assert daemon.config.generation.model == str(model_path(DEFAULT_MODEL))


async def test_reload_applies_queue_ahead_without_a_new_child_and_spin_count_with_one(
    tmp_path: Path, llama_server: str
) -> None:
    """queue_ahead changes how many calls llamad sends the child, not the child: a reload
    applies it to the running child's admission (same pid, no swap, reported as updated).
    spin_count is the child's environment: a reload swaps to a child started with it."""
    file = tmp_path / "llamad.toml"
    async with reloadable(file) as (daemon, c):
        before = await c.child(GEN)
        admission = daemon.children["generation"].admission
        assert (admission.limit, admission.ahead) == (before.slots, 0)
        write_config(file, model_path(SMALL_MODEL), ahead=3)
        report = await daemon.reload()
        assert (report.swapped, report.updated, report.error) == ([], ["generation"], "")
        now = await c.child(GEN)
        assert (now.pid, now.slots, now.last_swap.reason) == (before.pid, before.slots, "")
        assert (admission.ahead, admission.capacity) == (3, before.slots + 3)
        assert daemon.config.generation.queue_ahead == 3
        write_config(file, model_path(SMALL_MODEL), ahead=3, spin=200)
        report = await daemon.reload()
        assert (report.swapped, report.updated) == (["generation"], [])
        now = await c.child(GEN)
        assert now.pid != before.pid and now.last_swap.reason == "reload"
        setup = daemon.children["generation"].current
        assert setup is not None and setup.spec.spin_count == 200
        assert admission.ahead == 3


async def test_reload_with_bad_model_keeps_old_child(tmp_path: Path, llama_server: str) -> None:
    """A reload whose new child cannot start keeps the old child and configuration."""
    file = tmp_path / "llamad.toml"
    async with reloadable(file) as (daemon, c):
        before = await c.child(GEN)
        bad = tmp_path / "bad.gguf"
        bad.write_bytes(b"not a model")
        write_config(file, bad)
        report = await daemon.reload()
        assert "generation" in report.kept
        assert "bad.gguf" in report.kept["generation"]
        after = await c.child(GEN)
        assert (after.pid, after.model_path) == (before.pid, before.model_path)
        assert after.state == control_pb2.CHILD_STATE_RUNNING
        assert daemon.config.generation.model == str(model_path(SMALL_MODEL))


async def test_invalid_config_reload_changes_nothing(tmp_path: Path, llama_server: str) -> None:
    """A file that no longer validates is refused whole; settings needing a restart are named."""
    file = tmp_path / "llamad.toml"
    async with reloadable(file) as (daemon, _):
        write_config(file, model_path(SMALL_MODEL), threads="-3")
        report = await daemon.reload()
        assert "generation.threads" in report.error
        assert report.swapped == []
        write_config(file, model_path(SMALL_MODEL))
        file.write_text(file.read_text() + "[child]\nlog_lines = 500\n")
        report = await daemon.reload()
        assert report.error == ""
        assert report.restart_needed == ["child.log_lines"]
        assert report.changes == {"child.log_lines": "restart needed"}
        assert daemon.config.settings.child.log_lines == 2000  # the running value is kept
