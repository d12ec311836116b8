"""Runtime adapters: how to launch each kind of child, and how to talk to it.

Two runtimes serve the same OpenAI-compatible API:

* :class:`LlamaServerRuntime` — llama.cpp's ``llama-server`` binary, the production
  runtime (parallel slots, ``/health`` answering 503 while loading, ``/tokenize``).
* :class:`BundledRuntime` — ``python -m llama_cpp.server`` from llama-cpp-python, the
  fallback when no binary is present. It has no ``/health`` (``/v1/models`` answers once
  the model is loaded) and serves one request at a time.

An adapter owns its launch arguments and its :class:`ApiShape`; nothing else in the
supervisor knows which runtime it runs.

Every child is private to the daemon: it listens on a UNIX socket in a directory only the
daemon's user can enter (:mod:`supervisor._rundir`), never on a TCP port, and demands a
per-launch API key, which it gets through its environment (``LLAMA_API_KEY``), never its
command line (``ps`` shows argv to every user). llama-server also serves no ``/slots``
(each slot's prompt and parameters) unless the operator asks (``[child] slots``), no web UI,
and no CORS origin a browser page can have. llamad's own arguments come last on the command
line (llama.cpp keeps the last of a repeated flag) and ``extra_args`` may not name them.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import structlog

from ._client import ApiShape
from ._sampling import BUNDLED, LLAMA_CPP
from ._templates import BUNDLED_FORMATS, template_file

DEFAULT_CACHE_RAM_MIB = 256
"""llama-server's host-RAM prompt cache per child, MiB, unless configured (its own default
is 8192: up to 8 GiB per child beyond weights and KV cache)."""


def prompt_cache_bytes(spec: LaunchSpec, runtime_name: str) -> int:
    """Host RAM a child of ``spec`` may fill with its prompt cache: ``--cache-ram``, which
    only llama-server has (the bundled runtime keeps no prompt cache unless asked)."""
    return max(0, spec.cache_ram_mib) * 1024 * 1024 if runtime_name == "llama-server" else 0


@dataclass(frozen=True)
class LaunchSpec:
    """What to run, independent of the runtime.

    Attributes:
        role: "generation" or "embedding".
        model: path of the GGUF file.
        embedding: serve embeddings instead of completions.
        ctx_size: context size in tokens (0: the model's own training context).
        threads: CPU threads for generation and batch processing.
        parallel: concurrent request slots (llama-server only).
        batch: logical batch size; for embeddings it must hold a whole input.
        chat_template: a known chat template's name (``"gemma"``, ``"chatml"``) to use
            because the GGUF carries none (see :mod:`supervisor._templates`); None uses
            the model's own.
        extra_args: added to the runtime's command line, before llamad's own arguments
            (listener, key, alias, exposure), which they may not name (ValueError).
        spin_count: GOMP_SPINCOUNT for the child (-1: the environment's). llama.cpp's CPU
            threads are an OpenMP team that meets at a barrier after every operation,
            hundreds of times per token; libgomp's default spins there for long, so
            when anything else wants the same cores (the other child, a swap's incoming
            child, the daemon) a spinning thread holds a core its partner needs.
            Measured on 2 cores: two SmolLM2 children serving 2 requests each took
            5.7-195 s per round by default, 2.1 s at 300, 4.0 s at 3000; a lone
            generation child 0.96 s by default, 1.00 s at 300; a lone all-MiniLM child
            embedding 16 texts a call 106 texts/s by default, 84 at 300, 107 at 3000.
            (Sleeping at once, OMP_WAIT_POLICY=PASSIVE, cost a lone child 2.7x.)
        env: environment variables of the child beyond the daemon's (a catalog
            model's ``env``, e.g. ``CUDA_VISIBLE_DEVICES``); they win over spin_count.
        cache_ram_mib: host RAM llama-server may keep for its prompt cache, MiB (passed
            as ``--cache-ram``; 0 disables it). llama-server's own default is 8192 per
            child, which no memory estimate saw.
    """

    role: str
    model: Path
    embedding: bool = False
    ctx_size: int = 0
    threads: int = 2
    parallel: int = 1
    batch: int = 512
    chat_template: str | None = None
    extra_args: tuple[str, ...] = ()
    spin_count: int = -1
    env: tuple[tuple[str, str], ...] = ()
    cache_ram_mib: int = DEFAULT_CACHE_RAM_MIB


class Runtime(Protocol):
    """A kind of child process that serves the OpenAI-compatible API."""

    @property
    def name(self) -> str:
        """Shown in Status: "llama-server" or "llama-cpp-python"."""
        ...

    @property
    def api(self) -> ApiShape:
        """Where its non-standard endpoints are."""
        ...

    def command(self, spec: LaunchSpec, *, socket: Path, alias: str) -> list[str]:
        """The argv that starts this runtime listening on the UNIX socket ``socket``,
        reporting ``alias`` as its model id.

        Raises:
            ValueError: ``spec.extra_args`` names one of llamad's own arguments.
        """
        ...

    def environment(self, base: Mapping[str, str], key: str) -> dict[str, str]:
        """The child's environment: ``base`` with the API key ``key`` set and whatever
        would loosen its listener or its key taken out."""
        ...

    def max_concurrency(self, spec: LaunchSpec) -> int:
        """How many requests the child serves at once."""
        ...

    @property
    def queues_requests(self) -> bool:
        """Whether requests beyond those it serves wait in the child's own queue, so
        that a caller may send some ahead (llama-server's slots do)."""
        ...


LLAMA_SERVER_API = ApiShape(
    health_path="/health",
    tokenize_path="/tokenize",
    tokenize_field="content",
    tokenize_special_field="add_special",
    embed_base64=True,
    dialect=LLAMA_CPP,
)
BUNDLED_API = ApiShape(
    health_path=None,
    tokenize_path="/extras/tokenize",
    tokenize_field="input",
    tokenize_special_field=None,
    detokenize_path="/extras/detokenize",
    detokenize_field="text",
    apply_template_path=None,
    dialect=BUNDLED,
)


KEY_ENV = "LLAMA_API_KEY"
"""The environment variable a child takes its API key from (llama-server's ``--api-key``;
llamad's launcher of the bundled runtime reads the same)."""

# llama-server's flags that set its listener, its keys or what it shows, with their
# environment variables: llamad sets these itself (see the module docstring). llama.cpp
# reads "--a_b" as "--a-b".
LLAMA_SERVER_OWNED = {
    "--host": "LLAMA_ARG_HOST", "--port": "LLAMA_ARG_PORT",
    "--reuse-port": "LLAMA_ARG_REUSE_PORT", "-a": "", "--alias": "LLAMA_ARG_ALIAS",
    "--api-key": KEY_ENV, "--api-key-file": "LLAMA_ARG_API_KEY_FILE",
    "--slots": "LLAMA_ARG_ENDPOINT_SLOTS", "--no-slots": "LLAMA_ARG_NO_ENDPOINT_SLOTS",
    "--ui": "LLAMA_ARG_UI", "--webui": "", "--no-ui": "LLAMA_ARG_NO_UI", "--no-webui": "",
    "--cors-origins": "LLAMA_ARG_CORS_ORIGINS", "--cors-methods": "LLAMA_ARG_CORS_METHODS",
    "--cors-headers": "LLAMA_ARG_CORS_HEADERS",
    "--cors-credentials": "LLAMA_ARG_CORS_CREDENTIALS",
    "--no-cors-credentials": "LLAMA_ARG_NO_CORS_CREDENTIALS",
    "--api-prefix": "LLAMA_ARG_API_PREFIX", "--path": "LLAMA_ARG_STATIC_PATH",
    "--ssl-key-file": "LLAMA_ARG_SSL_KEY_FILE", "--ssl-cert-file": "LLAMA_ARG_SSL_CERT_FILE",
    # The prompt cache's bound is counted in the memory estimate: only llamad sets it.
    "-cram": "", "--cache-ram": "LLAMA_ARG_CACHE_RAM",
}
# The bundled server's (llama_cpp.server's settings, and uvicorn's through our launcher).
_BUNDLED_OWNED = {
    "--host": "HOST", "--port": "PORT", "--uds": "", "--api_key": "API_KEY",
    "--model_alias": "", "--ssl_keyfile": "", "--ssl_certfile": "", "--root_path": "",
    "--config_file": "CONFIG_FILE",
}
NO_ORIGIN = "https://llamad.invalid"
"""The one CORS origin a child allows: under ``.invalid`` (RFC 2606), no page has it, so
no browser page may read a child's answers (llama-server's default is every origin)."""


def refuse_owned(extra_args: Sequence[str], owned: Mapping[str, str], runtime: str) -> None:
    """Raise ValueError naming the first of ``extra_args`` that is one of llamad's own
    arguments of ``runtime``."""
    for arg in extra_args:
        flag = arg.split("=", 1)[0]
        if flag.startswith("--") and runtime == "llama-server":
            flag = flag.replace("_", "-")
        if flag in owned:
            raise ValueError(
                f"extra_args: {arg} is set by llamad itself (a child listens only on a "
                "private socket, with a per-launch key; see [child] slots for /slots)")


SYSTEM_CONFIG = Path("/etc/llama.cpp/config.ini")
"""llama.cpp's system-wide configuration: every llama-server reads it before its
environment and arguments (``common_params_apply_system_config``), so it could set what
llamad's checks refuse (``--log-file``, ``--tools``, another key). The user-level one
(``$XDG_CONFIG_HOME/llama.cpp/config.ini``) is kept out by the launcher, which points
``XDG_CONFIG_HOME`` at the child's private directory; this one only the host's root can
write, so it is the operator's, and llamad says at start that it is there."""


@functools.cache
def _warn_system_config() -> None:
    if SYSTEM_CONFIG.exists():
        structlog.get_logger("llamad.supervisor").warning(
            "llama.cpp system configuration present: every llama-server child reads it "
            "before llamad's arguments", path=str(SYSTEM_CONFIG))


def _private_env(base: Mapping[str, str], key: str, owned: Mapping[str, str]
                 ) -> dict[str, str]:
    drop = {name for name in owned.values() if name}
    env = {name: value for name, value in base.items() if name not in drop}
    env[KEY_ENV] = key
    return env


@dataclass(frozen=True)
class LlamaServerRuntime:
    """llama.cpp's ``llama-server`` binary.

    Attributes:
        slots: serve ``/slots`` (each slot's prompt and parameters; still only to holders
            of the key, on the private socket): ``[child] slots``, for debugging.
    """

    binary: str
    slots: bool = False
    name: str = "llama-server"
    api: ApiShape = field(default=LLAMA_SERVER_API)
    queues_requests: bool = True

    def command(self, spec: LaunchSpec, *, socket: Path, alias: str) -> list[str]:
        refuse_owned(spec.extra_args, LLAMA_SERVER_OWNED, self.name)
        parallel = max(1, spec.parallel)
        argv = [
            self.binary,
            "--model", str(spec.model),
            "--threads", str(spec.threads),
            "--threads-batch", str(spec.threads),
            "--parallel", str(parallel),
            # Its host-RAM prompt cache, bounded and counted in the memory estimate
            # (daemon.models.memory): llama-server's default is up to 8 GiB per child.
            "--cache-ram", str(max(0, spec.cache_ram_mib)),
        ]
        if spec.embedding:
            # An embedding input must fit one micro-batch (llama.cpp answers HTTP 500
            # "input is too large to process" otherwise), so ubatch == batch == ctx.
            ctx = spec.ctx_size or spec.batch
            argv += [
                "--embedding",
                # Every slot gets the model's whole context.
                "--ctx-size", str(ctx * parallel),
                "--batch-size", str(max(spec.batch, ctx)),
                "--ubatch-size", str(max(spec.batch, ctx)),
            ]
        else:
            argv += ["--ctx-size", str(spec.ctx_size * parallel if spec.ctx_size else 0)]
            argv += ["--batch-size", str(spec.batch)]
            if spec.chat_template:
                # A file, not --chat-template NAME: this llama-server takes that as the
                # Jinja source itself, and every prompt became the name.
                argv += ["--chat-template-file", str(template_file(spec.chat_template))]
        # Ours last: llama.cpp keeps the last value of a flag given twice.
        return argv + list(spec.extra_args) + [
            # A host ending in ".sock" is a UNIX socket path (llama.cpp's server-http.cpp).
            "--host", str(socket),
            "--alias", alias,
            "--slots" if self.slots else "--no-slots",
            "--no-webui",
            "--cors-origins", NO_ORIGIN,
        ]

    def environment(self, base: Mapping[str, str], key: str) -> dict[str, str]:
        _warn_system_config()
        return _private_env(base, key, LLAMA_SERVER_OWNED)

    def max_concurrency(self, spec: LaunchSpec) -> int:
        return max(1, spec.parallel)


BUNDLED_LAUNCHER = str(Path(__file__).with_name("_bundled_child.py"))
"""Our launcher of the bundled runtime, run by path (it imports no llamad module): it
builds llama_cpp.server's app with the key and serves it on a UNIX socket, which
``python -m llama_cpp.server`` cannot."""


@dataclass(frozen=True)
class BundledRuntime:
    """llama-cpp-python's server (the ``[server]`` extra), through :data:`BUNDLED_LAUNCHER`."""

    python: str = sys.executable
    name: str = "llama-cpp-python"
    api: ApiShape = field(default=BUNDLED_API)
    queues_requests: bool = False  # serves one request at a time; llamad sends no more

    def command(self, spec: LaunchSpec, *, socket: Path, alias: str) -> list[str]:
        refuse_owned(spec.extra_args, _BUNDLED_OWNED, self.name)
        ctx = spec.ctx_size or (spec.batch if spec.embedding else 0)
        argv = [
            self.python, BUNDLED_LAUNCHER,
            "--model", str(spec.model),
            # llama_cpp.server defaults to half the cores: always pass them explicitly.
            "--n_threads", str(spec.threads),
            "--n_threads_batch", str(spec.threads),
            "--n_ctx", str(ctx),
            "--n_batch", str(max(spec.batch, ctx) if spec.embedding else spec.batch),
            "--embedding", "true" if spec.embedding else "false",
            # By default a new request interrupts the one streaming: a liveness probe or a
            # second client would cut a running generation short.
            "--interrupt_requests", "false",
            "--verbose", "true",
        ]
        if spec.embedding:
            argv += ["--n_ubatch", str(max(spec.batch, ctx))]
        elif spec.chat_template:
            argv += ["--chat_format", BUNDLED_FORMATS[spec.chat_template]]
        return argv + list(spec.extra_args) + [
            "--uds", str(socket), "--model_alias", alias]

    def environment(self, base: Mapping[str, str], key: str) -> dict[str, str]:
        return _private_env(base, key, _BUNDLED_OWNED)

    def max_concurrency(self, spec: LaunchSpec) -> int:
        return 1


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def packaged_llama_server() -> Path | None:
    """The ``llama-server`` inside the installed llama-cpp-python package
    (``llama_cpp/bin``, where llamad's build of its wheel puts it), or None.

    Found without importing ``llama_cpp`` (that would load its shared libraries).
    """
    try:
        spec = importlib.util.find_spec("llama_cpp")
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        binary = Path(folder, "bin", "llama-server")
        if _executable(binary):
            return binary
    return None


def find_llama_server(explicit: str | None = None) -> str | None:
    """Locate a ``llama-server`` binary.

    Order: ``explicit`` (``--llama-bin``; must exist), next to the running interpreter
    (a virtualenv's ``bin/``), inside the installed llama-cpp-python package (a venv
    installed from the wheelhouse has it there and nowhere else), then ``PATH``.

    Raises:
        FileNotFoundError: ``explicit`` was given but is not an executable file.
    """
    if explicit:
        path = Path(explicit)
        if not _executable(path):
            raise FileNotFoundError(f"llama-server binary not found or not executable: {path}")
        return str(path.resolve())
    beside = Path(sys.executable).parent / "llama-server"
    if _executable(beside):
        return str(beside)
    # Before PATH: this one was built from the llama.cpp the installed package vendors,
    # the version whose options supervisor._args allows; one on PATH may be any other.
    if (packaged := packaged_llama_server()) is not None:
        return str(packaged)
    return shutil.which("llama-server")


def pick_runtime(kind: str, llama_bin: str | None = None, *, slots: bool = False) -> Runtime:
    """Choose a runtime: ``"llama-server"``, ``"bundled"``, or ``"auto"``.

    ``auto`` prefers llama-server (about 1.5-2x the tokens/s of the bundled runtime on
    the same model) and falls back to the bundled runtime when no binary is found.
    ``slots``: llama-server serves ``/slots`` (see :class:`LlamaServerRuntime`).
    """
    if kind == "bundled":
        return BundledRuntime()
    binary = find_llama_server(llama_bin)
    if binary is None:
        if kind == "llama-server":
            raise FileNotFoundError(
                "no llama-server binary: pass --llama-bin, put one beside the daemon, "
                "install a llama-cpp-python wheel built with llamad's hook (make install, "
                "make wheelhouse), or put one on PATH (packaging/build-llama-server.sh "
                "builds one)"
            )
        return BundledRuntime()
    return LlamaServerRuntime(binary, slots=slots)


def describe(argv: Sequence[str]) -> str:
    """A command line for logs."""
    return " ".join(argv)
