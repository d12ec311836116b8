"""packaging/: the systemd unit passes ``systemd-analyze verify``, carries the directives the
daemon's shutdown and supervision rely on, and the example configuration loads."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from daemon import config
from daemon.config import OPTIONS

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "packaging" / "llamad.service"
EXAMPLE = ROOT / "packaging" / "llamad.toml.example"
EXEC_START = "/opt/llamad/venv/bin/llamad serve --config /etc/llamad/llamad.toml"
DEFAULTS = {o.key: o.default for o in OPTIONS}

Unit = dict[str, dict[str, list[str]]]


def parse_unit(text: str) -> Unit:
    """Sections → key → values (in order; a key may repeat, e.g. Environment=)."""
    unit: Unit = {}
    section: dict[str, list[str]] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        assert not line.endswith("\\"), f"continuation lines are not used here: {raw!r}"
        if line.startswith("[") and line.endswith("]"):
            section = unit.setdefault(line[1:-1], {})
            continue
        assert section is not None, f"directive outside a section: {raw!r}"
        key, sep, value = line.partition("=")
        assert sep, f"not a directive: {raw!r}"
        section.setdefault(key.strip(), []).append(value.strip())
    return unit


_SPAN_UNITS = {"us": 1e-6, "usec": 1e-6, "ms": 1e-3, "msec": 1e-3, "": 1.0, "s": 1.0,
               "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "hr": 3600.0}


def seconds(span: str) -> float:
    """A systemd time span ("60", "5s", "1min 30s") in seconds."""
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", span)
    assert parts and re.fullmatch(r"(\s*\d+(\.\d+)?\s*[a-z]*)+\s*", span), span
    return sum(float(n) * _SPAN_UNITS[u] for n, u in parts)


@pytest.fixture(scope="module")
def unit() -> Unit:
    return parse_unit(UNIT.read_text())


def service(unit: Unit, key: str) -> str:
    values = unit["Service"].get(key)
    assert values, f"[Service] {key}= is missing"
    assert len(values) == 1, f"[Service] {key}= is set {len(values)} times"
    return values[0]


# --- directives ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("Type", "notify"),
        ("NotifyAccess", "main"),
        ("ExecStart", EXEC_START),
        ("ExecReload", "/bin/kill -HUP $MAINPID"),
        ("KillMode", "mixed"),
        ("OOMPolicy", "continue"),
        ("Restart", "on-failure"),
        ("RestartPreventExitStatus", "2"),
        ("User", "llamad"),
        ("Group", "llamad"),
        ("StateDirectory", "llamad"),
        ("RuntimeDirectory", "llamad"),
        ("LimitNOFILE", "65536"),
        ("NoNewPrivileges", "yes"),
        ("CapabilityBoundingSet", ""),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("PrivateDevices", "yes"),
        ("ProtectKernelTunables", "yes"),
        ("ProtectKernelModules", "yes"),
        ("ProtectControlGroups", "yes"),
        ("RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6"),
        ("RestrictNamespaces", "yes"),
        ("LockPersonality", "yes"),
        ("SystemCallArchitectures", "native"),
    ],
)
def test_unit_sets_directive(unit: Unit, key: str, expected: str) -> None:
    """Each directive the daemon's design relies on is set, exactly once, to its value."""
    assert service(unit, key) == expected


def test_unit_sets_each_service_directive_once(unit: Unit) -> None:
    """No directive is silently overridden by a later copy (Environment= may repeat)."""
    repeated = {k for k, v in unit["Service"].items() if len(v) > 1 and k != "Environment"}
    assert repeated == set()


def test_unit_time_spans(unit: Unit) -> None:
    """RestartSec and WatchdogSec are set; TimeoutStopSec exceeds the worst drain: the
    default drain_grace plus one child stop grace per child (they stop one after the
    other); TimeoutStartSec, which also bounds a reload, covers a swap."""
    children = sum(1 for key in ("generation.enabled", "embedding.enabled") if key in DEFAULTS)
    worst_stop = DEFAULTS["drain_grace"] + children * DEFAULTS["child.stop_grace"]
    assert seconds(service(unit, "TimeoutStopSec")) > worst_stop
    assert seconds(service(unit, "TimeoutStartSec")) == 300
    # systemd 252 bounds a notify-driven reload (RELOADING=1 ... READY=1) by TimeoutStartSec
    # too, and a reload may swap a child: launch beside the old one, then drain the old one.
    worst_swap = sum(float(DEFAULTS.get(k, 0.0))
                     for k in ("swap.ready_timeout", "swap.drain_timeout"))
    assert seconds(service(unit, "TimeoutStartSec")) > worst_swap
    assert seconds(service(unit, "RestartSec")) > 0
    # The daemon pings every WatchdogSec/2 from its loop; a second or less would trip on
    # an ordinary hiccup.
    assert seconds(service(unit, "WatchdogSec")) >= 10


def test_unit_logs_json_and_installs_for_multi_user(unit: Unit) -> None:
    """The journal gets one JSON object per line; enable hooks into multi-user.target."""
    assert "LLAMAD_LOG_FORMAT=json" in unit["Service"]["Environment"]
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]


