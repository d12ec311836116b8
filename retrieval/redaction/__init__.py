"""Credential redaction: secrets never reach an index or a model (ARCHITECTURE.md, 8)."""
