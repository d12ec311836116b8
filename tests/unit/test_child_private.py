"""A child is private to the daemon: what its command line, environment and runtime
directory say (issue 25). The real children are tried from another uid in
tests/integration/test_child_private.py."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from supervisor import LogRing, ProcessLauncher, Sampling, StartFailure, SystemClock, _rundir
from supervisor._rundir import (
    SUN_PATH_MAX,
    RuntimeDirError,
    child_key,
    ensure_private,
    runtime_dir,
    socket_path,
    sweep_stale,
)
from supervisor._runtime import (
    BUNDLED_LAUNCHER,
    KEY_ENV,
    NO_ORIGIN,
    BundledRuntime,
    LaunchSpec,
    LlamaServerRuntime,
)
from supervisor.testing.fake_runtime import FakeRuntime
from tests.support.child_http import child_http
from tests.support.child_http import child_key as child_key_of

SOCK = Path("/run/llamad/children/0123456789ab.sock")
KEY = "k" * 43


def spec(*extra: str, embedding: bool = False) -> LaunchSpec:
    return LaunchSpec(role="embedding" if embedding else "generation",
                      model=Path("/m/model.gguf"), embedding=embedding, extra_args=extra)


def flag(argv: list[str], name: str) -> str:
    """The value after the last ``name`` on ``argv``."""
    return argv[len(argv) - 1 - argv[::-1].index(name) + 1]


@pytest.mark.parametrize("embedding", [False, True])
def test_llama_server_listens_on_the_socket_with_slots_ui_and_cors_closed(
        embedding: bool) -> None:
    """llama-server gets the socket as its host and no port, --no-slots, --no-webui and
    the .invalid CORS origin, after the operator's extra arguments; no key on argv."""
    argv = LlamaServerRuntime("llama-server").command(
        spec("-ngl", "99", embedding=embedding), socket=SOCK, alias="llamad-generation-x")
    assert flag(argv, "--host") == str(SOCK)
    assert "--port" not in argv and "127.0.0.1" not in argv
    assert "--no-slots" in argv and "--slots" not in argv
    assert "--no-webui" in argv
    assert flag(argv, "--cors-origins") == NO_ORIGIN
    assert flag(argv, "--alias") == "llamad-generation-x"
    assert argv.index("-ngl") < argv.index("--host")  # ours last: llama.cpp keeps the last
    assert not any(a.startswith("--api-key") for a in argv)


def test_the_operator_can_turn_slots_on_and_nothing_else_opens() -> None:
    """[child] slots = true gives --slots; the socket, UI and CORS stay as they were."""
    argv = LlamaServerRuntime("llama-server", slots=True).command(spec(), socket=SOCK,
                                                                  alias="a")
    assert "--slots" in argv and "--no-slots" not in argv
    assert flag(argv, "--host") == str(SOCK) and "--no-webui" in argv


@pytest.mark.parametrize("extra", [
    ("--host", "0.0.0.0"), ("--port", "8080"), ("--api-key", "mine"), ("--api_key", "mine"),
    ("--api-key-file", "/tmp/k"), ("--slots",), ("--webui",), ("--ui",), ("-a", "x"),
    ("--alias", "x"), ("--cors-origins", "*"), ("--path", "/"), ("--api-prefix", "/x"),
    ("--reuse-port",), ("--ssl-key-file", "k"),
])
def test_extra_args_cannot_name_llamads_own(extra: tuple[str, ...]) -> None:
    """An extra argument that would move the listener, add a key, open /slots, the UI or
    CORS is refused, naming it (the fake runtime refuses the same)."""
    for runtime in (LlamaServerRuntime("llama-server"), FakeRuntime()):
        with pytest.raises(ValueError, match=f"extra_args: {extra[0]} is set by llamad"):
            runtime.command(spec("-c", "512", *extra), socket=SOCK, alias="a")


