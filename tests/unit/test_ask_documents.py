"""Ask's prompt by document, its trimmed conversation and its operator templates (issue 30):
a document's chunks are one source under one label, joined in document order; an
over-long conversation loses its oldest turns, never the question; an operator's template
set is checked (a missing slot named) and versioned by its hash.

The token counter is a character count: assembly only needs a monotonic measure.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from daemon.config import ConfigError, load
from daemon.config.answer_templates import load_templates
from daemon.services.ask import Assembled, PromptTooLarge, assemble, documents
from daemon.services.ask._core import cite
from daemon.services.ask._plan import BELOW_FLOOR, KEPT, OVER_BUDGET, planned, sections
from retrieval import Hit

_SOURCE = re.compile(r'<source label="(S\d+)" title="([^"]*)"')


def chunk(doc: int, ordinal: int, text: str, *, score: float = 0.5, heading: str = ""
          ) -> Hit:
    return Hit(chunk_id=f"kb/doc{doc}.md#{ordinal}", doc_id=f"kb/doc{doc}.md",
               title=f"doc {doc}", source_id="kb", path=f"doc{doc}.md", heading=heading,
               text=text, snippet=text[:40], search_source="hybrid", fused_score=score,
               score=score,
               text_rank=1, text_score=5.0, vector_rank=1, vector_score=score,
               indexed_at=1_700_000_000, ordinal=ordinal)


async def chars(text: str) -> int:
    return len(text)


async def build(hits: list[Hit], *, budget: int = 100_000, question: str = "Why?",
                history: tuple[tuple[str, str], ...] = ()) -> Assembled:
    return await assemble(question=question, task="answer", hits=hits, history=history,
                          attachment="", budget=budget, count_tokens=chars)


# --- one source per document --------------------------------------------------------------

async def test_a_documents_chunks_are_one_source_in_document_order() -> None:
    """Two chunks of doc 1 (ranked 1st and 3rd, the 3rd earlier in the document) and one of
    doc 2: two sources, doc 1's chunks joined in document order under S1, one citation
    per document with every chunk id, the best chunk's id and score."""
    hits = [chunk(1, 7, "seventh: rotate the logs", score=0.9),
            chunk(2, 1, "other runbook", score=0.8),
            chunk(1, 2, "second: check df -h", score=0.7)]
    assembled = await build(hits)
    user = assembled.messages[-1][1]
    assert _SOURCE.findall(user) == [("S1", "doc 1"), ("S2", "doc 2")]
    assert user.index("second: check df -h") < user.index("seventh: rotate the logs")
    assert "[…]" in user  # chunks 2 and 7 are not adjacent: the gap is marked
    citations = cite(assembled)
    assert [c.label for c in citations] == ["S1", "S2"]
    assert citations[0].chunk_id == "kb/doc1.md#7" and citations[0].score == 0.9
    assert citations[0].chunk_ids == ("kb/doc1.md#2", "kb/doc1.md#7")
    assert citations[1].chunk_ids == ("kb/doc2.md#1",)


async def test_adjacent_chunks_join_without_a_gap_mark_and_headings_merge() -> None:
    hits = [chunk(1, 3, "three", heading="Disk"), chunk(1, 4, "four", heading="Disk"),
            chunk(1, 5, "five", heading="Logs")]
    user = (await build(hits)).messages[-1][1]
    assert "three\nfour\nfive" in user and "[…]" not in user
    assert 'section="Disk / Logs"' in user


async def test_over_budget_the_lowest_ranked_chunk_goes_first() -> None:
    """The budget drops chunks by rank, not whole documents: doc 1 keeps its best chunk
    when its weaker one goes; the dropped count is in chunks."""
    hits = [chunk(1, 1, "a" * 300, score=0.9), chunk(2, 1, "b" * 300, score=0.8),
            chunk(1, 9, "c" * 300, score=0.7)]
    full = await build(hits)
    assembled = await build(hits, budget=full.prompt_tokens - 100)
    assert assembled.dropped == 1
    assert [tuple(h.chunk_id for h in d) for d in assembled.documents] == [
        ("kb/doc1.md#1",), ("kb/doc2.md#1",)]
    assert "c" * 300 not in assembled.messages[-1][1]


