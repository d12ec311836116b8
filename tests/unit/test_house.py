"""The shape of the shipped packages (issue 26): folders a reader can take in at a glance,
parts that import only the parts below them, no import cycle at run time.

Read from the source with :mod:`ast`, nothing imported: an import under ``if
TYPE_CHECKING:`` is for the type checker only and does not count; one inside a function
runs later and counts for the layering, not for cycles at import time.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("daemon", "retrieval", "supervisor", "clients", "models", "llamad_protocol")
MAX_MODULES_PER_FOLDER = 25

# Each package's parts, lowest first: a part imports only from itself and the parts
# before it. "" is the package's own __init__.
LAYERS = {
    "daemon": ("config", "telemetry", "errors", "checks", "models", "services", "ops",
               "grpcapi", "httpapi", "console", "server", "cli", "__main__", ""),
    "retrieval": ("errors", "redaction", "extraction", "chunking", "_limits", "_status",
                  "store", "_interface", "_embedder", "_sizing", "_backfill", "postgres",
                  "_backend", "search", "_later", "_review", "_retention", "_retriever_sources",
                  "_ingest", "_retriever", "_scan_report", "_scan", "_watch", "_migrate", ""),
}


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    is_package: bool


@dataclass(frozen=True)
class Import:
    target: str
    at_import_time: bool  # at module level, not inside a function


def _modules() -> dict[str, Module]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                continue
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            name = ".".join(parts[:-1] if is_package else parts)
            found[name] = Module(name, path, is_package)
    return found


MODULES = _modules()


def _type_checking_only(tree: ast.Module) -> set[int]:
    hidden: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            hidden.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    return hidden


def _in_functions(tree: ast.Module) -> set[int]:
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            inside.update(id(inner) for inner in ast.walk(node) if inner is not node)
    return inside


def imports_of(module: Module) -> Iterator[Import]:
    """The project modules ``module`` imports at run time (``from . import x`` names the
    submodule x, not the package it is taken from)."""
    tree = ast.parse(module.path.read_text(encoding="utf-8"))
    hidden = _type_checking_only(tree)
    later = _in_functions(tree)
    here = module.name.split(".") if module.is_package else module.name.split(".")[:-1]
    for node in ast.walk(tree):
        if id(node) in hidden:
            continue
        now = id(node) not in later
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[:len(here) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            submodules = [a for a in node.names if f"{source}.{a.name}" in MODULES]
            yield from (Import(f"{source}.{a.name}", now) for a in submodules)
            if source in MODULES and len(submodules) < len(node.names):
                yield Import(source, now)
        elif isinstance(node, ast.Import):
            yield from (Import(a.name, now) for a in node.names if a.name in MODULES)


def test_no_folder_holds_more_than_25_modules() -> None:
    crowded = {}
    for package in PACKAGES:
        for folder in [ROOT / package, *(p for p in (ROOT / package).rglob("*") if p.is_dir())]:
            if folder.name == "__pycache__":
                continue
            count = sum(1 for p in folder.glob("*.py") if not p.name.endswith("_pb2.py")
                        and not p.name.endswith("_pb2_grpc.py"))
            if count > MAX_MODULES_PER_FOLDER:
                crowded[str(folder.relative_to(ROOT))] = count
    assert crowded == {}


def test_no_import_cycle_at_import_time() -> None:
    graph = {name: {i.target for i in imports_of(m) if i.at_import_time}
             for name, m in MODULES.items()}
    state: dict[str, int] = {}  # 1: on the path being walked, 2: done
    cycles: list[list[str]] = []

    def walk(name: str, path: list[str]) -> None:
        state[name] = 1
        for target in sorted(graph[name]):
            if state.get(target) == 1:
                cycles.append([*path[path.index(target):], target])
            elif target not in state:
                walk(target, [*path, target])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            walk(name, [name])
    assert cycles == []


def _part(package: str, name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_parts_import_only_parts_below_them(package: str) -> None:
    order = LAYERS[package]
    unlisted, upward = set(), []
    for name, module in MODULES.items():
        if name != package and not name.startswith(package + "."):
            continue
        part = _part(package, name)
        for imp in imports_of(module):
            if imp.target != package and not imp.target.startswith(package + "."):
                continue
            target = _part(package, imp.target)
            if target == part:
                continue
            if part not in order or target not in order:
                unlisted.update({part, target} - set(order))
            elif order.index(target) > order.index(part):
                upward.append(f"{name} -> {imp.target}")
    assert unlisted == set(), "a new part of the package: place it in LAYERS"
    assert upward == []


def test_the_checks_see_real_imports() -> None:
    """The reader finds what it must: a relative import, a submodule imported by name,
    one inside a function, and none of those only under TYPE_CHECKING."""
    server = {i.target: i.at_import_time for i in imports_of(MODULES["daemon.server"])}
    assert server.get("daemon.models.pool") is True
    routes = {i.target for i in imports_of(MODULES["daemon.httpapi._routes"])}
    assert "daemon.httpapi._parse" in routes
    assert "daemon.httpapi" not in routes
    cli = {i.target: i.at_import_time for i in imports_of(MODULES["daemon.cli"])}
    assert cli.get("daemon.server") is False
    package = {i.target: i.at_import_time for i in imports_of(MODULES["daemon"])}
    assert package.get("daemon.server") is False  # only in __getattr__ and TYPE_CHECKING
