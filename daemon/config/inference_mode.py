"""Where a role's inference runs: :class:`InferenceMode`, and :class:`Mode` (it with the
endpoint it names).

The mode is a :class:`enum.StrEnum`: its values are the strings the configuration takes
(``generation.mode = "embedded"``, ``"endpoint"``, ``"disabled"``) and the metrics label
carries, so parsing stays ``InferenceMode(text)`` and a member still compares equal to its
string for code that has not been converted yet. Compare against the members, never the
strings.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from supervisor import EndpointSpec


class InferenceMode(enum.StrEnum):
    """Where a role's inference runs."""

    EMBEDDED = "embedded"
    """A llama.cpp child llamad launches and supervises."""
    ENDPOINT = "endpoint"
    """An external OpenAI-compatible server llamad watches but does not run."""
    DISABLED = "disabled"
    """Nothing: every call is refused with FAILED_PRECONDITION."""


@dataclass(frozen=True)
class Mode:
    """A role's mode, with the endpoint it names in endpoint mode."""

    kind: InferenceMode
    endpoint: EndpointSpec | None = None

    def __post_init__(self) -> None:
        # A string ("embedded") becomes its member, so ``is`` comparisons hold; an unknown
        # one raises ValueError here, not a wrong branch later.
        object.__setattr__(self, "kind", InferenceMode(self.kind))
