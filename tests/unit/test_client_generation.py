"""The clients' generation controls: keyword arguments to SamplingParams, logprobs back as
dataclasses (chunks and collect), the fake daemon's logprobs and refusals, and the
``generate``/``chat`` control flags."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import pytest

from clients import Client, TokenLogprobs, errors
from clients._generation import sampling
from clients.cli._generation import ControlError, add_controls, controls
from clients.testing import FakeLlamad
from daemon.cli import main
from llamad_protocol.v1 import inference_pb2 as ipb

SCHEMA = {"type": "object", "required": ["ok"], "properties": {"ok": {"type": "boolean"}}}


def test_keyword_arguments_become_sampling_params() -> None:
    """Each control lands in its SamplingParams field; unset ones stay unset; a logit
    bias keyed by int is a token id and by str a text; a schema mapping is sent as JSON
    and implies response_format json_schema."""
    params = sampling(min_p=0.1, repeat_penalty=1.1, repeat_last_n=32, presence_penalty=0.5,
                      frequency_penalty=0.25, logit_bias={15: -100, " no": 2.5}, logprobs=True,
                      top_logprobs=3, json_schema=SCHEMA, dry_multiplier=0.8, dry_base=1.75,
                      dry_allowed_length=2, dry_penalty_last_n=64, seed=7, stop=["\n"])
    assert params.repeat_last_n == 32 and params.dry_penalty_last_n == 64
    assert (params.logprobs, params.top_logprobs, params.seed) == (True, 3, 7)
    assert [(b.WhichOneof("target"), b.bias) for b in params.logit_bias] == [
        ("token", -100), ("text", 2.5)]
    assert params.logit_bias[1].text == " no"
    assert params.response_format.type == ipb.RESPONSE_FORMAT_TYPE_JSON_SCHEMA
    assert json.loads(params.response_format.json_schema) == SCHEMA
    assert not params.HasField("max_tokens") and not params.grammar
    bare = sampling()
    assert not any(bare.HasField(f) for f in ("min_p", "repeat_penalty", "dry_base",
                                              "top_logprobs", "response_format"))
    assert sampling(response_format="json_object").response_format.type == (
        ipb.RESPONSE_FORMAT_TYPE_JSON_OBJECT)
    assert sampling(grammar='root ::= "a"').grammar == 'root ::= "a"'


def test_misspelt_control_is_a_type_error() -> None:
    """A control generate does not know (forwarded to sampling) is a TypeError naming it,
    raised before anything is sent."""
    with Client("127.0.0.1:1") as client, pytest.raises(TypeError, match="max_token"):
        client.generate("x", max_token=3)  # type: ignore[call-arg]


def test_contradicting_formats_are_refused_before_sending() -> None:
    """An unknown response_format, or a schema with json_object, is a ValueError."""
    with pytest.raises(ValueError, match="response_format must be one of"):
        sampling(response_format="yaml")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="json_schema needs response_format 'json_schema'"):
        sampling(response_format="json_object", json_schema=SCHEMA)


def test_logprobs_come_back_per_chunk_and_collected(fake: FakeLlamad) -> None:
    """With logprobs, every chunk carries its token (id, bytes, alternatives) and
    collect() gathers them in order; without, none; top_logprobs alone is refused."""
    with Client(fake.address) as client:
        chunks = list(client.generate("hi", max_tokens=3, logprobs=True, top_logprobs=2))
        assert [len(c.logprobs) for c in chunks] == [1, 1, 1, 0]
        first = chunks[0].logprobs[0]
        assert isinstance(first, TokenLogprobs)
        assert (first.chosen.token, first.chosen.bytes, first.chosen.id) == ("The", b"The", 0)
        assert [t.token for t in first.top] == ["The", " quick"]
        result = client.chat([("user", "hi")], max_tokens=2, logprobs=True).collect()
        assert [e.chosen.token for e in result.logprobs] == ["The", " quick"]
        assert client.generate("hi", max_tokens=2).collect().logprobs == ()
        with pytest.raises(errors.InvalidArgument, match=r"needs sampling\.logprobs"):
            client.generate("hi", top_logprobs=2).collect()


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_controls(parser.add_argument_group("sampling"))
    return parser.parse_args(list(argv))


def test_control_flags_become_keyword_arguments(tmp_path: Path) -> None:
    """--logprobs N asks N alternatives; --json-schema and --grammar read their files;
    --logit-bias takes token ids and texts; unset flags are None."""
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    kw = controls(parse("--min-p", "0.05", "--logprobs", "3", "--json-schema", str(schema),
                        "--logit-bias", "15=-100", "--logit-bias", " no=2.5",
                        "--dry-multiplier", "0.8"))
    assert (kw["min_p"], kw["logprobs"], kw["top_logprobs"]) == (0.05, True, 3)
    assert json.loads(kw["json_schema"]) == SCHEMA
    assert kw["logit_bias"] == {15: -100.0, " no": 2.5}
    assert kw["dry_multiplier"] == 0.8 and kw["repeat_penalty"] is None
    grammar = tmp_path / "yes-no.gbnf"
    grammar.write_text('root ::= "yes" | "no"\n')
    assert controls(parse("--grammar", str(grammar)))["grammar"] == 'root ::= "yes" | "no"\n'
    assert controls(parse("--json-object"))["response_format"] == "json_object"
    with pytest.raises(ControlError, match="give TOKEN=BIAS"):
        controls(parse("--logit-bias", "15"))
    with pytest.raises(ControlError, match=r"--grammar .*missing\.gbnf"):
        controls(parse("--grammar", str(tmp_path / "missing.gbnf")))
    with pytest.raises(SystemExit):  # one output constraint at a time
        parse("--json-object", "--grammar", str(grammar))


def test_cli_prints_the_logprobs_table_and_json(
        fake: FakeLlamad, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """generate --logprobs prints the text then a token/logprob/alternatives table;
    with --json each chunk's logprobs (bytes as integers) are in its line; an unreadable
    --grammar file is a usage error (exit 2)."""
    monkeypatch.setenv("LLAMAD_ADDRESS", fake.address)
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert main(["generate", "hi", "--max-tokens", "2", "--logprobs", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "The quick"
    assert out[1].split() == ["token", "logprob", "alternatives"]
    assert out[2].startswith("'The'") and "' quick'" in out[2]
    assert main(["chat", "--user", "hi", "--max-tokens", "1", "--logprobs", "0",
                 "--json"]) == 0
    first = json.loads(capsys.readouterr().out.splitlines()[0])
    assert first["logprobs"][0]["chosen"]["bytes"] == list(b"The")
    assert first["logprobs"][0]["top"] == []
    assert main(["generate", "hi", "--grammar", str(tmp_path / "nope.gbnf")]) == 2
    assert "--grammar" in capsys.readouterr().err
