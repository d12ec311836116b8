"""The endpoint client's pieces: URL normalisation, the API key file and variable, failure
naming, model choice — and, against a tiny real HTTP server, the auth header, the retry
without a rejected optional parameter, and a missing tokenizer."""

from __future__ import annotations

import os
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from supervisor import (
    ENDPOINT_KINDS,
    ChildRequestError,
    EndpointClient,
    EndpointError,
    EndpointSpec,
    Sampling,
    TokenizeUnavailableError,
    display_url,
    normalise_url,
    pick_model,
    read_api_key,
    transport_error,
)
from supervisor.endpoint._launch import unusable
from tests.support.fake_openai import serve_fake_openai

KEY = "sk-test-0123456789"

# --- URLs --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "root"),
    [
        ("http://127.0.0.1:8080", "http://127.0.0.1:8080"),
        ("http://127.0.0.1:8080/", "http://127.0.0.1:8080"),
        ("http://127.0.0.1:8080/v1", "http://127.0.0.1:8080"),
        ("http://127.0.0.1:8080/v1/", "http://127.0.0.1:8080"),
        ("  HTTPS://llm.example:443/v1  ", "https://llm.example:443"),
        ("https://gateway.example/team/llm/v1", "https://gateway.example/team/llm"),
        ("https://gateway.example/team/llm", "https://gateway.example/team/llm"),
        ("http://[::1]:8080/v1", "http://[::1]:8080"),
        ("http://user:pw@10.0.0.5:8080/v1", "http://user:pw@10.0.0.5:8080"),
    ],
)
def test_normalise_url(given: str, root: str) -> None:
    """With or without /v1 and a trailing slash, the same root; a path prefix is kept."""
    assert normalise_url(given) == root


@pytest.mark.parametrize(
    ("given", "needle"),
    [
        ("ftp://host/v1", "scheme must be http or https"),
        ("127.0.0.1:8080", "scheme must be http or https"),
        ("http:///v1", "no host"),
        ("http://host:99999/v1", "not a valid URL"),
        ("http://host/v1?key=abc", "query"),
        ("http://host/v1#frag", "fragment"),
        ("http://host:8080/v1/chat/completions", "base URL"),
        ("http://host:8080/v1/models", "base URL"),
    ],
)
def test_normalise_url_refuses(given: str, needle: str) -> None:
    """Anything but an http(s) root URL is refused, saying why."""
    with pytest.raises(ValueError, match=needle):
        normalise_url(given)


def test_url_errors_never_show_credentials() -> None:
    """A refused URL's message shows it without its user:password."""
    with pytest.raises(ValueError, match="needs-a-path") as err:
        normalise_url("ftp://alice:s3cret@needs-a-path/v1")
    assert "s3cret" not in str(err.value)
    assert "alice" not in str(err.value)


@pytest.mark.parametrize(
    ("given", "shown"),
    [
        ("http://user:pw@10.0.0.5:8080/v1", "http://10.0.0.5:8080/v1"),
        ("https://token@host/llm", "https://host/llm"),
        ("http://host:8080", "http://host:8080"),
    ],
)
def test_display_url_strips_userinfo(given: str, shown: str) -> None:
    """What Status and logs print has no credentials."""
    assert display_url(given) == shown


def test_spec_repr_hides_credentials() -> None:
    """An EndpointSpec printed (a log line, a traceback) shows no userinfo."""
    spec = EndpointSpec("http://bob:hunter2@host:1/v1", "m", api_key_env="K")
    assert "hunter2" not in repr(spec)
    assert "host:1" in repr(spec)


# --- API keys ----------------------------------------------------------------------------


def key_file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "key"
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.mark.parametrize("mode", [0o600, 0o400, 0o700])
def test_key_file_not_world_readable_is_read(tmp_path: Path, mode: int) -> None:
    """A key file only its owner can read gives its one key line."""
    path = key_file(tmp_path, f"# the LLM gateway\n\n{KEY}\n", mode)
    assert read_api_key(str(path)) == KEY


