"""Composition of one supervised child from configuration.

A :class:`ManagedChild` bundles what the daemon keeps per role: the supervisor, its log
ring, the launch spec and runtime, and facts about the model file (GGUF metadata and
SHA-256, computed once per file version, off the event loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
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
    SystemClock,
    fallback_chat_template,
    pick_runtime,
    read_gguf_info,
    sha256_file,
)

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


@dataclass
class ManagedChild:
    role: str
    config: ChildConfig
    runtime: Runtime
    spec: LaunchSpec
    ring: LogRing
    supervisor: Supervisor
    model: ModelFacts

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
    model_path = Path(cc.model).expanduser()
    if not model_path.is_absolute():
        model_path = Path.cwd() / model_path
    facts = ModelFacts(model_path)
    template = None
    if role == "generation":
        with contextlib.suppress(InvalidModelError):
            # A bad file is reported by the supervisor, which validates before each launch.
            facts.validate()
        if facts.info is not None:
            template = fallback_chat_template(facts.info.architecture,
                                              facts.info.has_chat_template)
    spec = LaunchSpec(
        role=role,
        model=model_path,
        embedding=role == "embedding",
        ctx_size=cc.ctx_size,
        threads=cc.threads,
        parallel=cc.parallel,
        batch=cc.batch,
        chat_template=template,
        extra_args=cc.extra_args,
    )
    ring = LogRing(config.log_lines)
    launcher = ProcessLauncher(
        spec, runtime, clock=clock, ring=ring, timeouts=config.timeouts,
        sink=ChildLogForwarder(role), read_timeout=config.request_timeout,
    )
    sup = Supervisor(role, launcher, validate=facts.validate, policy=config.policy, clock=clock)
    return ManagedChild(role, cc, runtime, spec, ring, sup, facts)
