"""A directory scan reads the structured kinds by their suffix (issue 16): YAML, JSON,
TOML, shell and Python files are indexed with their kind, chunked by their structure,
and found by a kind filter; a binary file with such a suffix is refused as text is."""

from __future__ import annotations

from pathlib import Path

from retrieval import Filters, Retriever, scan_source
from tests.support.embedder import HashEmbedder

FILES = {
    "compose.yaml": ("yaml", "services:\n  web:\n    image: nginx\n    restart: always\n",
                     "services"),
    "ci.yml": ("yaml", "jobs:\n  build:\n    runs-on: ubuntu-latest\n", "jobs"),
    "inventory.json": ("json", '{\n  "web01": {"ip": "10.0.0.1", "role": "frontend"}\n}\n',
                       "web01"),
    "app.toml": ("toml", '[server]\nport = 8080\nworkers = 4\n', "[server]"),
    "deploy.sh": ("shell", "#!/bin/sh\n# roll out\ndeploy() {\n  rsync -a build/ web01:/srv\n}\n",
                  "deploy()"),
    "RESTART.BASH": ("shell", "restart() {\n  systemctl restart haproxy\n}\n", "restart()"),
    "tool.py": ("python", "import os\n\n\n# the entry point\ndef main() -> None:\n"
                          "    os.system('uptime')\n", "def main() -> None:"),
}


async def test_a_directory_of_structured_files_is_indexed_by_kind(tmp_path: Path) -> None:
    """Each file gets the kind of its suffix (case-insensitively) and structure-aware
    chunks; a kind filter finds only its files; a binary .json is refused, not indexed."""
    root = tmp_path / "ops"
    root.mkdir()
    for name, (_, text, _) in FILES.items():
        (root / name).write_text(text)
    (root / "blob.json").write_bytes(b"\x00\x01\x02" * 100)
    r = Retriever(tmp_path / "index", lambda: HashEmbedder("m"))
    await r.open()
    source = await r.add_source("ops", root=root)
    report = await scan_source(r, source.id)
    assert report.added == len(FILES)
    for name, (kind, _, heading) in FILES.items():
        row = await r.document(f"ops/{name}")
        assert row is not None and (row.kind, row.state) == (kind, "indexed"), name
        hits = (await r.search(name.split(".")[0], k=20,
                               filters=Filters(kinds=(kind,)))).hits
        assert {h.kind for h in hits} == {kind}
        mine = [h for h in hits if h.doc_id == f"ops/{name}"]
        assert mine and mine[0].heading == heading, name
    assert [(rel, "binary" in why) for rel, why in report.failed] == [("blob.json", True)]
    await r.close()
