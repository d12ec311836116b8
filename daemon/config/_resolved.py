"""The validated configuration of one daemon run: :class:`Config`, which holds the options
as read (:class:`~daemon.config._sections.Settings`) and what load resolved from them (a
role's :class:`ChildConfig`, directories, the TLS material and the tokens read from their
files). Its other attributes read the settings: nothing is kept twice."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar, overload

from supervisor import EndpointSpec, RestartPolicy, Timeouts

from ._catalog import Catalog
from ._options import INSTALLED_MODELS_DIR, value_of, with_values
from ._retrieval import RetrievalSettings
from ._sections import (
    AgentSettings,
    AnswerConfig,
    HttpSettings,
    Limits,
    Settings,
)
from .access import TlsMaterial, TokenTable
from .inference_mode import InferenceMode


@dataclass(frozen=True)
class ChildConfig:
    role: str
    enabled: bool
    """False exactly when ``mode`` is "disabled"."""
    model: str
    runtime: str
    ctx_size: int
    threads: int
    parallel: int
    batch: int
    extra_args: tuple[str, ...]
    mode: InferenceMode = InferenceMode.EMBEDDED
    spin_count: int = -1
    queue_ahead: int = 0
    endpoint_url: str = ""
    endpoint_model: str = ""
    api_key_file: str = ""
    api_key_env: str = ""
    env: tuple[tuple[str, str], ...] = ()
    """Environment of the child beyond the daemon's (a catalog model's ``env`` table)."""
    chat_template: str = "auto"
    """A generation model's chat template: "auto", or a name of llamad's templates."""

    def endpoint(self) -> EndpointSpec | None:
        """The configured endpoint (None when no URL is configured)."""
        if not self.endpoint_url:
            return None
        return EndpointSpec(self.endpoint_url, self.endpoint_model, self.api_key_file,
                            self.api_key_env)


_T = TypeVar("_T")

_FOLLOWS = "llamad.follows"
"""On a field of :class:`Config` resolved from one option alone: that option's key."""


class _Read(Generic[_T]):
    """An attribute of :class:`Config` that is the value of one option of its settings."""

    def __init__(self, key: str) -> None:
        self.key = key

    @overload
    def __get__(self, config: None, owner: type[Config]) -> _Read[_T]: ...
    @overload
    def __get__(self, config: Config, owner: type[Config] | None = None) -> _T: ...
    def __get__(self, config: Config | None,
                owner: type[Config] | None = None) -> _T | _Read[_T]:
        if config is None:
            return self
        value: _T = value_of(config.settings, self.key)
        return value


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

    listen = _Read[str]("listen")
    metrics_listen = _Read[str]("metrics_listen")
    http_listen = _Read[str]("http_listen")
    agent_listen = _Read[str]("agent_listen")
    agent = _Read[AgentSettings]("agent")
    drain_notice = _Read[float]("drain_notice")
    http = _Read[HttpSettings]("http")
    llama_bin = _Read[str]("llama_bin")
    retrieval = _Read[RetrievalSettings]("retrieval")
    answer = _Read[AnswerConfig]("answer")
    limits = _Read[Limits]("limits")
    drain_grace = _Read[float]("drain_grace")
    log_format = _Read[str]("log.format")
    log_level = _Read[str]("log.level")
    request_timeout = _Read[float]("child.request_timeout")
    log_lines = _Read[int]("child.log_lines")
    child_slots = _Read[bool]("child.slots")
    swap_ready_timeout = _Read[float]("swap.ready_timeout")
    swap_drain_timeout = _Read[float]("swap.drain_timeout")
    swap_handover_hold = _Read[float]("swap.handover_hold")
    swap_launch_nice = _Read[int]("swap.launch_nice")
    recycle_after_requests = _Read[int]("recycle.after_requests")
    recycle_max_rss_mb = _Read[int]("recycle.max_rss_mb")
    recycle_check_interval = _Read[float]("recycle.check_interval")
    recycle_min_uptime = _Read[float]("recycle.min_uptime")
    recycle_cancel_grace = _Read[float]("recycle.cancel_grace")

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
                        probe_interval=c.probe_interval, probe_timeout=c.probe_timeout,
                        probe_failures=c.probe_failures, stop_grace=c.stop_grace,
                        busy_silence=c.busy_silence)

    def child(self, role: str) -> ChildConfig:
        return self.generation if role == "generation" else self.embedding

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
