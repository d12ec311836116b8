"""The typed configuration: :class:`Config` and its sections."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from supervisor import EndpointSpec, RestartPolicy, Timeouts

from ._config_options import INSTALLED_MODELS_DIR
from .access import TlsMaterial, TokenTable


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
    mode: str = "embedded"
    spin_count: int = -1
    queue_ahead: int = 0
    endpoint_url: str = ""
    endpoint_model: str = ""
    api_key_file: str = ""
    api_key_env: str = ""

    def endpoint(self) -> EndpointSpec | None:
        """The configured endpoint (None when no URL is configured)."""
        if not self.endpoint_url:
            return None
        return EndpointSpec(self.endpoint_url, self.endpoint_model, self.api_key_file,
                            self.api_key_env)


@dataclass(frozen=True)
class Limits:
    max_prompt_chars: int
    max_messages: int
    default_max_tokens: int
    max_tokens: int
    max_stop: int
    max_embed_batch: int
    max_embed_chars: int
    queue_size: int
    max_message_bytes: int


@dataclass(frozen=True)
class RetrievalSettings:
    """The ``[retrieval]`` options, one field each (see :data:`OPTIONS` for their help)."""

    enabled: bool
    allowed_roots: tuple[str, ...]
    chunk_size: int
    chunk_overlap: int
    max_chunk_chars: int
    embed_batch: int
    embed_concurrency: int
    ingest_workers: int
    ingest_inflight_mb: int
    max_commit_batch: int
    query_embed_timeout: float
    text_candidates: int
    vector_candidates: int
    rrf_k: int
    default_k: int
    max_k: int
    max_query_chars: int
    max_document_chars: int
    max_file_mb: int
    max_files_per_source: int
    max_source_mb: int
    pdf_timeout: float
    pdf_max_pages: int
    pdf_max_memory_mb: int
    pdf_max_output_mb: int
    html_max_depth: int
    rescan_interval: float
    redact_hostnames: bool
    redact_ips: bool
    refuse_hard_links: bool


@dataclass(frozen=True)
class AnswerConfig:
    """The ``[answer]`` options, one field each (see :data:`OPTIONS` for their help)."""

    max_question_chars: int
    max_attachment_chars: int
    max_history_turns: int
    default_max_tokens: int
    default_k: int
    min_vector_score: float
    min_text_score: float
    cache_ttl: float
    cache_entries: int
    audit_log: str
    audit_max_mb: int
    audit_backups: int


_S = TypeVar("_S")


def _section(cls: Callable[..., _S], values: Mapping[str, Any], name: str) -> _S:
    """The options of section ``name`` as ``cls``, whose fields are named as the options
    (a field missing or left over fails at every load, hence in the unit tests)."""
    prefix = name + "."
    return cls(**{k.removeprefix(prefix): v for k, v in values.items()
                  if k.startswith(prefix)})


@dataclass(frozen=True)
class Config:
    """The validated configuration of one daemon run."""

    listen: str
    metrics_listen: str
    llama_bin: str
    state_dir: Path
    retrieval: RetrievalSettings
    answer: AnswerConfig
    generation: ChildConfig
    embedding: ChildConfig
    policy: RestartPolicy
    timeouts: Timeouts
    request_timeout: float
    swap_ready_timeout: float
    swap_drain_timeout: float
    swap_handover_hold: float
    swap_launch_nice: int
    recycle_after_requests: int
    recycle_max_rss_mb: int
    recycle_check_interval: float
    recycle_min_uptime: float
    log_lines: int
    drain_grace: float
    log_format: str
    log_level: str
    limits: Limits
    sources: Mapping[str, str]
    """Where each value came from: "flag", "env", "file" or "default"; a role's model
    taken from the manifest of ``models_dir`` is "models_dir"."""
    models_dir: Path = Path(INSTALLED_MODELS_DIR)
    tls: TlsMaterial | None = None
    """Certificate, key and client CA, read and checked at load (None: plaintext)."""
    tokens: TokenTable | None = None
    """The bearer tokens of ``auth.token_file`` (None: no token needed)."""
    values: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Each option's value by key, as read (a reload compares them, option by option)."""

    def child(self, role: str) -> ChildConfig:
        return self.generation if role == "generation" else self.embedding
