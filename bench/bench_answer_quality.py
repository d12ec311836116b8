"""Answer quality of the default-model candidates: do Ask and Chat answer sensibly?

For each generation model and each sampling setting, a real llamad daemon (``python -m
daemon serve``, llama-server children, the default embedding model) indexes the runbooks
of ``bench/data/runbooks`` and answers the questions of ``bench/data/questions.json``:

* Ask (no response cache): the share of answers that contain the question's key fact,
  cite a source label inline ([S1]...), and repeat no line more than twice; and the share
  that are degenerate (:func:`tests.support.repetition.degenerate`: a line more than
  twice, a phrase more than 4 times back to back, a character more than 24 times).
* Chat (no sources): the share of degenerate answers.

Prints one markdown table row per (model, setting), and writes them with every answer
to ``bench/results/answer_quality.json``. Run: ``.venv/bin/python -m
bench.bench_answer_quality`` (about 1-2 minutes per model and setting on 2 cores).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc

from bench._daemon import DaemonProcess, wait_ready
from bench._support import ROOT, foreign_benchmarks, git_head, model_file, short
from llamad_protocol.v1 import answer_pb2 as apb
from llamad_protocol.v1 import answer_pb2_grpc, inference_pb2_grpc, retrieval_pb2_grpc
from llamad_protocol.v1 import inference_pb2 as ipb
from llamad_protocol.v1 import retrieval_pb2 as rpb
from tests.support.repetition import MAX_LINE_REPEATS, cites, degenerate, line_repeats

DATA = ROOT / "bench" / "data"
OUT = ROOT / "bench" / "results" / "answer_quality.json"
CANDIDATES = ("gemma-3-270m-q4_k_m.gguf", "SmolLM2-135M-Instruct.Q4_1.gguf")
EMBED_MODEL = "all-MiniLM-L6-v2-f16.gguf"

_DRY = {"dry_multiplier": 0.8, "dry_base": 1.75, "dry_allowed_length": 2}
_SAMPLE = {"temperature": 0.7, "top_p": 0.9, "min_p": 0.05, "seed": 42}
SETTINGS: dict[str, dict[str, Any]] = {
    "greedy": {"temperature": 0.0},
    "greedy+rp": {"temperature": 0.0, "repeat_penalty": 1.1},
    "greedy+dry": {"temperature": 0.0, **_DRY},
    "sample+rp": {**_SAMPLE, "repeat_penalty": 1.1},
    "sample+dry": {**_SAMPLE, **_DRY},
    "sample": dict(_SAMPLE),
    "low+dry": {**_SAMPLE, "temperature": 0.3, **_DRY},
    "sample+dry+fp": {**_SAMPLE, **_DRY, "frequency_penalty": 0.5},
    "greedy+dry+fp": {"temperature": 0.0, **_DRY, "frequency_penalty": 0.5},
    "sample+dry+rp": {**_SAMPLE, **_DRY, "repeat_penalty": 1.05},
    "low+dry+fp": {**_SAMPLE, "temperature": 0.3, **_DRY, "frequency_penalty": 0.5},
    "sample+fp": {**_SAMPLE, "frequency_penalty": 0.5},
    # Nothing but a seed: the daemon's configured defaults (answer.*, limits.chat_*).
    "defaults": {"seed": 42},
}


@dataclass
class Row:
    """One model under one setting."""

    model: str
    setting: str
    asks: int = 0
    fact: int = 0
    cited: int = 0
    no_line_repeat: int = 0
    all_three: int = 0
    ask_degenerate: int = 0
    chats: int = 0
    chat_degenerate: int = 0
    seconds: float = 0.0
    answers: list[dict[str, Any]] = field(default_factory=list)

    def cells(self) -> list[str]:
        def share(n: int, of: int) -> str:
            return f"{n}/{of} ({100 * n / of:.0f}%)" if of else "—"
        return [self.model, self.setting, share(self.fact, self.asks),
                share(self.cited, self.asks), share(self.no_line_repeat, self.asks),
                share(self.all_three, self.asks), share(self.ask_degenerate, self.asks),
                share(self.chat_degenerate, self.chats), f"{self.seconds:.0f}"]


HEADER = ["model", "setting", "Ask: key fact", "Ask: cites [Sn]", "Ask: no line > 2x",
          "Ask: all three", "Ask: degenerate", "Chat: degenerate", "s"]


def tally(row: Row) -> None:
    """Score ``row``'s answers (again: the counts start from zero)."""
    row.asks = row.fact = row.cited = row.no_line_repeat = row.all_three = 0
    row.ask_degenerate = row.chats = row.chat_degenerate = 0
    for answer in row.answers:
        text = answer["text"]
        bad = degenerate(text)
        answer["degenerate"] = bad
        if answer["call"] == "Chat":
            row.chats += 1
            row.chat_degenerate += bool(bad)
            continue
        found, cited = has_fact(text, answer["facts"]), cites(text)
        lines_ok = line_repeats(text) <= MAX_LINE_REPEATS
        answer["fact"], answer["cited"] = found, cited
        row.asks += 1
        row.fact += found
        row.cited += cited
        row.no_line_repeat += lines_ok
        row.all_three += found and cited and lines_ok
        row.ask_degenerate += bool(bad)


def sampling(setting: dict[str, Any], max_tokens: int) -> ipb.SamplingParams:
    return ipb.SamplingParams(max_tokens=max_tokens, **setting)


def has_fact(text: str, facts: list[str]) -> bool:
    squeezed = " ".join(text.lower().split())
    return any(" ".join(f.lower().split()) in squeezed for f in facts)


