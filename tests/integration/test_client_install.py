"""The client-only install: ``llamad-client`` from its wheel, with every package index off,
in a fresh venv that then has no daemon, no llama.cpp and no retrieval engines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.load import patience

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.process, pytest.mark.timeout(patience(180))]

# Run inside the client venv, from a directory outside the source tree.
PROBE = """
import importlib.util, json
absent = ["llama_cpp", "hnswlib", "tantivy", "daemon", "retrieval", "supervisor", "models"]
present = [m for m in absent if importlib.util.find_spec(m) is not None]
import clients, llamad_protocol
from clients import Client
from clients.testing import FakeLlamad
from clients.cli import _progress  # the CLI verbs the wheel ships: their imports resolve
from llamad_protocol.v1 import inference_pb2, inference_pb2_grpc, wire
with FakeLlamad() as fake, Client(fake.address) as llamad:
    state = llamad.status().child("generation").state
    chunks = list(llamad.generate("Hello", max_tokens=4))
print(json.dumps({
    "present": present,
    "files": [clients.__file__, llamad_protocol.__file__],
    "state": state,
    "text": "".join(c.text for c in chunks),
    "finish": chunks[-1].finish_reason,
    "retry_key": wire.RETRY_AFTER_KEY,
}))
"""


def test_client_wheel_installs_alone_and_talks_to_a_fake_llamad(tmp_path: Path) -> None:
    """``llamad-client`` installs offline from its wheel and the wheelhouse, pulls in none of
    the daemon's packages, and its Client reaches a FakeLlamad (status, generate)."""
    wheelhouse = os.environ.get("LLAMAD_WHEELHOUSE")
    if not wheelhouse or not Path(wheelhouse).is_dir():
        pytest.fail("no wheelhouse: run `make wheelhouse` (make test builds it and sets "
                    "LLAMAD_WHEELHOUSE)")
    # The wheel of this checkout (the wheelhouse's may be older), built as make wheelhouse does.
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, str(ROOT / "packaging" / "client" / "build.py"),
                    "--wheel-dir", str(wheels)], check=True, timeout=120)
    # No config file: the machine's pip.conf may name extra indexes or find-links.
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1",
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    for key in ("PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PYTHONPATH"):
        env.pop(key, None)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = str(venv / "bin" / "python")
    subprocess.run([py, "-m", "pip", "install", "--quiet", "--no-index", "--find-links",
                    str(wheels), "--find-links", wheelhouse, "llamad-client"],
                   check=True, env=env, timeout=240)
    run = subprocess.run([py, "-c", PROBE], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout)
    assert found["present"] == []
    assert all(str(venv) in path for path in found["files"])  # not the source tree
    assert found["state"] == "running"
    assert found["text"]
    assert found["finish"] in {"stop", "length"}
    assert found["retry_key"] == "retry-after-ms"
