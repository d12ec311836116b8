"""The validated configuration of one daemon run: :class:`Config`, which holds the options
as read (:class:`~daemon.config._sections.Settings`) and what load resolved from them (a
role's :class:`ChildConfig`, directories, the TLS material and the tokens read from their
files). An option is read where it is declared, ``config.settings.child.request_timeout``:
nothing is kept twice."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from supervisor import EndpointSpec, RestartPolicy, Timeouts

from ._catalog import Catalog
from ._options import INSTALLED_MODELS_DIR, value_of, with_values
from ._sections import RoleSettings, Settings
from .access import TlsMaterial, TokenTable
from .role import Role


@dataclass(frozen=True, kw_only=True)
class ChildConfig(RoleSettings):
    """The settings one child runs with: its role section's options (a catalog model's
    table overriding some), as load resolved them, with its role and environment.

    ``mode`` is the mode in force and ``enabled`` is False exactly when it is disabled;
    ``model`` is the GGUF path (the prepared default when the section names none);
    ``extra_args`` is its words, single-spaced (:attr:`extra_argv` splits them).
    """

    role: Role
    env: tuple[tuple[str, str], ...] = ()
    """Environment of the child beyond the daemon's (a catalog model's ``env`` table)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        # Single-spaced, so two configurations that give the child the same arguments
        # compare equal (a reload relaunches nothing for a change of spacing).
        object.__setattr__(self, "extra_args", " ".join(self.extra_args.split()))
        object.__setattr__(self, "role", Role(self.role))

    @classmethod
    def of(cls, section: RoleSettings, role: Role | str, **resolved: Any) -> ChildConfig:
        """The child of ``role`` that runs with the options of ``section``, but for those
        ``resolved`` gives (by field name)."""
        options = {f.name: getattr(section, f.name) for f in dataclasses.fields(RoleSettings)}
        return cls(**{**options, **resolved}, role=Role(role))

    @property
    def extra_argv(self) -> tuple[str, ...]:
        """The extra arguments, one word each (what the child's command line gets)."""
        return tuple(self.extra_args.split())

    def endpoint(self) -> EndpointSpec | None:
        """The configured endpoint (None when no URL is configured)."""
        if not self.endpoint_url:
            return None
        return EndpointSpec(self.endpoint_url, self.endpoint_model, self.api_key_file,
                            self.api_key_env)


_FOLLOWS = "llamad.follows"
"""On a field of :class:`Config` resolved from one option alone: that option's key."""


@dataclass(frozen=True)
class Config:
    """The validated configuration of one daemon run."""

    settings: Settings
    """Every option as read, typed, one field each (a reload compares them)."""
    generation: ChildConfig
    embedding: ChildConfig
    state_dir: Path = dataclasses.field(metadata={_FOLLOWS: "state_dir"})
    sources: Mapping[str, str]
    """Where each value came from: "flag", "env", "file" or "default"; a role's model
    taken from the manifest of ``models_dir`` is "models_dir"."""
    models_dir: Path = dataclasses.field(default=Path(INSTALLED_MODELS_DIR),
                                         metadata={_FOLLOWS: "models_dir"})
    tls: TlsMaterial | None = None
    """Certificate, key and client CA, read and checked at load (None: plaintext)."""
    tokens: TokenTable | None = None
    """The bearer tokens of ``auth.token_file`` (None: no token needed)."""
    catalog: Catalog = dataclasses.field(default_factory=Catalog)
    """Every model by name (:mod:`daemon.config._catalog_load`), each role's default among them."""

    @property
    def policy(self) -> RestartPolicy:
        """The supervisor's restart policy, of ``[restart]``."""
        r = self.settings.restart
        return RestartPolicy(base=r.backoff_base, cap=r.backoff_cap,
                             max_failures=r.breaker_failures, stable_after=r.breaker_reset,
                             cooldown=r.breaker_cooldown or None)

    @property
    def timeouts(self) -> Timeouts:
        """The supervisor's timeouts, of ``[child]``."""
        c = self.settings.child
        return Timeouts(start=c.start_timeout, start_cap=c.start_cap,
                        start_cap_per_gib=c.start_cap_per_gib, start_cap_max=c.start_cap_max,
                        probe_interval=c.probe_interval, probe_timeout=c.probe_timeout,
                        probe_failures=c.probe_failures, stop_grace=c.stop_grace,
                        busy_silence=c.busy_silence, failed_calls=c.failed_calls,
                        token_probe_interval=c.token_probe_interval,
                        token_probe_timeout=c.token_probe_timeout,
                        token_probe_per_gib=c.token_probe_per_gib,
                        token_probe_busy_max=c.token_probe_busy_max,
                        unresponsive_grace=c.unresponsive_grace)

    def child(self, role: Role | str) -> ChildConfig:
        """The child configuration of ``role``."""
        return self.generation if role == Role.GENERATION else self.embedding

    def with_options(self, new: Config, keys: Collection[str]) -> Config:
        """This configuration with the options ``keys`` taken from ``new``, and with them
        what load resolved from one of those options alone (``models_dir``): what a reload
        put in force. A role's :class:`ChildConfig`, the tokens and the TLS material are
        the reload's to replace."""
        settings = with_values(self.settings, {k: value_of(new.settings, k) for k in keys})
        follows: dict[str, Any] = {f.name: getattr(new, f.name)
                                   for f in dataclasses.fields(self)
                                   if f.metadata.get(_FOLLOWS) in keys}
        return dataclasses.replace(self, settings=settings, **follows)