def test_documents_group_by_best_rank() -> None:
    hits = [chunk(3, 1, "x"), chunk(1, 5, "y"), chunk(3, 0, "z"), chunk(2, 2, "w")]
    assert [[h.chunk_id for h in d] for d in documents(hits)] == [
        ["kb/doc3.md#0", "kb/doc3.md#1"], ["kb/doc1.md#5"], ["kb/doc2.md#2"]]


# --- an over-long conversation ------------------------------------------------------------

async def test_an_over_long_conversation_loses_its_oldest_turns_first() -> None:
    history = tuple((("user", "assistant")[i % 2], f"turn{i} " + "x" * 400)
                    for i in range(6))
    hits = [chunk(1, 1, "rotate the logs")]
    whole = await build(hits, history=history)
    assert whole.turns_dropped == 0
    assembled = await build(hits, history=history, budget=whole.prompt_tokens - 500)
    assert assembled.turns_dropped == 2
    kept = [content for role, content in assembled.messages[1:-1]]
    assert [k.split()[0] for k in kept] == ["turn2", "turn3", "turn4", "turn5"]
    assert "rotate the logs" in assembled.messages[-1][1]  # the source stayed
    assert assembled.prompt_tokens <= assembled.budget


async def test_history_goes_before_the_best_source_does() -> None:
    """When the best source and the conversation cannot both fit, the turns go."""
    history = (("user", "y" * 1000),)
    hits = [chunk(1, 1, "z" * 500)]
    alone = await build(hits)
    assembled = await build(hits, history=history, budget=alone.prompt_tokens + 50)
    assert assembled.turns_dropped == 1 and assembled.dropped == 0


async def test_only_a_question_that_does_not_fit_is_refused() -> None:
    history = tuple(("user", "h" * 500) for _ in range(4))
    small = await build([], history=history, budget=1200, question="q" * 100)
    assert small.turns_dropped == 4  # everything but the question went
    with pytest.raises(PromptTooLarge):
        await build([], history=history, budget=1200, question="q" * 2000)


# --- the dry run's account ----------------------------------------------------------------

async def test_a_plan_says_what_became_of_each_hit() -> None:
    strong = [chunk(1, 1, "a" * 300, score=0.9), chunk(2, 1, "b" * 300, score=0.8)]
    weak = chunk(3, 1, "unrelated", score=0.1)
    full = await build(strong)
    assembled = await build(strong, budget=full.prompt_tokens - 100)
    plan = planned([*strong, weak], lambda h: h.fused_score >= 0.3, assembled)
    assert [(p.chunk_id, p.verdict, p.label) for p in plan] == [
        ("kb/doc1.md#1", KEPT, "S1"), ("kb/doc2.md#1", OVER_BUDGET, ""),
        ("kb/doc3.md#1", BELOW_FLOOR, "")]
    parts = await sections(assembled, chars)
    assert [s.role for s in parts] == ["system", "user"]
    assert [s.tokens for s in parts] == [len(s.content) for s in parts]


# --- operator templates -------------------------------------------------------------------

def test_packaged_templates_load_and_hash_stably() -> None:
    a, b = load_templates(), load_templates()
    assert a.sha256 == b.sha256 and len(a.sha256) == 64
    assert not a.operator
    assert "{sources}" in a["answer"].text


@pytest.mark.parametrize(("name", "body", "message"), [
    ("answer.txt", "Sources: {sources}\nAnswer it.", "lacks its required slot {question}"),
    ("diagnose.txt", "{question}", "lacks its required slot {sources}"),
    ("answer.txt", "{sources} {question} {secret}", "unknown slot {secret}"),
    ("system.txt", "Be brief {question}", "unknown slot {question}"),
    ("summarize.txt", "{sources} {question} {", "literal brace"),
    ("answers.txt", "{sources} {question}", "unknown template answers.txt"),
    ("no_context.txt", "", "is empty"),
    ("answer.txt", "{sources:>99999999} {question}", "no format spec"),
    ("answer.txt", "{sources} {question.__class__}", "unknown slot {question.__class__}"),
])
def test_a_broken_template_is_refused_naming_it(tmp_path: Path, name: str, body: str,
                                                 message: str) -> None:
    (tmp_path / name).write_text(body)
    with pytest.raises(ConfigError) as refused:
        load_templates(str(tmp_path))
    assert message in str(refused.value)
    assert name in str(refused.value)


