"""The reload decision, option by option: a change of any option is applied, brought to a
new child, or reported as needing a restart, as the option declares (issue 16, defect 3:
none is silently ignored)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from daemon import config
from daemon.config import OPTIONS, Config, ConfigError, Option, Reload
from daemon.ops.reload import (
    CATALOG,
    ReloadReport,
    _child_settings,
    reload_config,
    reload_plan,
    settle,
)
from tests.support.models import write_model
from tests.support.pki import make_ca

MODELS = {"generation.model": "/m/gen.gguf", "embedding.model": "/m/emb.gguf"}

# The TLS options need real certificates (made by openssl: the process tier).
TLS = ("tls.cert_file", "tls.key_file", "tls.client_ca_file")

STRINGS = {
    "listen": "127.0.0.1:50052",
    "metrics_listen": "127.0.0.1:9100",
    "http_listen": "127.0.0.1:8081",
    "agent_listen": "127.0.0.1:9777",
    "llama_bin": "/usr/local/bin/llama-server",
    "endpoint_url": "http://10.0.0.5:8080/v1",
    "endpoint_model": "other",
    "api_key_file": "/etc/llamad/key",
    "api_key_env": "OTHER_KEY",
    "env_prefix": "LLAMAD_TEST_KEY_",
    "extra_args": "--swa-full",
    "model": "/m/other.gguf",
    "log.format": "json",
    "models.device_budgets_mb": "cuda0=7500",
}


# Options valid only with others: both configurations compared carry these.
COMPANIONS: dict[str, dict[str, Any]] = {
    "retrieval.store": {"retrieval.postgres_dsn": "postgresql://llamad@db.example.net/kb"},
}


def _build(values: dict[str, Any]) -> Config:
    return config._build(values, {key: "default" for key in values}, {})


def _candidates(opt: Option, tmp_path: Path) -> list[Any]:
    """Values other than the default to try, in order."""
    if opt.kind is bool:
        return [not opt.default]
    if opt.choices:
        return [c for c in opt.choices if c != opt.default]
    if opt.kind is list:
        return [(str(tmp_path),)]
    if opt.key == "models.max_resident":  # 1 also changes the children's spin_count
        return [2]                        # (tests/unit/test_catalog.py): not alone
    if opt.kind in (int, float):
        bumped = [opt.minimum + 1] if opt.minimum is not None else []
        return [opt.kind(v) for v in [*bumped, opt.default + 1] if v != opt.default]
    if opt.key == "auth.token_file":
        tokens = tmp_path / "tokens"
        tokens.write_text("admin 0123456789abcdef0123\n")
        tokens.chmod(0o600)
        return [str(tokens)]
    if opt.key == "models_dir":  # another directory: other models of the catalog
        folder = tmp_path / "models"
        folder.mkdir()
        write_model(folder / "other.gguf")
        return [str(folder)]
    if opt.key == "answer.templates_dir":  # an operator's directory (empty: every
        folder = tmp_path / "templates"    # template the packaged one)
        folder.mkdir()
        return [str(folder)]
    if opt.key == "models_preset":
        preset = tmp_path / "models.ini"
        preset.write_text("version = 1\n")
        return [str(preset)]
    if opt.key in STRINGS:
        return [STRINGS[opt.key]]
    name = opt.key.rsplit(".", 1)[-1]
    return [STRINGS.get(name, str(tmp_path / name))]


def _changed(opt: Option, base: dict[str, Any], tmp_path: Path) -> Config:
    for value in _candidates(opt, tmp_path):
        try:
            return _build({**base, opt.key: value})
        except ConfigError:
            continue
    raise AssertionError(f"{opt.key}: no valid value other than the default to try")


def _tls(base: dict[str, Any], key: str, tmp_path: Path) -> tuple[Config, Config]:
    """TLS on with a certificate and key; then the same material at another path (the
    certificate or the key), or a client CA added (mutual TLS)."""
    server = make_ca(tmp_path / "pki", "server")
    on = base | {"tls.cert_file": str(server.cert), "tls.key_file": str(server.key)}
    if key == "tls.client_ca_file":
        return _build(on), _build(on | {key: str(server.cert)})
    moved = tmp_path / f"moved-{Path(on[key]).name}"
    moved.write_bytes(Path(on[key]).read_bytes())
    moved.chmod(0o600)
    return _build(on), _build(on | {key: str(moved)})


@pytest.mark.parametrize("opt", [
    pytest.param(o, id=o.key, marks=[pytest.mark.process] if o.key in TLS else [])
    for o in OPTIONS])
def test_every_option_change_is_planned_and_reported(opt: Option, tmp_path: Path) -> None:
    """A change of this option alone is planned under its declared kind, and a reload
    reports an outcome for it whatever the children did."""
    base = {o.key: o.default for o in OPTIONS} | MODELS | COMPANIONS.get(opt.key, {})
    if opt.key in TLS:
        current, new = _tls(base, opt.key, tmp_path)
    else:
        current, new = _build(base), _changed(opt, base, tmp_path)
    plan = reload_plan(current, new)
    catalog: dict[str, Reload] = {CATALOG: "restart"} if opt.key == "models_dir" else {}
    assert plan == {opt.key: opt.reload, **catalog}
    plan.pop(CATALOG, None)
    role = opt.key.split(".", 1)[0]
    went_through = ReloadReport(swapped=[role] if opt.reload == "new_child" else [],
                                updated=[role] if opt.reload == "apply" else [])
    settle(plan, went_through)
    expected = {"apply": "applied", "new_child": "new child",
                "restart": "restart needed"}[opt.reload]
    assert went_through.changes == {opt.key: expected}
    assert went_through.restart_needed == ([opt.key] if opt.reload == "restart" else [])
    nothing_ran = ReloadReport()
    settle(plan, nothing_ran)
    assert opt.key in nothing_ran.changes


# Role options that change how a role is served rather than its child's launch: a reload
# switches the mode (daemon.ops.reload._apply_role) instead of swapping the child.
MODE_OPTIONS = ("enabled", "mode", "endpoint_url", "endpoint_model", "api_key_file",
                "api_key_env")


@pytest.mark.parametrize("opt", [
    pytest.param(o, id=o.key) for o in OPTIONS
    if o.key.startswith("generation.") and o.reload == "new_child"
    and o.key.split(".", 1)[1] not in MODE_OPTIONS])
def test_every_role_option_a_new_child_takes_starts_one(opt: Option, tmp_path: Path) -> None:
    """A role option declared to need a new child changes what the reload compares to
    decide a swap (a change of cache_ram or chat_template was reported as taken by a new
    child while the running one kept its command line)."""
    base = {o.key: o.default for o in OPTIONS} | MODELS
    current, new = _build(base), _changed(opt, base, tmp_path)
    assert _child_settings(current.child("generation")) != _child_settings(
        new.child("generation"))


async def test_a_reload_applies_retrieval_limits_and_reports_the_rest() -> None:
    """retrieval.*, answer.* and state_dir are not ignored any more: retrieval's limits and
    the Ask settings apply, the others are reported as needing a restart and keep their
    running value."""
    base = {o.key: o.default for o in OPTIONS} | MODELS
    changed = {"retrieval.rrf_k": 61, "retrieval.embed_batch": 64, "answer.cache_ttl": 10.0,
               "answer.default_k": 7, "state_dir": "/srv/state", "limits.max_message_bytes": 2048,
               "limits.max_stop": 3}
    current = _build(base)
    applied, report = await reload_config(current, lambda: _build(base | changed),
                                          cast(Any, None), cast(Any, None))
    assert report.changes == {
        "state_dir": "restart needed", "retrieval.embed_batch": "restart needed",
        "retrieval.rrf_k": "applied", "answer.default_k": "applied",
        "answer.cache_ttl": "restart needed",
        "limits.max_stop": "applied", "limits.max_message_bytes": "restart needed"}
    assert report.restart_needed == ["state_dir", "retrieval.embed_batch", "answer.cache_ttl",
                                     "limits.max_message_bytes"]
    s = applied.settings
    assert (s.retrieval.rrf_k, s.retrieval.embed_batch) == (61, 32)
    assert (s.limits.max_stop, s.limits.max_message_bytes) == (3, 16 * 1024**2)
    assert (s.answer.default_k, s.answer.cache_ttl) == (7, 300.0)
    assert applied.state_dir == current.state_dir
    assert reload_plan(applied, _build(base | changed)) == {
        key: "restart" for key in report.restart_needed}


def test_the_grpc_message_limit_needs_a_restart_the_other_limits_apply() -> None:
    """The request limits apply at once but for the gRPC server's message size."""
    kinds = {o.key: o.reload for o in OPTIONS if o.key.startswith("limits.")}
    assert kinds.pop("limits.max_message_bytes") == "restart"
    assert set(kinds.values()) == {"apply"}


def test_a_change_of_the_catalogs_models_needs_a_restart(tmp_path: Path) -> None:
    """A model added to the catalog ([models.NAME]) is not silently ignored: without a
    pool to take it, the reload says it needs a restart (with one, the pool takes the new
    catalog: tests/unit/test_pool_reload.py)."""
    path = write_model(tmp_path / "extra.gguf")
    base = {o.key: o.default for o in OPTIONS} | MODELS
    current = _build(base)
    new = config._build(base, {key: "default" for key in base}, {},
                        {"extra": {"model": str(path)}})
    plan = reload_plan(current, new)
    assert plan == {CATALOG: "restart"}
    report = ReloadReport()
    settle(plan, report)
    assert report.changes == {CATALOG: "restart needed"}
    assert report.restart_needed == [CATALOG]
