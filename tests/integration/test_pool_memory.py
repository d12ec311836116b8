"""The pool's memory estimate counts every consumer of a child (issue 28): llama-server's
host-RAM prompt cache (``--cache-ram``, up to 8 GiB per child by its own default) is passed
explicitly, per model, and counted; against a memory budget nothing is over-committed."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from daemon.models import memory
from llamad_protocol.v1 import control_pb2, inference_pb2
from tests.conftest import models_dir
from tests.support.daemon import catalog_env, make_daemon, served

pytestmark = pytest.mark.integration

SMOL, GEMMA = "SmolLM2-135M-Instruct.Q4_1", "gemma-3-270m-q4_k_m"
MIB = 1024 * 1024
CACHE = {"smol": 64, "gemma": 128}


def _argv(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _env(tmp_path: Path, budget_mb: int) -> dict[str, str]:
    return catalog_env(
        tmp_path,
        f'[generation]\nmodel = "smol"\n\n'
        f'[models.smol]\nmodel = "{models_dir() / (SMOL + ".gguf")}"\npin = false\n'
        f'cache_ram = {CACHE["smol"]}\n\n'
        f'[models.gemma]\nmodel = "{models_dir() / (GEMMA + ".gguf")}"\n'
        f'cache_ram = {CACHE["gemma"]}\n',
        LLAMAD_MODELS_MEMORY_BUDGET_MB=str(budget_mb))


async def _generate(stub: object, model: str) -> str:
    request = inference_pb2.GenerateRequest(
        prompt="List the planets of the solar system, one per line:", model=model,
        sampling=inference_pb2.SamplingParams(max_tokens=16, temperature=0.0))
    msgs = [m async for m in stub.Generate(request, timeout=120)]  # type: ignore[attr-defined]
    assert msgs[-1].usage.completion_tokens > 0
    return str(msgs[-1].model_name)


async def test_the_prompt_cache_is_passed_and_counted_against_the_budget(
        llama_server: str, tmp_path: Path) -> None:
    """Each model's child runs with its own ``--cache-ram``; its estimate is weights, KV,
    overhead *and* that cache. A budget that would hold both models if the caches were
    not counted holds one: loading gemma evicts smol, the resident estimates never pass
    the budget, and each child's resident memory after serving stays within its
    estimate."""
    daemon = make_daemon(_env(tmp_path, 0))  # never started: only its estimates
    estimates = {name: daemon.pool.view(name).memory_estimate for name in ("smol", "gemma")}
    # What the estimate was before issue 28 (no prompt cache): the same setup, cache 0.
    smol_setup = daemon.pool.roles()["generation"].setup
    without = memory.memory_needed(dataclasses.replace(
        smol_setup, spec=dataclasses.replace(smol_setup.spec, cache_ram_mib=0)))
    assert estimates["smol"] - without == CACHE["smol"] * MIB

    # Both fit if the caches were not counted; with them, only one does.
    uncounted = sum(estimates.values()) - sum(CACHE.values()) * MIB
    budget_mb = (uncounted + sum(CACHE.values()) * MIB // 2) // MIB
    assert uncounted < budget_mb * MIB < sum(estimates.values())
    daemon = make_daemon(_env(tmp_path, budget_mb))
    async with served(daemon) as clients:
        smol = daemon.pool.model("smol")
        assert smol is not None
        argv = _argv(smol.serving_pid)
        assert argv[argv.index("--cache-ram") + 1] == str(CACHE["smol"])
        assert await _generate(clients.inference, "smol") == "smol"
        assert _rss(smol.serving_pid) <= estimates["smol"]

        assert await _generate(clients.inference, "gemma") == "gemma"
        gemma = daemon.pool.model("gemma")
        assert gemma is not None and gemma.serving_pid
        argv = _argv(gemma.serving_pid)
        assert argv[argv.index("--cache-ram") + 1] == str(CACHE["gemma"])
        assert _rss(gemma.serving_pid) <= estimates["gemma"]

        listed = await clients.control.ListModels(control_pb2.ListModelsRequest())
        states = {m.name: m.state for m in listed.models}
        assert states == {"smol": control_pb2.MODEL_STATE_UNLOADED,
                          "gemma": control_pb2.MODEL_STATE_READY}
        resident = sum(m.memory_estimate_bytes for m in listed.models
                       if m.state == control_pb2.MODEL_STATE_READY)
        assert resident <= budget_mb * MIB
        assert {m.name: m.memory_estimate_bytes for m in listed.models} == estimates