def test_an_operator_set_replaces_what_it_names_and_changes_the_hash(tmp_path: Path
                                                                     ) -> None:
    (tmp_path / "system.txt").write_text("You answer for ACME ops. Cite [S1].\n")
    (tmp_path / "no_context.txt").write_text("Nothing on {question}; ask #ops.\n")
    (tmp_path / "README.md").write_text("not a template: ignored")
    ours = load_templates(str(tmp_path))
    assert ours.operator and ours["system"].text.startswith("You answer for ACME ops.")
    assert ours["answer"] == load_templates()["answer"]  # the rest stay packaged
    assert ours.sha256 != load_templates().sha256
    (tmp_path / "system.txt").write_text("You answer for ACME ops, briefly.\n")
    assert load_templates(str(tmp_path)).sha256 != ours.sha256


async def test_assembly_uses_the_operator_set_and_versions_it(tmp_path: Path) -> None:
    (tmp_path / "answer.txt").write_text("# version: 7\nRUNBOOKS\n{sources}\nASKED: "
                                         "{question}\n")
    templates = load_templates(str(tmp_path))
    assembled = await assemble(question="Why?", task="answer", hits=[chunk(1, 1, "t")],
                               history=(), attachment="", budget=10_000,
                               count_tokens=chars, templates=templates)
    assert assembled.messages[-1][1].startswith("RUNBOOKS\n<source")
    assert assembled.messages[-1][1].endswith("ASKED: Why?")
    assert assembled.template_version == f"system/2+answer/7@{templates.sha256[:12]}"


def test_the_configuration_refuses_a_broken_template_directory(tmp_path: Path) -> None:
    """At load (and so on reload, which loads): the slot is named."""
    (tmp_path / "answer.txt").write_text("{sources}")
    env = {"LLAMAD_ANSWER_TEMPLATES_DIR": str(tmp_path), "LLAMAD_GENERATION_MODE": "disabled",
           "LLAMAD_EMBEDDING_MODE": "disabled"}
    with pytest.raises(ConfigError, match=r"lacks its required slot \{question\}"):
        load(env=env)
    with pytest.raises(ConfigError, match="cannot be read"):
        load(env={**env, "LLAMAD_ANSWER_TEMPLATES_DIR": str(tmp_path / "missing")})
    (tmp_path / "answer.txt").write_text("{sources}\n{question}")
    assert load(env=env).settings.answer.templates_dir == str(tmp_path)


async def test_adjacent_chunks_lose_the_overlap_and_heading_they_repeat() -> None:
    """The chunker repeats the tail of a chunk at the head of the next (the overlap) and
    starts each with its heading: joined, the document's text is in the prompt once."""
    words = " ".join(f"word{i}" for i in range(300))
    first = "Disk\n\n" + words[:1200]
    second = "Disk\n\n" + words[1000:2200]  # 200 characters of overlap
    other = "Logs\n\n" + words[2000:2400]     # another section: its heading stays
    user = (await build([chunk(1, 1, first, heading="Disk"),
                         chunk(1, 2, second, heading="Disk"),
                         chunk(1, 3, other, heading="Logs")])).messages[-1][1]
    assert words[:1200] + "\n" + words[1200:2200].lstrip() in user
    assert user.count(words[1000:1200]) == 1 and user.count("Disk\n\n") == 1
    assert "Logs\n\n" in user
    # Text that merely shares a few words is not taken for an overlap.
    short = (await build([chunk(2, 1, "alpha beta gamma"),
                          chunk(2, 2, "gamma delta")])).messages[-1][1]
    assert "alpha beta gamma\ngamma delta" in short
