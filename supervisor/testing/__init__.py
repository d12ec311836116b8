"""A fault-injecting fake ``llama-server``, for testing code that supervises children.

This package exists for fault injection only: it lets a test make a child crash, hang,
start slowly, report "loading" forever, ignore SIGTERM or flood its stdout, none of which a
real llama.cpp child does on demand. Everything that can be tested against a real child
(real generation, real embeddings, real load times) belongs in the integration tests, which
run real ``llama-server`` processes on real GGUF models.

The fake speaks enough of llama-server's HTTP API (``/health``, ``/v1/models``,
``/v1/completions``, ``/v1/chat/completions``, ``/v1/embeddings``, ``/tokenize``,
``/detokenize``) and prints enough of its log lines that a supervisor and an OpenAI-style
client take it for the real thing; ``GET /fake/stats`` adds counters a test can read. The
full CLI and endpoint behaviour, and what ``--fault-after`` counts for each fault, are in
the docstring of :mod:`supervisor.testing.fake_child`.

Usage::

    import subprocess

    from supervisor.testing import fake_child_command

    model = tmp_path / "tiny.gguf"
    model.write_bytes(b"GGUF")  # the fake only checks that the file can be opened
    cmd = fake_child_command(port=port, model=str(model), fault="crash-mid-stream", fault_after=2)
    child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    # ... stream a completion: two token events arrive, then the child dies of SIGSEGV
    assert child.wait() == -11

The command runs ``fake_child.py`` by path with ``sys.executable``, not with ``python -m
supervisor.testing.fake_child`` (which also works): by path the child imports nothing but
the standard library, so it is listening within about 50 ms, and it needs no ``PYTHONPATH``
or working directory that makes ``supervisor`` importable.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from .fake_child import FAULTS

__all__ = ["FAULTS", "FakeRuntime", "fake_child_command"]

_FAKE_CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_child.py")


def fake_child_command(
    *,
    port: int | None = None,
    model: str,
    socket: str | None = None,
    alias: str | None = None,
    fault: str | None = None,
    fault_after: int | None = None,
    load_seconds: float | None = None,
    embedding: bool = False,
    n_embd: int = 8,
    token_delay: float | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """Build the argv that starts a fake llama-server.

    Nothing is started and nothing is checked on disk; the fake itself reports a missing
    model file the way llama-server does (on stderr, exit status 1).

    Args:
        port: TCP port to listen on, on 127.0.0.1; give it or ``socket``.
        socket: a UNIX socket path ending in ``.sock`` to listen on instead (what llamad's
            supervisor gives its children); the key, if any, is ``LLAMA_API_KEY`` in the
            child's environment.
        model: path of the model file; it must exist and be readable, its content is ignored.
        alias: model id reported by ``/v1/models`` and in responses; default the file name.
        fault: one of :data:`FAULTS`, or None for a well-behaved child.
        fault_after: the count some faults use (``--fault-after``): tokens for
            ``crash-mid-stream``, requests for ``hang``, seconds for ``exit-after-ready``.
            None leaves the fault's default.
        load_seconds: seconds spent "loading the model" before ``/health`` answers 200.
            None leaves the default (0, or 3 with ``slow-start``).
        embedding: serve embeddings (llama-server's ``--embedding``) instead of completions.
        n_embd: length of the embedding vectors.
        token_delay: seconds between generated tokens; None leaves the default (0.002).
        extra: further arguments appended as they are, such as real llama-server flags
            (``-c 4096``, ``-np 2``), which the fake accepts and ignores.

    Returns:
        ``[sys.executable, "/abs/path/supervisor/testing/fake_child.py", ...]``.

    Raises:
        ValueError: ``fault`` is not one of :data:`FAULTS`, ``port`` is not 1-65535, or
            neither (or both of) ``port`` and ``socket`` are given, or ``socket`` does not
            end in ``.sock``.
    """
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; expected one of {', '.join(FAULTS)}")
    if (port is None) == (socket is None):
        raise ValueError("give port or socket")
    cmd = [sys.executable, _FAKE_CHILD]
    if socket is not None:
        if not socket.endswith(".sock"):
            raise ValueError(f"socket must end in .sock, got {socket}")
        cmd += ["--host", socket]
    elif port is not None:
        if not 0 < port < 65536:
            raise ValueError(f"port must be 1-65535, got {port}")
        cmd += ["--port", str(port)]
    cmd += ["--model", model, "--n-embd", str(n_embd)]
    if alias is not None:
        cmd += ["--alias", alias]
    if embedding:
        cmd.append("--embedding")
    if fault is not None:
        cmd += ["--fault", fault]
    if fault_after is not None:
        cmd += ["--fault-after", str(fault_after)]
    if load_seconds is not None:
        cmd += ["--load-seconds", repr(float(load_seconds))]
    if token_delay is not None:
        cmd += ["--token-delay", repr(float(token_delay))]
    cmd += list(extra)
    return cmd


def __getattr__(name: str) -> object:
    # FakeRuntime imports the supervisor package (httpx and more); load it only when asked,
    # so importing this package stays cheap.
    if name == "FakeRuntime":
        from .fake_runtime import FakeRuntime  # noqa: PLC0415

        return FakeRuntime
    raise AttributeError(name)