def test_llama_server_takes_its_key_from_the_environment_only() -> None:
    """The key is LLAMA_API_KEY in the child's environment; variables that would add a
    key, move the listener or open /slots are dropped from what the child inherits."""
    base = {"PATH": "/usr/bin", "LLAMA_ARG_API_KEY_FILE": "/tmp/keys",
            "LLAMA_ARG_HOST": "0.0.0.0", "LLAMA_ARG_ENDPOINT_SLOTS": "1",
            "LLAMA_ARG_CORS_ORIGINS": "*", KEY_ENV: "old", "LLAMA_ARG_THREADS": "2"}
    env = LlamaServerRuntime("llama-server").environment(base, KEY)
    assert env == {"PATH": "/usr/bin", "LLAMA_ARG_THREADS": "2", KEY_ENV: KEY}


def test_the_bundled_runtime_runs_our_launcher_on_the_socket() -> None:
    """The bundled runtime starts our launcher by path with --uds; its key comes from
    the environment (API_KEY, HOST, PORT and CONFIG_FILE are not inherited); an extra
    --api_key or --host is refused."""
    runtime = BundledRuntime(python="/venv/bin/python")
    argv = runtime.command(spec("--n_gpu_layers", "0"), socket=SOCK, alias="a")
    assert argv[:2] == ["/venv/bin/python", BUNDLED_LAUNCHER]
    assert Path(BUNDLED_LAUNCHER).is_file()
    assert flag(argv, "--uds") == str(SOCK) and flag(argv, "--model_alias") == "a"
    assert not {"--host", "--port", "--api_key"} & set(argv)
    env = runtime.environment({"API_KEY": "x", "HOST": "0.0.0.0", "PORT": "1",
                               "CONFIG_FILE": "/c.json", "HOME": "/h"}, KEY)
    assert env == {"HOME": "/h", KEY_ENV: KEY}
    for extra in (("--api_key", "mine"), ("--host", "0.0.0.0"), ("--uds", "/tmp/x.sock")):
        with pytest.raises(ValueError, match=f"{extra[0]} is set by llamad"):
            runtime.command(spec(*extra), socket=SOCK, alias="a")


def test_child_keys_are_long_random_and_printable() -> None:
    """Each launch's key is new, 43 URL-safe characters (256 bits)."""
    keys = {child_key() for _ in range(50)}
    assert len(keys) == 50
    assert all(len(k) == 43 and k.isascii() and k.isprintable() for k in keys)


