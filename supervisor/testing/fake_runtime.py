"""A :class:`~supervisor.Runtime` that launches the fault-injecting fake child."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .._client import ApiShape
from .._runtime import KEY_ENV, LLAMA_SERVER_API, LLAMA_SERVER_OWNED, LaunchSpec, refuse_owned
from . import fake_child_command


@dataclass(frozen=True)
class FakeRuntime:
    """Launches ``supervisor.testing.fake_child`` with llama-server's API and semantics,
    and its privacy: on the UNIX socket it is given, with the key from its environment.

    Attributes:
        fault: one of :data:`supervisor.testing.FAULTS`, or None.
        fault_after: see ``--fault-after``.
        load_seconds: simulated model load time.
        token_delay: seconds between streamed tokens.
        faults_per_launch: if given, the fault of the n-th launch (0-based) is
            ``faults_per_launch[n]`` (None for a healthy child); launches past the end
            are healthy. Lets a test say "crash the first start, then behave".
    """

    fault: str | None = None
    fault_after: int | None = None
    load_seconds: float | None = None
    token_delay: float | None = None
    faults_per_launch: tuple[str | None, ...] | None = None
    name: str = "fake-llama-server"
    api: ApiShape = field(default=LLAMA_SERVER_API)
    queues_requests: bool = False  # the fake child has no request queue of its own
    _launches: list[int] = field(default_factory=lambda: [0], compare=False)

    def command(self, spec: LaunchSpec, *, socket: Path, alias: str) -> list[str]:
        refuse_owned(spec.extra_args, LLAMA_SERVER_OWNED, "llama-server")
        n = self._launches[0]
        self._launches[0] += 1
        fault = self.fault
        if self.faults_per_launch is not None:
            fault = self.faults_per_launch[n] if n < len(self.faults_per_launch) else None
        return fake_child_command(
            socket=str(socket), model=str(spec.model), alias=alias, fault=fault,
            fault_after=self.fault_after, load_seconds=self.load_seconds,
            embedding=spec.embedding, token_delay=self.token_delay,
            extra=list(spec.extra_args),
        )

    def environment(self, base: Mapping[str, str], key: str) -> dict[str, str]:
        return {**base, KEY_ENV: key}

    def max_concurrency(self, spec: LaunchSpec) -> int:
        return max(1, spec.parallel)

    @property
    def launches(self) -> int:
        """How many commands were built (children launched)."""
        return self._launches[0]
