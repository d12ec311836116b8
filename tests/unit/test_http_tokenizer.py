"""The tokenizer routes and stored responses of the HTTP API in-process on port 0, over
the real router with scripted backends: /detokenize's shape and refusals, count_tokens
through the chat template (and its refusal where a runtime renders none), and a stored
response continued only with the token that created it."""

from __future__ import annotations

from pathlib import Path

from daemon.config.access import load_tokens
from tests.support.httpapi import client, serving

READ_1, READ_2 = "r1" * 10, "r2" * 10


async def test_detokenize_answers_the_text_and_refuses_bad_ids() -> None:
    """llama-server's shape both ways; ids that are not integers from 0, an unknown field
    and too many ids are a 400 naming the field, before any backend call."""
    async with serving() as h, client() as http:
        ok = await http.post(h.url + "/detokenize", json={"tokens": [2, 3]})
        assert ok.status_code == 200
        assert ok.json()["content"] == "xx xxx" and ok.json()["model"]
        for body, param in (({"tokens": [1, -2]}, "tokens"), ({"tokens": [1.5]}, "tokens"),
                            ({"tokens": [False]}, "tokens"), ({"tokens": "1 2"}, "tokens"),
                            ({"tokens": [1], "content": "x"}, "content"),
                            ({"tokens": [1] * 262_145}, "tokens")):
            refused = await http.post(h.url + "/detokenize", json=body)
            assert refused.status_code == 400, body
            assert refused.json()["error"]["param"] == param, refused.json()


async def test_count_tokens_is_the_rendered_prompt_with_special_tokens() -> None:
    """count_tokens tokenizes what the chat template renders (system and messages), with
    the special tokens a chat's prompt gets; where the runtime renders no template on
    request it is a 400 in Anthropic's shape saying so."""
    body = {"model": "gen", "system": "Be brief.",
            "messages": [{"role": "user", "content": "Name a colour."}]}
    async with serving() as h, client() as http:
        counted = await http.post(h.url + "/v1/messages/count_tokens", json=body)
        assert counted.status_code == 200, counted.text
        rendered = "<system>Be brief.<user>Name a colour."
        assert h.gen.tokenized[-1] == (rendered, True)
        assert counted.json() == {"input_tokens": len(rendered.split()) + 2}
        h.gen.no_template = "this runtime does not render its chat template on request"
        refused = await http.post(h.url + "/v1/messages/count_tokens", json=body)
    assert refused.status_code == 400
    assert refused.json()["type"] == "error"
    assert "does not render its chat template" in refused.json()["error"]["message"]


async def test_a_stored_response_is_continued_by_its_token_only(tmp_path: Path) -> None:
    """The response one token stored is continued with that token (its turn read before
    the new input) and unknown to another, a 400 naming previous_response_id."""
    path = tmp_path / "tokens"
    path.write_text(f"read {READ_1}\nread {READ_2}\n")
    path.chmod(0o600)
    async with serving(tokens=load_tokens(path)) as h, client() as http:
        first = await http.post(h.url + "/v1/responses", json={
            "model": "gen", "input": "My name is Ada."},
            headers={"Authorization": f"Bearer {READ_1}"})
        assert first.status_code == 200 and first.json()["store"] is True
        rid = first.json()["id"]
        body = {"model": "gen", "input": "What is my name?", "previous_response_id": rid}
        other = await http.post(h.url + "/v1/responses", json=body,
                                headers={"Authorization": f"Bearer {READ_2}"})
        own = await http.post(h.url + "/v1/responses", json=body,
                              headers={"Authorization": f"Bearer {READ_1}"})
    assert other.status_code == 400
    assert other.json()["error"]["param"] == "previous_response_id"
    assert own.status_code == 200 and own.json()["previous_response_id"] == rid
    assert [(m[0], m[1]) if isinstance(m, tuple) else (m.role, m.content)
            for m in h.gen.chats[-1]] == [("user", "My name is Ada."),
                                          ("assistant", "Hello, world"),
                                          ("user", "What is my name?")]