# --- the runtime directory ----------------------------------------------------------------


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """No directory chosen yet, and no systemd or XDG directory in the environment."""
    monkeypatch.setattr(_rundir._Chosen, "path", None)
    monkeypatch.delenv("RUNTIME_DIRECTORY", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_systemds_runtime_directory_gets_a_private_children_subdirectory(
        fresh: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """$RUNTIME_DIRECTORY (mode 0755: a gRPC socket may live there) is left as it is; the
    children's sockets go in its 0700 subdirectory."""
    run = tmp_path / "run"
    run.mkdir(mode=0o755)
    monkeypatch.setenv("RUNTIME_DIRECTORY", str(run))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    chosen = runtime_dir()
    assert chosen == run / "children"
    assert mode(chosen) == 0o700 and mode(run) == 0o755
    assert socket_path().parent == chosen


def test_xdg_runtime_dir_then_a_private_temporary_directory(
        fresh: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without systemd's: $XDG_RUNTIME_DIR/llamad; without either, a new 0700 directory
    under the temporary directory."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert runtime_dir() == tmp_path / "llamad" and mode(tmp_path / "llamad") == 0o700
    monkeypatch.setattr(_rundir._Chosen, "path", None)
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    temporary = runtime_dir()
    assert temporary.name.startswith("llamad-") and mode(temporary) == 0o700
    assert temporary.stat().st_uid == os.geteuid()
    temporary.rmdir()


def test_a_directory_too_deep_for_a_socket_path_is_not_used(
        fresh: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An XDG directory whose socket paths would pass 107 bytes is skipped; every socket
    path fits."""
    deep = tmp_path / ("d" * 90)
    deep.mkdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(deep))
    chosen = runtime_dir()
    assert not chosen.is_relative_to(deep)
    assert len(os.fsencode(str(socket_path()))) <= SUN_PATH_MAX
    chosen.rmdir()


def test_a_loose_directory_of_ours_is_tightened(tmp_path: Path) -> None:
    """Ours with group or other bits: made 0700."""
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o777)
    loose.chmod(0o777)
    assert ensure_private(loose) == loose and mode(loose) == 0o700


def test_someone_elses_directory_is_refused(tmp_path: Path) -> None:
    """A directory of another uid (someone who could read or swap our sockets) is
    refused, never used (tests run as root, who may chown)."""
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(RuntimeDirError, match="belongs to uid 65534"):
        ensure_private(theirs)


def test_a_symlink_or_a_file_is_refused(tmp_path: Path) -> None:
    """A symlink (to a directory anyone can enter) or a plain file is not a runtime
    directory."""
    (tmp_path / "open").mkdir(mode=0o777)
    (tmp_path / "link").symlink_to(tmp_path / "open")
    (tmp_path / "file").write_text("")
    for name in ("link", "file"):
        with pytest.raises(RuntimeDirError, match="is not a directory"):
            ensure_private(tmp_path / name)


def test_stale_sockets_are_swept_and_live_ones_kept(tmp_path: Path) -> None:
    """A socket nobody listens on (a crashed daemon's child) is removed; one a server
    listens on (another daemon's child) is left alone."""
    dead, live = tmp_path / "dead.sock", tmp_path / "live.sock"
    with socket.socket(socket.AF_UNIX) as gone:
        gone.bind(str(dead))  # bound, never listening, then closed: a stale socket file
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(live))
        server.listen()
        assert sweep_stale(tmp_path) == 1
        assert not dead.exists() and live.exists()


# --- a launched child ------------------------------------------------------------------------


@pytest.mark.process
async def test_a_launched_child_gets_its_key_through_its_environment(tmp_path: Path) -> None:
    """ProcessLauncher hands the key in the child's environment only (not on its command
    line), llamad's client sends it (the start-up probe and a completion pass), a request
    without it is 401, and the socket is removed once the child is stopped."""
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    sock = tmp_path / "c.sock"
    launcher = ProcessLauncher(LaunchSpec(role="generation", model=model), FakeRuntime(),
                               clock=SystemClock(), ring=LogRing(100),
                               socket_picker=lambda: sock)
    child = await launcher.launch()
    try:
        assert child.socket == str(sock) and sock.exists()
        key = child_key_of(child.pid)
        assert key.encode() not in Path(f"/proc/{child.pid}/cmdline").read_bytes()
        assert await child.client.complete("hello", Sampling(max_tokens=2))
        async with child_http(child.socket, child.pid, key=False) as http:
            refused = await http.get("/v1/models")
            assert refused.status_code == 401
            assert refused.json()["error"]["message"] == "Invalid API Key"
            assert (await http.get("/health")).status_code == 200  # public, as llama-server's
    finally:
        await child.stop()
    assert not sock.exists()


async def test_no_private_directory_fails_the_start_for_good(tmp_path: Path) -> None:
    """A runtime directory that is not private (someone else's) fails the launch at once,
    permanent, naming why; no child is started anywhere else."""
    def theirs() -> Path:
        raise RuntimeDirError("runtime directory /run/llamad/children belongs to uid 65534")

    launcher = ProcessLauncher(LaunchSpec(role="generation", model=tmp_path / "m.gguf"),
                               FakeRuntime(), clock=SystemClock(), ring=LogRing(10),
                               socket_picker=theirs)
    with pytest.raises(StartFailure) as failed:
        await launcher.launch()
    assert failed.value.cause.kind == "spawn_error" and failed.value.cause.permanent
    assert "belongs to uid 65534" in failed.value.cause.message
