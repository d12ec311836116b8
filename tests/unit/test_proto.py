"""The committed generated code: current with ``proto/``, imports package-relative, its
runtime version requirements matched by pyproject's bounds, and llamad's own top-level
packages the ones imported."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import tomllib
import types
from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2

import clients
import daemon
import supervisor
from daemon import cli
from daemon.grpcapi.health import HealthReporter
from llamad_protocol.v1 import answer_pb2, control_pb2, inference_pb2, retrieval_pb2, wire

ROOT = Path(__file__).resolve().parents[2]
PB = ROOT / "llamad_protocol" / "v1"


def load_generator() -> types.ModuleType:
    """Import ``proto/generate.py`` by path (``proto/`` is not a package)."""
    spec = importlib.util.spec_from_file_location("llamad_proto_generate",
                                                  ROOT / "proto" / "generate.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def lower_bound(name: str) -> tuple[int, ...]:
    """The ``>=`` bound of ``name`` in pyproject's [project] dependencies."""
    with open(ROOT / "pyproject.toml", "rb") as fh:
        deps = tomllib.load(fh)["project"]["dependencies"]
    bounds = [m.group(1) for dep in deps
              if (m := re.fullmatch(rf"{re.escape(name)}(?:\[[\w,]+\])?\s*>=\s*([\d.]+)", dep))]
    assert len(bounds) == 1, f"{name} has no single >= bound in {deps}"
    return version(bounds[0])


# --- (a) the generated code is current -------------------------------------------------


@pytest.mark.process
def test_generate_check_passes_on_committed_code() -> None:
    """``proto/generate.py --check`` finds the committed stubs identical to a regeneration."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "proto" / "generate.py"), "--check"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# protoc starts mypy-protobuf's plugins as child processes.
@pytest.mark.process
def test_generator_output_changes_with_the_proto(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control: renaming a field in a copy of the protos changes the generated code."""
    gen = load_generator()
    committed = (PB / "inference_pb2.py").read_text()
    shutil.copytree(ROOT / "proto" / "llamad", tmp_path / "llamad")
    monkeypatch.setattr(gen, "PROTO_ROOT", tmp_path)
    assert gen.generate()["inference_pb2.py"] == committed  # the copy alone changes nothing

    proto = tmp_path / "llamad" / "v1" / "inference.proto"
    text = proto.read_text()
    assert text.count("  string prompt = 1;") == 1
    proto.write_text(text.replace("  string prompt = 1;", "  string prompt_text = 1;"))
    renamed = gen.generate()
    assert renamed["inference_pb2.py"] != committed
    assert "prompt_text" in renamed["inference_pb2.pyi"]
    assert renamed["common_pb2.py"] == (PB / "common_pb2.py").read_text()