async def ask(stub: answer_pb2_grpc.AnswerServiceStub, question: str,
              params: ipb.SamplingParams) -> tuple[str, list[str]]:
    text, labels = [], []
    request = apb.AskRequest(question=question, sampling=params, no_cache=True)
    async for event in stub.Ask(request, timeout=300):
        kind = event.WhichOneof("event")
        if kind == "text":
            text.append(event.text)
        elif kind == "sources":
            labels = [c.document_id for c in event.sources.citations]
    return "".join(text), labels


async def chat(stub: inference_pb2_grpc.InferenceServiceStub, question: str,
               params: ipb.SamplingParams) -> str:
    request = ipb.ChatRequest(messages=[ipb.ChatMessage(role=ipb.CHAT_ROLE_USER,
                                                        content=question)],
                              sampling=params)
    return "".join([m.text async for m in stub.Chat(request, timeout=300)])


def write(out: Path, max_tokens: int, rows: list[Row]) -> None:
    """The rows so far, with every answer, as JSON (rewritten after each row)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"commit": git_head(), "max_tokens": max_tokens,
                               "settings": {r.setting: SETTINGS[r.setting] for r in rows},
                               "rows": [asdict(r) for r in rows]}, indent=1))


async def run_model(model: str, settings: list[str], questions: dict[str, Any],
                    max_tokens: int, *, limit: int, chat_limit: int,
                    done: list[Row], out: Path) -> list[Row]:
    tmp = Path(tempfile.mkdtemp(prefix="llamad-quality-"))
    env = {
        "LLAMAD_LISTEN": "127.0.0.1:0",
        "LLAMAD_STATE_DIR": str(tmp / "state"),
        "LLAMAD_GENERATION_MODEL": str(model_file(model)),
        "LLAMAD_EMBEDDING_MODEL": str(model_file(EMBED_MODEL)),
        "LLAMAD_GENERATION_RUNTIME": "llama-server",
        "LLAMAD_EMBEDDING_RUNTIME": "llama-server",
        "LLAMAD_GENERATION_THREADS": "2",
        "LLAMAD_EMBEDDING_THREADS": "2",
        "LLAMAD_GENERATION_PARALLEL": "1",
        "LLAMAD_GENERATION_CTX_SIZE": "4096",
        "LLAMAD_RETRIEVAL_ALLOWED_ROOTS": str(DATA),
        "LLAMAD_LOG_FORMAT": "json",
    }
    daemon = DaemonProcess(env, tmp / "daemon.log")
    rows = []
    try:
        address = await daemon.address()
        async with grpc.aio.insecure_channel(address) as channel:
            await wait_ready(channel)
            retrieval = retrieval_pb2_grpc.RetrievalServiceStub(channel)
            await retrieval.AddSource(rpb.AddSourceRequest(id="runbooks",
                                                           path=str(DATA / "runbooks")))
            _ = [m async for m in retrieval.Reindex(rpb.ReindexRequest(source_id="runbooks"))]
            answers = answer_pb2_grpc.AnswerServiceStub(channel)
            inference = inference_pb2_grpc.InferenceServiceStub(channel)
            for name in settings:
                row = Row(short(model), name)
                began = time.monotonic()
                params = sampling(SETTINGS[name], max_tokens)
                for item in questions["ask"][:limit]:
                    text, sources = await ask(answers, item["q"], params)
                    row.answers.append({"call": "Ask", "q": item["q"], "text": text,
                                        "facts": item["facts"], "sources": sources})
                for question in questions["chat"][:chat_limit]:
                    text = await chat(inference, question, params)
                    row.answers.append({"call": "Chat", "q": question, "text": text})
                row.seconds = time.monotonic() - began
                tally(row)
                print("| " + " | ".join(row.cells()) + " |", flush=True)
                rows.append(row)
                write(out, max_tokens, done + rows)
    finally:
        await daemon.stop()
    return rows


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--models", nargs="+", default=list(CANDIDATES))
    p.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    p.add_argument("--max-tokens", type=int, default=160)
    p.add_argument("--limit", type=int, default=1000, help="Ask questions to ask")
    p.add_argument("--chat-limit", type=int, default=1000, help="Chat questions to ask")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--rescore", type=Path, nargs="+", default=[],
                   help="score the answers stored in these result files again, and exit")
    args = p.parse_args()
    if args.rescore:
        print("| " + " | ".join(HEADER) + " |")
        print("|" + "---|" * len(HEADER))
        facts = {q["q"]: q["facts"] for q in
                 json.loads((DATA / "questions.json").read_text())["ask"]}
        for path in args.rescore:
            for stored in json.loads(path.read_text())["rows"]:
                row = Row(**stored)
                for answer in row.answers:
                    answer.setdefault("facts", facts.get(answer["q"], []))
                tally(row)
                print("| " + " | ".join(row.cells()) + " |")
        return
    questions = json.loads((DATA / "questions.json").read_text())
    others = foreign_benchmarks()
    print(f"commit {git_head()}, cores {os.cpu_count()}, other benchmarks running: "
          f"{', '.join(others) or 'none'}, load {os.getloadavg()[0]:.2f}")
    print("| " + " | ".join(HEADER) + " |")
    print("|" + "---|" * len(HEADER))
    rows: list[Row] = []
    for model in args.models:
        rows += await run_model(model, args.settings, questions, args.max_tokens,
                                limit=args.limit, chat_limit=args.chat_limit, done=rows,
                                out=args.out)
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