def test_exec_start_is_the_packaged_console_script() -> None:
    """ExecStart runs the `llamad` script pyproject.toml declares, on the example's path."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["llamad"] == "daemon.cli:main"
    binary, command, flag, path = EXEC_START.split()
    assert (Path(binary).name, command, flag) == ("llamad", "serve", "--config")
    assert Path(path).name == EXAMPLE.name.removesuffix(".example")


# --- systemd-analyze verify ------------------------------------------------------------


def _systemd_analyze() -> str:
    binary = shutil.which("systemd-analyze") or "/usr/bin/systemd-analyze"
    if not os.access(binary, os.X_OK):
        pytest.skip("systemd-analyze is not installed (Debian package: systemd)")
    return binary


def _verifiable_copy(tmp_path: Path, text: str) -> Path:
    """The unit with only ExecStart= rewritten: verify refuses a unit whose binary does not
    exist, and /opt/llamad is not installed here. The same command line runs from this
    checkout's interpreter instead (``python -m daemon`` is what the script runs)."""
    lines = text.splitlines(keepends=True)
    rewritten = [
        f"ExecStart={sys.executable} -m daemon serve --config /etc/llamad/llamad.toml\n"
        if line.startswith("ExecStart=") else line
        for line in lines
    ]
    assert sum(a != b for a, b in zip(lines, rewritten, strict=True)) == 1
    path = tmp_path / "llamad.service"
    path.write_text("".join(rewritten))
    return path


def _verify(path: Path) -> tuple[int, list[str]]:
    """Run ``systemd-analyze verify``; return its status and the lines naming our unit."""
    proc = subprocess.run(
        [_systemd_analyze(), "verify", str(path)],
        capture_output=True, text=True, timeout=120, check=False,
    )
    output = (proc.stdout + proc.stderr).splitlines()
    ours = [line for line in output if str(path) in line or path.name in line]
    return proc.returncode, ours


@pytest.mark.process
def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path) -> None:
    """`systemd-analyze verify` exits 0 and says nothing about the unit.

    verify (systemd 252) parses every directive and checks that ExecStart='s binary is
    executable, but it does not resolve User=/Group=: it passes whether or not user llamad
    exists, which is why no user is created here. A missing user shows only at start, as
    status 217/USER.
    """
    status, ours = _verify(_verifiable_copy(tmp_path, UNIT.read_text()))
    assert ours == []
    assert status == 0


@pytest.mark.parametrize(
    "broken",
    ["KillMode=mixd\n", "NoSuchDirective=yes\n", "ExecStart=/nonexistent/llamad serve\n"],
)
@pytest.mark.process
def test_verify_check_catches_mistakes(tmp_path: Path, broken: str) -> None:
    """The check above is not vacuous: a bad value, an unknown directive or a missing
    binary each produce a line about the unit (verify exits 0 for the first two)."""
    text = UNIT.read_text().replace("[Install]", broken + "\n[Install]")
    if broken.startswith("ExecStart="):
        path = tmp_path / "llamad.service"
        path.write_text(re.sub(r"(?m)^ExecStart=.*\n", "", UNIT.read_text()).replace(
            "[Install]", broken + "\n[Install]"))
    else:
        path = _verifiable_copy(tmp_path, text)
    _, ours = _verify(path)
    assert ours, f"systemd-analyze verify did not object to {broken.strip()!r}"


# --- the example configuration ---------------------------------------------------------


def test_example_config_loads_and_matches_the_unit(unit: Unit) -> None:
    """The example loads as the unit runs it (with the unit's Environment=), its models sit
    in the StateDirectory, it listens on loopback or in the RuntimeDirectory, and its
    drain and stop graces fit in TimeoutStopSec."""
    env = dict(item.split("=", 1) for item in unit["Service"]["Environment"])
    cfg = config.load(None, env=env, file=EXAMPLE)
    state_dir = Path("/var/lib") / service(unit, "StateDirectory")
    for role in ("generation", "embedding"):
        assert cfg.child(role).enabled
        assert Path(cfg.child(role).model).is_relative_to(state_dir)
    if cfg.settings.listen.startswith("unix:"):
        runtime_dir = Path("/run") / service(unit, "RuntimeDirectory")
        assert Path(cfg.settings.listen.removeprefix("unix:")).is_relative_to(runtime_dir)
    else:
        assert cfg.settings.listen.rpartition(":")[0] in ("127.0.0.1", "::1", "[::1]", "localhost")
    assert cfg.settings.log.format == "json"
    worst_stop = cfg.settings.drain_grace + 2 * cfg.timeouts.stop_grace
    assert seconds(service(unit, "TimeoutStopSec")) > worst_stop


def test_example_config_loads_on_its_own() -> None:
    """No environment at all: the file alone is a complete configuration."""
    cfg = config.load(None, env={}, file=EXAMPLE)
    assert cfg.sources["generation.model"] == "file"
    assert cfg.settings.log.format == "auto"