@pytest.mark.parametrize("mode", [0o644, 0o604, 0o666, 0o640, 0o620, 0o602])
def test_group_or_world_accessible_key_file_is_refused(tmp_path: Path, mode: int) -> None:
    """A key file group or others can read or write is refused, with the fix; the key is
    never shown."""
    path = key_file(tmp_path, KEY + "\n", mode)
    with pytest.raises(EndpointError) as err:
        read_api_key(str(path))
    assert err.value.kind == "api_key"
    assert err.value.permanent
    assert "readable or writable by group or others" in str(err.value)
    assert "chmod 600" in str(err.value)
    assert KEY not in str(err.value)


def test_malformed_key_file_is_refused(tmp_path: Path) -> None:
    """A key file must hold exactly one key: not none, not a list, not a sentence, not
    text an HTTP header cannot carry, not a big file; the error is the same whichever it
    is, so it tells nothing of the file (no line count, no first bytes)."""
    messages = set()
    for text in ["", "# only a comment\n", f"{KEY}\nsecond-key\n", "two words\n",
                 "caf\u00e9-key\n", "root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1\n",
                 "x" * 5000]:
        with pytest.raises(EndpointError, match="is not a key file") as err:
            read_api_key(str(key_file(tmp_path, text)))
        messages.add(str(err.value))
    assert len(messages) == 1, messages
    assert "second-key" not in messages.pop()


def test_missing_or_odd_key_files_are_refused(tmp_path: Path) -> None:
    """A missing file, a directory and a huge file are each refused by name."""
    with pytest.raises(EndpointError, match="No such file"):
        read_api_key(str(tmp_path / "nope"))
    with pytest.raises(EndpointError, match="not a regular file"):
        read_api_key(str(tmp_path))
    big = key_file(tmp_path, "x" * 5000)
    with pytest.raises(EndpointError, match="is not a key file"):
        read_api_key(str(big))


def test_key_from_environment_variable() -> None:
    """api_key_env names a variable; unset or empty is refused by its name."""
    assert read_api_key("", "LLM_KEY", {"LLM_KEY": f" {KEY}\n"}) == KEY
    with pytest.raises(EndpointError, match=r"LLM_KEY .* not set or empty"):
        read_api_key("", "LLM_KEY", {})
    with pytest.raises(EndpointError, match="not set or empty"):
        read_api_key("", "LLM_KEY", {"LLM_KEY": "  "})


def test_no_key_and_both_keys(tmp_path: Path) -> None:
    """Neither set: no key (None). Both set: refused."""
    assert read_api_key("", "", {}) is None
    with pytest.raises(EndpointError, match="not both"):
        read_api_key(str(key_file(tmp_path, KEY)), "LLM_KEY", {"LLM_KEY": KEY})


# --- failures named ----------------------------------------------------------------------


def chained(outer: BaseException, *inner: BaseException) -> BaseException:
    """``outer`` raised from ``inner[0]``, raised from ``inner[1]``, ... (as httpx does)."""
    current = outer
    for exc in inner:
        current.__cause__ = exc
        current = exc
    return outer


