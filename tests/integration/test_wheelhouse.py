"""The air-gapped install: everything from the wheelhouse, with every package index off,
and the installed daemon serving a chat and a search on the models it prepared offline
(issue 26)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import EMBED_MODEL, ROOT, SMALL_MODEL
from tests.support.daemon_process import DaemonProcess
from tests.support.procs import gone

pytestmark = pytest.mark.integration

# The folders of a machine with no Python tooling of ours: no checkout's venv (where
# `make llama-server` links one), no pyenv shims. The installed daemon must find
# llama-server by itself.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

DOCS = {
    "tape-rotation.txt": "Backup tapes are rotated every Friday. The offsite courier collects "
                         "the previous week's tapes at noon and returns the oldest set.",
    "vpn.txt": "The VPN concentrator in rack B4 terminates remote access tunnels; its "
               "certificates are renewed each quarter by the network team.",
    "espresso.txt": "Descale the espresso machine on the third floor monthly with citric "
                    "acid, then flush the steam wand twice.",
}


def offline_env(tmp_path: Path) -> dict[str, str]:
    """This environment with pip unable to reach any index and no llamad or Python path
    settings of this checkout."""
    # No config file: the machine's pip.conf may name extra indexes or find-links.
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("PIP_", "LLAMAD_", "PYTHON"))}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
               LLAMAD_CACHE=str(tmp_path / "cache"), PATH=SYSTEM_PATH)
    return env


def run(argv: list[str], env: dict[str, str], cwd: Path, timeout: float = 120
        ) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=timeout, check=False)
    assert done.returncode == 0, f"{argv[1:3]} exited {done.returncode}:\n{done.stderr}"
    return done


def wait_ready(llamad: str, address: str, env: dict[str, str], cwd: Path,
               daemon: DaemonProcess) -> dict[str, Any]:
    """``llamad status --json`` once both children run and the embedding model's SHA-256
    is known (only then are vectors written, issue 16)."""
    deadline = time.monotonic() + 120
    while True:
        status: dict[str, Any] = json.loads(
            run([llamad, "status", "--json", "--address", address], env, cwd).stdout)
        children = {c["role"]: c for c in status["children"]}
        if (all(c["state"] == "running" for c in children.values())
                and children["embedding"]["model_sha256"]):
            return status
        assert time.monotonic() < deadline, f"not ready: {children}\n{daemon.tail()}"
        time.sleep(0.5)


def stack_dump(daemon: DaemonProcess) -> list[str]:
    """The files of every frame of every thread of the daemon (SIGUSR1: faulthandler),
    once the whole dump is in its log: faulthandler writes the threads newest first, the
    main thread last, so a read that finds the first frames may be one of a dump still
    being written (it failed so in CI, with only worker threads' frames read). Done when
    two reads 0.3 s apart find the same frames."""
    daemon.proc.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + 30
    seen: list[str] = []
    while True:
        files = re.findall(r'File "([^"]+)"', daemon.tail(10**6))
        if files and files == seen:
            return files
        assert time.monotonic() < deadline, f"no whole stack dump:\n{daemon.tail()}"
        seen = files
        time.sleep(0.3)


def mapped_files(pid: int) -> set[str]:
    return {line.split(None, 5)[5] for line in Path(f"/proc/{pid}/maps").read_text()
            .splitlines() if len(line.split(None, 5)) == 6}


def test_installed_daemon_serves_chat_and_search_from_the_wheelhouse_alone(
        tmp_path: Path) -> None:
    """A fresh venv installs llamad from the wheelhouse alone, prepares the generation and
    embedding models offline, and its own `llamad serve` (cwd outside the checkout, no
    llama-server of ours on PATH) runs both on the wheel's llama-server, indexes a folder
    and answers a chat and a search that finds the right file."""
    wheelhouse = os.environ.get("LLAMAD_WHEELHOUSE")
    if not wheelhouse or not Path(wheelhouse).is_dir():
        pytest.fail("no wheelhouse: run `make wheelhouse` (make test builds it and sets "
                    "LLAMAD_WHEELHOUSE)")
    env = offline_env(tmp_path)
    venv, work = tmp_path / "venv", tmp_path / "work"
    work.mkdir()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py, llamad = str(venv / "bin" / "python"), str(venv / "bin" / "llamad")
    run([py, "-m", "pip", "install", "--quiet", "--no-index", "--find-links", wheelhouse,
         "llamad"], env, work, timeout=600)
    check = run([py, "-c", "import llama_cpp.server.app, hnswlib, tantivy, grpc, "
                           "prometheus_client, daemon, supervisor, models; "
                           "print(supervisor.LLAMAD_PACKAGE, supervisor.__file__)"], env, work)
    assert check.stdout.split()[0] == "True"
    assert check.stdout.split()[1].startswith(str(venv))  # not the source tree
    # What the wheel installs: llama-server inside llama_cpp, nothing beside python.
    packaged = venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / \
        "site-packages" / "llama_cpp" / "bin" / "llama-server"
    assert packaged.is_file() and not (venv / "bin" / "llama-server").exists()
    assert "--generation-model" in run([llamad, "serve", "--help"], env, work).stdout

    models = tmp_path / "models"
    run([py, "-m", "models", "prepare", "--find-links", wheelhouse, "--dest", str(models),
         "--model", SMALL_MODEL, "--model", EMBED_MODEL], env, work, timeout=300)
    assert (models / SMALL_MODEL).stat().st_size > 90_000_000
    assert (models / EMBED_MODEL).stat().st_size > 40_000_000
    docs = tmp_path / "docs"
    docs.mkdir()
    for name, text in DOCS.items():
        (docs / name).write_text(text + "\n")

    # No model named: each role runs the prepared default of models_dir.
    serve_env = {**env, "PYTHONPATH": "", "LLAMAD_LISTEN": "127.0.0.1:0",
                 "LLAMAD_MODELS_DIR": str(models), "LLAMAD_STATE_DIR": str(tmp_path / "state"),
                 "LLAMAD_RETRIEVAL_ALLOWED_ROOTS": str(docs), "LLAMAD_LOG_FORMAT": "json",
                 "LLAMAD_GENERATION_THREADS": "2", "LLAMAD_EMBEDDING_THREADS": "2",
                 "LLAMAD_GENERATION_CTX_SIZE": "2048", "LLAMAD_DRAIN_GRACE": "5",
                 "LLAMAD_CHILD_STOP_GRACE": "3"}
    daemon = DaemonProcess(tmp_path, serve_env, command=[llamad, "serve"], cwd=work)
    try:
        status = wait_ready(llamad, daemon.address, env, work, daemon)
        children = {c["role"]: c for c in status["children"]}
        for role, model in (("generation", SMALL_MODEL), ("embedding", EMBED_MODEL)):
            child = children[role]
            assert child["runtime"] == "llama-server", child
            assert child["model_path"] == str(models / model)
            # The wheel's own llama-server and libraries, found without a link or PATH.
            assert Path(f"/proc/{child['pid']}/exe").resolve() == packaged.resolve()
            assert not [f for f in mapped_files(child["pid"]) if f.startswith(str(ROOT))]
        assert Path(f"/proc/{daemon.pid}/cwd").resolve() == work.resolve()

        address = ["--address", daemon.address]
        ingested = json.loads(run([llamad, "ingest", str(docs), "--json", *address],
                                  env, work).stdout.splitlines()[-1])
        assert (ingested["added"], ingested["failed_total"]) == (3, 0), ingested
        found = json.loads(run([llamad, "search", "when does the courier take the backup "
                                "tapes offsite", "--json", *address], env, work).stdout)
        assert found["mode"] == "hybrid" and not found["warnings"], found
        assert found["vector_model"], found
        top = found["hits"][0]
        assert Path(top["path"]).name == "tape-rotation.txt", found["hits"]
        assert top["vector_rank"] is not None and top["text_rank"] is not None, top

        chunks = [json.loads(line) for line in run(
            [llamad, "chat", "--user", "Name one colour.", "--max-tokens", "8",
             "--temperature", "0", "--json", *address], env, work).stdout.splitlines()]
        last = chunks[-1]
        assert last["finish_reason"] in ("stop", "length"), chunks
        assert 1 <= last["usage"]["completion_tokens"] <= 8, last
        assert "".join(c["text"] for c in chunks).strip(), chunks

        # The daemon runs the venv's code: every frame of every thread is in the venv or
        # the standard library, and it maps nothing of the checkout (its venv included).
        site = str(packaged.parents[2])
        files = stack_dump(daemon)
        assert any(f.startswith(f"{site}/daemon/") for f in files), files
        assert not [f for f in files if f.startswith(str(ROOT))], files
        maps = mapped_files(daemon.pid)
        assert any(f.startswith(site) for f in maps)
        assert not [f for f in maps if f.startswith(str(ROOT))]

        pids = [c["pid"] for c in children.values()]
        code, _ = daemon.terminate(timeout=60)
        assert code == 0, daemon.tail()
        assert not gone(pids, 10)
    finally:
        daemon.kill()
