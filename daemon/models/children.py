"""Composition of one role (generation or embedding) from configuration.

:func:`build_child` makes the role's :class:`~daemon.models.model.Model` — the one object that
owns what the daemon keeps per role: its inference mode (a supervised child, an external
endpoint, or disabled), the supervisor (which runs the child — or watches the endpoint —
through a launcher), its log ring, and the embedded child's :class:`Setup`: launch spec,
runtime and facts about the model file (GGUF metadata and SHA-256, computed once per file
version, off the event loop). Every role has one, whatever its mode, so a mode can be
switched live (:mod:`daemon.models.modes`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import functools
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from supervisor import (
    Clock,
    EndpointLauncher,
    EndpointSpec,
    ExitCause,
    GGUFInfo,
    InvalidModelError,
    Launcher,
    LaunchSpec,
    LiveChild,
    LogRing,
    ProcessLauncher,
    Runtime,
    StageSink,
    StartFailure,
    Supervisor,
    SystemClock,
    Timeouts,
    choose_chat_template,
    pick_runtime,
    read_gguf_info,
    sha256_file,
)

from ..config import ChildConfig, Config, Role
from ..config.inference_mode import InferenceMode, Mode
from ..config.role import background_instance_wanted
from ..telemetry.logs import ChildLogForwarder
from .admission import Admission
from .lane_instance import LaneInstance
from .lanes import policy_from
from .model import Model, ahead_for, handover_settings, slots_for

_log = structlog.get_logger("llamad.children")

# Model hashes by (path, size, mtime): a swap back to a file already hashed costs nothing.
_HASHES: dict[tuple[str, int, int], str] = {}
# One thread, niced, for hashing: a 250 MB model is half a second of a core, taken right
# after a swap, when the new child is serving; it gets what the child leaves.
_HASHER = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="llamad-hash")


def _niced(fn: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        with contextlib.suppress(OSError):  # raising one's own nice value is always allowed
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        fn()
    return run


@dataclass
class ModelFacts:
    """What is known about the configured model file."""

    path: Path
    info: GGUFInfo | None = None
    sha256: str = ""

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
        key = (str(self.path), st.st_size, st.st_mtime_ns)
        if key not in _HASHES:
            _HASHES[key] = sha256_file(self.path)
        self.sha256 = _HASHES[key]

    async def hash_in_background(self) -> None:
        """:meth:`hash_if_changed` in the one niced hashing thread; never raises."""
        with contextlib.suppress(OSError):
            await asyncio.get_running_loop().run_in_executor(
                _HASHER, _niced(self.hash_if_changed))


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
    if role == Role.GENERATION and cc.chat_template not in ("", "auto"):
        template = cc.chat_template  # the model's setting, whatever its GGUF carries
    elif role == Role.GENERATION and facts.info is not None:
        template = choose_chat_template(facts.info).name or None
    spec = LaunchSpec(
        role=role,
        model=path,
        embedding=role == Role.EMBEDDING,
        ctx_size=cc.ctx_size if ctx_size is None else ctx_size,
        threads=cc.threads,
        parallel=cc.parallel,
        batch=cc.batch,
        cache_ram_mib=cc.cache_ram,
        chat_template=template,
        extra_args=cc.extra_argv if extra_args is None else extra_args,
        spin_count=cc.spin_count,
        env=cc.env,
    )
    return Setup(spec, runtime, facts)


class NoLauncher:
    """The launcher of a role with nothing to launch yet (disabled, no model configured)."""

    def __init__(self, role: str) -> None:
        self.role = role

    async def launch(self, on_stage: StageSink | None = None) -> LiveChild:
        raise StartFailure(ExitCause("spawn_error", True,
                                     f"the {self.role} role has no model or endpoint configured"))


def build_child(config: Config, role: str, *, clock: Clock | None = None,
                child: ChildConfig | None = None) -> Model:
    """Build (not start) the role: its supervisor set up for the configured mode; with
    ``child``, a model of the role run with those settings (a catalog model of the pool).

    Raises:
        FileNotFoundError: embedded mode with runtime "llama-server", and none was found.
    """
    clock = clock or SystemClock()
    cc = child or config.child(role)
    settings = config.settings
    setup: Setup | None = None
    if cc.model:
        try:
            runtime = pick_runtime(cc.runtime, settings.llama_bin or None,
                                   slots=settings.child.slots)
        except FileNotFoundError:
            if cc.mode is InferenceMode.EMBEDDED:
                raise
        else:
            setup = make_setup(role, cc.model, runtime, cc)
    ring = LogRing(settings.child.log_lines)
    sink = ChildLogForwarder(role)

    def launcher_for(s: Setup, timeouts: Timeouts = config.timeouts) -> ProcessLauncher:
        return ProcessLauncher(
            s.spec, s.runtime, clock=clock, ring=ring, timeouts=timeouts,
            sink=sink, read_timeout=settings.child.request_timeout,
            max_connections=settings.child.max_connections,
            max_idle=settings.child.max_idle_connections,
            stream_interval=settings.child.stream_interval / 1000,
            stream_interval_max=settings.child.stream_interval_max / 1000,
        )

    def endpoint_for(spec: EndpointSpec, timeouts: Timeouts = config.timeouts) -> EndpointLauncher:
        return EndpointLauncher(spec, embedding=role == Role.EMBEDDING, clock=clock,
                                timeouts=timeouts, read_timeout=settings.child.request_timeout,
                                max_connections=max(8, cc.parallel * 2))

    swap_timeouts = dataclasses.replace(
        config.timeouts,
        start=min(config.timeouts.start, settings.swap.ready_timeout),
        start_cap=settings.swap.ready_timeout,
    )
    mode = Mode(cc.mode, cc.endpoint() if cc.mode is InferenceMode.ENDPOINT else None)
    launcher: Launcher
    validate = None
    if mode.kind is InferenceMode.ENDPOINT and mode.endpoint is not None:
        launcher = endpoint_for(mode.endpoint)
    elif setup is not None:
        launcher, validate = launcher_for(setup), setup.model.validate
    else:
        launcher = NoLauncher(role)
    sup = Supervisor(role, launcher, validate=validate, policy=config.policy, clock=clock)
    admission = Admission(role, slots_for(mode, setup, cc), settings.limits.queue_size,
                          ahead=ahead_for(mode, setup, cc),
                          lanes=policy_from(settings.limits))
    model = Model(role, cc, setup, ring, sup,
                  launchers=functools.partial(launcher_for, timeouts=swap_timeouts),
                  endpoints=functools.partial(endpoint_for, timeouts=swap_timeouts),
                  admission=admission, mode=mode, clock=clock,
                  handover=handover_settings(settings.swap.drain_timeout,
                                             settings.swap.handover_hold,
                                             settings.swap.launch_nice))
    if background_instance_wanted(cc.background_instance, role):
        limits = settings.limits
        model.lane_instance = LaneInstance(
            model, role, nice=limits.background_instance_nice,
            threads=limits.background_instance_threads,
            idle=limits.background_instance_ttl, lanes=admission.lanes, clock=clock,
            drain_timeout=settings.swap.drain_timeout)
    return model


ManagedChild = Model
"""The old name of :class:`~daemon.models.model.Model`, for the modules that still use it."""
