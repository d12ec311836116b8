"""Configuration help: every option is in ``llamad serve --help`` with its environment
variable (in process and from a real ``llamad serve --help``), and flags, environment
names and file keys are unique.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from daemon import cli
from daemon.config import OPTIONS

ROOT = Path(__file__).resolve().parents[2]


# --- help ------------------------------------------------------------------------------


def _option_blocks(text: str) -> dict[str, str]:
    """Map each flag of an option entry in argparse help to the entry's whole text."""
    blocks: dict[str, str] = {}
    current: list[str] = []
    for line in [*text.splitlines(), "  -end"]:
        if re.match(r"^  -", line) or not line.strip():
            if current:
                entry = " ".join(" ".join(current).split())
                for flag in re.findall(r"(?<![\w-])(--?[\w-]+)", current[0]):
                    blocks[flag] = entry
            current = [line] if line.strip() else []
        elif current:
            current.append(line)
    return blocks


def test_every_option_in_serve_help_with_its_env(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``llamad serve --help`` lists every option's flag, with its env variable in its entry."""
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit) as exit_info:
        cli._parser().parse_args(["serve", "--help"])
    assert exit_info.value.code == 0
    blocks = _option_blocks(capsys.readouterr().out)
    for opt in OPTIONS:
        assert opt.flag in blocks, opt.key
        assert f"Env: {opt.env}." in blocks[opt.flag], opt.key
        if opt.kind is bool:
            assert "--no-" + opt.flag[2:] in blocks, opt.key
    assert "--config" in blocks
    assert "LLAMAD_CONFIG" in blocks["--config"]


@pytest.mark.process
def test_serve_help_subprocess_lists_every_env_variable() -> None:
    """The real entry point ``python -m daemon serve --help`` exits 0 naming every variable."""
    proc = subprocess.run(
        [sys.executable, "-m", "daemon", "serve", "--help"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "COLUMNS": "100"},
    )
    assert proc.returncode == 0, proc.stderr
    missing = [opt.env for opt in OPTIONS if opt.env not in proc.stdout]
    assert missing == []


def test_flags_env_names_and_keys_are_unique() -> None:
    """No two options share a flag, an env variable or a destination."""
    for attr in ("key", "flag", "env", "dest"):
        names = [getattr(opt, attr) for opt in OPTIONS]
        assert len(names) == len(set(names)), attr
