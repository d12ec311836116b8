"""packaging/llamad.toml.example against the option registry: the keys it sets load (see
test_packaging.py), and the keys it shows commented out, for an operator to uncomment, are
options too, with values they may take."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from daemon import config
from daemon.config import OPTIONS

EXAMPLE = Path(__file__).resolve().parents[2] / "packaging" / "llamad.toml.example"
_SECTION = re.compile(r"^\[([a-z_]+)\]\s*$")
_COMMENTED = re.compile(r"^#\s*([a-z_]+)\s*=\s*(.*)$")


def _commented_settings() -> list[tuple[str, str]]:
    """``(key, value)`` of every ``# name = value`` line, ``key`` with its section."""
    section, found = "", []
    for line in EXAMPLE.read_text().splitlines():
        if match := _SECTION.match(line):
            section = match.group(1) + "."
        elif match := _COMMENTED.match(line):
            found.append((section + match.group(1), match.group(2)))
    return found


def test_commented_out_settings_are_options_with_valid_values() -> None:
    """Each commented-out setting names an option; where its value is TOML (not prose),
    the option accepts it."""
    keys = {o.key for o in OPTIONS}
    found = _commented_settings()
    assert found, "the example shows no commented-out setting any more: drop this test"
    for key, raw in found:
        assert key in keys, f"{EXAMPLE.name}: {key} is not an option"
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            continue  # prose: the line lists the choices
        config._coerce(config.option(key), value, f"file {EXAMPLE.name}")


def test_every_section_is_a_section_of_options() -> None:
    """Each ``[section]`` of the example holds options (a typo would make an empty one)."""
    sections = {o.key.split(".", 1)[0] for o in OPTIONS if "." in o.key}
    shown = [m.group(1) for line in EXAMPLE.read_text().splitlines()
             if (m := _SECTION.match(line))]
    assert shown and set(shown) <= sections
