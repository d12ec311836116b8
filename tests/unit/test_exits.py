"""Exit classification on real output lines of llama-server and llama-cpp-python: the kind
decides whether a restart can help (transient) or the breaker opens at once (permanent)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from supervisor import _exits
from supervisor._exits import ExitCause, cgroup_oom_kills, classify_exit

# llama-server b-series on a truncated GGUF (captured).
TRUNCATED_MODEL = [
    "0.00.040.616 E cmn  common_init_: failed to load model '/tmp/trunc.gguf'",
    "0.00.040.618 E srv    load_model: failed to load model, '/tmp/trunc.gguf'",
    "0.00.040.621 I srv    operator(): operator(): cleaning up before exit...",
    "0.00.040.919 E srv  llama_server: exiting due to model loading error",
]
BAD_FLAG = ["error: invalid argument: --bogus-flag"]
PORT_IN_USE = [
    "0.00.003.038 E srv         start: couldn't bind HTTP server socket, hostname: "
    "127.0.0.1, port: 18112",
    "0.00.004.250 E srv  llama_server: exiting due to HTTP server error",
]
# llama-cpp-python's server (uvicorn, argparse).
UVICORN_PORT = [
    "INFO:     Started server process [4242]",
    "INFO:     Waiting for application startup.",
    "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 8000): "
    "address already in use",
    "INFO:     Waiting for application shutdown.",
]
PY_CORRUPT_MODEL = [
    "Traceback (most recent call last):",
    '  File "/venv/lib/python3.11/site-packages/llama_cpp/llama.py", line 374, in __init__',
    "ValueError: Failed to load model from file: /x.gguf",
]
ARGPARSE = [
    "usage: __main__.py [-h] [--model MODEL] [--model_alias MODEL_ALIAS]",
    "                   [--n_gpu_layers N_GPU_LAYERS] [--split_mode SPLIT_MODE]",
    "__main__.py: error: unrecognized arguments: --bogus",
]


@pytest.mark.parametrize("code", [1, 0])
def test_truncated_model_is_a_permanent_model_error(code: int) -> None:
    """llama-server's model-load failure is model_error and permanent, whether it exits 1 or 0."""
    cause = classify_exit(code, TRUNCATED_MODEL, at=12.5)
    assert cause.kind == "model_error"
    assert cause.permanent is True
    assert cause.exit_code == code
    assert "failed to load model" in cause.message
    assert "/tmp/trunc.gguf" in cause.message
    assert cause.at == 12.5


@pytest.mark.parametrize("code", [1, 0])
def test_bad_flag_is_a_permanent_usage_error(code: int) -> None:
    """llama-server's "invalid argument" is usage_error, permanent, with the flag named."""
    cause = classify_exit(code, ["build: 4242 (abc) with cc", *BAD_FLAG])
    assert (cause.kind, cause.permanent) == ("usage_error", True)
    assert cause.message == "error: invalid argument: --bogus-flag"


def test_port_in_use_is_transient() -> None:
    """llama-server's failed bind is port_in_use and transient (a fresh port may work)."""
    cause = classify_exit(1, PORT_IN_USE)
    assert (cause.kind, cause.permanent) == ("port_in_use", False)
    assert "couldn't bind HTTP server socket" in cause.message
    assert "18112" in cause.message


def test_uvicorn_port_clash_is_port_in_use() -> None:
    """llama-cpp-python's uvicorn bind error is port_in_use, transient."""
    cause = classify_exit(1, UVICORN_PORT)
    assert (cause.kind, cause.permanent) == ("port_in_use", False)
    assert "address already in use" in cause.message


def test_python_corrupt_model_is_model_error() -> None:
    """llama-cpp-python's "Failed to load model from file" is a permanent model_error."""
    cause = classify_exit(1, PY_CORRUPT_MODEL)
    assert (cause.kind, cause.permanent) == ("model_error", True)
    assert cause.message == "ValueError: Failed to load model from file: /x.gguf"


def test_argparse_error_is_usage_error_naming_the_argument() -> None:
    """argparse's usage + error (exit 2) is usage_error; the message is the error line."""
    cause = classify_exit(2, ARGPARSE)
    assert (cause.kind, cause.permanent, cause.exit_code) == ("usage_error", True, 2)
    assert "unrecognized arguments: --bogus" in cause.message


def test_usage_line_alone_is_usage_error() -> None:
    """A usage line with no error line still classifies as usage_error."""
    cause = classify_exit(2, ARGPARSE[:2])
    assert (cause.kind, cause.permanent) == ("usage_error", True)
    assert cause.message.startswith("usage: __main__.py")


def test_segfault_is_a_transient_signal() -> None:
    """-11 is a SIGSEGV signal death, transient, with no exit code."""
    cause = classify_exit(-11, TRUNCATED_MODEL)
    assert cause == ExitCause("signal", False, "killed by SIGSEGV", signal="SIGSEGV")


