"""Whether a model fits: its resident memory, estimated from GGUF metadata, against what
the system can give a new process.

The one memory check of every launch beside a serving model (swap, mode switch, reload,
recycle: :meth:`daemon.models.model.Model.replace`); the coming pool's budget builds on
:func:`memory_needed`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from supervisor import prompt_cache_bytes

if TYPE_CHECKING:
    from .children import Setup

OVERHEAD_BYTES = 256 * 1024 * 1024
"""Beyond weights and KV cache: compute buffers, runtime, thread stacks."""


def memory_available() -> int | None:
    """Bytes the system can give a new process: MemAvailable, capped by a cgroup v2
    memory.max when one is set. None if unknown."""
    available: int | None = None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    try:
        with open("/proc/self/cgroup") as fh:
            path = next((ln.strip()[3:] for ln in fh if ln.startswith("0::")), None)
        if path is not None:
            base = f"/sys/fs/cgroup{path}"
            with open(f"{base}/memory.max") as fh:
                limit = fh.read().strip()
            if limit != "max":
                with open(f"{base}/memory.current") as fh:
                    headroom = int(limit) - int(fh.read().strip())
                available = headroom if available is None else min(available, headroom)
    except (OSError, ValueError, StopIteration):
        pass
    return available


def memory_needed(setup: Setup) -> int:
    """An estimate of a child's resident memory: weights, KV cache, its host-RAM prompt
    cache (llama-server's ``--cache-ram``, which llamad always passes: ``cache_ram``),
    overhead (0 when the GGUF header could not be read: the validation that follows
    refuses such a file)."""
    info = setup.model.info
    if info is None:
        return 0
    slots = max(1, setup.runtime.max_concurrency(setup.spec))
    ctx = setup.spec.ctx_size or info.context_length or 2048
    return (info.size + info.kv_cache_bytes(ctx * slots)
            + prompt_cache_bytes(setup.spec, setup.runtime.name) + OVERHEAD_BYTES)
