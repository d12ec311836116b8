"""Composition of one role (generation or embedding) from configuration.

A :class:`ManagedChild` bundles what the daemon keeps per role: its inference mode (a
supervised child, an external endpoint, or disabled), the supervisor (which runs the
child — or watches the endpoint — through a launcher), its log ring, the launch spec and
runtime of the embedded child, and facts about the model file (GGUF metadata and SHA-256,
computed once per file version, off the event loop). Every role has one, whatever its
mode, so a mode can be switched live (:mod:`daemon.modes`).
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
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from supervisor import (
    Clock,
    EndpointClient,
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
    SwapRecord,
    SystemClock,
    Timeouts,
    choose_chat_template,
    pick_runtime,
    read_gguf_info,
    sha256_file,
)

from .admission import Admission
from .backend import ChildBackend, DisabledBackend, EndpointBackend, InferenceBackend
from .config import ChildConfig, Config
from .errors import FailedPrecondition
from .inference_mode import InferenceMode, Mode
from .logs import ChildLogForwarder

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
        template = choose_chat_template(facts.info).name or None
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
        spin_count=cc.spin_count,
    )
    return Setup(spec, runtime, facts)


class NoLauncher:
    """The launcher of a role with nothing to launch yet (disabled, no model configured)."""

    def __init__(self, role: str) -> None:
        self.role = role

    async def launch(self, on_stage: StageSink | None = None) -> LiveChild:
        raise StartFailure(ExitCause("spawn_error", True,
                                     f"the {self.role} role has no model or endpoint configured"))


@dataclass
class ManagedChild:
    """Everything the daemon keeps for one role."""

    role: str
    config: ChildConfig
    current: Setup | None
    """The embedded child's setup (None while no model was ever configured)."""
    ring: LogRing
    supervisor: Supervisor
    launcher_factory: Callable[[Setup], ProcessLauncher]
    """Makes the launcher for a setup; swaps get the swap readiness deadline."""
    endpoint_factory: Callable[[EndpointSpec], EndpointLauncher]
    """Makes the launcher of an endpoint, with the swap readiness deadline."""
    admission: Admission
    mode: Mode = field(default_factory=lambda: Mode(InferenceMode.EMBEDDED))
    previous: Setup | None = None
    last_swap: SwapRecord | None = None
    last_error: str = ""
    """The latest failure: a child's exit, an endpoint's, or a failed swap or switch."""
    switching: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held by a swap or a mode switch: they never interleave."""

    @property
    def setup(self) -> Setup:
        """The embedded child's setup.

        Raises:
            FailedPrecondition: no model has been configured for this role.
        """
        if self.current is None:
            raise FailedPrecondition(
                f"no {self.role} model is configured: set {self.role}.model, or give "
                "model_path")
        return self.current

    @property
    def spec(self) -> LaunchSpec:
        return self.setup.spec

    @property
    def runtime(self) -> Runtime:
        return self.setup.runtime

    @property
    def model(self) -> ModelFacts:
        return self.setup.model

    @property
    def serving_pid(self) -> int:
        """The child process serving now (0: none, or an endpoint)."""
        return self.supervisor.pid

    def backend(self) -> InferenceBackend:
        """What serves the role now: the one place a mode becomes an implementation.

        Raises:
            supervisor.ChildNotReadyError: the child or endpoint is not ready.
        """
        if self.mode.kind is InferenceMode.DISABLED:
            return DisabledBackend(self.role)
        client = self.supervisor.client
        if isinstance(client, EndpointClient):
            return EndpointBackend(client)
        return ChildBackend(client, self.current)

    async def hash_model(self) -> None:
        """Compute the model's SHA-256 in a thread (for Status); never raises."""
        if self.current is None:
            return
        with contextlib.suppress(OSError):
            await asyncio.get_running_loop().run_in_executor(
                _HASHER, _niced(self.current.model.hash_if_changed))


def build_child(config: Config, role: str, *, clock: Clock | None = None) -> ManagedChild:
    """Build (not start) the role: its supervisor set up for the configured mode.

    Raises:
        FileNotFoundError: embedded mode with runtime "llama-server", and none was found.
    """
    clock = clock or SystemClock()
    cc = config.child(role)
    setup: Setup | None = None
    if cc.model:
        try:
            runtime = pick_runtime(cc.runtime, config.llama_bin or None)
        except FileNotFoundError:
            if cc.mode is InferenceMode.EMBEDDED:
                raise
        else:
            setup = make_setup(role, cc.model, runtime, cc)
    ring = LogRing(config.log_lines)
    sink = ChildLogForwarder(role)

    def launcher_for(s: Setup, timeouts: Timeouts = config.timeouts) -> ProcessLauncher:
        return ProcessLauncher(
            s.spec, s.runtime, clock=clock, ring=ring, timeouts=timeouts,
            sink=sink, read_timeout=config.request_timeout,
        )

    def endpoint_for(spec: EndpointSpec, timeouts: Timeouts = config.timeouts) -> EndpointLauncher:
        return EndpointLauncher(spec, embedding=role == "embedding", clock=clock,
                                timeouts=timeouts, read_timeout=config.request_timeout,
                                max_connections=max(8, cc.parallel * 2))

    swap_timeouts = dataclasses.replace(
        config.timeouts,
        start=min(config.timeouts.start, config.swap_ready_timeout),
        start_cap=config.swap_ready_timeout,
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
    admission = Admission(role, slots_for(mode, setup, cc), config.limits.queue_size,
                          ahead=ahead_for(mode, setup, cc))
    return ManagedChild(role, cc, setup, ring, sup,
                        functools.partial(launcher_for, timeouts=swap_timeouts),
                        functools.partial(endpoint_for, timeouts=swap_timeouts),
                        admission, mode=mode)


def slots_for(mode: Mode, setup: Setup | None, cc: ChildConfig) -> int:
    """Calls served at once: the child's slots, or ``parallel`` for an endpoint."""
    if mode.kind is InferenceMode.EMBEDDED and setup is not None:
        return setup.runtime.max_concurrency(setup.spec)
    return max(1, cc.parallel)


def ahead_for(mode: Mode, setup: Setup | None, cc: ChildConfig) -> int:
    """Calls sent beyond the slots, to wait in the child's own queue: ``queue_ahead`` for
    a launched child whose runtime queues requests (llama-server); none otherwise (the
    bundled runtime serves one request at a time; of an endpoint llamad knows only
    ``parallel``)."""
    if mode.kind is InferenceMode.EMBEDDED and setup is not None and setup.runtime.queues_requests:
        return cc.queue_ahead
    return 0
