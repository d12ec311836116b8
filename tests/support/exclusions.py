"""The directory tree of the exclude-pattern tests: each file carries a word found
nowhere else, so a search says whether it was indexed."""

from __future__ import annotations

from pathlib import Path

TREE = {
    "runbooks/disk.md": "# Disk\n\nKeyword amberquill.\n",
    "runbooks/private/notes.md": "# Notes\n\nKeyword basaltmoth.\n",
    "tls/server.pem": "-----BEGIN PRIVATE KEY-----\nKeyword cobaltfern.\n",
    "ssh/id_ed25519": "Keyword duskwillow.\n",
    "gcp/credentials.json": '{"keyword": "emberlynx"}\n',  # an indexable kind
    "drafts/todo.md": "# Todo\n\nKeyword foxglade.\n",
}
"""Relative path -> text. tls/server.pem, ssh/id_ed25519 and gcp/credentials.json are
excluded by the built-in defaults."""


def write_tree(root: Path) -> None:
    for rel, text in TREE.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
