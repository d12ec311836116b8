"""The operator contract, pinned: every option's TOML key, flag, environment variable,
type, default, choices and minimum, compared with a committed golden file.

A change here is a change to what operators type: renaming or removing an option breaks
their configuration files, units and scripts. When the change is intended, regenerate
the file (``python -m tests.unit.test_config_contract``) and say so in the commit.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from daemon.config import OPTIONS, Option, add_arguments

GOLDEN = Path(__file__).resolve().parent.parent / "data" / "config-options.txt"


def _row(opt: Option) -> str:
    kind = opt.kind.__name__
    default = "''" if opt.default == "" else repr(opt.default)
    if opt.key.endswith(".threads"):
        default = "<cpu count>"  # os.cpu_count(): differs between machines
    parts = [opt.key, opt.flag, opt.env, kind, f"default={default}"]
    if opt.choices:
        parts.append(f"choices={'|'.join(opt.choices)}")
    if opt.minimum is not None:
        parts.append(f"min={opt.minimum:g}")
    return "  ".join(parts)


def render() -> str:
    """One line per option, in declaration order."""
    return "\n".join(_row(opt) for opt in OPTIONS) + "\n"


def test_every_option_matches_the_golden_contract() -> None:
    """Keys, flags, variables, types, defaults, choices and minimums are exactly the
    committed ones (regenerate the golden file only for an intended change)."""
    assert render() == GOLDEN.read_text()


def test_every_flag_parses_and_maps_to_its_option() -> None:
    """Every option's flag is accepted by the serve parser and lands on that option."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    for opt in OPTIONS:
        if opt.kind is bool:
            args = parser.parse_args([opt.flag])
            assert getattr(args, opt.dest) is True, opt.key
            args = parser.parse_args(["--no-" + opt.flag[2:]])
            assert getattr(args, opt.dest) is False, opt.key
        else:
            value = opt.choices[0] if opt.choices else "7"
            args = parser.parse_args([opt.flag, value])
            assert getattr(args, opt.dest) == value, opt.key


if __name__ == "__main__":
    GOLDEN.write_text(render())
    sys.stdout.write(f"wrote {GOLDEN} ({len(OPTIONS)} options)\n")
