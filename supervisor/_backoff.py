"""Restart policy: exponential backoff with full jitter, and a circuit breaker.

Backoff follows the "full jitter" scheme (AWS Architecture Blog, "Exponential Backoff
And Jitter"): the n-th retry waits ``uniform(0, min(cap, base * 2**n))``, which spreads
restarts of many daemons after a shared fault instead of synchronising them.

The breaker counts consecutive failed starts. It opens after ``max_failures`` of them,
or at once on a permanent failure (a corrupt model will not fix itself by retrying).
It closes again after the child has run ``stable_after`` seconds without failing.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class RestartPolicy:
    """Knobs of the restart policy; defaults are the documented seed values.

    Attributes:
        base: first backoff ceiling, seconds.
        cap: largest backoff ceiling, seconds.
        max_failures: consecutive failed starts that open the breaker.
        stable_after: seconds of running that reset the failure count.
        cooldown: seconds after which an open breaker tries once more (half-open);
            None keeps it open until reset. Permanent failures never cool down.
    """

    base: float = 0.5
    cap: float = 30.0
    max_failures: int = 5
    stable_after: float = 60.0
    cooldown: float | None = 300.0

    def __post_init__(self) -> None:
        if self.base <= 0 or self.cap < self.base:
            raise ValueError("backoff needs 0 < base <= cap")
        if self.max_failures < 1:
            raise ValueError("max_failures must be at least 1")
        if self.stable_after < 0:
            raise ValueError("stable_after must be >= 0")
        if self.cooldown is not None and self.cooldown <= 0:
            raise ValueError("cooldown must be > 0 (or None to disable)")

    def ceiling(self, attempt: int) -> float:
        """The backoff ceiling before retry number ``attempt`` (0-based)."""
        # Clamp the exponent: 2**attempt overflows a float long before attempt matters.
        return float(min(self.cap, self.base * (2 ** min(attempt, 62))))

    def delay(self, attempt: int, rng: random.Random) -> float:
        """A full-jitter delay before retry number ``attempt``."""
        return rng.uniform(0.0, self.ceiling(attempt))


class BreakerState(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"


class CircuitBreaker:
    """Counts consecutive failures; opens past the limit or on a permanent failure."""

    def __init__(self, policy: RestartPolicy) -> None:
        self._policy = policy
        self.failures = 0
        self.state = BreakerState.CLOSED
        self.opened_at: float | None = None
        self.permanent = False
        self.opens = 0

    def record_failure(self, now: float, *, permanent: bool) -> bool:
        """Count a failed start or a crash; return True if the breaker is now open."""
        self.failures += 1
        if permanent or self.failures >= self._policy.max_failures:
            if self.state is BreakerState.CLOSED:
                self.opens += 1
            self.state = BreakerState.OPEN
            self.opened_at = now
            self.permanent = permanent
        return self.state is BreakerState.OPEN

    def record_stable(self) -> None:
        """The child ran long enough: forget past failures."""
        self.failures = 0

    def reset(self) -> None:
        """Close the breaker and forget failures (operator reset or a new model)."""
        self.failures = 0
        self.state = BreakerState.CLOSED
        self.opened_at = None
        self.permanent = False

    def half_open(self) -> None:
        """The cool-down passed: allow one more start; its failure reopens the breaker."""
        self.state = BreakerState.CLOSED
        self.opened_at = None
        self.failures = self._policy.max_failures - 1

    def half_open_at(self) -> float | None:
        """When an open breaker may try again by itself, or None if it never will."""
        if self.state is BreakerState.CLOSED or self.permanent or self._policy.cooldown is None:
            return None
        opened = self.opened_at if self.opened_at is not None else 0.0
        return opened + self._policy.cooldown
