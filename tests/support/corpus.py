"""A small corpus of runbooks on disk, for the retrieval and answer tests against a real
daemon."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from llamad_protocol.v1 import retrieval_pb2 as rpb
from llamad_protocol.v1 import retrieval_pb2_grpc
from tests.support.daemon import EMB, Clients

RUNBOOKS = {
    "runbooks/web01.md": """# web01

## Disk full on web01

When web01 reports `No space left on device`, the nginx access logs under
/var/log/nginx have usually grown past 40 GB. Rotate them with
`logrotate -f /etc/logrotate.d/nginx`, then check `df -h /var`.

## TLS certificate renewal

web01 uses certbot; run `certbot renew --dry-run` first.
""",
    "runbooks/db02.md": """# db02

## Replication lag

If db02 falls behind the primary, check `SELECT now() - pg_last_xact_replay_timestamp();`
and look for long-running queries on the replica.

## Vacuum

Autovacuum thresholds are tuned in postgresql.conf.
""",
    "runbooks/vpn.md": """# VPN gateway

## Tunnel flapping

The IPsec tunnel to 10.20.0.1 flaps when dead peer detection is too aggressive.
Set `dpd 30` and check CVE-2024-3094 was patched on the gateway image v2.4.1.
""",
    "configs/core-sw1.cfg": """hostname core-sw1
!
interface GigabitEthernet0/1
 description uplink to web01
 switchport mode trunk
!
interface GigabitEthernet0/2
 description db02 replication link
 switchport access vlan 20
!
""",
}


def write_corpus(root: Path) -> None:
    for rel, text in RUNBOOKS.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


async def index_corpus(c: Clients, corpus: Path) -> None:
    """Index ``corpus`` as the directory source ``docs`` of the serving daemon ``c`` calls,
    once Status shows its embedding model's SHA-256 (vectors need it)."""
    deadline = time.monotonic() + 20
    while not (await c.child(EMB)).model_sha256:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    r = retrieval_pb2_grpc.RetrievalServiceStub(c.channel)
    await r.AddSource(rpb.AddSourceRequest(id="docs", path=str(corpus)))
    _ = [m async for m in r.Reindex(rpb.ReindexRequest(source_id="docs"))]
