"""PDF to text: pypdf runs in a worker process (:mod:`retrieval.extraction._pdf_worker`), never
here.

The worker runs under a memory rlimit, a CPU rlimit, a wall-clock timeout, a page cap and
an output cap, in its own process group with a parent-death signal, so a decompression
bomb or a parser bug can never crash, hang or bloat the daemon. It reads the PDF from its
standard input (a pipe, or the descriptor the caller checked: never a path it could
re-open) and prints one JSON result; anything else it does is an ``ExtractionError``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from ..errors import ExtractionError
from . import _pdf_worker
from ._dates import parse_pdf_date
from ._text import clean_title, normalise, stem

if TYPE_CHECKING:
    from ._extract import ExtractLimits

_log = structlog.get_logger("llamad.retrieval")

_WORKER = Path(_pdf_worker.__file__).resolve()
_WORKER_KINDS = frozenset({"pdf_malformed", "pdf_encrypted", "pdf_image_only", "too_large",
                           "resource_limit", "not_regular"})
_READ_CHUNK = 65536
_STDERR_KEEP = 4096


@dataclass
class _Warned:
    no_prlimit: bool = False


_warned = _Warned()


def _worker_argv(limits: ExtractLimits) -> list[str]:
    """The worker command: parent-death signal and rlimits first, when the tools exist.

    ``setpriv`` and ``prlimit`` (util-linux) set these up in the child before it execs
    python, instead of a ``preexec_fn``, which is unsafe in a process with threads.
    """
    prefix: list[str] = []
    setpriv = shutil.which("setpriv")
    if setpriv:
        prefix += [setpriv, "--pdeathsig", "KILL", "--"]
    prlimit = shutil.which("prlimit")
    if prlimit:
        cpu = math.ceil(limits.pdf_timeout) + 1
        prefix += [prlimit, f"--as={limits.pdf_max_memory}", f"--cpu={cpu}:{cpu + 1}",
                   "--core=0", "--"]
    elif not _warned.no_prlimit:
        _warned.no_prlimit = True
        _log.warning("pdf_worker_without_memory_limit",
                     reason="prlimit (util-linux) is not on PATH; PDF parsing is bounded by "
                            "the timeout and output cap only")
    # -P: the worker's directory is not put on sys.path; run as a script so that the
    # retrieval package (tantivy, hnswlib, numpy) is not imported under the memory cap.
    return [*prefix, sys.executable, "-P", str(_WORKER), "-",
            "--max-bytes", str(limits.max_bytes), "--max-pages", str(limits.pdf_max_pages),
            "--max-output", str(limits.pdf_max_output)]


def extract_pdf(name: str, limits: ExtractLimits, *, data: bytes | None = None,
                stdin_fd: int | None = None) -> tuple[str, str, int | None]:
    """``(title, text, date)`` of a PDF (the date: its metadata's ``/CreationDate``, unix
    seconds, None without a valid one): the worker run on ``data`` (piped) or on an open
    file (as its stdin). Blocking, for at most ``limits.pdf_timeout`` seconds: the worker's
    process group is then killed (and always reaped).

    Raises:
        ExtractionError: ``timeout``, ``resource_limit``, ``worker_failed``, or what the
            worker reported (``pdf_malformed``, ``pdf_encrypted``, ``pdf_image_only``,
            ``too_large``, ``not_regular``).
    """
    try:
        proc = subprocess.Popen(
            _worker_argv(limits),
            stdin=subprocess.PIPE if data is not None else stdin_fd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            process_group=0,
            close_fds=True,
        )
    except OSError as exc:
        raise ExtractionError(f"{name}: the PDF worker cannot be started: {exc}",
                              "worker_failed") from exc
    try:
        out, err, failure = _communicate(proc, data, limits)
    except OSError as exc:
        raise ExtractionError(f"{name}: talking to the PDF worker failed: {exc}",
                              "worker_failed") from exc
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
    if failure == "timeout":
        raise ExtractionError(f"{name}: PDF parsing took longer than {limits.pdf_timeout:g} s "
                              "(retrieval.pdf_timeout)", "timeout")
    if failure == "output":
        raise ExtractionError(f"{name}: PDF text exceeds the {limits.pdf_max_output}-byte "
                              "output limit (retrieval.pdf_max_output_mb)", "resource_limit")
    return _pdf_result(name, proc.returncode, out, err)


def _communicate(proc: subprocess.Popen[bytes], data: bytes | None,
                 limits: ExtractLimits) -> tuple[bytes, bytes, str | None]:
    """Feed stdin and drain stdout and stderr concurrently, within the deadline and the
    output cap. Returns (stdout, stderr tail, failure) with failure None, "timeout" or
    "output"."""
    deadline = time.monotonic() + limits.pdf_timeout
    out = bytearray()
    err = bytearray()
    view = memoryview(data) if data is not None else memoryview(b"")
    offset = 0
    stdin = proc.stdin
    with selectors.DefaultSelector() as sel:
        assert proc.stdout is not None  # noqa: S101 - created with PIPE
        assert proc.stderr is not None  # noqa: S101 - created with PIPE
        for stream in (proc.stdout, proc.stderr):
            os.set_blocking(stream.fileno(), False)
            sel.register(stream, selectors.EVENT_READ)
        if stdin is not None:
            os.set_blocking(stdin.fileno(), False)
            if len(view):
                sel.register(stdin, selectors.EVENT_WRITE)
            else:
                stdin.close()
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return bytes(out), bytes(err), "timeout"
            for key, _ in sel.select(remaining):
                ready, fd = key.fileobj, key.fd
                if stdin is not None and ready is stdin:
                    try:
                        offset += os.write(fd, view[offset : offset + _READ_CHUNK])
                    except (BlockingIOError, InterruptedError):
                        continue
                    except BrokenPipeError:
                        offset = len(view)
                    if offset >= len(view):
                        sel.unregister(stdin)
                        stdin.close()
                    continue
                try:
                    chunk = os.read(fd, _READ_CHUNK)
                except (BlockingIOError, InterruptedError):
                    continue
                if not chunk:
                    sel.unregister(ready)
                    continue
                if ready is proc.stdout:
                    out += chunk
                    if len(out) > limits.pdf_max_output + _READ_CHUNK:
                        return bytes(out), bytes(err), "output"
                else:
                    err += chunk
                    del err[:-_STDERR_KEEP]
    try:
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return bytes(out), bytes(err), "timeout"
    return bytes(out), bytes(err), None


def _pdf_result(name: str, returncode: int, out: bytes, err: bytes
                ) -> tuple[str, str, int | None]:
    if returncode != 0:
        tail = err.decode("utf-8", "replace").strip().splitlines()
        last = tail[-1][:200] if tail else ""
        if returncode in (-signal.SIGKILL, -signal.SIGXCPU) or "MemoryError" in last:
            raise ExtractionError(
                f"{name}: the PDF worker hit its memory or CPU limit "
                "(retrieval.pdf_max_memory_mb, retrieval.pdf_timeout) "
                f"(exit {returncode}{': ' + last if last else ''})", "resource_limit")
        raise ExtractionError(
            f"{name}: the PDF worker failed (exit {returncode}{': ' + last if last else ''})",
            "worker_failed")
    try:
        result = json.loads(out)
    except ValueError as exc:
        raise ExtractionError(f"{name}: the PDF worker printed no valid result",
                              "worker_failed") from exc
    if not isinstance(result, dict):
        raise ExtractionError(f"{name}: the PDF worker printed no valid result",
                              "worker_failed")
    if "error_kind" in result:
        kind, reason = result.get("error_kind"), result.get("reason")
        if kind not in _WORKER_KINDS or not isinstance(reason, str):
            raise ExtractionError(f"{name}: the PDF worker printed no valid result",
                                  "worker_failed")
        raise ExtractionError(f"{name}: {reason}", str(kind))
    pages, title = result.get("pages"), result.get("title")
    if not isinstance(pages, list) or not all(isinstance(p, str) for p in pages) or \
            not isinstance(title, str):
        raise ExtractionError(f"{name}: the PDF worker printed no valid result",
                              "worker_failed")
    text = normalise("\n\n".join(p.strip("\n") for p in pages))
    # JSON may carry lone surrogates (from broken font maps): make the text valid UTF-8.
    text = text.encode("utf-8", "replace").decode("utf-8")
    title = clean_title(title.encode("utf-8", "replace").decode("utf-8"))
    if not title:
        title = next((line.strip() for line in text.split("\n", 200) if line.strip()), "")
    created = result.get("created")
    date = parse_pdf_date(created) if isinstance(created, str) and created else None
    return clean_title(title) or stem(name), text, date
