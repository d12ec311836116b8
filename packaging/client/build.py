"""Build the ``llamad-client`` wheel: the ``clients`` and ``llamad_protocol`` packages alone.

    python packaging/client/build.py --wheel-dir wheelhouse

Another tool that talks to llamad installs this instead of ``llamad``, without
llama-cpp-python, hnswlib, tantivy or the daemon. One pyproject.toml holds one project, and
setuptools builds only packages inside the project's directory, so this script stages a
project in a temporary directory (copies of ``clients/`` and ``llamad_protocol/`` beside a
pyproject written here) and has pip build it there, offline (``--no-build-isolation``: the
setuptools of this interpreter). Version and dependency bounds are the root
pyproject's, so the two distributions cannot drift.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAME = "llamad-client"
PACKAGES = ("clients", "llamad_protocol")
# What the client needs at run time (the health client; google.rpc comes with grpcio-status;
# tqdm for the progress of the CLI verbs the wheel ships in clients/cli).
DEPENDENCIES = ("grpcio", "grpcio-health-checking", "grpcio-status", "protobuf", "tqdm")


def pyproject() -> str:
    """The client project's pyproject.toml, from the root one's version and bounds."""
    with open(ROOT / "pyproject.toml", "rb") as fh:
        project = tomllib.load(fh)["project"]
    deps = [dep for dep in project["dependencies"]
            if (m := re.match(r"[A-Za-z0-9_.-]+", dep)) and m.group(0) in DEPENDENCIES]
    if len(deps) != len(DEPENDENCIES):
        raise SystemExit(f"the root pyproject lacks one of {DEPENDENCIES}: {deps}")
    return f"""\
[build-system]
requires = ["setuptools>=77"]
build-backend = "setuptools.build_meta"

[project]
name = "{NAME}"
version = "{project["version"]}"
description = "Python client of llamad (sync and asyncio), its gRPC stubs and wire constants"
readme = "README.md"
requires-python = "{project["requires-python"]}"
license = "{project["license"]}"
dependencies = {json.dumps(deps)}

[tool.setuptools.packages.find]
include = {json.dumps([f"{p}*" for p in PACKAGES])}

[tool.setuptools.package-data]
"*" = ["py.typed"]
"""


def build(wheel_dir: Path) -> Path:
    """Build the wheel into ``wheel_dir``; return its path."""
    wheel_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="llamad-client-") as tmp:
        stage = Path(tmp)
        for package in PACKAGES:
            shutil.copytree(ROOT / package, stage / package,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        shutil.copy(Path(__file__).with_name("README.md"), stage / "README.md")
        (stage / "pyproject.toml").write_text(pyproject())
        out = stage / "dist"
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                        "--no-build-isolation", "--no-index", "--wheel-dir", str(out),
                        str(stage)], check=True, timeout=600)
        (built,) = out.glob("llamad_client-*.whl")
        target = wheel_dir / built.name
        shutil.copy(built, target)
    return target


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel-dir", type=Path, required=True)
    print(build(parser.parse_args().wheel_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
