"""Composition of one supervised child from configuration.

A :class:`ManagedChild` bundles what the daemon keeps per role: the supervisor, its log
ring, the launch spec and runtime, and facts about the model file (GGUF metadata and
SHA-256, computed once per file version, off the event loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from supervisor import (
    Clock,
    GGUFInfo,
    InvalidModelError,
    LaunchSpec,
    LogRing,
    ProcessLauncher,
    Runtime,
    Supervisor,
    SwapRecord,
    SystemClock,
    Timeouts,
    fallback_chat_template,
    pick_runtime,
    read_gguf_info,
    sha256_file,
)

from .admission import Admission
from .config import ChildConfig, Config
from .logs import ChildLogForwarder

_log = structlog.get_logger("llamad.children")


@dataclass
class ModelFacts:
    """What is known about the configured model file."""

    path: Path
    info: GGUFInfo | None = None
    sha256: str = ""
    _hashed: tuple[int, int] | None = field(default=None, repr=False)

    def validate(self) -> None:
        """Read and check the GGUF header (raises InvalidModelError). Thread-safe enough:
        it only replaces attributes."""
        self.info = read_gguf_info(self.path)

    def hash_if_changed(self) -> None:
        """(Re)compute the SHA-256 when the file's size or mtime changed."""
        try:
            st = os.stat(self.path)
        except OSError:
            return
        key = (st.st_size, st.st_mtime_ns)
        if key != self._hashed:
            self.sha256 = sha256_file(self.path)
            self._hashed = key


@dataclass(frozen=True)
class Setup:
    """One configuration of a child — what a swap replaces, all at once."""

    spec: LaunchSpec
    runtime: Runtime
    model: ModelFacts


def make_setup(
    role: str,
    model: str | Path,
    runtime: Runtime,
    cc: ChildConfig,
    *,
    ctx_size: int | None = None,
    extra_args: tuple[str, ...] | None = None,
) -> Setup:
    """The launch spec and model facts for ``model`` with ``cc``'s settings.

    Reads the GGUF header when it can (to pick a chat template for files without one); a
    bad file is not an error here: the supervisor validates before every launch.
    """
    path = Path(model).expanduser()
    if not path.is_absolute():
        path = Path.cwd() / path
    facts = ModelFacts(path)
    with contextlib.suppress(InvalidModelError):
        facts.validate()
    template = None
    if role == "generation" and facts.info is not None:
        template = fallback_chat_template(facts.info.architecture, facts.info.has_chat_template)
    spec = LaunchSpec(
        role=role,
        model=path,
        embedding=role == "embedding",
        ctx_size=cc.ctx_size if ctx_size is None else ctx_size,
        threads=cc.threads,
        parallel=cc.parallel,
        batch=cc.batch,
        chat_template=template,
        extra_args=cc.extra_args if extra_args is None else extra_args,
    )
    return Setup(spec, runtime, facts)


@dataclass
class ManagedChild:
    """Everything the daemon keeps for one role."""

    role: str
    config: ChildConfig
    current: Setup
    ring: LogRing
    supervisor: Supervisor
    launcher_factory: Callable[[Setup], ProcessLauncher]
    """Makes the launcher for a setup; swaps get the swap readiness deadline."""
    admission: Admission
    previous: Setup | None = None
    last_swap: SwapRecord | None = None

    @property
    def spec(self) -> LaunchSpec:
        return self.current.spec

    @property
    def runtime(self) -> Runtime:
        return self.current.runtime

    @property
    def model(self) -> ModelFacts:
        return self.current.model

    async def hash_model(self) -> None:
        """Compute the model's SHA-256 in a thread (for Status); never raises."""
        with contextlib.suppress(OSError):
            await asyncio.to_thread(self.model.hash_if_changed)


def build_child(config: Config, role: str, *, clock: Clock | None = None) -> ManagedChild:
    """Build (not start) the supervised child for ``role``.

    Raises:
        FileNotFoundError: runtime "llama-server" was asked for and none was found.
    """
    clock = clock or SystemClock()
    cc = config.child(role)
    runtime = pick_runtime(cc.runtime, config.llama_bin or None)
    setup = make_setup(role, cc.model, runtime, cc)
    ring = LogRing(config.log_lines)
    sink = ChildLogForwarder(role)

    def launcher_for(s: Setup, timeouts: Timeouts = config.timeouts) -> ProcessLauncher:
        return ProcessLauncher(
            s.spec, s.runtime, clock=clock, ring=ring, timeouts=timeouts,
            sink=sink, read_timeout=config.request_timeout,
        )

    swap_timeouts = dataclasses.replace(
        config.timeouts,
        start=min(config.timeouts.start, config.swap_ready_timeout),
        start_cap=config.swap_ready_timeout,
    )
    sup = Supervisor(role, launcher_for(setup), validate=setup.model.validate,
                     policy=config.policy, clock=clock)
    admission = Admission(role, runtime.max_concurrency(setup.spec), config.limits.queue_size)
    return ManagedChild(role, cc, setup, ring, sup,
                        functools.partial(launcher_for, timeouts=swap_timeouts), admission)
