"""A daemon with the HTTP API on a free loopback port, bearer tokens required, whose
generation model ``smol`` (SmolLM2-135M) runs with llamad's chatml-tools template (its
template renders tools) and whose ``gemma`` (gemma-3-270m, its usual template, which
renders none) loads on demand: for the tests of the other APIs' shapes over HTTP."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterable, AsyncIterator
from pathlib import Path
from typing import Any

from daemon import Daemon
from tests.conftest import DEFAULT_MODEL, SMALL_MODEL, models_dir
from tests.support.child_http import generation_idle
from tests.support.daemon import catalog_env, serving

SMOL = "smol"
GEMMA = "gemma"
READ = "read-token-0123456789abcdef"
# "<", "tool", "_", "call", ">" of SmolLM2's vocabulary: at temperature 0 the model opens
# a call to the one tool offered (tests/integration/test_http_tools.py).
OPEN_A_CALL = {"44": 6, "19324": 6, "79": 4, "4350": 6, "46": 4}
NO_REPEAT_GUARD = {"repeat_penalty": 1.0, "dry_multiplier": 0, "frequency_penalty": 0}


def tools_env(folder: Path, **extra: str) -> dict[str, str]:
    """The configuration (a file and environment, ``extra`` added) of a daemon whose
    generation model ``smol`` has the chatml-tools template and whose ``gemma`` loads on
    demand, the HTTP API on a free loopback port, one generation slot, no embedding; its
    files under ``folder``."""
    return catalog_env(
        folder,
        f'[generation]\nmodel = "{SMOL}"\n\n'
        f'[models.{SMOL}]\nmodel = "{models_dir() / SMALL_MODEL}"\n'
        'chat_template = "chatml-tools"\n\n'
        f'[models.{GEMMA}]\nmodel = "{models_dir() / DEFAULT_MODEL}"\n',
        LLAMAD_HTTP_LISTEN="127.0.0.1:0", LLAMAD_GENERATION_PARALLEL="1", **extra)


@contextlib.asynccontextmanager
async def tools_daemon(folder: Path) -> AsyncIterator[Daemon]:
    """The daemon of :func:`tools_env` with a read token required and the children serving
    /slots, started and serving generation."""
    tokens = folder / "tokens"
    tokens.write_text(f"read {READ}\n")
    tokens.chmod(0o600)
    env = tools_env(folder, LLAMAD_STATE_DIR=str(folder), LLAMAD_AUTH_TOKEN_FILE=str(tokens),
                    LLAMAD_CHILD_SLOTS="true")
    async with serving(env, "generation") as (daemon, _):
        yield daemon


async def read_deltas(stream: AsyncIterable[Any], delta_type: str, deltas: int = 5) -> None:
    """Read an SDK's event stream until ``deltas`` events of type ``delta_type`` came, and
    no further (the caller then leaves the stream)."""
    seen = 0
    async for event in stream:
        seen += event.type == delta_type
        if seen == deltas:
            return


async def generation_stops(daemon: Daemon) -> bool:
    """Whether ``daemon``'s generation child is idle within 10 s (a stream a client left
    stops its generation)."""
    sup = daemon.children["generation"].supervisor
    return await generation_idle(sup.socket, sup.pid, timeout=10)
