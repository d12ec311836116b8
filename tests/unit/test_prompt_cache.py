"""llama-server's host-RAM prompt cache (issue 28): llamad passes ``--cache-ram`` itself
(the model's ``cache_ram``; llama-server's own default is 8 GiB per child), no extra
argument may set it, and the memory estimate counts it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from daemon.models.children import ModelFacts, Setup
from daemon.models.memory import memory_needed
from supervisor import (
    DEFAULT_CACHE_RAM_MIB,
    ArgumentRefused,
    BundledRuntime,
    LaunchSpec,
    LlamaServerRuntime,
    check_operator_args,
)
from tests.support.models import write_model

MIB = 1024 * 1024


def _flag(argv: list[str]) -> str:
    return argv[argv.index("--cache-ram") + 1]


def test_the_child_gets_the_models_cache_ram(tmp_path: Path) -> None:
    """Every llama-server child gets ``--cache-ram``: the default (256 MiB), the model's
    value, 0 to disable; the embedding child too."""
    runtime = LlamaServerRuntime("llama-server")
    sock = tmp_path / "c.sock"
    spec = LaunchSpec(role="generation", model=tmp_path / "m.gguf")
    assert _flag(runtime.command(spec, socket=sock, alias="a")) == str(DEFAULT_CACHE_RAM_MIB)
    assert DEFAULT_CACHE_RAM_MIB == 256
    for mib in (0, 64, 4096):
        argv = runtime.command(dataclasses.replace(spec, cache_ram_mib=mib), socket=sock,
                               alias="a")
        assert _flag(argv) == str(mib) and argv.count("--cache-ram") == 1
    embedding = dataclasses.replace(spec, role="embedding", embedding=True, cache_ram_mib=32)
    assert _flag(runtime.command(embedding, socket=sock, alias="a")) == "32"
    assert "--cache-ram" not in BundledRuntime().command(spec, socket=sock, alias="a")


@pytest.mark.parametrize("words", [("--cache-ram", "0"), ("-cram", "99999")])
def test_extra_args_cannot_set_it(words: tuple[str, str]) -> None:
    """llamad owns the flag (an estimate that does not know the cache would be wrong)."""
    with pytest.raises(ArgumentRefused, match="llamad sets it itself"):
        check_operator_args(list(words), models_dir=Path("/models"))
    with pytest.raises(ValueError, match="is set by llamad itself"):
        LlamaServerRuntime("llama-server").command(
            LaunchSpec(role="generation", model=Path("/m.gguf"), extra_args=words),
            socket=Path("/tmp/x.sock"), alias="a")


def test_the_estimate_counts_the_cache_for_llama_server_only(tmp_path: Path) -> None:
    """The estimate grows by exactly the cache, for llama-server; the bundled runtime
    keeps no prompt cache, so its estimate does not change."""
    path = tmp_path / "m.gguf"
    write_model(path)
    facts = ModelFacts(path)
    facts.validate()
    spec = LaunchSpec(role="generation", model=path, cache_ram_mib=0)
    llama = Setup(spec, LlamaServerRuntime("llama-server"), facts)
    base = memory_needed(llama)
    assert base > 0
    for mib in (64, 1024):
        cached = dataclasses.replace(llama, spec=dataclasses.replace(spec, cache_ram_mib=mib))
        assert memory_needed(cached) - base == mib * MIB
    bundled = Setup(dataclasses.replace(spec, cache_ram_mib=1024), BundledRuntime(), facts)
    assert memory_needed(bundled) == memory_needed(dataclasses.replace(bundled, spec=spec))
