"""A child answers only the daemon (issue 25): a real child of each runtime, in a running
daemon, tried as another local user (uid 65534 through setpriv), as a process of ours
without the key, and with the key where the debugging endpoints stay closed; llamad's own
calls still work through it all."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
from pathlib import Path

import grpc
import pytest

from llamad_protocol.v1 import inference_pb2 as pb
from tests.conftest import RUNTIMES
from tests.support.child_http import child_http, child_key
from tests.support.daemon import GEN, config_env, serving

pytestmark = pytest.mark.integration

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
# Run as uid 65534 by the system's Python (stdlib only): what another local user gets.
PROBE = """
import json, os, socket, sys
path, pid = sys.argv[1], sys.argv[2]
out = {}
def attempt(name, call):
    try:
        call()
        out[name] = "ok"
    except OSError as exc:
        out[name] = type(exc).__name__
attempt("listdir", lambda: os.listdir(os.path.dirname(path)))
attempt("stat", lambda: os.stat(path))
attempt("connect", lambda: socket.socket(socket.AF_UNIX).connect(path))
attempt("environ", lambda: open(f"/proc/{pid}/environ", "rb").read())
print(json.dumps(out))
"""


def tcp_listeners(pid: int) -> list[str]:
    """The TCP sockets (IPv4 and IPv6) process ``pid`` listens on, as /proc/net shows them."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                found.append(f"{table}: {cols[1]}")
    return found


@pytest.fixture(params=RUNTIMES)
def runtime(request: pytest.FixtureRequest, llama_server: str) -> str:
    return str(request.param)


async def test_a_child_answers_only_the_daemon(runtime: str) -> None:
    """The child listens on no TCP port, only on a socket in a 0700 directory of ours;
    another uid can neither list that directory, nor reach the socket, nor read the key
    from the child's environment; the key is not on its command line; without it our own
    request is 401; with it /slots, the web UI (or the bundled server's API docs) and CORS
    stay closed; llamad's Generate, Chat, Tokenize and Detokenize (a round trip; an id
    outside the vocabulary refused before the child) are served; the socket is gone with
    the child."""
    env = config_env(runtime, LLAMAD_EMBEDDING_ENABLED="false")
    async with serving(env, "generation") as (_, c):
        gen = await c.child(GEN)
        sock = Path(gen.socket)
        assert gen.port == 0 and sock.suffix == ".sock"
        info = sock.parent.lstat()
        assert stat.S_ISDIR(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o700
        assert info.st_uid == os.geteuid()
        assert tcp_listeners(gen.pid) == []

        probe = await asyncio.to_thread(
            subprocess.run, [*NOBODY, "/usr/bin/python3", "-c", PROBE, str(sock), str(gen.pid)],
            capture_output=True, text=True, timeout=30, check=True)
        assert json.loads(probe.stdout) == {"listdir": "PermissionError",
                                            "stat": "PermissionError",
                                            "connect": "PermissionError",
                                            "environ": "PermissionError"}, probe.stderr

        key = child_key(gen.pid)
        assert len(key) >= 40
        assert key.encode() not in Path(f"/proc/{gen.pid}/cmdline").read_bytes()

        body = {"prompt": "Hello", "max_tokens": 1}
        async with child_http(gen.socket, gen.pid, key=False) as http:
            assert (await http.post("/v1/completions", json=body)).status_code == 401
            assert (await http.get("/v1/models")).status_code == 401
        async with child_http(gen.socket, gen.pid) as http:
            assert (await http.post("/v1/completions", json=body)).status_code == 200
            page = "http://localhost:8000"
            models = await http.get("/v1/models", headers={"Origin": page})
            assert models.status_code == 200
            assert models.headers.get("access-control-allow-origin") not in (page, "*")
            if runtime == "llama-server":
                slots = await http.get("/slots")
                assert slots.status_code == 501, slots.text  # --no-slots
                assert (await http.get("/")).status_code == 404  # no web UI
            else:
                assert (await http.get("/docs")).status_code == 404
                assert (await http.get("/openapi.json")).status_code == 404

        out = [m async for m in c.inference.Generate(pb.GenerateRequest(
            prompt="Hello", sampling=pb.SamplingParams(max_tokens=4)))]
        assert "".join(m.text for m in out)
        chat = [m async for m in c.inference.Chat(pb.ChatRequest(
            messages=[pb.ChatMessage(role=pb.CHAT_ROLE_USER, content="Hi")],
            sampling=pb.SamplingParams(max_tokens=4)))]
        assert "".join(m.text for m in chat)
        tokens = await c.inference.Tokenize(pb.TokenizeRequest(text="Héllo wörld 🎉"))
        assert tokens.count >= 2
        text = await c.inference.Detokenize(pb.DetokenizeRequest(tokens=tokens.tokens))
        assert text.text == "Héllo wörld 🎉"
        with pytest.raises(grpc.aio.AioRpcError) as refused:  # never sent to the child
            await c.inference.Detokenize(pb.DetokenizeRequest(tokens=[1, 4_000_000_000]))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "4000000000 is not a token id" in str(refused.value.details())
        assert (await c.inference.Tokenize(pb.TokenizeRequest(text="still"))).count
    assert not sock.exists()


async def test_the_daemon_users_llama_cpp_config_never_reaches_a_child(
        llama_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """llama.cpp applies ${XDG_CONFIG_HOME:-~/.config}/llama.cpp/config.ini before its
    arguments (a config there can set --log-file: the control below shows it does); a
    child's XDG_CONFIG_HOME is its own private directory, so the daemon user's file is
    never read."""
    config = tmp_path / "config"
    (config / "llama.cpp").mkdir(parents=True)
    leak = tmp_path / "leak.log"
    (config / "llama.cpp" / "config.ini").write_text(f"log-file = {leak}\n")
    control = await asyncio.to_thread(
        subprocess.run, [llama_server, "--version"], capture_output=True, timeout=60,
        env={**os.environ, "XDG_CONFIG_HOME": str(config)}, check=False)
    assert leak.exists(), control.stderr  # the vector is real
    leak.unlink()

    env = config_env("llama-server", LLAMAD_EMBEDDING_ENABLED="false")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))  # the daemon's own environment
    async with serving(env, "generation") as (_, c):
        gen = await c.child(GEN)
        environ = Path(f"/proc/{gen.pid}/environ").read_bytes().split(b"\0")
        assert f"XDG_CONFIG_HOME={Path(gen.socket).parent}".encode() in environ
        out = [m async for m in c.inference.Generate(pb.GenerateRequest(
            prompt="Hello", sampling=pb.SamplingParams(max_tokens=2)))]
        assert out
    assert not leak.exists()