# protoc starts mypy-protobuf's plugins as child processes.
@pytest.mark.process
def test_check_mode_fails_on_stale_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Negative control: ``--check`` returns 1 and names the file when one stub differs."""
    gen = load_generator()
    out = tmp_path / "v1"
    shutil.copytree(PB, out, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(gen, "OUT", out)
    monkeypatch.setattr(sys, "argv", ["generate.py", "--check"])
    assert gen.main() == 0

    stale = out / "control_pb2.pyi"
    stale.write_text(stale.read_text() + "# hand edit\n")
    assert gen.main() == 1
    assert "control_pb2.pyi" in capsys.readouterr().out


# --- (b) version bounds ----------------------------------------------------------------


def test_grpcio_bound_covers_generated_version() -> None:
    """pyproject's grpcio lower bound is at least every stub's GRPC_GENERATED_VERSION."""
    files = sorted(PB.glob("*_pb2_grpc.py"))
    assert files
    for path in files:
        found = re.findall(r"^GRPC_GENERATED_VERSION = '([\d.]+)'$", path.read_text(), re.M)
        assert len(found) == 1, path.name
        assert lower_bound("grpcio") >= version(found[0]), path.name


def test_protobuf_bound_covers_gencode_version() -> None:
    """pyproject's protobuf lower bound is at least every stub's gencode runtime version."""
    files = sorted(PB.glob("*_pb2.py"))
    assert files
    pattern = re.compile(
        r"ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,\s*"
        r"(\d+),\s*(\d+),\s*(\d+),"
    )
    for path in files:
        found = pattern.findall(path.read_text())
        assert len(found) == 1, path.name
        assert lower_bound("protobuf") >= tuple(int(n) for n in found[0]), path.name


def test_lower_bound_parser_reads_pyproject() -> None:
    """The bound parser finds the real bounds (guards the two tests above against vacuity)."""
    assert lower_bound("grpcio") >= (1, 0)
    assert lower_bound("protobuf") >= (3, 0)
    assert lower_bound("llama-cpp-python") >= (0, 1)


# --- (c) package-relative imports ------------------------------------------------------


def test_generated_imports_are_package_relative() -> None:
    """No generated file imports a top-level ``llamad`` package; siblings import as ``.``."""
    files = sorted(PB.glob("*.py*"))
    assert len(files) >= 9
    absolute = re.compile(r"^\s*(from|import)\s+llamad\b", re.M)
    for path in files:
        assert not absolute.search(path.read_text()), path.name
    assert "from . import common_pb2" in (PB / "inference_pb2.py").read_text()


# --- (d) and (e) our packages, not namesakes -------------------------------------------


@pytest.mark.parametrize("module", [supervisor, daemon, clients])
def test_packages_resolve_inside_the_repo(module: types.ModuleType) -> None:
    """supervisor, daemon and clients are imported from this repository, not site-packages."""
    assert module.__file__ is not None
    path = Path(module.__file__).resolve()
    assert path.is_relative_to(ROOT), path
    assert "site-packages" not in path.relative_to(ROOT).parts


def test_supervisor_is_llamads() -> None:
    """The imported supervisor package carries llamad's marker."""
    assert supervisor.LLAMAD_PACKAGE is True
    assert cli._check_packages() is None


def test_check_packages_refuses_a_namesake(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``supervisor`` module without llamad's marker (supervisord's) is reported."""
    impostor = types.ModuleType("supervisor")
    impostor.__file__ = "/usr/lib/python3/dist-packages/supervisor/__init__.py"
    monkeypatch.setitem(sys.modules, "supervisor", impostor)
    problem = cli._check_packages()
    assert problem is not None
    assert "is not llamad's" in problem
    assert impostor.__file__ in problem


def test_check_packages_reports_an_unimportable_supervisor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A ``supervisor`` that cannot be imported is reported, not raised."""
    monkeypatch.setitem(sys.modules, "supervisor", None)
    problem = cli._check_packages()
    assert problem is not None
    assert problem.startswith("cannot import llamad's supervisor package")


# --- (f) the hand-written wire constants -----------------------------------------------


def test_wire_service_names_match_the_protos() -> None:
    """The service names in ``wire.py`` are the generated descriptors' full names, and the
    health names llamad reports include every one but AnswerService (no health entry)."""
    def full(module: types.ModuleType, name: str) -> str:
        return str(module.DESCRIPTOR.services_by_name[name].full_name)

    assert full(inference_pb2, "InferenceService") == wire.INFERENCE_SERVICE
    assert full(control_pb2, "ControlService") == wire.CONTROL_SERVICE
    assert full(retrieval_pb2, "RetrievalService") == wire.RETRIEVAL_SERVICE
    assert full(answer_pb2, "AnswerService") == wire.ANSWER_SERVICE
    assert full(health_pb2, "Health") == wire.HEALTH_SERVICE
    assert len(set(wire.HEALTH_NAMES)) == len(wire.HEALTH_NAMES) == 6


def test_daemon_reports_exactly_the_wire_health_names() -> None:
    """``daemon/grpcapi/health.py`` reports every name of ``wire.HEALTH_NAMES`` and no other."""
    assert set(HealthReporter().statuses()) == set(wire.HEALTH_NAMES)


@pytest.mark.process
def test_protocol_package_imports_neither_side() -> None:
    """``llamad_protocol`` imports no llamad package: a client-only install can carry it."""
    code = ("import sys, llamad_protocol.v1.wire; "
            "from llamad_protocol.v1 import inference_pb2_grpc, answer_pb2_grpc; "
            "bad = [m for m in ('daemon', 'clients', 'supervisor', 'retrieval', 'models') "
            "if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
