"""The load of ``bench.soak``: concurrent clients, the run, and the final checks."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import grpc

from bench._soak.common import (
    CLIENT_CANCEL,
    DIR_SOURCE,
    GEN,
    PUSH_SOURCE,
    QUERIES,
    Check,
    DocRecord,
    SwapRecord,
    body,
    token,
)
from bench._soak.harness import Harness
from bench._support import PROMPTS, short
from llamad_protocol.v1 import (
    control_pb2,
    control_pb2_grpc,
    inference_pb2,
    inference_pb2_grpc,
    retrieval_pb2,
    retrieval_pb2_grpc,
)


class Soak(Harness):
    """The clients, the run, and what they saw (the bookkeeping is :class:`Harness`'s)."""

    # -- clients -----------------------------------------------------------------------

    async def generate_client(self, cid: int) -> None:
        rng = random.Random(1000 + cid)
        async with self.channel() as ch:
            stub = inference_pb2_grpc.InferenceServiceStub(ch)
            n = 0
            while not self.stop.is_set():
                cancel_after = rng.randint(1, 4) if rng.random() < self.args.cancel_share \
                    else None
                request = inference_pb2.GenerateRequest(
                    prompt=PROMPTS[(cid + n) % len(PROMPTS)],
                    sampling=inference_pb2.SamplingParams(
                        max_tokens=rng.randint(8, self.args.max_tokens), temperature=0.7,
                        seed=rng.randrange(1 << 30)))

                async def fn(deadline: float, request: Any = request,
                             cancel_after: int | None = cancel_after) -> tuple[str, int]:
                    call = stub.Generate(request, timeout=deadline)
                    texts = 0
                    try:
                        async for msg in call:
                            texts += bool(msg.text)
                            if cancel_after is not None and texts >= cancel_after:
                                call.cancel()
                                return CLIENT_CANCEL, texts
                    finally:
                        call.cancel()  # no-op once it ended
                    return "OK", texts

                code, _, err = await self.call("Generate", fn)
                n += 1
                await self.pause(self.after(code, err, 0.2))

    async def search_client(self, cid: int) -> None:
        rng = random.Random(2000 + cid)
        async with self.channel() as ch:
            stub = retrieval_pb2_grpc.RetrievalServiceStub(ch)
            while not self.stop.is_set():
                clean = [d for d in self.docs.values() if d.clean]
                probe = rng.choice(clean) if clean and rng.random() < 0.5 else None
                query = probe.token if probe is not None and probe.token else rng.choice(
                    QUERIES)
                request = retrieval_pb2.SearchRequest(query=query, top_k=5)

                async def fn(deadline: float, request: Any = request
                             ) -> tuple[str, list[str]]:
                    resp = await stub.Search(request, timeout=deadline)
                    return "OK", [h.document_id for h in resp.hits
                                  if h.HasField("text_rank")]

                code, ids, err = await self.call("Search", fn)
                if probe is not None and code == "OK" and ids is not None and probe.clean:
                    self.probes["found" if probe.id in ids else "missed"] += 1
                await self.pause(self.after(code, err, 0.3))

    async def ingest_client(self) -> None:
        rng = random.Random(3000)
        async with self.channel() as ch:
            stub = retrieval_pb2_grpc.RetrievalServiceStub(ch)
            n = 0
            while not self.stop.is_set():
                clean = [d for d in self.docs.values() if d.clean]
                live = [d for d in self.docs.values() if d.token and not d.deleted]
                r = rng.random()
                if clean and (r < self.args.delete_share or len(live) > self.args.max_docs):
                    doc = clean[0] if len(live) > self.args.max_docs else rng.choice(clean)
                    code, err = await self.delete(stub, doc)
                elif clean and r < self.args.delete_share + self.args.update_share:
                    code, err = await self.upsert(stub, rng.choice(clean), rng)
                else:
                    n += 1
                    doc = self.docs.setdefault(f"soak/{n:06d}", DocRecord(f"soak/{n:06d}"))
                    code, err = await self.upsert(stub, doc, rng)
                await self.pause(self.after(code, err, self.args.ingest_pause))

    async def upsert(self, stub: Any, doc: DocRecord, rng: random.Random
                     ) -> tuple[str, grpc.aio.AioRpcError | None]:
        tok = token(rng)
        request = retrieval_pb2.UpsertDocumentRequest(
            source_id=PUSH_SOURCE, id=doc.id, title=f"Soak note {doc.id}",
            text=body(rng, tok, rng.randint(1, 4)), kind="text")

        async def fn(deadline: float) -> tuple[str, int]:
            resp = await stub.UpsertDocument(request, timeout=deadline)
            return "OK", int(resp.document.state)

        with doc.writing():
            code, state, err = await self.call("UpsertDocument", fn)
        if code == "OK":
            if state != retrieval_pb2.DOCUMENT_STATE_INDEXED:
                self.anomalies[f"UpsertDocument OK with state {state}"] += 1
            if doc.token:
                doc.superseded.append(doc.token)
            doc.token = tok
            doc.pending.clear()
        else:
            doc.pending.append(tok)
        return code, err

    async def delete(self, stub: Any, doc: DocRecord) -> tuple[str, grpc.aio.AioRpcError | None]:
        async def fn(deadline: float) -> tuple[str, bool]:
            resp = await stub.DeleteDocument(retrieval_pb2.DeleteDocumentRequest(id=doc.id),
                                             timeout=deadline)
            return "OK", bool(resp.deleted)

        with doc.writing():
            code, deleted, err = await self.call("DeleteDocument", fn)
        if code == "OK":
            doc.deleted = True
            if not deleted:
                self.anomalies["DeleteDocument of an acknowledged document: deleted=false"] += 1
        else:
            doc.delete_pending = True
        return code, err

    def write_file(self, name: str, rng: random.Random) -> None:
        tok = token(rng)
        old = self.dir_files.get(name)
        if old:
            self.dir_removed.append(old)
        text = body(rng, tok, rng.randint(1, 3))
        (self.corpus / name).write_text(f"# Runbook {name}\n\n{text}\n")
        self.dir_files[name] = tok

    async def reindex(self, stub: Any, rpc: str = "Reindex"
                      ) -> tuple[str, grpc.aio.AioRpcError | None]:
        async def fn(deadline: float) -> tuple[str, Any]:
            call = stub.Reindex(retrieval_pb2.ReindexRequest(source_id=DIR_SOURCE),
                                timeout=deadline)
            last = None
            try:
                async for msg in call:
                    last = msg
            finally:
                call.cancel()
            if last is None or not last.done:
                return "ended without done", last
            return "OK", last

        files = dict(self.dir_files)
        code, last, err = await self.call(rpc, fn)
        if code == "OK" and last is not None:
            for issue in [*last.failed]:
                self.reindex_failures[f"{Path(issue.path).name}: {issue.reason}"[:120]] += 1
            self.dir_acked = files
        return code, err

    async def directory_client(self) -> None:
        rng = random.Random(4000)
        n = len(self.dir_files)
        async with self.channel() as ch:
            stub = retrieval_pb2_grpc.RetrievalServiceStub(ch)
            async for _ in self.every(self.args.reindex_every):
                names = sorted(self.dir_files)
                for name in rng.sample(names, min(2, len(names))):
                    self.write_file(name, rng)
                n += 1
                self.write_file(f"note-{n:04d}.md", rng)
                if len(self.dir_files) > 10:
                    gone = rng.choice(sorted(self.dir_files))
                    (self.corpus / gone).unlink()
                    self.dir_removed.append(self.dir_files.pop(gone))
                await self.reindex(stub)

    async def swap_client(self) -> None:
        async with self.channel() as ch:
            control = control_pb2_grpc.ControlServiceStub(ch)
            async for _ in self.every(self.args.swap_every):
                async def status(deadline: float) -> tuple[str, str]:
                    resp = await control.Status(control_pb2.StatusRequest(), timeout=deadline)
                    return "OK", next((c.model_path for c in resp.children if c.role == GEN),
                                      "")

                _, current, _ = await self.call("Status", status)
                now = Path(current or "").name
                target = self.models[1] if now == self.models[0].name else self.models[0]
                messages: list[str] = []

                async def swap(deadline: float, target: Path = target,
                               messages: list[str] = messages) -> tuple[str, str]:
                    call = control.Swap(control_pb2.SwapRequest(
                        role=GEN, model_path=str(target), reason="soak"), timeout=deadline)
                    stage = ""
                    try:
                        async for msg in call:
                            stage = control_pb2.SwapStage.Name(msg.stage)
                            messages.append(msg.message)
                    finally:
                        call.cancel()
                    return ("OK" if stage == "SWAP_STAGE_DONE" else f"ended at {stage}"), stage

                at = self.now()
                code, _, err = await self.call("Swap", swap)
                message = (err.details() or "") if err is not None else next(
                    (m for m in reversed(messages) if m.strip()), "")
                self.swaps.append(SwapRecord(at, now, target.name, self.now() - at, code,
                                             " ".join(message.split())[:120]))
                print(f"  swap {len(self.swaps)} at {at:.0f}s: {short(now)} -> "
                      f"{short(target.name)}: {code} in {self.now() - at:.1f}s", flush=True)

    async def status_client(self) -> None:
        async with self.channel() as ch:
            control = control_pb2_grpc.ControlServiceStub(ch)
            retrieval = retrieval_pb2_grpc.RetrievalServiceStub(ch)
            tick = 0
            while not self.stop.is_set():
                async def status(deadline: float) -> tuple[str, None]:
                    await control.Status(control_pb2.StatusRequest(), timeout=deadline)
                    return "OK", None

                async def rstatus(deadline: float) -> tuple[str, None]:
                    await retrieval.Status(retrieval_pb2.RetrievalStatusRequest(),
                                           timeout=deadline)
                    return "OK", None

                async def listing(deadline: float) -> tuple[str, None]:
                    await retrieval.ListDocuments(
                        retrieval_pb2.ListDocumentsRequest(source_id=PUSH_SOURCE),
                        timeout=deadline)
                    return "OK", None

                await self.call("Status", status)
                if tick % 3 == 0:
                    await self.call("RetrievalService/Status", rstatus)
                if tick % 6 == 0:
                    await self.call("ListDocuments", listing)
                tick += 1
                await self.pause(5.0)

    # -- the run -------------------------------------------------------------------------

    async def setup(self) -> None:
        rng = random.Random(5000)
        for i in range(8):
            self.write_file(f"note-{i:04d}.md", rng)
        async with self.channel() as ch:
            stub = retrieval_pb2_grpc.RetrievalServiceStub(ch)
            for request in (retrieval_pb2.AddSourceRequest(id=PUSH_SOURCE, category="soak"),
                            retrieval_pb2.AddSourceRequest(id=DIR_SOURCE, path=str(self.corpus),
                                                           category="soak")):
                async def fn(deadline: float, request: Any = request) -> tuple[str, None]:
                    await stub.AddSource(request, timeout=deadline)
                    return "OK", None

                code, _, err = await self.call("AddSource", fn)
                if code != "OK":
                    raise SystemExit(f"soak: AddSource {request.id} failed: {code} "
                                     f"{err.details() if err is not None else ''}")
            code, _ = await self.reindex(stub)
            if code != "OK":
                raise SystemExit(f"soak: the first Reindex failed: {code}")

    async def run(self, duration: float) -> None:
        self.t0 = time.monotonic()
        tasks = [asyncio.create_task(self.sampler(duration), name="sampler")]
        tasks += [asyncio.create_task(self.generate_client(i), name=f"generate-{i}")
                  for i in range(self.args.generate_clients)]
        tasks += [asyncio.create_task(self.search_client(i), name=f"search-{i}")
                  for i in range(self.args.search_clients)]
        tasks += [asyncio.create_task(c(), name=c.__name__) for c in (
            self.ingest_client, self.directory_client, self.swap_client, self.status_client)]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), duration)
        self.stop.set()
        await asyncio.gather(*tasks)

    async def settle(self, timeout: float = 15.0) -> tuple[int, int, float]:
        """Once the load stopped: until the generation child has no call running or queued
        (cancelled and abandoned calls must be cleaned up), up to ``timeout`` s."""
        began = time.monotonic()
        in_flight = queued = -1
        async with self.channel() as ch:
            control = control_pb2_grpc.ControlServiceStub(ch)
            while time.monotonic() - began < timeout:
                resp = await control.Status(control_pb2.StatusRequest(), timeout=5)
                gen = next(c for c in resp.children if c.role == GEN)
                in_flight, queued = int(gen.in_flight), int(gen.queued)
                if in_flight == 0 and queued == 0:
                    break
                await asyncio.sleep(0.25)
        return in_flight, queued, time.monotonic() - began

    async def verify(self) -> Check:
        check = Check()
        check.in_flight, check.queued, check.settle_seconds = await self.settle()
        async with self.channel() as ch:
            stub = retrieval_pb2_grpc.RetrievalServiceStub(ch)
            code, _ = await self.reindex(stub, "Reindex (final)")
            check.dir_reindex = code

            async def listing(deadline: float) -> tuple[str, list[Any]]:
                resp = await stub.ListDocuments(retrieval_pb2.ListDocumentsRequest(),
                                                timeout=deadline)
                return "OK", list(resp.documents)

            code, docs, _ = await self.call("ListDocuments", listing)
            if code != "OK" or docs is None:
                raise SystemExit(f"soak: ListDocuments failed at the end: {code}")
            listed = {d.id: d for d in docs}
            files = {Path(d.path).name: d for d in docs if d.source_id == DIR_SOURCE}
            gate = asyncio.Semaphore(4)

            async def finds(query: str, source: str) -> set[str]:
                """Document ids (push) or file names (directory) whose text a search for
                ``query`` matched (BM25: a hybrid search always returns nearest vectors,
                whatever the query); retried on failure, so that a flaky search is not a
                lost write."""
                async with gate:
                    request = retrieval_pb2.SearchRequest(
                        query=query, top_k=5,
                        filters=retrieval_pb2.SearchFilters(sources=[source]))
                    for _ in range(3):
                        async def fn(deadline: float) -> tuple[str, set[str]]:
                            resp = await stub.Search(request, timeout=deadline)
                            return "OK", {h.document_id if source == PUSH_SOURCE
                                          else Path(h.path).name for h in resp.hits
                                          if h.HasField("text_rank")}

                        code, found, _ = await self.call("Search (check)", fn)
                        if code == "OK" and found is not None:
                            return found
                        await asyncio.sleep(1)
                    raise SystemExit(f"soak: the checking searches fail ({code})")

            indexed = retrieval_pb2.DOCUMENT_STATE_INDEXED

            async def check_doc(d: DocRecord) -> None:
                if d.token is None:
                    check.never_acked += 1
                    return
                if d.deleted:
                    check.deleted_checked += 1
                    if d.id in listed or d.id in await finds(d.token, PUSH_SOURCE):
                        check.resurrected.append(d.id)
                    return
                if d.pending or d.delete_pending:
                    check.ambiguous_checked += 1
                    hits = [d.id in await finds(t, PUSH_SOURCE) for t in [d.token, *d.pending]]
                    if not any(hits) and not (d.delete_pending and d.id not in listed):
                        check.ambiguous_lost.append(d.id)
                    return
                check.push_checked += 1
                doc = listed.get(d.id)
                if doc is None or doc.state != indexed:
                    state = "missing" if doc is None else retrieval_pb2.DocumentState.Name(
                        doc.state)
                    check.push_not_indexed.append(f"{d.id} ({state})")
                if d.id not in await finds(d.token, PUSH_SOURCE):
                    check.push_not_found.append(d.id)
                for old in d.superseded:
                    check.superseded_checked += 1
                    if d.id in await finds(old, PUSH_SOURCE):
                        check.stale.append(f"{d.id} ({old})")

            async def check_file(name: str, tok: str) -> None:
                check.dir_checked += 1
                doc = files.get(name)
                if doc is None or doc.state != indexed or name not in await finds(
                        tok, DIR_SOURCE):
                    check.dir_lost.append(name)

            async def check_removed(tok: str) -> None:
                check.dir_removed_checked += 1
                if await finds(tok, DIR_SOURCE):
                    check.dir_stale.append(tok)

            jobs: list[Awaitable[None]] = [check_doc(d) for d in self.docs.values()]
            if check.dir_reindex == "OK":
                jobs += [check_file(n, t) for n, t in self.dir_files.items()]
                jobs += [check_removed(t) for t in self.dir_removed]
            await asyncio.gather(*jobs)
        return check
