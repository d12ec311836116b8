"""Chunking shell sessions: every prompt style starts a record, a command stays with its
output, small records share a chunk, a long output is cut between lines with its command
line atop every piece, and a secondary prompt continues its command.
"""

from __future__ import annotations

import pytest

from retrieval.chunking._chunker import chunk_text
from retrieval.chunking._session import PROMPT
from tests.support.chunk_samples import NGINX_STATUS, SESSION, sessions
from tests.support.chunks import assert_covered, assert_guarantees
from tests.support.scaling import assert_linear


@pytest.mark.parametrize(("line", "command"), [
    ("$ df -h", "df -h"),
    ("# systemctl restart nginx", "systemctl restart nginx"),
    ("> Get-Date", "Get-Date"),
    ("ops@web01:~$ df -h", "df -h"),
    ("root@web01:/etc/nginx# nginx -t", "nginx -t"),
    ("ops@web01 ~ % ls", "ls"),
    ("[root@web01 nginx]# ls -l", "ls -l"),
    ("(venv) $ pip list", "pip list"),
    ("(base) ops@gpu1:~/src$ make", "make"),
    ("PS C:\\Users\\ops> Get-Service nginx", "Get-Service nginx"),
    ("PS /home/ops> ls", "ls"),
    ("PS> dir", "dir"),
    ("C:\\Users\\ops> dir /s", "dir /s"),
])
def test_prompts_are_recognised(line: str, command: str) -> None:
    """Each documented prompt style matches, and what follows it is the command."""
    m = PROMPT.match(line)
    assert m is not None
    assert line[m.end():] == command


@pytest.mark.parametrize("line", [
    "$", "$   ", "#", "Filesystem      Size  Used", "  $ indented", "$HOME is set",
    "#comment", "web01 nginx[1001]: started", "10.0.0.1 > 10.0.0.2: ICMP echo",
    "PSU 1 > ok",
])
def test_output_lines_are_not_prompts(line: str) -> None:
    """A prompt needs a command after a space; output and indented lines are not
    commands."""
    assert PROMPT.match(line) is None


def test_long_output_is_cut_with_its_command_atop_each_piece() -> None:
    """`systemctl status nginx`'s output spans 3 chunks; each opens with the command line,
    is headed by the command, and the output lines appear once each, in order."""
    chunks = chunk_text(SESSION, "session", size=1200, overlap=0, max_chars=2000)
    status = [c for c in chunks if c.heading == "systemctl status nginx"]
    assert len(status) == 3
    seen: list[str] = []
    for n, c in enumerate(status):
        lines = c.text.split("\n")
        assert lines[0] == "$ systemctl status nginx"
        assert len(c.text) <= 1200
        body = lines[1:]
        if n == len(status) - 1:  # the next, smaller records join the last piece
            body = body[:body.index("[root@web01 nginx]# nginx -t")]
        seen += body
    assert [line for line in seen if line] == [line for line in NGINX_STATUS if line]


def test_small_records_share_a_chunk_headed_by_the_first_command() -> None:
    """The note and the short commands before the long output fill one chunk, headed by
    the first command; the text before any prompt is kept."""
    chunks = chunk_text(SESSION, "session", size=1200, overlap=0, max_chars=2000)
    first = chunks[0]
    assert first.heading == "uptime"
    assert first.text.startswith("Session on web01, ticket OPS-1234\n\nops@web01:~$ uptime\n")
    assert "ops@web01:~$ df -h /var\nFilesystem" in first.text
    assert "/dev/sda3        20G   20G     0 100% /var" in first.text


def test_each_command_stays_with_its_output() -> None:
    """No record is split when it fits a chunk, whatever the chunk size: each short
    command and its output are in one chunk."""
    for size in (200, 400, 1200):
        chunks = chunk_text(SESSION, "session", size=size, overlap=0, max_chars=size)
        for record in ("[root@web01 nginx]# nginx -t\nnginx: the configuration file syntax "
                       "is ok\n\nnginx: configuration file /etc/nginx/nginx.conf test is "
                       "successful",
                       "PS C:\\Users\\ops> Get-Service nginx\nStatus   Name\nRunning  nginx",
                       "(venv) $ pip list | wc -l\n42"):
            assert sum(record in c.text for c in chunks) == 1, (size, record)


def test_continuation_lines_stay_with_their_command() -> None:
    """`>` lines right after a command continue it instead of starting records."""
    chunks = chunk_text(SESSION, "session", size=120, overlap=0, max_chars=120)
    loop = [c for c in chunks if c.heading == 'for f in *.gz; do']
    assert len(loop) == 1
    assert loop[0].text == 'root@web01:/var/log# for f in *.gz; do\n> rm -- "$f"\n> done'


def test_a_long_command_line_is_cut_when_repeated() -> None:
    """A command line longer than half the chunk is a piece of its own, then repeated cut
    to half the chunk, ending in an ellipsis."""
    command = "$ curl -s https://example.com/" + "a" * 200
    text = command + "\n" + "\n".join(f"line {n}" for n in range(200))
    chunks = chunk_text(text, "session", size=300, overlap=0, max_chars=300)
    assert len(chunks) > 3
    assert chunks[0].text == command
    for c in chunks[1:]:
        assert c.text.startswith(command[:148] + "…\nline ")
        assert len(c.text) <= 300
    assert chunks[1].text.startswith(command[:148] + "…\nline 0\nline 1\n")
    assert_covered(text, chunks, "session", 300)


def test_session_fixture_keeps_the_guarantees() -> None:
    """At every size the session chunks are bounded, numbered, deterministic, covering."""
    for size, max_chars in ((1200, 2000), (300, 300), (64, 64), (10, 10), (1, 1)):
        chunks = chunk_text(SESSION, "session", size=size, overlap=0, max_chars=max_chars)
        assert_guarantees(SESSION, "session", size, 0, max_chars, chunks)
        assert_covered(SESSION, chunks, "session", size)


def test_sessions_chunk_in_linear_time() -> None:
    """8x the transcript, about 8x the CPU."""
    assert_linear(sessions, lambda text: chunk_text(text, "session"), 200_000)
