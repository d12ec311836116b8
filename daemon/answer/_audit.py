"""The Ask audit log: :class:`daemon.audit.AuditLog` (shared with Search's)."""

from __future__ import annotations

from ..audit import AuditLog

__all__ = ["AuditLog"]
