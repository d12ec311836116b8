"""Access material read from files: bearer tokens with roles, and TLS certificates.

No gRPC here: :mod:`daemon.config` loads and validates these files at start (a bad file
is a configuration error, exit status 2) and again on SIGHUP (a bad file refuses the
reload as a whole, so the running tokens and certificates stay); :mod:`daemon.grpcapi.auth` uses
what they hold.

The token file (``auth.token_file``) holds one ``<role> <token>`` per line::

    # who uses it                 role   token
    # NOC dashboard (read only)
    read   4f1d0c2a9b7e43f8a1c6d5e2b3a49f70
    # deploy pipeline
    admin  b93e7c1d2a4f4e6b8c0d9e1f2a3b4c5d

Roles are ``read`` and ``admin`` (admin implies read). A token is 16 to 4096 visible
ASCII characters (no spaces); ``#`` starts a comment line; blank lines are ignored. The
file must be a regular file that nobody but its owner and group can read or write (the
daemon refuses to start otherwise, naming the file and its mode).

After the token, a line may give the token a class, a lane and quotas, as ``key=value``
terms in any order (issue 28; enforced by :mod:`daemon.services.quotas`)::

    read  9c0e...  class=nightly-etl lane=batch rpm=120 tpm=200000

* ``class``: the name its calls are counted and logged under (metrics, log lines: never
  the token); 1 to 32 of ``A-Z a-z 0-9 _ . -``, at most :data:`MAX_CLASSES` different
  names in a file; default ``default``.
* ``lane``: the highest lane its model calls travel in (``interactive``, the default, or
  ``batch``): a batch token's calls wait in the batch lane even when they ask for
  interactive; any token may ask for batch.
* ``rpm``: its calls that spend model time per quota window (``auth.quota_window``,
  60 s), ``tpm``: the prompt and generated tokens of those calls per window, counted when
  each call ends; 0 or absent: no limit. Limits are the token's own: two tokens of one
  class each have theirs.

Tokens are kept only as SHA-256 digests. A presented token is hashed and compared with
every configured digest by :func:`hmac.compare_digest`, without stopping at a match, so
the time taken says nothing about which token (or how much of one) matched. Logs show a
token only as a short fingerprint: an HMAC under a key drawn at random when the process
starts, so it cannot be reversed (not even for a short guessed secret) and is stable only
within one run; the fingerprints of the configured tokens are logged when they are loaded,
so a denial can be matched to a line of the file.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import ssl
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

READ = "read"
ADMIN = "admin"
ROLES = (READ, ADMIN)

MIN_TOKEN_CHARS = 16
MAX_TOKEN_CHARS = 4096
MAX_TOKEN_FILE_BYTES = 1024 * 1024
MAX_PEM_FILE_BYTES = 1024 * 1024
MAX_CLASSES = 32
"""Class names a token file may use: they are a metrics label (bounded cardinality)."""
DEFAULT_CLASS = "default"
TOKEN_LANES = ("interactive", "batch")
"""The lanes a token may be given (:data:`daemon.models.lanes.CLIENT_LANES`)."""
MAX_QUOTA = 10**12
_CLASS_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")

_FINGERPRINT_KEY = secrets.token_bytes(32)


class AccessError(ValueError):
    """A token, certificate or key file is missing, unsafe or malformed.

    The message names the file (and what is wrong), never a token or key.
    """


def fingerprint(token: str) -> str:
    """A short, non-reversible name for a token, for logs (stable within this process)."""
    return hmac.new(_FINGERPRINT_KEY, token.encode("utf-8", "surrogatepass"),
                    hashlib.sha256).hexdigest()[:12]


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


@dataclass(frozen=True)
class TokenEntry:
    """One line of the token file: the role, the digest (never the token), and the
    class, lane and quotas its terms give (module docstring)."""

    role: str
    digest: bytes = field(repr=False)
    fingerprint: str
    line: int = field(compare=False)
    klass: str = DEFAULT_CLASS
    lane: str = "interactive"
    rpm: int = 0
    tpm: int = 0


@dataclass(frozen=True)
class TokenTable:
    """The bearer tokens of ``auth.token_file``, as digests."""

    path: str
    entries: tuple[TokenEntry, ...]

    def role_of(self, token: str) -> str | None:
        """The role of ``token`` (``read`` or ``admin``), None when it is not configured.

        Constant time in the token: every configured digest is compared, always.
        """
        entry = self.entry_of(token)
        return None if entry is None else entry.role

    def entry_of(self, token: str) -> TokenEntry | None:
        """The line of ``token`` (role, class, lane, quotas), None when it is not
        configured; constant time in the token, as :meth:`role_of`."""
        presented = _digest(token)
        found: TokenEntry | None = None
        for entry in self.entries:
            if hmac.compare_digest(presented, entry.digest):
                found = entry
        return found

    def classes(self) -> frozenset[str]:
        """The class names the file uses (the metrics' label values)."""
        return frozenset(entry.klass for entry in self.entries)

    def roles(self) -> dict[str, list[str]]:
        """Fingerprints of the configured tokens by role, for the log."""
        out: dict[str, list[str]] = {r: [] for r in ROLES}
        for entry in self.entries:
            out[entry.role].append(entry.fingerprint)
        return out


@contextlib.contextmanager
def _opened(path: Path, what: str) -> Iterator[int]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise AccessError(f"{what} {path}: {exc.strerror}") from None
    try:
        yield fd
    finally:
        os.close(fd)


def _read_file(path: Path, what: str, limit: int, *, private: bool) -> bytes:
    """Read a small regular file; with ``private``, refuse one that others may read or
    write. The checks are made on the open file, not the name (no race with a rename)."""
    with _opened(path, what) as fd:
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise AccessError(f"{what} {path} is not a regular file")
            mode = stat.S_IMODE(st.st_mode)
            if private and mode & stat.S_IROTH:
                raise AccessError(f"{what} {path} is readable by everyone (mode {mode:04o}); "
                                  "chmod o-rwx it")
            if private and mode & stat.S_IWOTH:
                raise AccessError(f"{what} {path} is writable by everyone (mode {mode:04o}); "
                                  "chmod o-rwx it")
            if st.st_size > limit:
                raise AccessError(f"{what} {path} is larger than {limit} bytes")
            data = b""
            while len(data) <= limit:
                chunk = os.read(fd, limit + 1 - len(data))
                if not chunk:
                    break
                data += chunk
        except OSError as exc:
            raise AccessError(f"{what} {path}: {exc.strerror}") from None
    if len(data) > limit:
        raise AccessError(f"{what} {path} is larger than {limit} bytes")
    return data


def _visible_ascii(token: str) -> bool:
    return all(0x21 <= ord(ch) <= 0x7E for ch in token)


def _terms(terms: list[str], where: str) -> tuple[str, str, int, int]:
    """A line's ``key=value`` terms after its token (module docstring), checked: its
    class, lane, rpm and tpm.

    Raises:
        AccessError: an unknown or repeated key, or a bad value, naming the line.
    """
    # No value is ever quoted back: a token written in the wrong place must not reach
    # the log through its error.
    out: dict[str, str] = {}
    for n, term in enumerate(terms, start=1):
        key, eq, value = term.partition("=")
        if not eq or key not in ("class", "lane", "rpm", "tpm"):
            raise AccessError(f"{where}: term {n} after the token is not one of class=NAME "
                              "lane=interactive|batch rpm=N tpm=N")
        if key in out:
            raise AccessError(f"{where}: {key} given twice")
        if key == "class" and not (1 <= len(value) <= 32 and set(value) <= _CLASS_CHARS):
            raise AccessError(f"{where}: class must be 1 to 32 of A-Z a-z 0-9 _ . -")
        if key == "lane" and value not in TOKEN_LANES:
            raise AccessError(f"{where}: lane must be {' or '.join(TOKEN_LANES)}")
        if key in ("rpm", "tpm") and not (value.isascii() and value.isdigit()
                                          and len(value) <= 13 and int(value) <= MAX_QUOTA):
            raise AccessError(f"{where}: {key} must be a whole number from 0 to "
                              f"{MAX_QUOTA} (0: no limit)")
        out[key] = value
    return (out.get("class", DEFAULT_CLASS), out.get("lane", TOKEN_LANES[0]),
            int(out.get("rpm", "0")), int(out.get("tpm", "0")))


def load_tokens(path: str | os.PathLike[str]) -> TokenTable:
    """Read and check a token file (format in the module docstring).

    Raises:
        AccessError: unreadable, not a regular file, readable or writable by others, not
            UTF-8, a malformed line (by number, never its token), an unknown role, a token
            too short or too long, a token listed twice, or no token at all.
    """
    p = Path(path)
    what = "token file"
    raw = _read_file(p, what, MAX_TOKEN_FILE_BYTES, private=True)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise AccessError(f"{what} {p} is not UTF-8 text") from None
    entries: list[TokenEntry] = []
    seen: dict[bytes, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        fields = stripped.split()
        if len(fields) < 2:
            raise AccessError(f"{what} {p}, line {number}: expected '<role> <token>' "
                              f"(roles: {', '.join(ROLES)})")
        role, token = fields[:2]
        if role not in ROLES:
            raise AccessError(f"{what} {p}, line {number}: unknown role {role[:20]!r} "
                              f"(roles: {', '.join(ROLES)})")
        if not MIN_TOKEN_CHARS <= len(token) <= MAX_TOKEN_CHARS:
            raise AccessError(f"{what} {p}, line {number}: a token must be "
                              f"{MIN_TOKEN_CHARS} to {MAX_TOKEN_CHARS} characters long "
                              f"(this one has {len(token)})")
        if not _visible_ascii(token):
            raise AccessError(f"{what} {p}, line {number}: a token may hold visible ASCII "
                              "characters only")
        digest = _digest(token)
        if digest in seen:
            raise AccessError(f"{what} {p}, line {number}: the same token as line "
                              f"{seen[digest]}")
        seen[digest] = number
        klass, lane, rpm, tpm = _terms(fields[2:], f"{what} {p}, line {number}")
        entries.append(TokenEntry(role, digest, fingerprint(token), number, klass, lane,
                                  rpm, tpm))
    if not entries:
        raise AccessError(f"{what} {p} holds no token (one '<role> <token>' per line)")
    classes = {entry.klass for entry in entries}
    if len(classes) > MAX_CLASSES:
        raise AccessError(f"{what} {p} names {len(classes)} classes; at most {MAX_CLASSES} "
                          "(a class is a metrics label)")
    return TokenTable(str(p), tuple(entries))


# --- TLS ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TlsMaterial:
    """The server's certificate chain and key, and the client CA for mutual TLS."""

    cert_file: str
    key_file: str
    client_ca_file: str
    cert_chain: bytes = field(repr=False)
    private_key: bytes = field(repr=False)
    client_ca: bytes | None = field(repr=False)

    @property
    def require_client_cert(self) -> bool:
        return self.client_ca is not None


class _EncryptedKey(Exception):
    pass


def _no_password() -> bytes:
    raise _EncryptedKey


@contextlib.contextmanager
def _memfile(data: bytes) -> Iterator[str]:
    """A path naming exactly ``data`` (an anonymous in-memory file), so what is validated
    is what is served, even if the file on disk changes meanwhile."""
    fd = os.memfd_create("llamad-tls", os.MFD_CLOEXEC)
    try:
        os.write(fd, data)
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


def _check_pair(cert_chain: bytes, private_key: bytes, cert_file: str, key_file: str) -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        try:
            with _memfile(cert_chain) as cert_path, _memfile(private_key) as key_path:
                context.load_cert_chain(cert_path, key_path, password=_no_password)
        except ssl.SSLError:
            raise
        except OSError:  # no memfd or no /proc: validate the files themselves
            context.load_cert_chain(cert_file, key_file, password=_no_password)
    except _EncryptedKey:
        raise AccessError(f"tls key file {key_file} is encrypted; llamad needs an "
                          "unencrypted key (protect it with file permissions)") from None
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc):
            raise AccessError(f"tls key file {key_file} does not match the certificate "
                              f"{cert_file}") from None
        raise AccessError(f"tls certificate {cert_file} or key {key_file} is not valid "
                          f"PEM ({exc.reason or exc})") from None
    except OSError as exc:
        raise AccessError(f"tls certificate {cert_file} or key {key_file}: "
                          f"{exc.strerror or exc}") from None


def server_ssl_context(material: TlsMaterial) -> ssl.SSLContext:
    """An :class:`ssl.SSLContext` serving ``material`` (already checked by
    :func:`load_tls`): exactly its bytes, not the files as they are now, and requiring a
    client certificate signed by its client CA when it has one (for listeners that are
    not gRPC: the HTTP API)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with _memfile(material.cert_chain) as cert_path, \
            _memfile(material.private_key) as key_path:
        context.load_cert_chain(cert_path, key_path, password=_no_password)
    if material.client_ca is not None:
        context.load_verify_locations(cadata=material.client_ca.decode("ascii"))
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def load_tls(cert_file: str, key_file: str, client_ca_file: str = "") -> TlsMaterial:
    """Read and check the server's certificate chain and key, and the client CA.

    The key must not be readable by others; the pair must parse and match; the client CA
    (optional) must hold at least one certificate.

    Raises:
        AccessError: naming the file and what is wrong with it.
    """
    cert = _read_file(Path(cert_file), "tls certificate", MAX_PEM_FILE_BYTES, private=False)
    key = _read_file(Path(key_file), "tls key file", MAX_PEM_FILE_BYTES, private=True)
    if b"-----BEGIN CERTIFICATE-----" not in cert:
        raise AccessError(f"tls certificate {cert_file} holds no PEM certificate")
    if b"PRIVATE KEY-----" not in key:
        raise AccessError(f"tls key file {key_file} holds no PEM private key")
    _check_pair(cert, key, cert_file, key_file)
    ca: bytes | None = None
    if client_ca_file:
        ca = _read_file(Path(client_ca_file), "tls client CA file", MAX_PEM_FILE_BYTES,
                        private=False)
        if b"-----BEGIN CERTIFICATE-----" not in ca:
            raise AccessError(f"tls client CA file {client_ca_file} holds no PEM certificate")
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_verify_locations(
                cadata=ca.decode("ascii"))
        except (ssl.SSLError, UnicodeDecodeError, ValueError) as exc:
            raise AccessError(f"tls client CA file {client_ca_file} is not valid PEM "
                              f"({getattr(exc, 'reason', None) or exc})") from None
    return TlsMaterial(cert_file, key_file, client_ca_file, cert, key, ca)

