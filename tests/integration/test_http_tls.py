"""The HTTP API over TLS with the daemon's certificate files (test certificates made with
openssl): HTTPS, a certificate reload seen by the next handshake, and mutual TLS."""

from __future__ import annotations

import asyncio
import ssl

import httpx
import pytest

from daemon.config.access import load_tls
from daemon.grpcapi.connlimits import ConnectionCap
from tests.support.httpapi import serving
from tests.support.pki import Issued, Pki


async def _peer_certificate(url: str, ca: Issued, client: Issued | None = None) -> bytes:
    """The DER certificate the server presents to a new TLS connection."""
    context = ssl.create_default_context(cafile=str(ca.cert))
    if client is not None:
        context.load_cert_chain(str(client.cert), str(client.key))
    host, port = url.removeprefix("https://").split(":")
    _, writer = await asyncio.open_connection(host, int(port), ssl=context)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(True)
        assert isinstance(der, bytes)
        return der
    finally:
        writer.close()


async def test_https_serves_and_follows_a_certificate_reload(pki: Pki) -> None:
    """With tls.cert_file and tls.key_file the API is HTTPS only; after a reload the next
    handshake presents the new certificate."""
    material = load_tls(str(pki.server1.cert), str(pki.server1.key))
    async with serving(tls=material) as h:
        async with httpx.AsyncClient(verify=ssl.create_default_context(
                cafile=str(pki.ca.cert)), trust_env=False) as http:
            assert (await http.get(h.url + "/v1/models")).status_code == 200
        assert await _peer_certificate(h.url, pki.ca) == pki.server1.der()
        h.api.update_tls(load_tls(str(pki.server2.cert), str(pki.server2.key)))
        assert await _peer_certificate(h.url, pki.ca) == pki.server2.der()
        async with httpx.AsyncClient(trust_env=False) as plain:
            with pytest.raises(httpx.HTTPError):
                await plain.get(h.url.replace("https://", "http://") + "/v1/models")


def _context(pki: Pki, client: Issued | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca.cert))
    if client is not None:
        context.load_cert_chain(str(client.cert), str(client.key))
    return context


async def test_mutual_tls_needs_a_client_certificate_of_the_ca(pki: Pki) -> None:
    """With tls.client_ca_file, a client without a certificate, or with one of another CA,
    is refused at the handshake; one of the CA is served."""
    material = load_tls(str(pki.server1.cert), str(pki.server1.key), str(pki.ca.cert))
    async with serving(tls=material) as h:
        async with httpx.AsyncClient(verify=_context(pki, pki.client), trust_env=False) as ok:
            assert (await ok.get(h.url + "/v1/models")).status_code == 200
        for client in (None, pki.stranger):
            async with httpx.AsyncClient(verify=_context(pki, client),
                                         trust_env=False) as refused:
                with pytest.raises(httpx.TransportError):
                    await refused.get(h.url + "/v1/models")


async def test_tls_connections_are_counted_at_accept_and_cut_at_the_handshake_timeout(
        pki: Pki) -> None:
    """Connections that never start their TLS handshake count against the listener's cap
    from the moment they are accepted (one past it is closed at once, unanswered: no
    plaintext 503 on a TLS port) and are closed at connections.handshake_timeout; then a
    TLS client is served."""
    material = load_tls(str(pki.server1.cert), str(pki.server1.key))
    async with serving(tls=material, connections=ConnectionCap(total=4, per_peer=0),
                       handshake_timeout=1.0) as h:
        host, port = h.url.removeprefix("https://").split(":")
        held = [await asyncio.open_connection(host, int(port)) for _ in range(4)]
        began = asyncio.get_running_loop().time()
        reader, writer = await asyncio.open_connection(host, int(port))
        assert await asyncio.wait_for(reader.read(), 5) == b""  # the fifth: closed at once
        writer.close()
        assert asyncio.get_running_loop().time() - began < 0.5
        for r, _ in held:  # the four: closed at the handshake timeout
            assert await asyncio.wait_for(r.read(), 5) == b""
        assert 0.8 <= asyncio.get_running_loop().time() - began < 3
        for _, w in held:
            w.close()
        assert h.api.connections.open == 0
        async with httpx.AsyncClient(verify=ssl.create_default_context(
                cafile=str(pki.ca.cert)), trust_env=False) as http:
            assert (await http.get(h.url + "/v1/models")).status_code == 200
