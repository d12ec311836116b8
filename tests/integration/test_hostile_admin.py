"""An admin token is an API role, not a shell (issue 25, items 2 and 3), tried as a hostile
tester would, through a real gRPC server on port 0: Swap's extra_args cannot publish the
child, write a file or load one from outside the models directory (the real llama-server
child is left untouched); a configuration file or catalog entry that tries is refused at
load and on reload (the old configuration keeps serving); SetMode takes an endpoint's key
only from where the operator configured, reads nothing else, sends nothing, and its errors
quote no byte of a file.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from daemon import ConfigError, Daemon, load
from llamad_protocol.v1 import control_pb2
from llamad_protocol.v1 import inference_pb2 as pb
from tests.conftest import DEFAULT_MODEL, SMALL_MODEL, model_path
from tests.integration.test_reload import env_without_models, reloadable, write_config
from tests.support.daemon import GEN, Clients, config_env, serving
from tests.support.fake_openai import serve_fake_openai
from tests.support.modes import ENDPOINT, KEY, MakeDaemon

pytestmark = pytest.mark.integration

# What /etc/passwd starts with on every Linux: none of it may appear in an answer.
PASSWD_BYTES = ("root:", ":0:0:", "/bin/", "/root")


@pytest.fixture
async def running(llama_server: str) -> AsyncIterator[tuple[Daemon, Clients]]:
    async with serving(config_env("llama-server", LLAMAD_EMBEDDING_ENABLED="false")) as pair:
        yield pair


async def _swap(c: Clients, extra_args: str) -> list[control_pb2.SwapProgress]:
    request = control_pb2.SwapRequest(role=GEN, extra_args=extra_args)
    return [p async for p in c.control.Swap(request)]


def _write(file: Path, model: Path, text: str) -> None:
    """The reloadable configuration on ``model`` with ``text``: a [models.NAME] table
    appended, else settings added to [generation]."""
    write_config(file, model)
    body = file.read_text()
    file.write_text(body + text if text.startswith("[")
                    else body.replace("[limits]", text + "[limits]"))


async def _generate(c: Clients) -> str:
    out = [m async for m in c.inference.Generate(pb.GenerateRequest(
        prompt="The capital of France is", sampling=pb.SamplingParams(max_tokens=4)))]
    return "".join(m.text for m in out)


async def test_swap_refuses_arguments_that_reach_the_host(
        running: tuple[Daemon, Clients], tmp_path: Path) -> None:
    """--host 0.0.0.0, --log-file, --chat-template-file /etc/passwd and the other spellings
    are INVALID_ARGUMENT naming the argument; no file is written, the child keeps its pid
    and serves; a performance knob still swaps."""
    daemon, c = running
    before = await c.child(GEN)
    written = tmp_path / "child.log"
    for args, named in [
        ("--host 0.0.0.0", "--host"),
        (f"--log-file {written}", "--log-file"),
        ("--chat-template-file /etc/passwd", "--chat-template-file"),
        (f"-ngl 0 --log_file={written}", "--log_file"),
        ("--webui", "--webui"),
        ("--path /", "--path"),
        ("--tools all", "--tools"),
        ("--api-key-file /etc/shadow", "--api-key-file"),
        ("-ngl --host 0.0.0.0", "--host"),
        ("--port 8080", "--port"),
        ("--slot-save-path /tmp", "--slot-save-path"),
    ]:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _swap(c, args)
        details = err.value.details() or ""
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, args
        assert details.startswith(f"extra_args: {named}") or f"'{named}'" in details, details
        assert not any(b in details for b in PASSWD_BYTES)
    assert not written.exists()
    after = await c.child(GEN)
    assert (after.pid, after.state) == (before.pid, control_pb2.CHILD_STATE_RUNNING)
    assert after.last_swap == before.last_swap  # nothing was swapped
    assert await _generate(c)
    # What the API may pass still swaps, make-before-break, to a new child.
    stages = [p.stage for p in await _swap(c, "-ngl 0 --flash-attn off --cache-type-k f16")]
    assert stages[-1] == control_pb2.SWAP_STAGE_DONE
    swapped = await c.child(GEN)
    assert swapped.pid != before.pid
    assert daemon.children["generation"].setup.spec.extra_args == (
        "-ngl", "0", "--flash-attn", "off", "--cache-type-k", "f16")
    assert await _generate(c)


async def test_forbidden_arguments_in_files_are_refused_at_load_and_on_reload(
        tmp_path: Path, llama_server: str) -> None:
    """A role's extra_args, a catalog model's extra_args or env: refused when loading; on a
    reload the whole new configuration is refused, the running one and its child stay."""
    file = tmp_path / "llamad.toml"
    written = tmp_path / "child.log"
    small, other = model_path(SMALL_MODEL), model_path(DEFAULT_MODEL)
    bad_files = [
        (f'extra_args = "--log-file {written}"\n', "generation.extra_args: --log-file"),
        (f'[models.other]\nmodel = "{other}"\nextra_args = "--host 0.0.0.0"\n',
         "models.other.extra_args: --host"),
        (f'[models.other]\nmodel = "{other}"\nenv = {{ LLAMA_ARG_HOST = "0.0.0.0" }}\n',
         "models.other.env: LLAMA_ARG_HOST"),
        (f'[models.other]\nmodel = "{other}"\nextra_args = "--chat-template-file /etc/passwd"\n',
         "models.other.extra_args: --chat-template-file"),
    ]
    env = env_without_models()
    for text, needle in bad_files:
        _write(file, small, text)
        with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
            load(None, env=env, file=file)
    async with reloadable(file) as (daemon, c):
        before = await c.child(GEN)
        for text, needle in bad_files:
            _write(file, small, text)
            report = await daemon.reload()
            assert needle in report.error, report.error
            assert report.swapped == []
        after = await c.child(GEN)
        assert (after.pid, after.state) == (before.pid, control_pb2.CHILD_STATE_RUNNING)
        assert daemon.config.generation.extra_argv == ()
        assert daemon.config.catalog.find("other") is None
        assert not written.exists()
        assert await _generate(c)


def test_the_daemon_refuses_to_start_on_a_forbidden_argument(tmp_path: Path) -> None:
    """``llamad serve`` with a catalog model that would write a log file as the daemon's
    user exits with status 2 naming the model, the argument and why; nothing is written."""
    written = tmp_path / "child.log"
    file = tmp_path / "llamad.toml"
    file.write_text(f'[generation]\nmodel = "{model_path(SMALL_MODEL)}"\n'
                    f'[models.other]\nmodel = "{model_path(DEFAULT_MODEL)}"\n'
                    f'extra_args = "-ngl 0 --log-file {written}"\n')
    env = {**os.environ, "LLAMAD_STATE_DIR": str(tmp_path / "state"),
           "LLAMAD_LISTEN": "127.0.0.1:0", "LLAMAD_EMBEDDING_MODE": "disabled"}
    done = subprocess.run([sys.executable, "-m", "daemon", "serve", "--config", str(file)],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    assert "models.other.extra_args: --log-file is refused: it writes a file on the host" \
        in done.stderr
    assert not written.exists()


# --- SetMode's endpoint keys ------------------------------------------------------------


def _key_file(path: Path, text: str, mode: int = 0o600) -> Path:
    """``path`` holding ``text``, its permissions ``mode``."""
    path.write_text(text)
    path.chmod(mode)
    return path


async def _set_endpoint(c: Clients, url: str, *, key_file: str = "", key_env: str = ""
                        ) -> list[control_pb2.SwapProgress]:
    request = control_pb2.SetModeRequest(role=GEN, mode=ENDPOINT,
                                         endpoint=control_pb2.EndpointSettings(
                                             url=url, api_key_file=key_file,
                                             api_key_env=key_env))
    return [p async for p in c.control.SetMode(request)]


async def test_set_mode_takes_keys_only_from_configured_places(
        daemon_for: MakeDaemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A key file outside endpoint_keys.dir (/etc/passwd, a link out of the directory), one
    group- or world-readable inside it, a multi-line file, a variable outside the prefix:
    each INVALID_ARGUMENT naming the field, quoting no byte of the file, and the endpoint
    is sent nothing. A key file in the directory, closed to others, switches."""
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    os.symlink("/etc/passwd", keys / "escape.key")
    loose = _key_file(keys / "loose.key", f"{KEY}\n", 0o644)
    group = _key_file(keys / "group.key", f"{KEY}\n", 0o640)
    copied = _key_file(keys / "passwd.key", Path("/etc/passwd").read_text())
    good = _key_file(keys / "gateway.key", f"# the gateway\n{KEY}\n")
    monkeypatch.setenv("SECRET_OF_THE_DAEMON", "sk-not-for-you")
    with serve_fake_openai(key=KEY) as (url, seen):
        _, c = await daemon_for(
            LLAMAD_GENERATION_MODE="endpoint", LLAMAD_GENERATION_ENDPOINT_URL=url,
            LLAMAD_GENERATION_API_KEY_FILE=str(good), LLAMAD_EMBEDDING_MODE="disabled",
            LLAMAD_ENDPOINT_KEYS_DIR=str(keys))
        await c.wait_serving("generation", timeout=30)
        seen.clear()
        for where, needle in [
            (dict(key_file="/etc/passwd"), "endpoint.api_key_file: /etc/passwd is neither"),
            (dict(key_file=str(keys / "escape.key")), "is neither inside endpoint_keys.dir"),
            (dict(key_file=f"{keys}/../keys/../../../etc/passwd"), "is neither inside"),
            (dict(key_file=str(loose)), "readable or writable by group or others"),
            (dict(key_file=str(group)), "readable or writable by group or others"),
            (dict(key_file=str(copied)), "is not a key file"),
            (dict(key_env="SECRET_OF_THE_DAEMON"),
             "endpoint.api_key_env: SECRET_OF_THE_DAEMON does not begin with "
             "endpoint_keys.env_prefix LLAMAD_ENDPOINT_KEY_"),
            (dict(key_env="HOME"), "does not begin with endpoint_keys.env_prefix"),
            (dict(key_env="LLAMAD_ENDPOINT_KEY_UNSET"), "is not set or empty"),
        ]:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await _set_endpoint(c, url, **where)
            details = err.value.details() or ""
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (where, details)
            assert needle in details, details
            assert not any(b in details for b in PASSWD_BYTES), details
            assert "found" not in details, details
            assert "sk-not-for-you" not in details
        assert seen == []  # nothing was sent anywhere
        # A key of the directory, and one of the prefix, switch (the endpoint sees it).
        assert (await _set_endpoint(c, url, key_file=str(good)))[-1].stage == \
            control_pb2.SWAP_STAGE_DONE
        monkeypatch.setenv("LLAMAD_ENDPOINT_KEY_GATEWAY", KEY)
        assert (await _set_endpoint(c, url, key_env="LLAMAD_ENDPOINT_KEY_GATEWAY"))[-1].stage \
            == control_pb2.SWAP_STAGE_DONE
        assert seen and all(auth == f"Bearer {KEY}" for _, _, auth in seen)


async def test_set_mode_without_a_key_dir_takes_only_the_configured_file(
        daemon_for: MakeDaemon, tmp_path: Path) -> None:
    """With endpoint_keys.dir unset, a key file is refused unless the configuration names
    it (a file beside it, closed to others, is still refused)."""
    named = _key_file(tmp_path / "named.key", f"{KEY}\n")
    beside = _key_file(tmp_path / "beside.key", f"{KEY}\n")
    with serve_fake_openai(key=KEY) as (url, seen):
        _, c = await daemon_for(
            LLAMAD_GENERATION_MODE="endpoint", LLAMAD_GENERATION_ENDPOINT_URL=url,
            LLAMAD_GENERATION_API_KEY_FILE=str(named), LLAMAD_EMBEDDING_MODE="disabled")
        await c.wait_serving("generation", timeout=30)
        seen.clear()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _set_endpoint(c, url, key_file=str(beside))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "inside endpoint_keys.dir (not set)" in (err.value.details() or "")
        assert seen == []
        assert (await _set_endpoint(c, url, key_file=str(named)))[-1].stage == \
            control_pb2.SWAP_STAGE_DONE
