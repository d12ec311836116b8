"""Where llamad finds llama-server: ``--llama-bin``, beside the interpreter, inside the
installed llama-cpp-python package (all a venv installed from the wheelhouse has, issue 26),
then PATH. The installed daemon finding it is tested in
tests/integration/test_wheelhouse.py."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from supervisor import find_llama_server, pick_runtime
from supervisor._runtime import BundledRuntime, LlamaServerRuntime


def executable(path: Path, mode: int = 0o755) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(mode)
    return path


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An interpreter in a venv with no llama-server beside it, an empty PATH, and an
    import path holding a llama_cpp package whose bin/ has one (as its wheel installs)."""
    monkeypatch.setattr(sys, "executable", str(tmp_path / "venv" / "bin" / "python"))
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    monkeypatch.setenv("PATH", str(tmp_path / "path"))
    site = tmp_path / "site-packages"
    executable(site / "llama_cpp" / "__init__.py", 0o644)
    executable(site / "llama_cpp" / "bin" / "llama-server")
    monkeypatch.setattr(sys, "path", [str(site)])
    monkeypatch.delitem(sys.modules, "llama_cpp", raising=False)
    importlib.invalidate_caches()
    return tmp_path


def test_the_packaged_llama_server_is_found_when_none_is_beside_the_interpreter(
        machine: Path) -> None:
    """With nothing beside the venv's python and nothing on PATH, the llama-server in the
    llama_cpp package is found, and auto picks it over the bundled runtime."""
    packaged = str(machine / "site-packages" / "llama_cpp" / "bin" / "llama-server")
    assert find_llama_server() == packaged
    runtime = pick_runtime("auto")
    assert isinstance(runtime, LlamaServerRuntime) and runtime.binary == packaged
    assert "llama_cpp" not in sys.modules  # found, not imported (no shared libraries loaded)


def test_beside_the_interpreter_comes_before_the_package(machine: Path) -> None:
    """A llama-server beside the venv's python (make llama-server's link) wins."""
    beside = executable(machine / "venv" / "bin" / "llama-server")
    assert find_llama_server() == str(beside)


def test_the_package_comes_before_path(machine: Path) -> None:
    """The package's llama-server (the llama.cpp whose options llamad allows) wins over
    one on PATH, which may be any other build."""
    executable(machine / "path" / "llama-server")
    assert find_llama_server() == str(machine / "site-packages" / "llama_cpp" / "bin" /
                                      "llama-server")


def test_a_package_without_an_executable_llama_server_falls_to_path(machine: Path) -> None:
    """A llama_cpp wheel built without llamad's hook (or a non-executable file) is passed
    over: PATH's llama-server, else none, and auto falls back to the bundled runtime."""
    (machine / "site-packages" / "llama_cpp" / "bin" / "llama-server").chmod(0o644)
    assert find_llama_server() is None
    assert isinstance(pick_runtime("auto"), BundledRuntime)
    on_path = executable(machine / "path" / "llama-server")
    assert find_llama_server() == str(on_path)


def test_no_llama_cpp_package_at_all(machine: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without llama-cpp-python installed the lookup goes on to PATH, raising nothing."""
    monkeypatch.setattr(sys, "path", [str(machine / "empty")])
    importlib.invalidate_caches()
    assert find_llama_server() is None
    with pytest.raises(FileNotFoundError, match="no llama-server binary"):
        pick_runtime("llama-server")