@pytest.mark.parametrize(
    ("exc", "kind", "needle"),
    [
        (chained(httpx.ConnectError("All connection attempts failed"),
                 OSError("All connection attempts failed"),
                 ConnectionRefusedError(111, "Connect call failed")),
         "refused", "connection refused"),
        (chained(httpx.ConnectError("[SSL: WRONG_VERSION_NUMBER]"),
                 ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number")),
         "tls", "TLS handshake failed"),
        (chained(httpx.ConnectError("certificate verify failed"),
                 ssl.SSLCertVerificationError(1, "certificate verify failed")),
         "tls", "certificate not trusted"),
        (chained(httpx.ConnectError("Name or service not known"),
                 socket.gaierror(-2, "Name or service not known")),
         "unreachable", "cannot resolve"),
        (httpx.ConnectTimeout(""), "unreachable", "connecting timed out"),
        (httpx.ReadTimeout(""), "timeout", "no answer in time"),
        (httpx.RemoteProtocolError("Server disconnected"), "endpoint_error",
         "dropped the connection"),
        (httpx.ConnectError("No route to host"), "unreachable", "cannot connect"),
    ],
)
def test_transport_errors_are_named(exc: BaseException, kind: str, needle: str) -> None:
    """A request without an answer is named: refused, TLS, DNS, timeouts, dropped."""
    error = transport_error(exc, "GET http://h:1/v1/models")
    assert (error.kind, error.permanent) == (kind, ENDPOINT_KINDS[kind])
    assert needle in str(error)
    assert str(error).startswith("GET http://h:1/v1/models: ")


def test_every_kind_has_a_permanence() -> None:
    """Each named failure says whether retrying can help (transient ones back off)."""
    assert {k for k, permanent in ENDPOINT_KINDS.items() if not permanent} == {
        "refused", "unreachable", "timeout", "endpoint_error"}


@pytest.mark.parametrize(
    ("embedding", "status", "message", "kind"),
    [
        (True, 501, "This server does not support embeddings. Start it with `--embeddings`",
         "no_embeddings"),
        (True, 404, "Not Found", "no_embeddings"),
        (True, 400, "The model does not support Embeddings API", "no_embeddings"),
        (False, 500, "the current context does not support logits computation", "not_chat"),
        (False, 404, "This is not a chat model", "not_chat"),
        (False, 400, "default chat template is no longer allowed", "not_chat"),
        (False, 503, "Loading model", "endpoint_error"),
        (True, 500, "out of memory", "endpoint_error"),
    ],
)
def test_readiness_failures_are_named(embedding: bool, status: int, message: str,
                                      kind: str) -> None:
    """The tiny readiness request's failure says what is wrong with the endpoint."""
    error = unusable(ChildRequestError(f"/v1/x: HTTP {status}: {message}", status=status),
                     embedding=embedding, where="endpoint http://h:1", model="m")
    assert error.kind == kind
    assert error.permanent == (kind != "endpoint_error")


MODELS: list[dict[str, Any]] = [{"id": "/models/SmolLM2.gguf", "aliases": ["smol"]},
                                {"id": "qwen2.5:0.5b"}]


@pytest.mark.parametrize(
    ("wanted", "picked"),
    [("qwen2.5:0.5b", "qwen2.5:0.5b"), ("smol", "/models/SmolLM2.gguf"),
     ("SmolLM2.gguf", "/models/SmolLM2.gguf")],
)
def test_pick_model_by_id_alias_or_file_name(wanted: str, picked: str) -> None:
    """The configured model is found by id, by alias, or by file name when the id is a
    path (as llama-server reports it)."""
    assert pick_model(MODELS, wanted, "endpoint e")["id"] == picked


def test_pick_model_refusals() -> None:
    """Unknown model, several without a choice, none at all: each said, with the list."""
    with pytest.raises(EndpointError, match=r"does not offer the model 'gpt-4'; it offers: "
                       r"/models/SmolLM2.gguf, qwen2.5:0.5b") as err:
        pick_model(MODELS, "gpt-4", "endpoint e")
    assert err.value.kind == "unknown_model"
    with pytest.raises(EndpointError, match=r"offers 2 models .* choose one"):
        pick_model(MODELS, "", "endpoint e")
    with pytest.raises(EndpointError, match="offers no models"):
        pick_model([], "", "endpoint e")
    assert pick_model(MODELS[1:], "", "endpoint e")["id"] == "qwen2.5:0.5b"


# --- against a tiny real server ----------------------------------------------------------


@pytest.fixture
def server() -> Iterator[tuple[str, list[tuple[str, dict[str, Any], str]]]]:
    with serve_fake_openai(key=KEY, prefix="/prefix") as (url, seen):
        yield url + "/", seen


async def test_client_against_a_strict_server(
    server: tuple[str, list[tuple[str, dict[str, Any], str]]],
) -> None:
    """Models are discovered under the path prefix with the key; a stream whose
    stream_options and top_k the server rejects is retried once without them, and they
    are not sent again; a missing tokenizer is FAILED_PRECONDITION material."""
    url, seen = server
    client = EndpointClient(url, api_key=KEY)
    try:
        models = await client.discover()
        client.use_model(str(models[0]["id"]), models[0])
        assert (client.model_id, client.context_length) == ("tiny-chat", 2048)
        sampling = Sampling(max_tokens=4, top_k=5)
        chunks = [c async for c in client.stream_chat([("user", "hi")], sampling)]
        assert "".join(c.text for c in chunks) == "The answer is 42. "
        posts = [body for path, body, _ in seen if path.endswith("/chat/completions")]
        assert len(posts) == 3  # rejected twice (one parameter at a time), then served
        assert "stream_options" in posts[0]
        assert "stream_options" not in posts[1] and "top_k" in posts[1]
        assert "stream_options" not in posts[2] and "top_k" not in posts[2]
        assert posts[2]["model"] == "tiny-chat"
        del seen[:]
        await client.complete_chat([("user", "hi")], sampling)
        assert len(seen) == 1 and "top_k" not in seen[0][1]  # remembered
        with pytest.raises(TokenizeUnavailableError, match="not available from this endpoint"):
            await client.tokenize("hello")
        asked = len(seen)
        with pytest.raises(TokenizeUnavailableError):
            await client.tokenize("hello")
        assert len(seen) == asked  # known now: not asked again
        assert all(auth == f"Bearer {KEY}" for _, _, auth in seen)
        assert KEY not in repr(client)
    finally:
        await client.aclose()


async def test_wrong_key_and_wrong_path(
    server: tuple[str, list[tuple[str, dict[str, Any], str]]],
) -> None:
    """A wrong key is 'auth' (the key never in the message); a root that serves HTML on
    /v1/models is 'not_openai'."""
    url, _ = server
    wrong = EndpointClient(url, api_key="not-the-key")
    try:
        with pytest.raises(EndpointError) as err:
            await wrong.discover()
        assert err.value.kind == "auth"
        assert "refused the API key (HTTP 401: Invalid API Key)" in str(err.value)
        assert "not-the-key" not in str(err.value)
    finally:
        await wrong.aclose()
    keyless = EndpointClient(url, api_key=None)
    try:
        with pytest.raises(EndpointError, match="needs an API key"):
            await keyless.discover()
    finally:
        await keyless.aclose()
    no_prefix = EndpointClient(url.replace("/prefix", ""), api_key=KEY)
    try:
        with pytest.raises(EndpointError, match=r"not an OpenAI-compatible endpoint: GET "
                           r"/v1/models answered HTTP 404 \(text/html\)") as err:
            await no_prefix.discover()
        assert err.value.kind == "not_openai"
    finally:
        await no_prefix.aclose()


def test_key_file_permission_check_uses_the_opened_file(tmp_path: Path) -> None:
    """The mode checked is the file actually read (fstat), so a symlink to a
    world-readable file is refused too."""
    target = key_file(tmp_path, KEY, 0o644)
    link = tmp_path / "link"
    os.symlink(target, link)
    with pytest.raises(EndpointError, match="readable or writable by group or others"):
        read_api_key(str(link))


def test_key_file_of_another_user_is_refused(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A key file owned by someone other than the daemon's user or root is refused, by
    its owner's uid (another user could change the key llamad sends)."""
    path = key_file(tmp_path, KEY)
    if os.geteuid() == 0:
        os.chown(path, 65534, 65534)
        owner = 65534
    else:  # the daemon runs as another user than the file's owner
        owner = os.geteuid()
        monkeypatch.setattr(os, "geteuid", lambda: owner + 1)
    with pytest.raises(EndpointError, match=f"owned by uid {owner}") as err:
        read_api_key(str(path))
    assert KEY not in str(err.value)


def test_key_from_environment_must_be_a_header_value() -> None:
    """A variable holding spaces or non-ASCII text is no key; its value is not quoted."""
    with pytest.raises(EndpointError, match="holds no key") as err:
        read_api_key("", "LLM_KEY", {"LLM_KEY": "two words"})
    assert "two" not in str(err.value)
