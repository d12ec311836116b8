"""The air-gapped install: everything from the wheelhouse, with every package index off."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SMALL_MODEL

pytestmark = pytest.mark.integration


def test_install_and_prepare_from_wheelhouse_without_any_index(tmp_path: Path) -> None:
    """A fresh venv installs llamad from the wheelhouse alone and prepares a model offline."""
    wheelhouse = os.environ.get("LLAMAD_WHEELHOUSE")
    if not wheelhouse or not Path(wheelhouse).is_dir():
        pytest.fail("no wheelhouse: run `make wheelhouse` (make test builds it and sets "
                    "LLAMAD_WHEELHOUSE)")
    # No config file: the machine's pip.conf may name extra indexes or find-links.
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1",
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    for key in ("PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "LLAMAD_CACHE"):
        env.pop(key, None)
    env["LLAMAD_CACHE"] = str(tmp_path / "cache")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = str(venv / "bin" / "python")
    subprocess.run([py, "-m", "pip", "install", "--quiet", "--no-index", "--find-links",
                    wheelhouse, "llamad"], check=True, env=env, timeout=600)
    check = subprocess.run(
        [py, "-c", "import llama_cpp.server.app, hnswlib, tantivy, grpc, prometheus_client, "
                   "daemon, supervisor, models; print(supervisor.LLAMAD_PACKAGE)"],
        capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path, check=False)
    assert check.returncode == 0, check.stderr
    assert check.stdout.strip() == "True"
    assert str(venv) in subprocess.run(
        [py, "-c", "import supervisor; print(supervisor.__file__)"], capture_output=True,
        text=True, env=env, cwd=tmp_path, check=True).stdout  # not the source tree
    help_run = subprocess.run([str(venv / "bin" / "llamad"), "serve", "--help"],
                              capture_output=True, text=True, env=env, timeout=60,
                              cwd=tmp_path, check=False)
    assert help_run.returncode == 0
    assert "--generation-model" in help_run.stdout
    dest = tmp_path / "models"
    prepare = subprocess.run(
        [py, "-m", "models", "prepare", "--find-links", wheelhouse, "--dest", str(dest),
         "--model", SMALL_MODEL],
        capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path, check=False)
    assert prepare.returncode == 0, prepare.stderr
    assert (dest / SMALL_MODEL).stat().st_size > 90_000_000
