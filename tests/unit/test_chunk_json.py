"""Chunking JSON: top-level members whole, a big array split between its elements under
its key path, closers kept with what they close, minified JSON cut after commas, and
any document (valid or not) chunked.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from retrieval.chunking._chunker import chunk_text
from tests.support.chunk_samples import INVENTORY, json_files
from tests.support.chunks import assert_covered, assert_guarantees
from tests.support.scaling import assert_linear


def test_a_big_array_is_split_between_elements_under_its_key() -> None:
    """The hosts array is cut between whole elements; each piece after the first opens
    with the path ``hosts``; every host is in exactly one chunk, whole."""
    chunks = chunk_text(INVENTORY, "json", size=1200, overlap=0, max_chars=2000)
    assert len(chunks) >= 5
    for n in range(80):
        host = (f'    {{\n      "name": "web{n:03d}",\n      "ip": "10.0.{n // 250}.'
                f'{n % 250}",\n      "tags": ["web", "rack{n % 8}"]\n    }}')
        assert sum(host in c.text for c in chunks) == 1, n
    middle = chunks[1:-1]
    for c in middle:
        assert c.heading == "hosts"
        assert c.text.startswith("hosts\n\n    {\n")


def test_small_members_share_the_first_chunk() -> None:
    """settings (small) and the array's opening share the first chunk, which has no
    heading (it holds several top-level members); the array's last piece takes nothing
    after it but its closing bracket."""
    chunks = chunk_text(INVENTORY, "json", size=1200, overlap=0, max_chars=2000)
    assert chunks[0].heading == ""
    assert chunks[0].text.startswith('{\n  "settings": {\n    "region": "eu-west-1",\n'
                                     '    "retries": 3\n  },\n  "hosts": [\n')
    assert chunks[-2].text.endswith('    }\n  ],')  # the array's tail stays under hosts
    assert chunks[-1].text == 'version\n\n  "version": 7\n}'


def test_nested_paths_name_keys_and_indexes() -> None:
    """At a small size the headings reach into elements: hosts[3]."""
    chunks = chunk_text(INVENTORY, "json", size=120, overlap=0, max_chars=120)
    headings = {c.heading for c in chunks}
    assert "hosts[3]" in headings
    web = next(c for c in chunks if '"name": "web003"' in c.text)
    assert web.heading == "hosts[3]"
    assert web.text.startswith('hosts[3]\n\n    {\n      "name": "web003",')


def test_minified_json_is_cut_after_commas() -> None:
    """One long line is cut after commas, never inside a value."""
    data = {"hosts": [{"name": f"web{n:03d}", "ip": f"10.0.0.{n}"} for n in range(200)]}
    text = json.dumps(data)
    chunks = chunk_text(text, "json", size=300, overlap=0, max_chars=300)
    assert len(chunks) > 10
    for c in chunks[:-1]:
        assert c.text.endswith(",")
    assert " ".join(c.text for c in chunks) == text  # the cuts replace ", " only
    assert_covered(text, chunks, "json", 300)


def test_invalid_json_still_chunks() -> None:
    """Unbalanced brackets, an unterminated string, comments and JSON Lines chunk,
    bounded and covering."""
    for text in ('{"a": [1, 2,\n "b": "unterminated\n}}}]]\n{"c": 3}\n',
                 '// settings\n{\n  /* the port */\n  "port": 80\n}\n',
                 '{"id": 1}\n{"id": 2}\n{"id": 3}\n', "]]]\n[[[\n"):
        for size in (8, 40, 1200):
            chunks = chunk_text(text, "json", size=size, overlap=0, max_chars=size)
            assert_guarantees(text, "json", size, 0, size, chunks)
            assert_covered(text, chunks, "json", size)


def _values() -> st.SearchStrategy[Any]:
    leaf = st.one_of(st.integers(), st.text(max_size=20), st.booleans(), st.none(),
                     st.floats(allow_nan=False, allow_infinity=False))
    return st.recursive(leaf, lambda inner: st.one_of(
        st.lists(inner, max_size=6), st.dictionaries(st.text(max_size=10), inner,
                                                     max_size=6)), max_leaves=80)


@settings(max_examples=150, deadline=None)
@given(data=_values(), indent=st.sampled_from([None, 0, 1, 2, 4]),
       size=st.integers(16, 600), extra=st.integers(0, 600))
def test_generated_documents_keep_the_guarantees(data: Any, indent: int | None, size: int,
                                                 extra: int) -> None:
    """Any JSON document, pretty or minified: bounded, numbered, deterministic,
    covering."""
    text = json.dumps(data, indent=indent)
    chunks = chunk_text(text, "json", size=size, overlap=0, max_chars=size + extra)
    assert_guarantees(text, "json", size, 0, size + extra, chunks)
    assert_covered(text, chunks, "json", size)


def test_json_chunks_in_linear_time() -> None:
    """8x the document, about 8x the CPU; 20 000 nested brackets neither recurse nor
    slow it down."""
    assert_linear(json_files, lambda text: chunk_text(text, "json"), 50_000)
    deep = "[\n" * 20_000 + "]\n" * 20_000
    assert_guarantees(deep, "json", 1200, 200, 2000, chunk_text(deep, "json"))
    assert_linear(lambda n: "{\n" * n + "}\n" * n, lambda text: chunk_text(text, "json"),
                  4_000)
