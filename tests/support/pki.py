"""Test certificates made with the ``openssl`` command: CAs, server and client certificates
(EC P-256, valid two days). Keys are written with mode 0600."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


@dataclass(frozen=True)
class Issued:
    cert: Path
    key: Path

    def der(self) -> bytes:
        """The certificate, DER-encoded (what ``SSLSocket.getpeercert(True)`` returns)."""
        return ssl.PEM_cert_to_DER_cert(self.cert.read_text())


def _openssl(cwd: Path, *args: str) -> None:
    binary = shutil.which("openssl")
    if binary is None:
        pytest.fail("the openssl command is needed to make test certificates")
    subprocess.run([binary, *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def make_ca(directory: Path, name: str) -> Issued:
    """A self-signed CA: ``<name>.pem`` and ``<name>.key``."""
    directory.mkdir(parents=True, exist_ok=True)
    _openssl(directory, "req", "-x509", *_EC, "-keyout", f"{name}.key", "-out", f"{name}.pem",
             "-days", "2", "-subj", f"/CN={name}",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    (directory / f"{name}.key").chmod(0o600)
    return Issued(directory / f"{name}.pem", directory / f"{name}.key")


def issue(directory: Path, ca: Issued, name: str, *, server: bool = True) -> Issued:
    """A certificate signed by ``ca``: for a server, valid for localhost and 127.0.0.1; for
    a client, for client authentication."""
    directory.mkdir(parents=True, exist_ok=True)
    _openssl(directory, "req", *_EC, "-keyout", f"{name}.key", "-out", f"{name}.csr",
             "-subj", f"/CN={name}")
    ext = directory / f"{name}.ext"
    if server:
        ext.write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n"
                       "extendedKeyUsage=serverAuth\n")
    else:
        ext.write_text("extendedKeyUsage=clientAuth\n")
    _openssl(directory, "x509", "-req", "-in", f"{name}.csr", "-CA", str(ca.cert), "-CAkey",
             str(ca.key), "-CAcreateserial", "-out", f"{name}.pem", "-days", "2",
             "-extfile", ext.name)
    (directory / f"{name}.key").chmod(0o600)
    return Issued(directory / f"{name}.pem", directory / f"{name}.key")


class Pki:
    """Two CAs; two server certificates and a client certificate from the first, a client
    certificate from the second."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.ca = make_ca(directory, "ca1")
        self.other_ca = make_ca(directory, "ca2")
        self.server1 = issue(directory, self.ca, "server1")
        self.server2 = issue(directory, self.ca, "server2")
        self.client = issue(directory, self.ca, "client1", server=False)
        self.stranger = issue(directory, self.other_ca, "client2", server=False)

    def encrypted_key(self, issued: Issued, dest: Path) -> Path:
        """``issued``'s key, encrypted with a passphrase."""
        _openssl(self.dir, "pkey", "-in", str(issued.key), "-aes256", "-passout",
                 "pass:secret", "-out", str(dest))
        dest.chmod(0o600)
        return dest
