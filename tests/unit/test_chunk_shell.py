"""Chunking shell scripts: each function whole with the comment above it, braces in
quotes, comments and here-documents ignored, every definition style recognised, and a
function too big for a chunk cut with its definition line atop each piece.
"""

from __future__ import annotations

from retrieval.chunking._chunker import chunk_text
from tests.support.chunk_samples import SHELL, shell_scripts
from tests.support.chunks import assert_covered, assert_guarantees
from tests.support.scaling import assert_linear


def test_functions_are_whole_and_headed_by_their_definition() -> None:
    """Every definition style is one function from its comment to its closing brace; a
    brace in quotes, a comment or a here-document does not end it."""
    chunks = chunk_text(SHELL, "shell", size=60, overlap=0, max_chars=400)
    by_heading = {c.heading: c.text for c in chunks}
    assert by_heading["restart_nginx()"].startswith("# Restart nginx and wait for it.\n"
                                                    "restart_nginx() {\n")
    assert by_heading["restart_nginx()"].endswith("then { echo ok; }; fi\n}")
    assert by_heading["function deploy"] == ('function deploy {\n  echo "deploying $1"  '
                                             '# a } in a comment\n}')
    assert by_heading["oneliner()"] == "oneliner() { echo hi; }"
    assert by_heading["next_line_brace()"] == ('next_line_brace()\n{\n  echo "the brace on '
                                               'its own line"\n}')
    assert chunks[0].heading == ""
    assert chunks[0].text == "#!/bin/bash\n# Deploy helpers.\nset -euo pipefail"
    assert chunks[-1].text == 'main "$@"'


def test_small_functions_share_a_chunk() -> None:
    """At the default size the whole script is one chunk headed by its first function."""
    chunks = chunk_text(SHELL, "shell")
    assert len(chunks) == 1
    assert chunks[0].heading == "restart_nginx()"


def test_a_big_function_is_cut_with_its_definition_line_repeated() -> None:
    """A function over max_chars is cut between lines; each piece after the first opens
    with the definition line and is headed by it."""
    text = "deploy_all() {\n" + "".join(f"  deploy web{n:02d}\n" for n in range(80)) + "}\n"
    chunks = chunk_text(text, "shell", size=200, overlap=0, max_chars=200)
    assert len(chunks) > 5
    for c in chunks:
        assert c.heading == "deploy_all()"
        assert c.text.startswith("deploy_all() {\n  deploy web")
    assert chunks[-1].text.endswith("\n}")
    assert_covered(text, chunks, "shell", 200)


def test_here_strings_and_shifts_are_not_here_documents() -> None:
    """``<<<`` and ``<< 2`` open no here-document; ``<<-'END'`` does, and a brace in it
    does not count."""
    text = ("f() {\n  grep x <<< \"$input\"\n  echo $(( 1 << 2 ))\n}\n\nmain\n\n"
            "g() {\n  cat <<-'END'\n\t} not a brace\n\tEND\n}\n")
    chunks = chunk_text(text, "shell", size=40, overlap=0, max_chars=60)
    assert [(c.heading, c.text) for c in chunks] == [
        ("f()", 'f() {\n  grep x <<< "$input"\n  echo $(( 1 << 2 ))\n}'), ("", "main"),
        ("g()", "g() {\n  cat <<-'END'\n\t} not a brace\n\tEND\n}")]


def test_an_unbalanced_function_ends_at_the_next_definition() -> None:
    """A stray quote keeps braces from balancing; the next definition at column 0 still
    starts a function of its own."""
    text = "broken() {\n  echo 'oops\n}\n\nfine() {\n  echo ok\n}\n"
    chunks = chunk_text(text, "shell", size=30, overlap=0, max_chars=30)
    assert [c.heading for c in chunks] == ["broken()", "fine()"]
    assert chunks[1].text == "fine() {\n  echo ok\n}"
    for size in (5, 30, 1200):
        got = chunk_text(text, "shell", size=size, overlap=0, max_chars=size)
        assert_guarantees(text, "shell", size, 0, size, got)
        assert_covered(text, got, "shell", size)


def test_shell_chunks_in_linear_time() -> None:
    """8x the script, about 8x the CPU."""
    assert_linear(shell_scripts, lambda text: chunk_text(text, "shell"), 200_000)
