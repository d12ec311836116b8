"""Process hygiene at the edges: stopping a child is cancellation-safe both ways (the child
is still killed and reaped and its socket removed, and the caller's own cancellation is not
swallowed), and a child dies with its daemon whether or not setpriv is installed."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from supervisor._child import ProcessChild, Timeouts
from supervisor._client import ApiShape, InferenceClient
from supervisor._clock import SystemClock
from supervisor._logring import LogRing
from supervisor._process import ChildProcess
from supervisor._transport import ChildAddress
from tests.conftest import ROOT
from tests.support.load import patience

pytestmark = pytest.mark.process  # real child processes

# Ignores SIGTERM, so only the SIGKILL after the grace period stops it.
STUBBORN = "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); " \
           "print('up', flush=True); time.sleep(60)"


async def test_cancelling_stop_propagates_and_still_reaps_the_child(tmp_path: Path) -> None:
    """A stop() cancelled while it waits out the grace period raises CancelledError in
    the caller; the child is killed and reaped anyway, and its socket file is removed."""
    ring = LogRing()
    process = await ChildProcess.spawn([sys.executable, "-c", STUBBORN], ring=ring)
    # Until it prints "up" it does not ignore SIGTERM yet, and stop() would end at once.
    async with asyncio.timeout(patience(10)):
        async for line in ring.follow():
            if line.text == "up":
                break
    sock = tmp_path / "c.sock"
    sock.touch()  # what a child leaves behind
    client = InferenceClient(ChildAddress.BASE_URL, model_id="m",
                             api=ApiShape("/health", "/tokenize", "content", None),
                             child=ChildAddress(str(sock), "k"))
    child = ProcessChild(process, client, sock, SystemClock(), Timeouts(stop_grace=1.0))
    stopping = asyncio.create_task(child.stop())
    await asyncio.sleep(0.2)
    stopping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopping
    code = await asyncio.wait_for(process.wait(), patience(5))  # the shielded kill goes on
    assert code != 0
    await asyncio.sleep(0)  # the shielded stop's last step: the socket goes once reaped
    for _ in range(100):
        if not sock.exists():
            break
        await asyncio.sleep(0.01)
    assert not sock.exists()
    with pytest.raises(ProcessLookupError):
        os.kill(process.pid, 0)


@pytest.mark.parametrize("setpriv", [True, False], ids=["setpriv", "prctl-prelude"])
def test_a_child_dies_with_its_daemon_with_or_without_setpriv(
        tmp_path: Path, setpriv: bool) -> None:
    """A child spawned by a process that is then SIGKILLed dies too: through setpriv, and
    through the prctl prelude on a machine without setpriv (PATH without it)."""
    if setpriv and shutil.which("setpriv") is None:
        pytest.skip("util-linux setpriv is not installed here")
    pidfile = tmp_path / "child.pid"
    parent = (
        "import asyncio, sys\n"
        "from supervisor._logring import LogRing\n"
        "from supervisor._process import ChildProcess, pdeathsig_method\n"
        "CHILD = 'import os, sys, time; open(sys.argv[1], \"w\").write(str(os.getpid())); "
        "time.sleep(60)'\n"
        "async def main():\n"
        "    assert pdeathsig_method() == sys.argv[2], pdeathsig_method()\n"
        "    await ChildProcess.spawn([sys.executable, '-c', CHILD, sys.argv[1]],\n"
        "                             ring=LogRing())\n"
        "    await asyncio.sleep(60)\n"
        "asyncio.run(main())\n"
    )
    env = dict(os.environ)
    if not setpriv:
        bare = tmp_path / "bin"  # sh only: no setpriv anywhere on PATH
        bare.mkdir()
        (bare / "sh").symlink_to(shutil.which("sh") or "/bin/sh")
        env["PATH"] = str(bare)
    daemon = subprocess.Popen(
        [sys.executable, "-c", parent, str(pidfile), "setpriv" if setpriv else "prctl"],
        env=env, cwd=ROOT)
    try:
        deadline = time.monotonic() + 20
        while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
            assert daemon.poll() is None, "the parent exited early"
            time.sleep(0.05)
        child = int(pidfile.read_text())
        daemon.kill()
        daemon.wait(10)
        for _ in range(100):
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            os.kill(child, signal.SIGKILL)
            pytest.fail("the child outlived its parent")
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