def test_sigkill_we_sent_is_stopped() -> None:
    """A SIGKILL the supervisor sent is a stop, even when the cgroup saw OOM kills."""
    cause = classify_exit(-9, [], we_killed=True, oom_kills=1)
    assert (cause.kind, cause.permanent, cause.signal) == ("stopped", False, "SIGKILL")


def test_sigterm_we_sent_is_stopped() -> None:
    """A SIGTERM death after we asked is a stop too."""
    assert classify_exit(-15, [], we_killed=True).kind == "stopped"


def test_sigkill_with_oom_kills_is_oom() -> None:
    """A SIGKILL not sent by us while the cgroup counted an OOM kill is oom, transient."""
    cause = classify_exit(-9, [], oom_kills=1)
    assert (cause.kind, cause.permanent, cause.signal) == ("oom", False, "SIGKILL")
    assert "OOM" in cause.message


@pytest.mark.parametrize("oom_kills", [0, None])
def test_sigkill_without_oom_evidence_is_signal(oom_kills: int | None) -> None:
    """A SIGKILL not sent by us and without an OOM count is a plain signal death."""
    cause = classify_exit(-9, [], oom_kills=oom_kills)
    assert (cause.kind, cause.permanent, cause.signal) == ("signal", False, "SIGKILL")
    assert "not sent by llamad" in cause.message


def test_oom_count_ignored_for_other_signals() -> None:
    """OOM kills only explain SIGKILL; a SIGSEGV stays a signal death."""
    assert classify_exit(-11, [], oom_kills=3).kind == "signal"


def test_unknown_signal_number_is_named() -> None:
    """A signal number without a name is reported as SIG<n>, not an exception."""
    cause = classify_exit(-200, [])
    assert (cause.kind, cause.signal) == ("signal", "SIG200")


def test_exit_zero_unasked_is_a_crash() -> None:
    """Exit 0 with nothing recognisable in the output is a transient crash."""
    cause = classify_exit(0, ["main: server is listening on http://127.0.0.1:8080"])
    assert (cause.kind, cause.permanent, cause.exit_code) == ("crash", False, 0)
    assert "without being asked to stop" in cause.message


def test_plain_exit_code_uses_last_line() -> None:
    """An unrecognised non-zero exit is a crash whose message is the last non-blank line."""
    cause = classify_exit(3, ["starting", "GGML_ASSERT(n > 0) failed", "   ", ""])
    assert cause == ExitCause("crash", False, "GGML_ASSERT(n > 0) failed", exit_code=3)


def test_plain_exit_code_without_output() -> None:
    """With no output, the crash message states the exit status."""
    assert classify_exit(3, []).message == "exited with status 3"


def test_message_is_one_bounded_line() -> None:
    """Messages are stripped and cut to 300 characters."""
    cause = classify_exit(1, ["  " + "w" * 1000 + "  "])
    assert cause.message == "w" * 300


# --- cgroup OOM counter ----------------------------------------------------------------


def test_cgroup_oom_kills_never_raises() -> None:
    """On this machine the counter is None or a non-negative int; reading never raises."""
    kills = cgroup_oom_kills()
    assert kills is None or (isinstance(kills, int) and kills >= 0)


def _fake_files(monkeypatch: pytest.MonkeyPatch, files: dict[str, str]) -> None:
    def fake_open(path: str | Path, *args: Any, **kwargs: Any) -> io.StringIO:
        if str(path) not in files:
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return io.StringIO(files[str(path)])

    monkeypatch.setattr(_exits, "open", fake_open, raising=False)


def test_cgroup_oom_kills_reads_memory_events(monkeypatch: pytest.MonkeyPatch) -> None:
    """The oom_kill line of the cgroup's memory.events is returned as an int."""
    _fake_files(monkeypatch, {
        "/proc/self/cgroup": "0::/system.slice/llamad.service\n",
        "/sys/fs/cgroup/system.slice/llamad.service/memory.events":
            "low 0\nhigh 0\nmax 4\noom 2\noom_kill 3\noom_group_kill 0\n",
    })
    assert cgroup_oom_kills() == 3


@pytest.mark.parametrize(
    "files",
    [
        {},
        {"/proc/self/cgroup": "12:memory:/user.slice\n"},
        {"/proc/self/cgroup": "0::/a\n"},
        {"/proc/self/cgroup": "0::/a\n", "/sys/fs/cgroup/a/memory.events": "oom 1\n"},
        {"/proc/self/cgroup": "0::/a\n", "/sys/fs/cgroup/a/memory.events": "oom_kill x\n"},
    ],
)
def test_cgroup_oom_kills_unreadable_is_none(
    monkeypatch: pytest.MonkeyPatch, files: dict[str, str]
) -> None:
    """No cgroup v2 entry, no memory.events, no or a garbled oom_kill line: None."""
    _fake_files(monkeypatch, files)
    assert cgroup_oom_kills() is None
