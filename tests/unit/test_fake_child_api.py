"""The fault-injecting fake llama-server's API, run as real processes on free ports:
deterministic completions and chat (plain and streamed, stop strings), a client's disconnect
cancelling the task, deterministic normalised embeddings (only in embedding mode), tokenize
and detokenize, and errors shaped like llama-server's.
"""

from __future__ import annotations

import base64
import json
import math
import socket
import struct
import time

import httpx
import pytest

from supervisor.testing import fake_child as fake
from tests.support.fake_children import PROMPT, Spawner, post_stream
from tests.support.load import patience

pytestmark = pytest.mark.process  # every test runs the fake child


def test_completion_is_deterministic(spawn: Spawner) -> None:
    """A non-streamed completion returns generate_tokens(prompt), the same every time."""
    child = spawn()
    child.wait_ready()
    body = {"prompt": PROMPT, "max_tokens": 5, "temperature": 0.7, "seed": 3}
    first = httpx.post(f"{child.url}/v1/completions", json=body).json()
    second = httpx.post(f"{child.url}/v1/completions", json=body).json()
    assert first["choices"] == second["choices"]
    assert first["object"] == "text_completion"
    assert first["model"] == "tiny.gguf"
    assert first["choices"][0]["text"] == "".join(fake.generate_tokens(PROMPT, 5))
    assert first["choices"][0]["finish_reason"] == "length"
    assert first["usage"] == {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}


def test_stream_completion_events(spawn: Spawner) -> None:
    """A streamed completion sends one event per token, a final event with usage, then [DONE]."""
    child = spawn()
    child.wait_ready()
    events: list[str] = []
    response = post_stream(
        f"{child.url}/v1/completions", {"prompt": PROMPT, "max_tokens": 4, "stream": True}, events
    )
    assert response.headers["content-type"] == "text/event-stream"
    assert response.headers["transfer-encoding"] == "chunked"
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert [c["choices"][0]["text"] for c in chunks[:-1]] == fake.generate_tokens(PROMPT, 4)
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 4
    assert child.stats() == {"cancelled": 0, "completions": 1, "active_streams": 0}


