"""A reload's new catalog in the pool (issue 14): models added are loadable at once,
removed ones are drained and forgotten, a resident model whose settings changed gets a
new child make-before-break (keeping the old one if the new one fails), residency
settings apply at once; the roles' defaults are left to the roles' own reload.
Scripted models, no processes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from daemon.config._catalog import Catalog, CatalogEntry
from daemon.errors import UnknownModel
from daemon.models._pool_reload import compare
from daemon.models.children import Setup, make_setup
from supervisor import State
from tests.support.models import write_model
from tests.support.scripted import PERMANENT, settle
from tests.support.scripted_model import RUNTIME
from tests.support.scripted_pool import Rig


def setup_for(entry: CatalogEntry) -> Setup:
    return make_setup(entry.role, entry.path, RUNTIME, entry.child)


def changed(catalog: Catalog, folder: Path) -> Catalog:
    """gen-b removed, gen-c with another context size, gen-d new, emb pinned."""
    entries = {e.name: e for e in catalog.entries}
    gen_c = entries["gen-c"]
    gen_d = dataclasses.replace(
        gen_c, name="gen-d", aliases=(),
        child=dataclasses.replace(gen_c.child,
                                  model=str(write_model(folder / "gen-d.gguf"))))
    return Catalog((entries["gen-a"],
                    dataclasses.replace(gen_c, child=dataclasses.replace(gen_c.child,
                                                                         ctx_size=1024)),
                    dataclasses.replace(entries["emb"], pin=True), gen_d),
                   catalog.defaults, catalog.skipped)


async def rig_with_two_loaded(tmp_path: Path) -> Rig:
    rig = Rig(tmp_path)
    rig.default.start()
    await settle(rig.default.supervisor, State.RUNNING)
    await rig.pool.load("gen-b")
    await rig.pool.load("gen-c")
    return rig


def test_compare_names_each_kind_of_change(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    change = compare(rig.catalog, changed(rig.catalog, tmp_path))
    assert (change.added, change.removed, change.relaunch, change.updated) == (
        ["gen-d"], ["gen-b"], ["gen-c"], ["emb"])
    assert not change.defaults_renamed and change
    assert not compare(rig.catalog, rig.catalog)


async def test_reconfigure_applies_the_new_catalog(tmp_path: Path) -> None:
    rig = await rig_with_two_loaded(tmp_path)
    gen_b, gen_c = rig.pool.model("gen-b"), rig.pool.model("gen-c")
    assert gen_b is not None and gen_c is not None
    old_child = gen_c.serving_pid
    change = await rig.pool.reconfigure(changed(rig.catalog, tmp_path), setup_for)
    assert not change.kept
    # Removed: drained, stopped, forgotten; a call naming it is NOT_FOUND.
    assert gen_b.status == "unloaded" and rig.pool.model("gen-b") is None
    with pytest.raises(UnknownModel):
        rig.pool.entry("gen-b")
    # Relaunched make-before-break with its new settings; the default untouched.
    assert gen_c.status == "ready" and gen_c.setup.spec.ctx_size == 1024
    assert gen_c.serving_pid != old_child and rig.launches("gen-c") == 2
    assert rig.launches("gen-a") == 1
    # Added: listed and loadable; updated: in force.
    assert rig.pool.view("gen-d").state == "unloaded"
    await rig.pool.load("gen-d")
    assert rig.pool.view("gen-d").state == "ready"
    assert rig.pool.view("emb").pinned


async def test_a_relaunch_that_fails_keeps_the_running_model_and_its_entry(
        tmp_path: Path) -> None:
    rig = await rig_with_two_loaded(tmp_path)
    rig.outcomes["gen-c"] = [PERMANENT]
    gen_c = rig.pool.model("gen-c")
    assert gen_c is not None
    change = await rig.pool.reconfigure(changed(rig.catalog, tmp_path), setup_for)
    assert "gen-c" in change.kept
    assert gen_c.status == "ready" and gen_c.setup.spec.ctx_size != 1024
    entry = rig.pool.catalog.find("gen-c")
    assert entry is not None and entry.child.ctx_size != 1024  # so the next reload retries


async def test_a_model_not_resident_takes_its_new_settings_at_its_next_load(
        tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.default.start()
    await settle(rig.default.supervisor, State.RUNNING)
    before = await rig.pool.load("gen-c")
    await rig.pool.unload("gen-c")
    await rig.pool.reconfigure(changed(rig.catalog, tmp_path), setup_for)
    model = await rig.pool.load("gen-c")
    assert model.setup.spec.ctx_size == 1024 and before.setup.spec.ctx_size != 1024
