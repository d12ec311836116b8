"""What the operator reads, rendered from the registry: the ``serve`` flags with their
``--help`` (:func:`add_arguments`) and a reference configuration file listing every option
at its default (:func:`example_config`)."""

from __future__ import annotations

import argparse
import json
import textwrap
from typing import Any

from ._sections import OPTIONS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every option as a flag (with its env variable and default in the help)."""
    parser.add_argument("--config", metavar="FILE",
                        help="TOML configuration file (env LLAMAD_CONFIG).")
    groups: dict[str, argparse._ArgumentGroup] = {}
    for opt in OPTIONS:
        section = opt.key.split(".")[0] if "." in opt.key else "daemon"
        group = groups.setdefault(section, parser.add_argument_group(section))
        default = "" if opt.default in ("", ()) else f" Default: {opt.default}."
        text = f"{opt.help}{default} Env: {opt.env}."
        if opt.kind is bool:
            group.add_argument(opt.flag, dest=opt.dest, default=None,
                               action=argparse.BooleanOptionalAction, help=text)
        else:
            group.add_argument(opt.flag, dest=opt.dest, default=None, help=text,
                               metavar=opt.key.split(".")[-1].upper(),
                               choices=opt.choices or None)


def _toml(value: Any) -> str:
    """``value`` as a TOML value (a JSON string is a TOML basic string)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(list(value) if isinstance(value, tuple) else value)


def example_config(width: int = 88) -> str:
    """A TOML file that lists every option, commented out at its default, under its help,
    its choices, its minimum and its environment variable; top-level options first, then
    one table per section."""
    top = [o for o in OPTIONS if "." not in o.key]
    lines = ["# llamad: every option at its default (uncomment to change one).",
             "# Precedence: flag > environment > this file > default."]
    section = ""
    for opt in top + [o for o in OPTIONS if "." in o.key]:
        head, _, name = opt.key.rpartition(".")
        if head != section:
            section = head
            lines += ["", f"[{section}]"]
        notes = [f"One of: {', '.join(opt.choices)}."] if opt.choices else []
        if opt.minimum is not None:
            notes.append(f"At least {opt.minimum:g}.")
        text = " ".join([opt.help, *notes, f"Env: {opt.env}."])
        lines += ["", *textwrap.wrap(text, width, initial_indent="# ",
                                     subsequent_indent="# ")]
        lines.append(f"# {name} = {_toml(opt.default)}")
    return "\n".join(lines) + "\n"