def test_chat_completion_plain_and_streamed(spawn: Spawner) -> None:
    """Chat answers carry message.content, and chat streams carry delta.content chunks."""
    child = spawn()
    child.wait_ready()
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    expected = "".join(fake.generate_tokens(fake.render_chat(messages), 3))
    url = f"{child.url}/v1/chat/completions"
    plain = httpx.post(url, json={"messages": messages, "max_tokens": 3}).json()
    assert plain["object"] == "chat.completion"
    assert plain["choices"][0]["message"] == {"role": "assistant", "content": expected}
    events: list[str] = []
    post_stream(url, {"messages": messages, "max_tokens": 3, "stream": True}, events)
    chunks = [json.loads(e) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == expected
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert events[-1] == "[DONE]"


def test_stop_string_ends_with_finish_reason_stop(spawn: Spawner) -> None:
    """Generation is cut before the first stop string and finish_reason is "stop"."""
    child = spawn()
    child.wait_ready()
    tokens = fake.generate_tokens(PROMPT, 10)
    body = {"prompt": PROMPT, "max_tokens": 10, "stop": [tokens[3].strip()]}
    choice = httpx.post(f"{child.url}/v1/completions", json=body).json()["choices"][0]
    assert choice == {
        "text": "".join(tokens[:3]) + " ",
        "index": 0,
        "logprobs": None,
        "finish_reason": "stop",
    }


def test_stream_disconnect_cancels_the_task(spawn: Spawner) -> None:
    """A client leaving mid-stream stops generation, logs the cancel and counts it."""
    child = spawn(token_delay=0.01)
    child.wait_ready()
    body = {"prompt": PROMPT, "max_tokens": 1000, "stream": True}
    with (
        httpx.Client(timeout=5.0) as client,
        client.stream("POST", f"{child.url}/v1/completions", json=body) as response,
    ):
        lines = response.iter_lines()
        received = [next(lines) for _ in range(5)]
        assert received[0].startswith("data: ")
        assert child.stats()["active_streams"] == 1
    deadline = time.monotonic() + patience(3.0)
    while child.stats() != {"cancelled": 1, "completions": 0, "active_streams": 0}:
        assert time.monotonic() < deadline, child.stats()
        time.sleep(0.02)
    assert "stop: cancel task, id_task = 0" in child.stderr()


def test_non_streamed_disconnect_cancels_the_task(spawn: Spawner) -> None:
    """A client leaving while a non-streamed completion generates cancels it too."""
    child = spawn(token_delay=0.01)
    child.wait_ready()
    body = json.dumps({"prompt": PROMPT, "max_tokens": 1000}).encode()
    request = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    with socket.create_connection(("127.0.0.1", child.port)) as sock:
        sock.sendall(request)
        time.sleep(0.1)
    deadline = time.monotonic() + patience(3.0)
    while child.stats()["cancelled"] != 1:
        assert time.monotonic() < deadline, child.stats()
        time.sleep(0.02)
    assert "stop: cancel task, id_task = 0" in child.stderr()


def test_embeddings_are_deterministic_and_normalised(spawn: Spawner) -> None:
    """Embeddings have n_embd floats of norm 1, equal for equal texts, also as base64."""
    child = spawn(embedding=True, n_embd=16)
    child.wait_ready()
    url = f"{child.url}/v1/embeddings"
    body = httpx.post(url, json={"input": ["alpha", "beta", "alpha"]}).json()
    assert body["object"] == "list"
    assert body["model"] == "tiny.gguf"
    vectors = [d["embedding"] for d in body["data"]]
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    assert all(len(v) == 16 for v in vectors)
    assert all(math.isclose(math.sqrt(sum(x * x for x in v)), 1.0) for v in vectors)
    assert vectors[0] == vectors[2] != vectors[1]
    assert vectors[0] == fake.embed_text("alpha", 16)
    single = httpx.post(url, json={"input": "alpha"}).json()["data"][0]["embedding"]
    assert single == vectors[0]
    packed = httpx.post(url, json={"input": "alpha", "encoding_format": "base64"}).json()
    floats = struct.unpack("<16f", base64.b64decode(packed["data"][0]["embedding"]))
    assert floats == pytest.approx(vectors[0], rel=1e-6)


def test_embeddings_refused_without_embedding_mode(spawn: Spawner) -> None:
    """Without --embedding, /v1/embeddings answers 501 with llama-server's message."""
    child = spawn()
    child.wait_ready()
    response = httpx.post(f"{child.url}/v1/embeddings", json={"input": "x"})
    assert response.status_code == 501
    assert "does not support embeddings" in response.json()["error"]["message"]


def test_completions_refused_in_embedding_mode(spawn: Spawner) -> None:
    """In --embedding mode the completion endpoints answer 501, as llama-server's do."""
    child = spawn(embedding=True)
    child.wait_ready()
    response = httpx.post(f"{child.url}/v1/completions", json={"prompt": "x"})
    assert response.status_code == 501
    assert response.json()["error"]["type"] == "not_supported_error"


def test_tokenize_and_detokenize(spawn: Spawner) -> None:
    """/tokenize gives one id per word (plus BOS on request) and /detokenize reverses it."""
    child = spawn()
    child.wait_ready()
    url = child.url
    plain = httpx.post(f"{url}/tokenize", json={"content": "a b c"}).json()["tokens"]
    special = httpx.post(f"{url}/tokenize", json={"content": "a b c", "add_special": True})
    assert len(plain) == 3
    assert special.json()["tokens"] == [1, *plain]
    back = httpx.post(f"{url}/detokenize", json={"tokens": special.json()["tokens"]}).json()
    assert back == {"content": "a b c"}


def test_errors_are_shaped_like_llama_server(spawn: Spawner) -> None:
    """Unknown paths answer 404 and malformed bodies 400, both in the error envelope."""
    child = spawn()
    child.wait_ready()
    missing = httpx.get(f"{child.url}/v2/nothing")
    assert missing.status_code == 404
    assert missing.json()["error"] == {
        "code": 404,
        "message": "File Not Found",
        "type": "not_found_error",
    }
    bad = httpx.post(f"{child.url}/v1/completions", content=b"{not json")
    assert bad.status_code == 400
    assert bad.json()["error"]["type"] == "invalid_request_error"
